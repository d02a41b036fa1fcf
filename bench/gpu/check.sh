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
  rm -rf gpu-bin && mkdir -p gpu-bin
  cp target/release/oxccl-gpucheck gpu-bin/
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
  ./gpu-bin/oxccl-gpucheck 2>&1 | tee "$out/gpucheck.txt" || status=1
  exit $status
  ;;
*)
  echo "usage: bash bench/gpu/check.sh build|device" >&2
  exit 2
  ;;
esac
