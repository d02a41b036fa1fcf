# Sourced by bench/gpu/check.sh and nccl_tests.sh on the device machine: NVLink multicast off,
# the kernel cache that travels in gpu-bin/, and NVRTC (the CUDA toolkit's, else the one
# PyTorch's wheels bring).
export NCCL_NVLS_ENABLE=0
[ -d gpu-bin/kcache ] && export OXCCL_KERNEL_CACHE="$PWD/gpu-bin/kcache"
if [ -z "${OXCCL_NVRTC:-}" ]; then
  for f in /usr/local/cuda/lib64/libnvrtc.so.13 /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13; do
    [ -e "$f" ] && export OXCCL_NVRTC="$f" && break
  done
fi
