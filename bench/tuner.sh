#!/usr/bin/env bash
# The tuner against every forced algorithm, side by side: oxccl-perf all_reduce_perf with the
# tuner's choices (nothing set) and with NCCL_ALGO=Ring, Tree (3+ ranks) and Direct, sizes
# 8 B .. 256 MiB, P = 2 and 4, configurations interleaved round by round; per size the best
# out-of-place time over the rounds. Writes bench/results/tuner.md (the table: the tuner's
# time, each forced one, and the tuner's time over the best forced time).
#
#   bash bench/tuner.sh [ROUNDS]     (default 2; ITERS=10, MAX=256M, NPS="2 4")
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
ITERS=${ITERS:-10}
MAX=${MAX:-256M}
NPS=${NPS:-"2 4"}
RAW=bench/results/raw/tuner
mkdir -p "$RAW"
cargo build --release -q -p oxccl-perf
BIN=target/release/oxccl-perf
for r in $(seq 1 "$ROUNDS"); do
  for np in $NPS; do
    for algo in default ring tree direct; do
      if [ "$algo" = tree ] && [ "$np" -lt 3 ]; then continue; fi
      out=$RAW/np${np}_${algo}_r${r}.txt
      if [ "$algo" = default ]; then
        env -u NCCL_ALGO "$BIN" all_reduce_perf -np "$np" -b 8 -e "$MAX" -f 2 -n "$ITERS" -w 2 > "$out" 2>&1
      else
        NCCL_ALGO=$algo "$BIN" all_reduce_perf -np "$np" -b 8 -e "$MAX" -f 2 -n "$ITERS" -w 2 > "$out" 2>&1
      fi
      echo "round $r np $np $algo: $(grep -c '^ *[0-9]' "$out") sizes"
    done
  done
done
python3 - "$RAW" "$NPS" <<'PY'
import glob, os, sys, collections
raw, nps = sys.argv[1], sys.argv[2].split()
best = collections.defaultdict(dict)   # (np, size) -> algo -> best µs
wrong = 0
for f in glob.glob(os.path.join(raw, "np*_*_r*.txt")):
    name = os.path.basename(f)
    np_, algo = name.split("_")[0][2:], name.split("_")[1]
    for line in open(f):
        p = line.split()
        if len(p) >= 13 and p[0].isdigit():
            size, t = int(p[0]), float(p[5])
            wrong += int(p[8]) + int(p[12])
            d = best[(int(np_), size)]
            d[algo] = min(d.get(algo, float("inf")), t)
out = ["# Tuner vs forced NCCL_ALGO, all_reduce_perf, out-of-place µs (best of the rounds)", "",
       "command: `bash bench/tuner.sh` (oxccl-perf all_reduce_perf -np P -b 8 -e 256M -f 2, configurations interleaved)", ""]
worst = 0.0
for np_ in map(int, nps):
    algos = ["ring", "tree", "direct"] if np_ >= 3 else ["ring", "direct"]
    out += [f"## P = {np_}", "", "| bytes | tuner | " + " | ".join(algos) + " | best forced | tuner / best |",
            "|---:|---:|" + "---:|" * len(algos) + "---|---:|"]
    for size in sorted(s for (n, s) in best if n == np_):
        d = best[(np_, size)]
        if "default" not in d:
            continue
        forced = {a: d[a] for a in algos if a in d}
        b = min(forced, key=forced.get)
        ratio = d["default"] / forced[b]
        worst = max(worst, ratio)
        out.append(f"| {size} | {d['default']:.2f} | " + " | ".join(f"{d.get(a, float('nan')):.2f}" for a in algos)
                   + f" | {b} | {ratio:.3f} |")
    out.append("")
out.append(f"worst tuner / best forced ratio: {worst:.3f}; wrong results: {wrong}")
open("bench/results/tuner.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
