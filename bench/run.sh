#!/usr/bin/env bash
# The peer harness: installs the peers (Open MPI and Gloo from Debian; Intel MPI and oneCCL
# from PyPI into a virtualenv), builds small benchmarks of our own against each (same sizes,
# timing method, columns and JSON as oxccl-perf), measures this machine's memory copy
# bandwidth and loopback TCP rate, runs oxccl and the peers interleaved in rounds, and writes
# the ratio tables and plots under bench/results/.
#
#   bash bench/run.sh [ROUNDS]          (default 3 rounds; ~25 minutes per round on 2 cores)
#
# Environment: SIZES_MAX (default 256M), ITERS (20), COLLS ("all_reduce broadcast all_gather
# reduce_scatter alltoall"), NPS ("2 4").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=${1:-3}
MAX=${SIZES_MAX:-256M}
ITERS=${ITERS:-20}
COLLS=${COLLS:-"all_reduce broadcast all_gather reduce_scatter alltoall"}
NPS=${NPS:-"2 4"}
PEERS=$ROOT/bench/.peers            # installs and builds (not committed)
OUT=$ROOT/bench/results
RAW=$OUT/raw
mkdir -p "$PEERS/build" "$RAW"

# ---------------------------------------------------------------- install
export DEBIAN_FRONTEND=noninteractive
need=()
for p in openmpi-bin libopenmpi-dev libgloo-dev iperf3 libfabric1 g++; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}"
fi
V=$PEERS/venv
if [ ! -x "$V/bin/mpicc" ]; then
  python3 -m venv "$V"
  # The wheels declare libfabric>=2.6, which PyPI lacks: install without dependencies and use
  # Debian's libfabric1.
  "$V/bin/pip" install -q --no-deps oneccl==2022.2.0 oneccl-devel==2022.2.0 impi-rt==2021.19.0 impi-devel==2021.19.0
  "$V/bin/pip" install -q intel-sycl-rt==2026.2.0
fi

# ---------------------------------------------------------------- build
B=$PEERS/build
cargo build --release -q -p oxccl-perf
OXPERF=$ROOT/target/release/oxccl-perf
mpicc -O2 -o "$B/mpi_perf_ompi" bench/peers/mpi_perf.c
I_MPI_ROOT=$V "$V/bin/mpicc" -O2 -o "$B/mpi_perf_impi" bench/peers/mpi_perf.c
g++ -O2 -std=c++17 -o "$B/gloo_perf" bench/peers/gloo_perf.cc -lgloo -lpthread
g++ -O2 -std=c++17 -I"$V/include" -o "$B/ccl_perf" bench/peers/ccl_perf.cc "$V/lib/ccl/cpu/lib/libccl.a" \
  /usr/lib/x86_64-linux-gnu/libfabric.so.1 -L"$V/lib" -lhwloc -lintlc -lirc -lpthread -ldl -lrt -Wl,-rpath,"$V/lib"
gcc -O2 -pthread -o "$B/membw" bench/peers/membw.c

# ---------------------------------------------------------------- machine facts
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($(nproc) cores)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "kernel: $(uname -r)"
  echo "oxccl: $(git rev-parse --short HEAD)"
  echo "open mpi: $(mpirun --version 2>/dev/null | head -1)"
  echo "intel mpi: impi-rt 2021.19.0; oneccl 2022.2.0 (CPU static library)"
  echo "gloo: $(dpkg -s libgloo-dev | awk '/^Version/ {print $2}')"
} > "$OUT/machine.txt"

run_membw() { "$B/membw"; }
run_iperf() {
  local len=$1
  iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p 5299 -t 3 -l "$len" -J 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["end"]["sum_received"]["bits_per_second"]/8e9, 2))'
  wait
}

# ---------------------------------------------------------------- one run of each library
common="-b 8 -e $MAX -f 2 -n $ITERS -w 5"
run_oxccl() { # coll P transport buffers(heap|reg) json
  local shm=0; [ "$3" = tcp ] && shm=1
  local reg=1; [ "$4" = heap ] && reg=0
  NCCL_SHM_DISABLE=$shm OXCCL_TIMEOUT=300 "$OXPERF" "${1}_perf" -np "$2" $common -c 1 -R $reg -J "$5" >/dev/null
}
run_ompi() { # coll P transport json
  local btl="self,vader"; [ "$3" = tcp ] && btl="self,tcp --mca btl_tcp_if_include lo"
  # shellcheck disable=SC2086
  mpirun --allow-run-as-root --oversubscribe -np "$2" --mca pml ob1 --mca btl $btl "$B/mpi_perf_ompi" "$1" $common -J "$4" -L "openmpi-$3" >/dev/null
}
run_impi() { # coll P json
  I_MPI_ROOT=$V LD_LIBRARY_PATH=$V/lib I_MPI_FABRICS=shm I_MPI_HYDRA_BOOTSTRAP=fork \
    "$V/bin/mpiexec.hydra" -iface lo -n "$2" -hosts localhost "$B/mpi_perf_impi" "$1" $common -J "$3" -L intel-mpi >/dev/null
}
run_ccl() { # coll P json
  local kvs; kvs=$(mktemp -u /tmp/oxccl-ccl-kvs.XXXX)
  local extra=(CCL_WORKER_OFFLOAD=0)
  [ "$2" -gt 2 ] && extra=(CCL_YIELD=sched_yield)
  local pids=()
  for ((r = 0; r < $2; r++)); do
    env CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm CCL_PROCESS_LAUNCHER=none CCL_KVS_IFACE=lo \
      CCL_LOCAL_RANK=$r CCL_LOCAL_SIZE="$2" RANK=$r SIZE="$2" KVS_FILE="$kvs" "${extra[@]}" \
      taskset -c $((r % $(nproc))) "$B/ccl_perf" "$1" $common -J "$3" -L oneccl >/dev/null 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  rm -f "$kvs"
  return $rc
}
run_gloo() { # P json
  local store; store=$(mktemp -d /tmp/oxccl-gloo.XXXX)
  local pids=()
  for ((r = 0; r < $1; r++)); do
    RANK=$r SIZE=$1 STORE=$store "$B/gloo_perf" all_reduce $common -J "$2" -L gloo-tcp >/dev/null &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  rm -rf "$store"
  return $rc
}

try() { # label command...: runs it, logging failures instead of stopping the harness
  local label=$1; shift
  local t0=$SECONDS
  if "$@"; then echo "  ok   $label ($((SECONDS - t0)) s)"; else echo "  FAIL $label (exit $?)"; fi
}

# ---------------------------------------------------------------- rounds (interleaved)
# The summary is of this run's rounds only: an earlier run's files (other libraries, other
# buffer kinds) must not mix in.
rm -rf "$RAW"/round*
for ((round = 1; round <= ROUNDS; round++)); do
  d=$RAW/round$round
  mkdir -p "$d"
  echo "== round $round of $ROUNDS"
  run_membw > "$d/membw.json"
  echo "{\"len_128K_GBps\":$(run_iperf 128K),\"len_1M_GBps\":$(run_iperf 1M)}" > "$d/iperf3.json"
  echo "  machine: $(cat "$d/membw.json") iperf3: $(cat "$d/iperf3.json")"
  for P in $NPS; do
    for c in $COLLS; do
      # Heap buffers, as the peers use (the headline), then oxccl's registered shared buffers.
      try "oxccl heap $c P=$P" run_oxccl "$c" "$P" shm heap "$d/oxccl-heap-$c-P$P.json"
      try "oxccl registered $c P=$P" run_oxccl "$c" "$P" shm reg "$d/oxccl-reg-$c-P$P.json"
      try "openmpi shm $c P=$P" run_ompi "$c" "$P" shm "$d/openmpi-shm-$c-P$P.json"
      try "intel-mpi $c P=$P" run_impi "$c" "$P" "$d/intel-mpi-$c-P$P.json"
      try "oneccl $c P=$P" run_ccl "$c" "$P" "$d/oneccl-$c-P$P.json"
    done
    try "oxccl tcp all_reduce P=$P" run_oxccl all_reduce "$P" tcp heap "$d/oxccl-tcp-all_reduce-P$P.json"
    try "openmpi tcp all_reduce P=$P" run_ompi all_reduce "$P" tcp "$d/openmpi-tcp-all_reduce-P$P.json"
    try "gloo tcp all_reduce P=$P" run_gloo "$P" "$d/gloo-tcp-all_reduce-P$P.json"
  done
done

# ---------------------------------------------------------------- tables and plots
python3 bench/analyze.py "$RAW" "$OUT" "$OXPERF"
echo "results: $OUT/summary.md"
