#!/usr/bin/env bash
# NVIDIA's nccl-tests against NVIDIA's NCCL and against oxccl's libnccl.so.2: the same
# binaries, both libraries in one call (issue 9). In two halves:
#   bash bench/gpu/nccl_tests.sh prepare   here: puts nccl-tests' source (a stored snapshot of
#                                          github.com/NVIDIA/nccl-tests, fetched with the
#                                          `fetch` tool, never committed) in gpu-bin/, the
#                                          git-ignored folder that travels to the device;
#   bash bench/gpu/nccl_tests.sh device    on the device machine (carry ["gpu-bin"], after
#                                          `check.sh build`): builds the tests there with nvcc
#                                          against the nvidia-nccl-cu13 wheel's headers, then
#                                          runs each benchmark with NVIDIA's library and with
#                                          ours, and prints busbw side by side with the ratio.
# Settings: GPUS (default: every GPU nvidia-smi lists) ranks as threads of one process
# (-t GPUS -g 1: one GPU each; nccl-tests refuses more ranks than GPUs, so on one GPU both
# libraries run one rank: a dry run of the API, busbw 0); BENCHES; MAXBYTES (8G); ITERS (20);
# RUN_TIMEOUT (300 s per run); EXTRA (more flags for every run, e.g. "-G 10": CUDA graphs).
set -uo pipefail
cd "$(dirname "$0")/../.."
mirror=/work/.mirror/NVIDIA+nccl-tests/repo
case "${1:-}" in
prepare)
  set -e
  [ -d "$mirror" ] || { echo "no snapshot of NVIDIA/nccl-tests at $mirror: fetch github:NVIDIA/nccl-tests first"; exit 1; }
  rm -rf gpu-bin/nccl-tests-src && mkdir -p gpu-bin/nccl-tests-src
  git --git-dir="$mirror" archive HEAD 2>/dev/null | tar -x -C gpu-bin/nccl-tests-src \
    || git -C "$mirror" archive HEAD | tar -x -C gpu-bin/nccl-tests-src
  echo "nccl-tests $(git --git-dir="$mirror" log -1 --format=%h 2>/dev/null || git -C "$mirror" log -1 --format=%h) in gpu-bin/nccl-tests-src"
  ;;
device)
  final="${OUT:-/tmp/gpu-out}"
  out=/tmp/nccl-tests-logs
  rm -rf "$out" && mkdir -p "$out" "$final"
  . bench/gpu/device-env.sh
  # NVIDIA's NCCL: the wheel PyTorch uses (headers and library).
  nccl_home=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl 2>/dev/null | head -1)
  [ -n "$nccl_home" ] && [ -e "$nccl_home/include/nccl.h" ] || { echo "no nvidia-nccl wheel with headers found"; exit 1; }
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  src=gpu-bin/nccl-tests-src
  build=/tmp/nccl-tests-build
  benches=${BENCHES:-all_reduce all_gather reduce_scatter broadcast alltoall sendrecv}
  # The wheel ships libnccl.so.2 only: an NCCL_HOME whose lib/ also has the name the linker
  # looks for.
  home=/tmp/nccl-home
  rm -rf "$home" && mkdir -p "$home/lib"
  ln -s "$nccl_home/include" "$home/include"
  ln -s "$nccl_home/lib/libnccl.so.2" "$home/lib/libnccl.so.2"
  ln -s libnccl.so.2 "$home/lib/libnccl.so"
  t0=$(date +%s)
  make -C "$src/src" -j16 build BUILDDIR="$build" MPI=0 CUDA_HOME="$cuda_home" NCCL_HOME="$home" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BIN_FILES_LIST="$benches" \
    > "$out/build.txt" 2>&1 || { tail -30 "$out/build.txt"; cp "$out/build.txt" "$final/"; exit 1; }
  echo "nccl-tests built in $(( $(date +%s) - t0 )) s"
  gpus=${GPUS:-$(nvidia-smi -L | wc -l)}
  ours="$PWD/gpu-bin/libnccl.so.2"
  # The topology, as the driver reports it and as oxccl detects it.
  { echo "== nvidia-smi topo -m"; nvidia-smi topo -m; echo "== oxccl topo"; ./gpu-bin/oxccl topo; } \
    > "$out/topology.txt" 2>&1
  cat "$out/topology.txt"
  status=0
  for b in $benches; do
    bin="$build/${b}_perf"
    args="-b 8 -e ${MAXBYTES:-8G} -f 2 -g 1 -t $gpus -c 1 -n ${ITERS:-20} -w 5 ${EXTRA:-}"
    LD_LIBRARY_PATH="$nccl_home/lib:${LD_LIBRARY_PATH:-}" timeout "${RUN_TIMEOUT:-300}" "$bin" $args > "$out/$b-nvidia.txt" 2>&1 || status=1
    LD_PRELOAD="$ours" timeout "${RUN_TIMEOUT:-300}" "$bin" $args > "$out/$b-oxccl.txt" 2>&1 || status=1
    python3 - "$out/$b-nvidia.txt" "$out/$b-oxccl.txt" "$b" <<'EOF' | tee -a "$out/summary.txt"
import sys
def rows(path):
    out = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) >= 13 and f[0].isdigit():
            # size count type redop root | out-of-place time algbw busbw #wrong | in-place ...
            out[int(f[0])] = (float(f[5]), float(f[7]), f[8])
    return out
nv, ox = rows(sys.argv[1]), rows(sys.argv[2])
print(f"== {sys.argv[3]}, out of place: time (us) and busbw (GB/s), NVIDIA's NCCL vs oxccl, same binary;")
print("   speed = NVIDIA's time / oxccl's (above 1: oxccl faster)")
print(f"{'bytes':>12} {'t nvidia':>10} {'t oxccl':>10} {'bw nvidia':>10} {'bw oxccl':>10} {'speed':>6}  #wrong nvidia/oxccl")
for size in sorted(set(nv) | set(ox)):
    a, b = nv.get(size), ox.get(size)
    speed = f"{a[0] / b[0]:.2f}" if a and b and b[0] > 0 else "-"
    cell = lambda r, k: f"{r[k]:>10}" if r else f"{'-':>10}"
    print(f"{size:>12} {cell(a, 0)} {cell(b, 0)} {cell(a, 1)} {cell(b, 1)} {speed:>6}  {a[2] if a else '-'}/{b[2] if b else '-'}")
EOF
    echo "$b: oxccl $(grep -h 'Out of bounds' "$out/$b-oxccl.txt" | tail -1); nvidia $(grep -h 'Out of bounds' "$out/$b-nvidia.txt" | tail -1)" | tee -a "$out/summary.txt"
  done
  cp "$out/summary.txt" "$final/nccl-tests-summary.txt" 2>/dev/null
  tar czf "$final/nccl-tests-logs.tgz" -C "$out" . 2>/dev/null
  exit $status
  ;;
*)
  echo "usage: $0 prepare|device"
  exit 2
  ;;
esac
