#!/usr/bin/env python3
"""Turns bench/cluster/run.sh's raw JSON (RAW/round*/LIB-COLL.json, RAW/round*/pingpong.json)
into the cluster table (OUT/summary-SHAPE.md), median JSON files and SVG plots drawn by
oxccl-perf --plot (OUT/COLL-SHAPE.svg).

    python3 bench/cluster/analyze.py RAW OUT OXCCL_PERF --shape 2x2-r1 --rate 1gbit --command CMD

Medians per (library, collective, size) over the rounds. The bound of a collective is what the
hosts' links allow a plan that sends each byte across a host's links once (hierarchical):
all-reduce: link × (2(N−1)/N) / (2(H−1)/H); all-gather, reduce-scatter: link × ((N−1)/N) /
((H−1)/H); broadcast: link; all-to-all: link × ((N−1)/N) / (K(H−1)/H), with link the rails'
total rate in GB/s (R × rate / 8), N ranks, H hosts, K ranks per host."""
import argparse
import glob
import json
import math
import os
import re
import statistics
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("raw")
ap.add_argument("out")
ap.add_argument("oxperf")
ap.add_argument("--shape", required=True, help="HxK-rR")
ap.add_argument("--rate", required=True, help="tc rate of each link")
ap.add_argument("--command", default="")
a = ap.parse_args()

m = re.fullmatch(r"(\d+)x(\d+)-r(\d+)", a.shape)
H, K, R = (int(x) for x in m.groups())
N = H * K


def rate_gbytes(rate):
    mt = re.fullmatch(r"([\d.]+)([a-z]*)", rate.strip().lower())
    v, u = float(mt.group(1)), mt.group(2)
    mult = {"bit": 1, "": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}[u]
    return v * mult / 8e9


LINK = R * rate_gbytes(a.rate)


def bound(coll):
    if H < 2:
        return float("nan")
    f = (H - 1) / H
    return {
        "all_reduce": LINK * (2 * (N - 1) / N) / (2 * f),
        "all_gather": LINK * ((N - 1) / N) / f,
        "reduce_scatter": LINK * ((N - 1) / N) / f,
        "broadcast": LINK,
        "alltoall": LINK * ((N - 1) / N) / (K * f),
    }[coll]


LIBS = ["oxccl", "oxccl-ring", "openmpi", "gloo"]
NAMES = {"oxccl": "oxccl", "oxccl-ring": "oxccl flat (NCCL_ALGO=ring)", "openmpi": "Open MPI (TCP)", "gloo": "Gloo (torch)"}
runs, rtts = {}, []
for rd in sorted(glob.glob(os.path.join(a.raw, "round*"))):
    try:
        rtts.append(json.load(open(os.path.join(rd, "pingpong.json")))["rtt_us_median"])
    except (OSError, ValueError, KeyError):
        pass
    for f in glob.glob(os.path.join(rd, "*.json")):
        mt = re.fullmatch(r"(.+)-(all_reduce|broadcast|all_gather|reduce_scatter|alltoall)\.json", os.path.basename(f))
        if not mt:
            continue
        try:
            j = json.load(open(f))
        except ValueError:
            continue
        for r in j.get("results", []):
            oop = r.get("out_of_place") or {}
            if r.get("size") is None or oop.get("bus_bw") is None:
                continue
            runs.setdefault((mt.group(1), mt.group(2)), {}).setdefault(int(r["size"]), []).append((float(oop["bus_bw"]), float(oop["time"])))
med = {k: {s: (statistics.median(b for b, _ in v), statistics.median(t for _, t in v)) for s, v in d.items()} for k, d in runs.items()}
RTT = statistics.median(rtts) if rtts else float("nan")


def size_str(s):
    for u, n in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if s >= n and s % n == 0:
            return f"{s // n} {u}iB"
    return f"{s} B"


def time_str(us):
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


lines = []
say = lines.append
say(f"# oxccl and its peers across an emulated cluster: {H} hosts × {K} ranks, {R} rail(s) of {a.rate}")
say("")
if a.command:
    say(f"Made by `{a.command}` (then `bench/cluster/analyze.py`). Medians over {max(len(rtts), 1)} round(s) of one run, "
        "every library in turn in the same cluster of network namespaces (oxccl-cluster), float32 sum, out of place, "
        "heap buffers (oxccl-perf `-R 0`); busbw in GB/s (nccl-tests' convention).")
say("")
try:
    say("```\n" + open(os.path.join(a.raw, "machine.txt")).read().strip() + "\n```")
except OSError:
    pass
say("")
say(f"8-byte TCP round trip between host 0 and host 1, same run: {RTT:.1f} µs (median of the rounds' medians); "
    f"the small-message target 2·⌈log2 H⌉ × that = {2 * max(1, math.ceil(math.log2(H))) * RTT:.1f} µs.")
say("")
verdicts = []
colls = sorted({c for _, c in med}, key=lambda c: ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall"].index(c))
for coll in colls:
    b = bound(coll)
    libs = [lib for lib in LIBS if (lib, coll) in med] + sorted(lib for lib, c in med if c == coll and lib not in LIBS)
    say(f"## {coll}, {H} hosts × {K} ranks, bound {b:.4f} GB/s")
    say("")
    say("| size | " + " | ".join(f"{NAMES.get(x, x)}: time, busbw, % of bound" for x in libs) + " | oxccl ÷ best peer (busbw) |")
    say("|---|" + "---|" * (len(libs) + 1))
    sizes = sorted({s for x in libs for s in med[(x, coll)]})
    for s in sizes:
        cells = []
        for x in libs:
            v = med[(x, coll)].get(s)
            cells.append(f"{time_str(v[1])}, {v[0]:.3f}, {100 * v[0] / b:.0f}%" if v else "–")
        ox = med.get(("oxccl", coll), {}).get(s)
        peers = [med[(x, coll)][s] for x in ("openmpi", "gloo") if s in med.get((x, coll), {})]
        best = max((p[0] for p in peers), default=0)
        ratio = f"{ox[0] / best:.2f}" if ox and best > 0 else "–"
        say(f"| {size_str(s)} | " + " | ".join(cells) + f" | {ratio} |")
    say("")
    ox = med.get(("oxccl", coll), {})
    if coll == "all_reduce" and ox:
        big = [(s, v[0] / b) for s, v in ox.items() if s >= 4 << 20]
        if big:
            verdicts.append(f"- {'MET' if all(f >= 0.9 for _, f in big) else 'MISSED'}: all-reduce busbw ≥ 90% of the bound at ≥ 4 MiB: "
                            + ", ".join(f"{size_str(s)} {100 * f:.0f}%" for s, f in sorted(big)))
        for peer, want in (("gloo", 1.5), ("openmpi", 1.2)):
            pm = med.get((peer, coll), {})
            mid = [(s, ox[s][0] / pm[s][0]) for s in sorted(ox) if (64 << 10) <= s <= (2 << 20) and s in pm and pm[s][0] > 0]
            if mid:
                verdicts.append(f"- {'MET' if all(r >= want for _, r in mid) else 'MISSED'}: all-reduce busbw ≥ {want}× {NAMES[peer]} at 64 KiB–2 MiB: "
                                + ", ".join(f"{size_str(s)} {r:.2f}×" for s, r in mid))
        if 8 in ox and rtts:
            lim = 2 * max(1, math.ceil(math.log2(H))) * RTT
            verdicts.append(f"- {'MET' if ox[8][1] <= lim else 'MISSED'}: all-reduce 8 B time ≤ 2·⌈log2 H⌉ × RTT = {lim:.1f} µs: {ox[8][1]:.1f} µs")
    if coll in ("all_gather", "reduce_scatter") and ox:
        pm = med.get(("openmpi", coll), {})
        big = [(s, ox[s][0] / pm[s][0]) for s in sorted(ox) if s >= 1 << 20 and s in pm and pm[s][0] > 0]
        if big:
            verdicts.append(f"- {'MET' if all(r >= 1.2 for _, r in big) else 'MISSED'}: {coll} busbw ≥ 1.2× Open MPI at ≥ 1 MiB: "
                            + ", ".join(f"{size_str(s)} {r:.2f}×" for s, r in big))
say("## Targets of this shape")
say("")
lines.extend(verdicts or ["- nothing to judge (no oxccl results)"])
say("")
os.makedirs(a.out, exist_ok=True)
summary = os.path.join(a.out, f"summary-{a.shape}.md")
open(summary, "w").write("\n".join(lines) + "\n")
print("\n".join(verdicts))

mdir = os.path.join(a.out, "median", a.shape)
os.makedirs(mdir, exist_ok=True)
for f in glob.glob(os.path.join(mdir, "*.json")):
    os.unlink(f)
for (lib, coll), d in med.items():
    res = [{"size": s, "type": "float", "redop": "sum", "root": 0, "out_of_place": {"time": t, "bus_bw": bw}} for s, (bw, t) in sorted(d.items())]
    json.dump({"label": NAMES.get(lib, lib), "results": res}, open(os.path.join(mdir, f"{lib}-{coll}.json"), "w"))
for coll in colls:
    files = [os.path.join(mdir, f"{lib}-{coll}.json") for lib in LIBS if (lib, coll) in med]
    title = (f"{coll}, {H} hosts x {K} ranks, {R} rail(s) of {a.rate} (emulated: network namespaces, tc tbf), "
             f"float32 sum, heap buffers; hierarchical bound {bound(coll):.3f} GB/s")
    subprocess.run([a.oxperf, "--plot", os.path.join(a.out, f"{coll}-{a.shape}.svg"), "--title", title] + files,
                   check=False, stdout=subprocess.DEVNULL)
