#!/usr/bin/env bash
# The tuner against every forced algorithm x protocol, side by side: oxccl-perf all_reduce_perf
# with the tuner's choices (nothing set) and with NCCL_ALGO / NCCL_PROTO forced to Ring, Tree
# (3+ ranks) and Direct x Simple, LL, LL128 (Direct does not use connection slots, so it has
# no protocol), sizes 8 B .. 256 MiB, P = 2 and 4, configurations interleaved round by round
# (the order rotates each round); per size the best out-of-place time over the rounds. Writes
# bench/results/tuner.md (the table: the tuner's time, each forced one, and the tuner's time
# over the best forced time).
#
# Sizes up to 1 MiB run SMALL_ITERS iterations (a few µs each: 10 would be noise), larger
# ones ITERS.
#
#   bash bench/tuner.sh [ROUNDS]     (0: only rebuild the table from RAW; default 3; ITERS=8, SMALL_ITERS=300, MAX=256M, NPS="2 4",
#                                    CONFIGS="default ring:Simple ...", RAW=..., OUT=...)
# A quieter A/B of the tuner against the best forced configuration only, e.g.:
#   CONFIGS="default direct:Simple" RAW=bench/results/raw/tuner-ab OUT=bench/results/tuner-ab.md \
#     ITERS=20 SMALL_ITERS=1000 bash bench/tuner.sh 6
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
ITERS=${ITERS:-8}
SMALL_ITERS=${SMALL_ITERS:-300}
MAX=${MAX:-256M}
NPS=${NPS:-"2 4"}
RAW=${RAW:-bench/results/raw/tuner}
OUT=${OUT:-bench/results/tuner.md}
mkdir -p "$RAW"
if [ "$ROUNDS" = 0 ]; then :; else
cargo build --release -q -p oxccl-perf
BIN=target/release/oxccl-perf
CONFIGS=${CONFIGS:-"default ring:Simple ring:LL ring:LL128 tree:Simple tree:LL tree:LL128 direct:Simple"}
for r in $(seq 1 "$ROUNDS"); do
  # Rotate the order each round, so no configuration always runs first.
  set -- $CONFIGS
  for _ in $(seq 2 "$r"); do set -- "${@:2}" "$1"; done
  for np in $NPS; do
    for cfg in "$@"; do
      algo=${cfg%%:*}; proto=${cfg#*:}
      if [ "$algo" = tree ] && [ "$np" -lt 3 ]; then continue; fi
      name=${cfg/:/-}
      out=$RAW/np${np}_${name}_r${r}.txt
      run() {
        if [ "$algo" = default ]; then env -u NCCL_ALGO -u NCCL_PROTO "$BIN" all_reduce_perf -np "$np" -f 2 "$@"
        else NCCL_ALGO=$algo NCCL_PROTO=$proto "$BIN" all_reduce_perf -np "$np" -f 2 "$@"; fi
      }
      { run -b 8 -e 1M -n "$SMALL_ITERS" -w 20; run -b 2M -e "$MAX" -n "$ITERS" -w 1; } > "$out" 2>&1
      echo "round $r np $np $cfg: $(grep -c '^ *[0-9]' "$out") sizes"
    done
  done
done
fi
python3 - "$RAW" "$NPS" "$OUT" <<'PY'
import glob, os, sys, collections
raw, nps, outfile = sys.argv[1], sys.argv[2].split(), sys.argv[3]
best = collections.defaultdict(dict)   # (np, size) -> algo -> best µs
allt = collections.defaultdict(lambda: collections.defaultdict(list))   # (np, size) -> algo -> every round's µs
wrong = 0
for f in glob.glob(os.path.join(raw, "np*_*_r*.txt")):
    name = os.path.basename(f)
    np_, algo = name.split("_")[0][2:], name.split("_")[1]
    if algo in ("ring", "tree", "direct"):
        continue   # an older run's file (algorithm only)
    for line in open(f):
        p = line.split()
        if len(p) >= 13 and p[0].isdigit():
            size, t = int(p[0]), float(p[5])
            wrong += int(p[8]) + int(p[12])
            d = best[(int(np_), size)]
            d[algo] = min(d.get(algo, float("inf")), t)
            allt[(int(np_), size)][algo].append(t)
def median(v):
    v = sorted(v)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2
out = ["# Tuner vs forced NCCL_ALGO × NCCL_PROTO, all_reduce_perf, out-of-place µs (best of the rounds; the last column compares medians over the rounds)", "",
       "command: `bash bench/tuner.sh` (oxccl-perf all_reduce_perf -np P -f 2, 8 B..1 MiB × SMALL_ITERS iterations and 2 MiB..256 MiB × ITERS, configurations interleaved round by round, order rotated each round; the tuner's choice here is Direct at every size, so its column and direct-Simple's measure the same path twice: their spread is this machine's noise)", ""]
worst = 0.0
worst_med = 0.0
for np_ in map(int, nps):
    algos = [a + "-" + p for a in (["ring", "tree"] if np_ >= 3 else ["ring"]) for p in ("Simple", "LL", "LL128")] + ["direct-Simple"]
    algos = [a for a in algos if any(a in best[k] for k in best if k[0] == np_)]
    out += [f"## P = {np_}", "", "| bytes | tuner | " + " | ".join(algos) + " | best forced | tuner / best | median tuner / median best forced |",
            "|---:|---:|" + "---:|" * len(algos) + "---|---:|---:|"]
    for size in sorted(s for (n, s) in best if n == np_):
        d = best[(np_, size)]
        if "default" not in d:
            continue
        forced = {a: d[a] for a in algos if a in d}
        b = min(forced, key=forced.get)
        ratio = d["default"] / forced[b]
        worst = max(worst, ratio)
        med = {a: median(allt[(np_, size)][a]) for a in list(forced) + ["default"]}
        bm = min(forced, key=lambda a: med[a])
        ratio_med = med["default"] / med[bm]
        worst_med = max(worst_med, ratio_med)
        out.append(f"| {size} | {d['default']:.2f} | " + " | ".join(f"{d.get(a, float('nan')):.2f}" for a in algos)
                   + f" | {b} | {ratio:.3f} | {ratio_med:.3f} |")
    out.append("")
out.append(f"worst tuner / best forced ratio: {worst:.3f} (best of rounds), {worst_med:.3f} (medians over rounds); wrong results: {wrong}")
open(outfile, "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
