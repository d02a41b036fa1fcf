#!/usr/bin/env bash
# The tuner against every forced algorithm, side by side: oxccl-perf all_reduce_perf with the
# tuner's choices (nothing set) and with NCCL_ALGO=Ring, Tree (3+ ranks) and Direct, sizes
# 8 B .. 256 MiB, P = 2 and 4, configurations interleaved round by round; per size the best
# out-of-place time over the rounds. Writes bench/results/tuner.md (the table: the tuner's
# time, each forced one, and the tuner's time over the best forced time).
#
# Sizes up to 1 MiB run SMALL_ITERS iterations (a few µs each: 10 would be noise), larger
# ones ITERS.
#
#   bash bench/tuner.sh [ROUNDS]     (default 3; ITERS=8, SMALL_ITERS=300, MAX=256M, NPS="2 4")
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
ITERS=${ITERS:-8}
SMALL_ITERS=${SMALL_ITERS:-300}
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
      run() {
        if [ "$algo" = default ]; then env -u NCCL_ALGO "$BIN" all_reduce_perf -np "$np" -f 2 "$@"
        else NCCL_ALGO=$algo "$BIN" all_reduce_perf -np "$np" -f 2 "$@"; fi
      }
      { run -b 8 -e 1M -n "$SMALL_ITERS" -w 20; run -b 2M -e "$MAX" -n "$ITERS" -w 1; } > "$out" 2>&1
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
       "command: `bash bench/tuner.sh` (oxccl-perf all_reduce_perf -np P -f 2, 8 B..1 MiB × 300 iterations and 2 MiB..256 MiB × 8, configurations interleaved round by round; the tuner's choice here is Direct at every size, so its column and Direct's measure the same path twice: their spread is this machine's noise)", ""]
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
