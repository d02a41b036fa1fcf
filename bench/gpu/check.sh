#!/usr/bin/env bash
# The GPU check, in two halves:
#   bash bench/gpu/check.sh build    here: builds the GPU programs and puts stripped copies in
#                                    gpu-bin/ (git-ignored), the folder that travels to the device;
#   bash bench/gpu/check.sh device   on the device machine (the `device` tool's run, with
#                                    carry ["gpu-bin"]): runs the whole check there, writing each
#                                    part's output under $OUT (or /tmp/gpu-out).
# The device machine has no Rust toolchain, so nothing is built there. Parts can be skipped:
# SKIP_GPUCHECK=1 (kernels, bandwidth, thread-group timing), SKIP_PERF=1 (oxccl-perf on device
# buffers: every benchmark, type and operator, ranks as threads and as processes),
# SKIP_TORCH=1 (PyTorch over our libnccl.so.2: the IPC engine, then staged through host memory).
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
build)
  set -e
  cargo build --release -p oxccl-perf --bin oxccl-gpucheck --bin oxccl-perf --bin oxccl
  cargo build --release -p oxccl-capi
  rm -rf gpu-bin && mkdir -p gpu-bin
  cp target/release/oxccl-gpucheck target/release/oxccl-perf target/release/oxccl gpu-bin/
  cp target/release/libnccl.so gpu-bin/libnccl.so.2
  strip gpu-bin/* 2>/dev/null || true
  # Every kernel compiled here for Hopper (NVRTC from OXCCL_NVRTC, as CI gets it) into the
  # kernel cache that travels along: the device then loads it instead of spending minutes of
  # its time in NVRTC (a CUBIN its driver refuses is compiled afresh there).
  if [ -n "${OXCCL_NVRTC:-}" ]; then
    OXCCL_KERNEL_CACHE="$PWD/gpu-bin/kcache" ./target/release/oxccl-gpucheck --cubin sm_90 /dev/null
  else
    echo "OXCCL_NVRTC unset: kernels will be compiled on the device"
  fi
  ls -la gpu-bin
  ;;
device)
  final="${OUT:-/tmp/gpu-out}"
  out=/tmp/gpu-logs
  rm -rf "$out" && mkdir -p "$out" "$final"
  . bench/gpu/device-env.sh
  nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv | tee "$out/gpu.txt"
  status=0
  summary="$out/summary.txt"
  : > "$summary"
  if [ "${SKIP_GPUCHECK:-0}" != 1 ]; then
    # QUICK=1: only the thread group's timing and checks (no kernel check, no bandwidth).
    timeout 300 ./gpu-bin/oxccl-gpucheck ${QUICK:+--threads-only} > "$out/gpucheck.txt" 2>&1 || status=1
    grep -E "^(kernels|CHECK|BW|THREADS|TIMEOUT|MISMATCH|GPU CHECK|WRONG|ERROR)" "$out/gpucheck.txt" | grep -v "^WRONG" | head -80
    echo "gpucheck: $(grep -c '^WRONG' "$out/gpucheck.txt") WRONG lines; $(tail -1 "$out/gpucheck.txt")" >> "$summary"
  fi
  perf=./gpu-bin/oxccl-perf
  if [ "${QUICK:-0}" = 1 ]; then
    # Small and mid all-reduces (LL and LL128 among threads), every type and operator, both configurations.
    for mode in "-t 4" "-np 4"; do
      tag=$(echo "$mode" | tr -d ' -')
      f="$out/perf-quick-$tag.txt"
      timeout 120 $perf all_reduce_perf $mode --mem device -b 8 -e 256K -f 4 -d all -o all -c 1 -n 2 -w 1 -T 30 > "$f" 2>&1
      rc=$?
      echo "perf-quick $tag all_reduce: rc=$rc $(grep -h 'Out of bounds' "$f" | tail -1)" | tee -a "$summary"
      [ $rc = 0 ] || status=1
    done
    SKIP_PERF=1
    SKIP_TORCH=1
  fi
  if [ "${SKIP_PERF:-0}" != 1 ]; then
    # Correctness: every benchmark, every type and operator (and root), out of place and in
    # place, checked (-c 1): 4 ranks as threads of one process, then 4 processes (CUDA IPC),
    # then 4 threads on the event engine (the one threads on several GPUs get; forced here).
    for mode in "-t 4" "-np 4" "-t 4 events"; do
      tag=$(echo "$mode" | tr -d ' -')
      case $mode in *events) export OXCCL_DEVICE_ENGINE=events; mode="-t 4" ;; *) unset OXCCL_DEVICE_ENGINE ;; esac
      for b in all_reduce all_gather broadcast reduce_scatter reduce alltoall gather scatter sendrecv hypercube; do
        extra="-d all"
        case $b in all_reduce|reduce|reduce_scatter) extra="-d all -o all" ;; esac
        case $b in broadcast|reduce|gather|scatter) extra="$extra -r all" ;; esac
        f="$out/perf-check-$tag.txt"
        echo "== ${b}_perf $mode --mem device -b 8 -e 1M -f 64 $extra -c 1 -n 2 -w 1" >> "$f"
        timeout 60 $perf ${b}_perf $mode --mem device -b 8 -e 1M -f 64 $extra -c 1 -n 2 -w 1 -T 30 >> "$f" 2>&1
        rc=$?
        line="perf-check $tag $b: rc=$rc $(grep -h 'Out of bounds' "$f" | tail -1)"
        echo "$line" | tee -a "$summary"
        [ $rc = 0 ] || status=1
      done
    done
    unset OXCCL_DEVICE_ENGINE
    # Speed, ranks as threads: all-reduce float and bfloat16 from 8 B to 1 GiB, CUDA-event-free
    # nccl-tests timing (host clock around -n calls, then a stream sync).
    for t in float bfloat16; do
      timeout 240 $perf all_reduce_perf -t 4 --mem device -b 8 -e 1G -f 4 -d $t -n 50 -w 5 -c 1 \
        -J "$out/perf-allreduce-t4-$t.json" > "$out/perf-allreduce-t4-$t.txt" 2>&1 || status=1
      grep -v "^# \[" "$out/perf-allreduce-t4-$t.txt" | tail -24
    done
  fi
  lib="$PWD/gpu-bin/libnccl.so.2"
  if [ "${SKIP_TORCH:-0}" != 1 ]; then
    # The loader's word on who serves PyTorch's NCCL symbols: bind everything at load, log the
    # bindings, and list each nccl* symbol libtorch_cuda.so binds with the library it got.
    LD_PRELOAD="$lib" LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/ld python3 -c 'import torch' || status=1
    cat /tmp/ld.* | grep "libtorch_cuda.so" | grep -o "to [^ ]* \[[0-9]*\]: normal symbol \`p\?nccl[A-Za-z]*'" \
      | sed "s/ \[[0-9]*\]: normal symbol / /" | sort -u > "$out/bindings.txt"
    if grep -v "$lib" "$out/bindings.txt" | grep -q .; then
      echo "SOME NCCL SYMBOLS BOUND ELSEWHERE"; status=1
    fi
    echo "loader: $(wc -l < "$out/bindings.txt") nccl symbols of libtorch_cuda.so bound, $(grep -vc "$lib" "$out/bindings.txt") elsewhere" | tee -a "$summary"
    rm -f /tmp/ld.*
    # PyTorch, unchanged, over oxccl: 4 processes on the one GPU (the CUDA IPC engine).
    PYTHONUNBUFFERED=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_PRELOAD="$lib" \
      timeout 400 python3 bench/gpu/torch_check.py 4 > "$out/torch.txt" 2>&1 || status=1
    grep -v " NCCL INFO " "$out/torch.txt" | grep -E "FAIL|failures|Error|error" | tail -12
    echo "torch: $(grep -h 'processes on ' "$out/torch.txt" | tail -1); INFO lines from oxccl: $(grep -c 'NCCL INFO' "$out/torch.txt")" | tee -a "$summary"
    for mode in ipc staged-async staged-blocking; do
      ipc=0 asyncs=1
      [ "$mode" = ipc ] && ipc=1
      [ "$mode" = staged-blocking ] && asyncs=0
      PYTHONUNBUFFERED=1 OXCCL_CUDA_IPC=$ipc OXCCL_ASYNC_STREAMS=$asyncs LD_PRELOAD="$lib" \
        timeout 200 python3 bench/gpu/torch_check.py 4 --timing > "$out/timing-$mode.txt" 2>&1 || status=1
      grep -h "^timing" "$out/timing-$mode.txt" | sed "s/^/torch $mode: /" | tee -a "$summary"
    done
    # The whole check again, staged (as across hosts): asynchronous, the default.
    PYTHONUNBUFFERED=1 OXCCL_CUDA_IPC=0 LD_PRELOAD="$lib" \
      timeout 200 python3 bench/gpu/torch_check.py 4 > "$out/torch-staged.txt" 2>&1 || status=1
    echo "torch staged-async: $(grep -h 'processes on ' "$out/torch-staged.txt" | tail -1)" | tee -a "$summary"
    # Two hosts as oxccl sees them (OXCCL_HOST_ID per pair of ranks): TCP between them, and
    # device buffers staged, as across real hosts.
    PYTHONUNBUFFERED=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_PRELOAD="$lib" \
      timeout 200 python3 bench/gpu/torch_check.py 4 --two-hosts > "$out/torch-two-hosts.txt" 2>&1 || status=1
    echo "torch two-hosts: $(grep -h 'processes on ' "$out/torch-two-hosts.txt" | tail -1); $(grep -h 'NCCL INFO' "$out/torch-two-hosts.txt" | grep -c 'via NET/Socket') INFO lines show a connection between the hosts (NET/Socket)" | tee -a "$summary"
  fi
  echo "== summary (status $status)"
  cat "$summary"
  # What comes back is at most 8 files: the summary, the kernel check, and everything in one
  # archive.
  cp "$summary" "$final/summary.txt"
  [ -f "$out/gpucheck.txt" ] && cp "$out/gpucheck.txt" "$final/gpucheck.txt"
  tar czf "$final/logs.tgz" -C "$out" .
  exit $status
  ;;
*)
  echo "usage: bash bench/gpu/check.sh build|device" >&2
  exit 2
  ;;
esac
