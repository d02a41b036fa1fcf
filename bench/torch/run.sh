#!/usr/bin/env bash
# Gloo and oxccl side by side through torch.distributed on CPU tensors, 2 and 4 ranks, then
# the ratio table and plots: bench/results/torch/ (summary.md, *.svg, raw/*.json).
#   bash bench/torch/run.sh [ROUNDS]
# Needs a python with torch and the oxccl package (`pip install ./python`): OXCCL_PYTHON, else
# python3. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${OXCCL_PYTHON:-python3}"
rounds="${1:-3}"
out=bench/results/torch
mkdir -p "$out/raw"
cargo build --release -q -p oxccl-perf
for p in 2 4; do
  "$py" -m torch.distributed.run --standalone --nproc-per-node "$p" bench/torch/bench.py \
    --out "$out/raw" --rounds "$rounds" 2>&1 | grep -v '^W[0-9]* \|^\*\*\*\*\|OMP_NUM_THREADS' | tee "$out/raw/log-P$p.txt"
done
"$py" bench/torch/render.py "$out" --oxccl-perf target/release/oxccl-perf \
  --command "bash bench/torch/run.sh $rounds"
