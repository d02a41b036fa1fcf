#!/usr/bin/env bash
# The call-path guard: builds oxccl-perf at two commits and runs them alternately, all_reduce
# at 8 B (time) and 128 KiB (busbw), 2 and 4 ranks, heap buffers (-R 0) and registered ones
# (-R 1), then prints each side's median, HEAD / BASE of the medians and the median of the
# rounds' HEAD / BASE.
#
#   bash bench/latency.sh BASE [HEAD]     (HEAD: default the checked-out commit)
#
# Environment: ROUNDS (default 5: alternating BASE, HEAD, BASE, ...), ITERS (20000 calls at
# 8 B; 2000 at 128 KiB). Builds are kept per commit in bench/.latency/ (not committed), so a
# second run against the same BASE builds only what changed. Run it on an otherwise idle
# machine; ratios of medians from one run are the numbers to quote, with this command.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  usage
  exit 0
fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  usage >&2
  exit 2
fi
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-20000}
resolve() {
  git rev-parse --verify --quiet "$1^{commit}" || { echo "latency.sh: '$1' is not a commit of this repository" >&2; exit 2; }
}
BASE=$(resolve "$1")
HEAD=$(resolve "${2:-HEAD}")
CACHE=$ROOT/bench/.latency
mkdir -p "$CACHE"

# One worktree and target folder per commit.
build() {
  local sha=$1 dir=$CACHE/$1
  if [ ! -d "$dir/src" ]; then
    git worktree add --detach -f "$dir/src" "$sha" >/dev/null
  fi
  echo "== building oxccl-perf at ${sha:0:12}" >&2
  (cd "$dir/src" && CARGO_TARGET_DIR=$dir/target cargo build --release -q -p oxccl-perf)
  echo "$dir/target/release/oxccl-perf"
}
BIN_BASE=$(build "$BASE")
BIN_HEAD=$(build "$HEAD")

# name, ranks, bytes, registered, iterations, column (6: out-of-place time µs; 8: busbw GB/s)
CASES=(
  "8B_P2_heap 2 8 0 $ITERS 6"
  "8B_P2_reg 2 8 1 $ITERS 6"
  "8B_P4_heap 4 8 0 $ITERS 6"
  "8B_P4_reg 4 8 1 $ITERS 6"
  "128K_P2_heap 2 128K 0 $((ITERS / 10)) 8"
  "128K_P2_reg 2 128K 1 $((ITERS / 10)) 8"
  "128K_P4_heap 4 128K 0 $((ITERS / 10)) 8"
  "128K_P4_reg 4 128K 1 $((ITERS / 10)) 8"
)
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  for c in "${CASES[@]}"; do
    read -r name np size reg iters col <<<"$c"
    for side in base head; do
      bin=$BIN_BASE
      [ "$side" = head ] && bin=$BIN_HEAD
      v=$("$bin" all_reduce_perf -np "$np" -b "$size" -e "$size" -R "$reg" -n "$iters" -w $((iters / 10)) 2>&1 \
        | awk -v col="$col" '$1 ~ /^[0-9]+$/ {print $col; exit}')
      if [ -z "$v" ]; then
        echo "latency.sh: $side ($bin) printed no result for $name" >&2
        exit 1
      fi
      echo "$name $side $v" >>"$OUT"
    done
  done
  echo "== round $r of $ROUNDS done" >&2
done

python3 - "$OUT" "$BASE" "$HEAD" "$ROUNDS" <<'EOF'
import statistics, sys
path, base, head, rounds = sys.argv[1:]
vals = {}
for line in open(path):
    name, side, v = line.split()
    vals.setdefault(name, {}).setdefault(side, []).append(float(v))
print(f"# bash bench/latency.sh {base[:12]} {head[:12]}  ({rounds} alternating rounds; medians)")
# head/base of the medians, and the median of each round's head/base (the two sides of a round
# ran back to back, so that ratio is the one a slow phase of the machine disturbs least).
print(f"{'case':14s} {'unit':6s} {'base':>9s} {'head':>9s} {'head/base':>10s} {'per-round':>10s}   runs (base | head)")
for name, d in vals.items():
    unit = "us" if name.startswith("8B") else "GB/s"
    b, h = statistics.median(d["base"]), statistics.median(d["head"])
    pr = statistics.median(y / x for x, y in zip(d["base"], d["head"]))
    note = "(lower is better)" if unit == "us" else "(higher is better)"
    runs = " ".join(f"{x:g}" for x in d["base"]) + " | " + " ".join(f"{x:g}" for x in d["head"])
    print(f"{name:14s} {unit:6s} {b:9.3f} {h:9.3f} {h / b:10.3f} {pr:10.3f}   {runs} {note}")
EOF
