"""Ratio tables and plots from bench/torch/bench.py's results (DIR/raw/*.json):
DIR/summary.md and DIR/<collective>_P<n>.svg (through `oxccl-perf --plot`)."""

import argparse
import glob
import json
import os
import subprocess

COLLS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")


def size_str(s):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if s >= 1 << shift and s % (1 << shift) == 0:
            return f"{s >> shift} {unit}"
    return f"{s} B"


def load(path):
    with open(path) as f:
        return {r["size"]: r["out_of_place"] for r in json.load(f)["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir")
    ap.add_argument("--oxccl-perf", default="target/release/oxccl-perf")
    ap.add_argument("--command", default="bash bench/torch/run.sh")
    a = ap.parse_args()
    raw = os.path.join(a.dir, "raw")
    lines = ["# torch.distributed on CPU tensors: Gloo and oxccl side by side", "",
             f"Made by `{a.command}` (bench/torch/bench.py under torchrun, one run per rank count: "
             "both backends in one process, every size timed alternately, median of the rounds).", "",
             "Ratio = oxccl's busbw / Gloo's busbw (= Gloo's time / oxccl's time). Sizes are the "
             "largest buffer of the call, as in nccl-tests.", ""]
    verdicts = []
    for p in (2, 4):
        for coll in COLLS:
            gf, of = (os.path.join(raw, f"{b}-{coll}-P{p}.json") for b in ("gloo", "oxccl"))
            if not (os.path.exists(gf) and os.path.exists(of)):
                continue
            g, o = load(gf), load(of)
            lines += [f"## {coll}, {p} ranks", "",
                      "| size | Gloo µs | Gloo busbw GB/s | oxccl µs | oxccl busbw GB/s | ratio |",
                      "|---:|---:|---:|---:|---:|---:|"]
            worst = None
            for s in sorted(set(g) & set(o)):
                r = g[s]["time"] / o[s]["time"]
                worst = (r, s) if worst is None or r < worst[0] else worst
                lines.append(f"| {size_str(s)} | {g[s]['time']:.1f} | {g[s]['bus_bw']:.3f} | "
                             f"{o[s]['time']:.1f} | {o[s]['bus_bw']:.3f} | {r:.1f}× |")
            lines.append("")
            need = 3 if coll == "all_reduce" else 2
            verdicts.append(f"- {'PASS' if worst[0] >= need else 'FAIL'}: {coll}, {p} ranks, ≥ {need}× Gloo at every size: "
                            f"worst {worst[0]:.1f}× at {size_str(worst[1])}")
            if os.path.exists(a.oxccl_perf):
                subprocess.run([a.oxccl_perf, "--plot", os.path.join(a.dir, f"{coll}_P{p}.svg"), gf, of],
                               check=False, stdout=subprocess.DEVNULL)
    for f in sorted(glob.glob(os.path.join(raw, "ddp-P*.json"))):
        d = json.load(open(f))
        p = f.rsplit("-P", 1)[1].split(".")[0].split("-")[0]
        st, cm = d["step_s"], d["comm_s"]
        view = d.get("bucket_view", False)
        how = "DDP with gradient_as_bucket_view=True (both backends)" if view else "DDP as constructed by default"
        lines += [f"## DDP training step, {p} ranks" + (", gradient_as_bucket_view" if view else ""), "",
                  f"MLP of {d['params'] / 1e6:.1f} M parameters, batch {d['batch']} per rank, SGD; {how}; median of "
                  f"{d['steps']} steps each, alternating. Communication = step time − the same step without DDP."
                  + (f" Made by `{d['command']}`." if "command" in d else ""), "",
                  "| | step ms | communication ms |", "|---|---:|---:|",
                  f"| no DDP | {st['local'] * 1e3:.1f} | |",
                  f"| DDP on Gloo | {st['gloo'] * 1e3:.1f} | {cm['gloo'] * 1e3:.1f} |",
                  f"| DDP on oxccl | {st['oxccl'] * 1e3:.1f} | {cm['oxccl'] * 1e3:.1f} |"]
        if "no_comm" in st:
            own = st["no_comm"] - st["local"]
            lines += [f"| DDP without communication (a comm hook returning the bucket) | {st['no_comm'] * 1e3:.1f} | "
                      f"{own * 1e3:.1f} |", "",
                      f"DDP's own work (filling the buckets, dividing, copying out) is {own * 1e3:.1f} ms of each "
                      f"backend's communication time; beyond it, oxccl {(cm['oxccl'] - own) * 1e3:.1f} ms and Gloo "
                      f"{(cm['gloo'] - own) * 1e3:.1f} ms. Even communication that took no time at all would leave "
                      f"oxccl at {own / cm['gloo']:.2f} of Gloo's communication time."]
        lines += [""]
        frac = cm["oxccl"] / cm["gloo"] if cm["gloo"] > 0 else float("inf")
        verdicts.append(f"- {'PASS' if frac <= 1 / 3 else 'FAIL'}: DDP communication, {p} ranks"
                        + (" (gradient_as_bucket_view)" if view else "") + ", ≤ 1/3 of Gloo's: "
                        f"{frac:.2f} ({cm['oxccl'] * 1e3:.1f} ms against {cm['gloo'] * 1e3:.1f} ms)")
    for f in sorted(glob.glob(os.path.join(raw, "latency-P*.txt"))):
        p = f.rsplit("-P", 1)[1].split(".")[0]
        perf = [float(l.split()[1]) for l in open(f) if l.startswith("perf_8B_us")]
        tor = [float(l.split()[1]) for l in open(f) if l.startswith("torch_8B_us")]
        if perf and tor:
            mp, mt = sorted(perf)[len(perf) // 2], sorted(tor)[len(tor) // 2]
            lines += [f"## 8 B all_reduce, {p} ranks", "",
                      "oxccl-perf `all_reduce_perf -b 8 -e 8 -n 20000` (out-of-place time) and "
                      "bench/torch/latency.py (`dist.all_reduce` of two floats on the backend \"oxccl\"), "
                      "alternating, 3 runs each; medians.", "",
                      "| | µs per call (runs) |", "|---|---|",
                      f"| oxccl-perf | {mp:.2f} ({', '.join(f'{x:.2f}' for x in perf)}) |",
                      f"| torch.distributed, backend oxccl | {mt:.2f} ({', '.join(f'{x:.2f}' for x in tor)}) |", ""]
            verdicts.append(f"- {'PASS' if mt - mp <= 5 else 'FAIL'}: 8 B all_reduce through torch.distributed "
                            f"within 5 µs of oxccl-perf, {p} ranks: {mt:.2f} µs against {mp:.2f} µs "
                            f"(+{mt - mp:.2f} µs)")
    lines[6:6] = ["## Targets", ""] + verdicts + [""]
    with open(os.path.join(a.dir, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()
