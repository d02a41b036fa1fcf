#!/usr/bin/env bash
# What a command (the test suite) left behind: the entries that appeared, while it ran, where
# tests must not leave anything.
#
#   scripts/leftovers.sh snapshot FILE   record what is there now in FILE
#   scripts/leftovers.sh compare FILE    name every entry that is there now and was not then;
#                                        exit 1 if there is any
#   scripts/leftovers.sh run CMD...      snapshot, run CMD, compare; CMD's exit code if it
#                                        failed, else the comparison's
#
# The places: the temporary directory ($TMPDIR, else /tmp) and /tmp, two levels deep (a new
# file inside a directory that was there is named too); /dev/shm (shared-memory segments);
# /run/netns (network namespaces); oxccl's cache (${XDG_CACHE_HOME:-$HOME/.cache}/oxccl), all
# of it; the files of this repository's work tree that git neither tracks nor ignores.
#
# Only what is new counts, so a snapshot taken just before the command isolates it, as long
# as nothing else writes there meanwhile (CI runs nothing else). On a shared machine, set
# LEFTOVERS_IGNORE to an extended regular expression of paths that are other programs'.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"

places() {
  local tmp="${TMPDIR:-/tmp}"
  tmp="${tmp%/}"
  printf '2 %s\n' "${tmp:-/}"
  [ "$(realpath -m "${tmp:-/}")" = /tmp ] || printf '2 %s\n' /tmp
  printf '1 %s\n' /dev/shm /run/netns
  printf 'all %s\n' "${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/oxccl"
}

# Every entry of every place (the place itself too, so that one made by the command counts),
# one path a line, sorted.
listing() {
  places | while read -r depth dir; do
    [ -e "$dir" ] || continue
    if [ "$depth" = all ]; then
      find "$dir" 2>/dev/null || true
    else
      find "$dir" -maxdepth "$depth" 2>/dev/null || true
    fi
  done
  if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$root" ls-files --others --exclude-standard | sed "s|^|$root/|"
  fi
}

# Sorted paths on stdin → the ones not under another one of them (a new directory is named,
# not everything in it).
topmost() {
  awk '{
    a = $0
    while ((i = match(a, /\/[^\/]*$/)) > 1) {
      a = substr(a, 1, i - 1)
      if (a in named) next
    }
    named[$0] = 1
    print
  }'
}

describe() {
  local p="$1"
  if [ -d "$p" ]; then
    echo "  $p/ (a directory of $(find "$p" 2>/dev/null | wc -l | tr -d ' ') entries)"
  elif [ -e "$p" ]; then
    echo "  $p ($(stat -c '%s bytes, modified %y' "$p" 2>/dev/null | cut -d. -f1))"
  else
    echo "  $p (gone again)"
  fi
}

snapshot() {
  local file="$1"
  # The file itself first, so that it is in the listing and never counts as new.
  : > "$file"
  listing | LC_ALL=C sort -u > "$file.tmp"
  mv "$file.tmp" "$file"
  echo "leftovers: snapshot of $(wc -l < "$file" | tr -d ' ') entries in $file"
}

compare() {
  local file="$1" new
  [ -f "$file" ] || { echo "leftovers: no snapshot $file (run: $0 snapshot $file)" >&2; return 2; }
  new="$(LC_ALL=C comm -13 "$file" <(listing | LC_ALL=C sort -u) \
    | { if [ -n "${LEFTOVERS_IGNORE:-}" ]; then grep -Ev -- "$LEFTOVERS_IGNORE" || true; else cat; fi; } \
    | topmost)"
  local where
  where="$(places | cut -d' ' -f2- | tr '\n' ' ')and the work tree's untracked files"
  if [ -z "$new" ]; then
    echo "leftovers: nothing new in $where"
    return 0
  fi
  local n
  n="$(printf '%s\n' "$new" | wc -l | tr -d ' ')"
  echo "leftovers: $n new $([ "$n" = 1 ] && echo entry || echo entries) since the snapshot (in $where):" >&2
  printf '%s\n' "$new" | while read -r p; do describe "$p"; done >&2
  return 1
}

case "${1:-}" in
  snapshot) [ $# -eq 2 ] || { echo "usage: $0 snapshot FILE" >&2; exit 2; }; snapshot "$2" ;;
  compare) [ $# -eq 2 ] || { echo "usage: $0 compare FILE" >&2; exit 2; }; compare "$2" ;;
  run)
    shift
    [ "${1:-}" = -- ] && shift
    [ $# -ge 1 ] || { echo "usage: $0 run CMD..." >&2; exit 2; }
    snap="$(mktemp "${TMPDIR:-/tmp}/oxccl-leftovers.XXXXXX")"
    snapshot "$snap" >/dev/null
    rc=0
    "$@" || rc=$?
    check=0
    compare "$snap" || check=$?
    rm -f "$snap"
    if [ "$rc" -ne 0 ]; then exit "$rc"; fi
    exit "$check"
    ;;
  *)
    echo "usage: $0 snapshot FILE | compare FILE | run CMD..." >&2
    exit 2
    ;;
esac
