#!/usr/bin/env bash
# oxccl and its peers across an emulated cluster on this machine: HOSTS network namespaces ×
# PER_HOST ranks, each host's RAILS links shaped to RATE (oxccl-cluster), in ROUNDS rounds; each
# round runs, in the same cluster and in turn, the 8-byte TCP round trip between host 0 and
# host 1, then per collective: oxccl (its own plan choice), oxccl flat (NCCL_ALGO=ring), Open MPI
# (TCP between hosts) and Gloo (torch.distributed, one torchrun per host). Then the table and
# SVGs: bench/results/cluster/ (summary-HxK-rR.md, COLL-HxK-rR.svg, raw/).
#
#   bash bench/cluster/run.sh [ROUNDS]        (default 1; needs root: network namespaces)
#
# Environment: HOSTS (2), PER_HOST (2), RAILS (1), RATE (1gbit), COLLS ("all_reduce"),
# SIZES_MIN (8), SIZES_MAX (64M), ITERS (20), WARMUP (5), LIBS ("oxccl oxccl-ring openmpi gloo"),
# MPI_BTL (self,vader,tcp: shared memory inside a host, TCP between hosts, as Open MPI runs on
# real clusters), OXCCL_PYTHON (a python with torch; default /opt/oxccl-ci-venv/bin/python if
# present, else python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ROUNDS=${1:-1}
HOSTS=${HOSTS:-2}
PER_HOST=${PER_HOST:-2}
RAILS=${RAILS:-1}
RATE=${RATE:-1gbit}
COLLS=${COLLS:-all_reduce}
MIN=${SIZES_MIN:-8}
MAX=${SIZES_MAX:-64M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
LIBS=${LIBS:-"oxccl oxccl-ring openmpi gloo"}
MPI_BTL=${MPI_BTL:-self,vader,tcp}
SHAPE="${HOSTS}x${PER_HOST}-r${RAILS}"
OUT=$ROOT/bench/results/cluster
RAW=$OUT/raw/$SHAPE
BUILD=$ROOT/bench/.peers/build
LOGS=$ROOT/bench/.peers/cluster-logs/$SHAPE   # the ranks other than the first: their output
rm -rf "$LOGS"
mkdir -p "$RAW" "$BUILD" "$LOGS"
if [ -z "${OXCCL_PYTHON:-}" ]; then
  if [ -x /opt/oxccl-ci-venv/bin/python ]; then OXCCL_PYTHON=/opt/oxccl-ci-venv/bin/python; else OXCCL_PYTHON=python3; fi
fi
TORCHRUN=$(dirname "$(command -v "$OXCCL_PYTHON")")/torchrun

# ---------------------------------------------------------------- install and build
export DEBIAN_FRONTEND=noninteractive
need=()
for p in openmpi-bin libopenmpi-dev iperf3 gcc; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}"
fi
cargo build --release -q -p oxccl-perf -p oxccl-testkit
T=${CARGO_TARGET_DIR:-$ROOT/target}
case $T in /*) ;; *) T=$ROOT/$T ;; esac
OXPERF=$T/release/oxccl-perf
CLUSTER=$T/release/oxccl-cluster
mpicc -O2 -o "$BUILD/mpi_perf_ompi" bench/peers/mpi_perf.c
gcc -O2 -o "$BUILD/pingpong" bench/cluster/pingpong.c
"$OXCCL_PYTHON" -c 'import torch' || { echo "no torch in $OXCCL_PYTHON (set OXCCL_PYTHON)"; exit 1; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($(nproc) cores)"
  echo "kernel: $(uname -r)"
  echo "oxccl: $(git rev-parse --short HEAD)"
  echo "open mpi: $(mpirun --version 2>/dev/null | head -1) (btl $MPI_BTL)"
  echo "torch: $("$OXCCL_PYTHON" -c 'import torch; print(torch.__version__)')"
  echo "cluster: $HOSTS hosts x $PER_HOST ranks, $RAILS rail(s) of $RATE each way per host (tc tbf)"
} > "$RAW/machine.txt"

# ---------------------------------------------------------------- the jobs, one cluster
# The summary is of this run's rounds only.
rm -rf "$RAW"/round*
common="-b $MIN -e $MAX -f 2 -n $ITERS -w $WARMUP"
jobs=$RAW/jobs.txt
: > "$jobs"
for ((round = 1; round <= ROUNDS; round++)); do
  d=$RAW/round$round
  mkdir -p "$d"
  echo "ranks $BUILD/pingpong -J $d/pingpong.json" >> "$jobs"
  for c in $COLLS; do
    for lib in $LIBS; do
      case $lib in
        oxccl) echo "ranks env OXCCL_TIMEOUT=300 $OXPERF ${c}_perf $common -c 1 -R 0 -J $d/oxccl-$c.json" ;;
        oxccl-ring) echo "ranks env NCCL_ALGO=ring OXCCL_TIMEOUT=300 $OXPERF ${c}_perf $common -c 1 -R 0 -J $d/oxccl-ring-$c.json" ;;
        openmpi) echo "mpi $BUILD/mpi_perf_ompi $c $common -J $d/openmpi-$c.json -L openmpi" ;;
        gloo) echo "gloo $ROOT/bench/cluster/gloo_perf.py $c $common -J $d/gloo-$c.json -L gloo" ;;
        *) echo "unknown library $lib (oxccl oxccl-ring openmpi gloo)" >&2; exit 2 ;;
      esac >> "$jobs"
    done
  done
done
echo "== $SHAPE at $RATE, $ROUNDS round(s): $(grep -c . "$jobs") jobs ($jobs)"
# Open MPI yields when idle, as it does by itself when it knows it is oversubscribed: this
# machine's cores run every host's ranks.
set +e
OMPI_MCA_mpi_yield_when_idle=1 "$CLUSTER" --hosts "$HOSTS" --per-host "$PER_HOST" --rails "$RAILS" --rate "$RATE" \
  --mpi-btl "$MPI_BTL" --torchrun "$TORCHRUN" --timeout 900 --log-dir "$LOGS" --jobs "$jobs" 2>&1 \
  | grep --line-buffered -v '^W[0-9]* \|^\*\*\*\*\|OMP_NUM_THREADS\|hostname of the client socket'
st=("${PIPESTATUS[@]}")
set -e
rc=${st[0]}
[ "$rc" = 0 ] || echo "oxccl-cluster: exit status $rc (a job failed; the table shows what was measured)"

# ---------------------------------------------------------------- table and plots
python3 bench/cluster/analyze.py "$RAW" "$OUT" "$OXPERF" --shape "$SHAPE" --rate "$RATE" \
  --command "HOSTS=$HOSTS PER_HOST=$PER_HOST RAILS=$RAILS RATE=$RATE COLLS=\"$COLLS\" SIZES_MAX=$MAX bash bench/cluster/run.sh $ROUNDS"
echo "results: $OUT/summary-$SHAPE.md"
exit "$rc"
