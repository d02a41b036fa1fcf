#!/usr/bin/env bash
# Collectives captured into CUDA graphs (issue 28), on the device machine, after
# `bash bench/gpu/check.sh build` here (carry ["gpu-bin"]; the Python package's wheel in .whl/
# for the torch part: `pip wheel --no-deps ./python -w .whl`). Parts, one or more per call:
#   perf     oxccl-perf -G 10 -c 1: every benchmark as 4 threads, 4 processes (CUDA IPC) and 4
#            threads on the event engine; every type and operator of the all-reduce.
#   latency  the 8-byte all-reduce's time per call, eager and through a graph, alternating.
#   modes    the capture modes (global, thread, relaxed); a capture on the staged path (must
#            be refused).
#   eager    eager calls checked again (the kernels' meeting changed), and oxccl-gpucheck.
# QUICK=1: fewer of the event engine's and processes' eager runs, no oxccl-gpucheck;
# BENCHES: the benchmarks of perf and eager (no every-type run then); GRAPH_MODES: the modes.
#   torch    PyTorch with our libnccl.so.2 preloaded: torch_check.py --graph (a chain of
#            kernels, all_reduce and all_gather_into_tensor replayed 100 times), the same
#            staged (refused), the whole torch_check.py, and the "oxccl" backend's check.
#   nccl     nccl-tests -G 10 over our library and NVIDIA's (bench/gpu/nccl_tests.sh).
# Each part appends to the summary under $OUT; what comes back: summary.txt and the logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ "${1:-}" = device ] || { echo "usage: bash bench/gpu/graph.sh device [perf|torch|nccl|latency|modes|eager]..." >&2; exit 2; }
shift
parts="${*:-perf torch nccl latency modes eager}"
final="${OUT:-/tmp/gpu-out}"
out=/tmp/graph-logs
mkdir -p "$out" "$final"
. bench/gpu/device-env.sh
perf=./gpu-bin/oxccl-perf
lib="$PWD/gpu-bin/libnccl.so.2"
summary="$final/summary.txt"  # written as it goes: it comes back even if the call is cut off
status=0
t0=$(date +%s)
note() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$summary"; }
bounds() { grep -h 'Out of bounds' "$1" | tail -1; }
# sweep LABEL TAG MODE BENCHES LIMIT [FLAGS...]: each benchmark on device buffers, sizes through
# LL, LL128 and the simple kernels, every root of the rooted ones, checked once, into
# $out/LABEL-TAG.txt, a summary line each. A captured sweep (graph) skips the rest of its
# configuration after a hang: one is not worth nine more.
sweep() {
  local label=$1 tag=$2 mode=$3 benches=$4 limit=$5 b extra f rc
  shift 5
  f="$out/$label-$tag.txt"
  for b in $benches; do
    extra=""
    case $b in broadcast|reduce|gather|scatter) extra="-r all" ;; esac
    [ "$label" = graph ] && echo "== ${b}_perf $mode --mem device -b 8 -e 8M -f 16 $extra $* -c 1 -n 2 -w 1" >> "$f"
    timeout "$limit" $perf ${b}_perf $mode --mem device -b 8 -e 8M -f 16 $extra "$@" -c 1 -n 2 -w 1 -T 30 >> "$f" 2>&1
    rc=$?
    note "$label $tag $b: rc=$rc $(bounds "$f")"
    [ $rc = 0 ] || status=1
    if [ "$label" = graph ] && [ $rc = 124 ]; then
      note "graph $tag: $b timed out, the rest skipped"; tail -5 "$f" >> "$summary"; break
    fi
  done
}

for part in $parts; do
case $part in
perf)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$summary"
  # Every benchmark captured (-G 10: the timed iterations launched 10 times as one graph; each
  # check's call captured and replayed), sizes through LL, LL128 and the simple kernels.
  for mode in "-t 4" "-np 4" "-t 4 events"; do
    tag=$(echo "$mode" | tr -d ' -')
    case $mode in *events) export OXCCL_DEVICE_ENGINE=events; mode="-t 4" ;; *) unset OXCCL_DEVICE_ENGINE ;; esac
    benches="${BENCHES:-all_reduce all_gather broadcast reduce_scatter reduce alltoall gather scatter sendrecv hypercube}"
    [ "$tag" = t4events ] && [ "${QUICK:-0}" = 1 ] && benches="all_reduce sendrecv"
    sweep graph "$tag" "$mode" "$benches" 90 -G 10
  done
  unset OXCCL_DEVICE_ENGINE
  # Every type and operator of the LL, LL128 and simple all-reduces, captured, as threads.
  [ -n "${BENCHES:-}" ] && continue
  f="$out/graph-t4-types.txt"
  timeout 120 $perf all_reduce_perf -t 4 --mem device -b 8 -e 1M -f 32 -d all -o all -G 10 -c 1 -n 2 -w 1 -T 30 > "$f" 2>&1
  rc=$?; note "graph t4 all_reduce every type and op: rc=$rc $(bounds "$f")"; [ $rc = 0 ] || status=1
  ;;
latency)
  # The 8-byte all-reduce's time per call, 4 threads, eager and through a graph, alternating.
  for round in 1 2 3; do
    f="$out/lat-eager-$round.txt"
    timeout 60 $perf all_reduce_perf -t 4 --mem device -b 8 -e 8 -n 2000 -w 200 -c 0 > "$f" 2>&1
    note "latency eager round $round: $(grep -E '^ +8 ' "$f" | awk '{print "out-of-place " $6 " us, in-place " $10 " us"}')"
    f="$out/lat-graph-$round.txt"
    timeout 60 $perf all_reduce_perf -t 4 --mem device -b 8 -e 8 -n 200 -w 200 -G 10 -c 0 > "$f" 2>&1
    note "latency graph round $round: $(grep -E '^ +8 ' "$f" | awk '{print "out-of-place " $6 " us, in-place " $10 " us"}')"
  done
  ;;
modes)
  # The capture modes.
  for gm in ${GRAPH_MODES:-global thread relaxed}; do
    for m in "-t 4" "-np 4"; do
      f="$out/graph-mode-$gm-$(echo "$m" | tr -d ' -').txt"
      timeout 60 $perf all_reduce_perf $m --mem device -b 8 -e 1M -f 32 -G 5 -c 1 -n 2 -w 1 -T 30 --graph_mode $gm > "$f" 2>&1
      rc=$?; note "graph mode $gm $m all_reduce: rc=$rc $(bounds "$f")"; [ $rc = 0 ] || status=1
    done
  done
  # The staged path (processes, OXCCL_CUDA_IPC=0) cannot be captured: refused, naming why.
  f="$out/graph-staged.txt"
  OXCCL_CUDA_IPC=0 timeout 60 $perf all_reduce_perf -np 4 --mem device -b 8 -e 8 -G 1 -c 1 -n 2 -w 1 -T 30 > "$f" 2>&1
  rc=$?
  msg=$(grep -m1 -o "captured into a CUDA graph[^;]*" "$f")
  if [ $rc != 0 ] && [ -n "$msg" ]; then note "graph staged refused (rc=$rc): ...$msg"; else note "graph staged NOT REFUSED as expected: rc=$rc"; status=1; fi
  grep -m1 "captured into a CUDA graph" "$f" | cut -c1-600 >> "$summary"
  ;;
eager)
  # Eager calls, checked again: every benchmark as threads and as processes (float), and the
  # thread group's own check (timing, LL chains).
  for mode in "-t 4" "-np 4"; do
    tag=$(echo "$mode" | tr -d ' -')
    benches="${BENCHES:-all_reduce all_gather broadcast reduce_scatter reduce alltoall gather scatter sendrecv hypercube}"
    [ "$tag" = np4 ] && [ "${QUICK:-0}" = 1 ] && benches="all_reduce sendrecv"
    sweep eager "$tag" "$mode" "$benches" 60
  done
  f="$out/eager-t4-types.txt"
  timeout 120 $perf all_reduce_perf -t 4 --mem device -b 8 -e 1M -f 32 -d all -o all -c 1 -n 2 -w 1 -T 30 > "$f" 2>&1
  rc=$?; note "eager t4 all_reduce every type and op: rc=$rc $(bounds "$f")"; [ $rc = 0 ] || status=1
  if [ "${QUICK:-0}" != 1 ]; then
    timeout 240 ./gpu-bin/oxccl-gpucheck --threads-only > "$out/gpucheck-threads.txt" 2>&1 || status=1
    note "gpucheck --threads-only: $(grep -c '^WRONG' "$out/gpucheck-threads.txt") WRONG lines; $(tail -1 "$out/gpucheck-threads.txt")"
  fi
  ;;
torch)
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site
  fi
  f="$out/torch-graph.txt"
  PYTHONUNBUFFERED=1 LD_PRELOAD="$lib" timeout 200 python3 bench/gpu/torch_check.py 4 --graph > "$f" 2>&1 || status=1
  grep -E "FAIL|graph:|refused" "$f" | head -8 >> "$summary"
  note "torch graph (IPC): $(grep -h 'processes on ' "$f" | tail -1)"
  f="$out/torch-graph-staged.txt"
  PYTHONUNBUFFERED=1 OXCCL_CUDA_IPC=0 LD_PRELOAD="$lib" timeout 200 python3 bench/gpu/torch_check.py 4 --graph > "$f" 2>&1 || status=1
  grep -m2 "refused" "$f" | cut -c1-600 >> "$summary"
  note "torch graph staged (must be refused): $(grep -o 'capture refused with oxccl message' "$f" | wc -l) of 4 ranks refused with oxccl's message; $(grep -h 'processes on ' "$f" | tail -1)"
  f="$out/torch.txt"
  PYTHONUNBUFFERED=1 LD_PRELOAD="$lib" timeout 300 python3 bench/gpu/torch_check.py 4 > "$f" 2>&1 || status=1
  grep -E "^FAIL" "$f" | head -5 >> "$summary"
  note "torch_check (IPC): $(grep -h 'processes on ' "$f" | tail -1)"
  if [ -n "${PYTHONPATH:-}" ]; then
    for n in 2 4; do
      f="$out/torch-backend-$n.txt"
      PYTHONUNBUFFERED=1 timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node $n \
        bench/gpu/torch_backend_check.py > "$f" 2>&1
      rc=$?; [ $rc = 0 ] || status=1
      note "torch backend oxccl, $n processes: rc=$rc, $(grep -c '^ok ' "$f") ok lines, $(grep -c 'FAIL' "$f") FAIL lines; $(tail -1 "$f" | cut -c1-200)"
    done
  else
    note "torch backend: no wheel in .whl/, not run"
  fi
  ;;
nccl)
  EXTRA="-G 10" MAXBYTES=${MAXBYTES:-64M} ITERS=${ITERS:-20} RUN_TIMEOUT=120 OUT="$out/nccl" \
    bash bench/gpu/nccl_tests.sh device > "$out/nccl-tests.txt" 2>&1 || status=1
  grep -E "Out of bounds|nccl-tests built" "$out/nccl-tests.txt" | tee -a "$summary"
  ;;
*)
  echo "unknown part $part" >&2
  status=2
  ;;
esac
done
note "status $status"
tar czf "$final/graph-logs.tgz" -C "$out" .
exit $status
