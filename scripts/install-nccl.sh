#!/usr/bin/env bash
# Builds oxccl's libnccl.so.2 and installs it with its nccl.h:
#   PREFIX/lib/libnccl.so.2, PREFIX/lib/libnccl.so -> libnccl.so.2, PREFIX/include/nccl.h
# Usage: scripts/install-nccl.sh [PREFIX]   (default: ./dist)
# Then: cc -I PREFIX/include prog.c -L PREFIX/lib -lnccl, and run with
# LD_LIBRARY_PATH=PREFIX/lib (or LD_PRELOAD=PREFIX/lib/libnccl.so.2 for a program built
# against another NCCL).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-dist}"
cargo build --release -p oxccl-capi
mkdir -p "$prefix/lib" "$prefix/include"
install -m 0755 target/release/libnccl.so "$prefix/lib/libnccl.so.2"
ln -sf libnccl.so.2 "$prefix/lib/libnccl.so"
install -m 0644 crates/oxccl-capi/include/nccl.h "$prefix/include/nccl.h"
echo "installed $prefix/lib/libnccl.so.2 (soname $(readelf -d "$prefix/lib/libnccl.so.2" | sed -n 's/.*soname: \[\(.*\)\]/\1/p')) and $prefix/include/nccl.h"
