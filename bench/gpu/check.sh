#!/usr/bin/env bash
# The GPU check, in two halves:
#   bash bench/gpu/check.sh build    here: builds the GPU programs and puts stripped copies in
#                                    gpu-bin/ (git-ignored), the folder that travels to the device;
#   bash bench/gpu/check.sh device   on the device machine (the `device` tool's run, with
#                                    carry ["gpu-bin"]): runs the whole check there, writing each
#                                    program's output under $OUT (or /tmp/gpu-out).
# The device machine has no Rust toolchain, so nothing is built there.
set -uo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
build)
  set -e
  cargo build --release -p oxccl-perf --bin oxccl-gpucheck
  cargo build --release -p oxccl-capi
  rm -rf gpu-bin && mkdir -p gpu-bin
  cp target/release/oxccl-gpucheck gpu-bin/
  cp target/release/libnccl.so gpu-bin/libnccl.so.2
  strip gpu-bin/* 2>/dev/null || true
  ls -la gpu-bin
  ;;
device)
  out="${OUT:-/tmp/gpu-out}"
  mkdir -p "$out"
  export NCCL_NVLS_ENABLE=0
  # NVRTC: the CUDA toolkit's, else the one PyTorch's wheels bring.
  if [ -z "${OXCCL_NVRTC:-}" ]; then
    for f in /usr/local/cuda/lib64/libnvrtc.so.13 /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13; do
      [ -e "$f" ] && export OXCCL_NVRTC="$f" && break
    done
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv | tee "$out/gpu.txt"
  status=0
  if [ "${SKIP_GPUCHECK:-0}" != 1 ]; then
    timeout 300 ./gpu-bin/oxccl-gpucheck 2>&1 | tee "$out/gpucheck.txt" || status=1
  fi
  lib="$PWD/gpu-bin/libnccl.so.2"
  # The loader's word on who serves PyTorch's NCCL symbols: bind everything at load, log the
  # bindings, and list each nccl* symbol libtorch_cuda.so binds with the library it got.
  LD_PRELOAD="$lib" LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/ld python3 -c 'import torch' || status=1
  cat /tmp/ld.* | grep "libtorch_cuda.so" | grep -o "to [^ ]* \[[0-9]*\]: normal symbol \`p\?nccl[A-Za-z]*'" \
    | sed "s/ \[[0-9]*\]: normal symbol / /" | sort -u | tee "$out/bindings.txt"
  if grep -v "$lib" "$out/bindings.txt" | grep -q .; then
    echo "SOME NCCL SYMBOLS BOUND ELSEWHERE"; status=1
  fi
  echo "$(wc -l < "$out/bindings.txt") nccl symbols of libtorch_cuda.so bound, all to $lib unless said above"
  rm -f /tmp/ld.*
  # PyTorch, unchanged, over oxccl: 4 processes on the one GPU.
  PYTHONUNBUFFERED=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_PRELOAD="$lib" \
    timeout 400 python3 bench/gpu/torch_check.py 4 > "$out/torch.txt" 2>&1 || status=1
  grep -v " NCCL INFO " "$out/torch.txt" | tail -40
  # Timing, side by side in one run: all-reduce by CUDA IPC (the default for a single call on
  # one host), then staged through host mirrors (OXCCL_CUDA_IPC=0), blocking and asynchronous.
  for mode in ipc staged-blocking staged-async; do
    ipc=0; a=0
    [ "$mode" = ipc ] && ipc=1
    [ "$mode" = staged-async ] && a=1
    echo "== torch timing, $mode (OXCCL_CUDA_IPC=$ipc OXCCL_ASYNC_STREAMS=$a)"
    PYTHONUNBUFFERED=1 OXCCL_CUDA_IPC=$ipc OXCCL_ASYNC_STREAMS=$a LD_PRELOAD="$lib" \
      timeout 200 python3 bench/gpu/torch_check.py 4 --timing 2>&1 | tee "$out/timing-$mode.txt" \
      | grep -E "timing|failures|FAIL" || status=1
  done
  if [ "${ASYNC_CHECK:-0}" = 1 ]; then
    echo "== torch correctness, OXCCL_ASYNC_STREAMS=1"
    PYTHONUNBUFFERED=1 OXCCL_ASYNC_STREAMS=1 LD_PRELOAD="$lib" \
      timeout 200 python3 bench/gpu/torch_check.py 4 > "$out/torch-async.txt" 2>&1 || status=1
    grep -E "failures|FAIL|SeqNum" "$out/torch-async.txt" | head -8
  fi
  echo "INFO lines from oxccl: $(grep -c "NCCL INFO" "$out/torch.txt"); first ones:"
  grep "NCCL INFO" "$out/torch.txt" | head -5
  exit $status
  ;;
*)
  echo "usage: bash bench/gpu/check.sh build|device" >&2
  exit 2
  ;;
esac
