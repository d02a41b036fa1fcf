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
# 8 B all_reduce: oxccl-perf's time and torch.distributed's (backend "oxccl"), alternating.
for p in 2 4; do
  : > "$out/raw/latency-P$p.txt"
  for r in 1 2 3; do
    target/release/oxccl-perf all_reduce_perf -np "$p" -b 8 -e 8 -n 20000 -w 500 2>&1 \
      | awk '$1 == 8 {print "perf_8B_us", $6}' >> "$out/raw/latency-P$p.txt"
    "$py" -m torch.distributed.run --standalone --nproc-per-node "$p" bench/torch/latency.py 2>&1 \
      | grep '^torch_8B_us' >> "$out/raw/latency-P$p.txt"
  done
  cat "$out/raw/latency-P$p.txt"
done
for p in 2 4; do
  "$py" -m torch.distributed.run --standalone --nproc-per-node "$p" bench/torch/bench.py \
    --out "$out/raw" --rounds "$rounds" 2>&1 | grep -v '^W[0-9]* \|^\*\*\*\*\|OMP_NUM_THREADS' | tee "$out/raw/log-P$p.txt"
done
"$py" bench/torch/render.py "$out" --oxccl-perf target/release/oxccl-perf \
  --command "bash bench/torch/run.sh $rounds"
