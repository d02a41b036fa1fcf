"""Runs PyTorch's own distributed test suite (DistributedTest, in the torch wheel) against a
backend, with one pair of rank processes for many tests.

    python run.py --backend oxccl [--world-size 2] [--json OUT] [--against GLOO.json] [-k TEXT]

Why: torch's driver (driver.py here) spawns fresh rank processes for every test, skipped
ones included, and each imports torch: 21 minutes for the suite on 2 cores, most of it
spent starting processes for tests that then skip. Here each rank process starts once and
runs the tests in turn, each in a process group of its own (a FileStore in the test's own
directory), as TestDistBackend._run does: init, barrier, the test, barrier, destroy. A test
its decorators skip before it runs (`__unittest_skip__`) is not sent at all.

A test that fails, hangs or kills a rank in the shared processes is run again alone through
driver.py, in fresh processes, as torch runs it, and that result is the one that counts
(the shared run's is kept beside it): a test that fails only after other tests in the same
process (state they left) says nothing about the backend. After a hang or a death the pair
of processes is started afresh.

Output: a line per test, a summary, and with --json the whole result (status, reason,
seconds per test); --against a result of another backend (Gloo's) lists every test whose
outcome differs, with both reasons. --lift-gates (with --against): a test the suite skips
for this backend only because a list of backends names the other one (its decorator, or
its body: driver.BODY_READS_BACKEND_AS) is run anyway, with that skip taken off, and must
pass. Exit status 1 if any test failed alone, or (with --lift-gates) any test that passes
with the other backend does not pass here; else 0.
Everything a run writes goes under one temporary directory, removed at the end.
"""

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))


def _suite(backend):
    """The test class, as driver.py makes it (imported in each process)."""
    os.environ["BACKEND"] = backend
    sys.path.insert(0, HERE)
    import driver

    return driver.TestDistBackendWithSpawn


def _worker(rank, backend, world, conn, log_path):
    """One rank: runs the tests the parent sends, one at a time, answering (status, detail)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    suite = _suite(backend)
    import unittest

    import torch.distributed as dist
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.distributed import distributed_test as dt

    skips = {s.exit_code: s.message for s in TEST_SKIPS.values()}
    while True:
        msg = conn.recv()
        if msg is None:
            return
        name, file_name, temp_dir, lift = msg
        env = dict(os.environ)
        os.environ["TEMP_DIR"] = temp_dir
        dt.Barrier.barrier_id = 0
        print(f"==== {name} (rank {rank})", flush=True)
        try:
            status, detail = _one(suite, name, rank, world, file_name, dist, common_utils, dt, skips, unittest, lift)
        finally:
            os.environ.clear()
            os.environ.update(env)
        sys.stdout.flush()
        conn.send((status, detail))


def _one(suite, name, rank, world, file_name, dist, common_utils, dt, skips, unittest, lift):
    t = suite(name)
    t.rank = rank
    t.file_name = file_name
    try:
        timeout = dt.CUSTOM_PG_TIMEOUT.get(name, dt.default_pg_timeout)
        dist.init_process_group(init_method=t.init_method, backend=dt.BACKEND, world_size=world, rank=rank,
                                timeout=timedelta(seconds=timeout))
        t._barrier()
        common_utils.set_rng_seed()
        fn = getattr(type(t), name)
        if lift:  # the skip a backend list put on the test comes off (driver.unskipped)
            import driver

            fn = driver.unskipped(fn)
        try:
            fn(t)
        except unittest.SkipTest as e:
            return "skip", str(e)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
            if code in skips:
                return "skip", skips[code]
            return ("ok", "") if code == 0 else ("error", f"the test exited with status {code}")
        t._barrier()
        return "ok", ""
    except Exception:  # noqa: BLE001 - the test's failure, reported
        return "error", traceback.format_exc()
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


class Pair:
    """The rank processes, started once and again after a hang or a death."""

    def __init__(self, backend, world, root):
        self.backend, self.world, self.root = backend, world, root
        self.procs, self.conns = [], []
        self.starts = 0

    def start(self):
        ctx = multiprocessing.get_context("spawn")
        self.starts += 1
        for r in range(self.world):
            parent, child = ctx.Pipe()
            log = os.path.join(self.root, f"rank{r}.log")
            p = ctx.Process(target=_worker, args=(r, self.backend, self.world, child, log), daemon=True)
            p.start()
            self.procs.append(p)
            self.conns.append(parent)

    def stop(self, kill=False):
        for c in self.conns:
            try:
                if not kill:
                    c.send(None)
            except OSError:
                pass
        for p in self.procs:
            if kill:
                p.kill()
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        self.procs, self.conns = [], []

    def run(self, name, deadline_s, lift=False):
        """Every rank's (status, detail), or None for a rank that hung or died."""
        if not self.procs:
            self.start()
        d = tempfile.mkdtemp(dir=self.root, prefix="t-")
        for sub in ("barrier", "test_dir", "init_dir"):
            os.mkdir(os.path.join(d, sub))
        file_name = os.path.join(d, "store")
        for c in self.conns:
            c.send((name, file_name, d, lift))
        out = [None] * self.world
        until = time.monotonic() + deadline_s
        errored_at = None
        while any(o is None for o in out):
            now = time.monotonic()
            # A rank that failed may leave the others waiting in a call it will never make.
            if now >= until or (errored_at is not None and now >= errored_at + 30):
                break
            for r, c in enumerate(self.conns):
                if out[r] is None:
                    try:
                        if c.poll(0.05):
                            out[r] = c.recv()
                            if out[r][0] == "error" and errored_at is None:
                                errored_at = time.monotonic()
                    except (EOFError, OSError):
                        out[r] = ("died", f"rank {r}'s process died (exit {self.procs[r].exitcode})")
        if any(o is None or o[0] == "died" for o in out):
            self.stop(kill=True)
        shutil.rmtree(d, ignore_errors=True)
        return out


def combine(out):
    """One outcome from every rank's: an error anywhere, else a skip anywhere, else ok."""
    bad = [(r, o) for r, o in enumerate(out) if o is None or o[0] in ("error", "died")]
    if bad:
        return "error", "\n".join(
            f"rank {r}: " + ("no answer before the deadline (hung)" if o is None else o[1]) for r, o in bad)
    skips = [o[1] for o in out if o[0] == "skip"]
    if skips:
        return "skip", skips[0]
    return "ok", ""


def alone(backend, world, name, root, lift=False):
    """The test run alone, as torch runs it (driver.py, fresh processes): (status, detail)."""
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world), TMPDIR=root)
    if lift:
        env["OXCCL_TORCH_SUITE_LIFT"] = name
    cmd = [sys.executable, os.path.join(HERE, "driver.py"), f"TestDistBackendWithSpawn.{name}"]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return "error", "alone: no result within 900 s"
    tail = (p.stdout + p.stderr)[-4000:]
    if p.returncode == 0:
        return ("skip", tail.strip().splitlines()[-1]) if "skipped=" in tail else ("ok", "")
    return "error", tail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", required=True)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--json", help="write the whole result here")
    ap.add_argument("--against", help="a result of another backend (its --json) to compare with")
    ap.add_argument("-k", action="append", default=[], help="run only tests whose name contains this")
    ap.add_argument("--lift-gates", action="store_true",
                    help="with --against: run the tests a decorator skips for this backend but that pass with the "
                         "other one (a list of backends names theirs), with that skip taken off")
    a = ap.parse_args()

    root = tempfile.mkdtemp(prefix=f"oxccl-torch-suite-{os.getpid()}-")
    os.environ["TMPDIR"] = root
    tempfile.tempdir = root
    os.environ["WORLD_SIZE"] = str(a.world_size)
    t0 = time.monotonic()
    try:
        suite = _suite(a.backend)
        suite.setUpClass()  # MASTER_ADDR (and the base class's settings), inherited by the ranks
        import torch

        names = sorted(n for n in dir(suite) if n.startswith("test_"))
        if a.k:
            names = [n for n in names if any(k in n for k in a.k)]
        results = {}
        other = None
        if a.against:
            with open(a.against) as f:
                other = json.load(f)
        pair = Pair(a.backend, a.world_size, root)
        for i, name in enumerate(names, 1):
            fn = getattr(suite, name)
            s0 = time.monotonic()
            gated = getattr(fn, "__unittest_skip__", False)
            why = str(getattr(fn, "__unittest_skip_why__", ""))
            if gated and not (a.lift_gates and other and other["tests"].get(name, {}).get("status") == "ok"):
                res = {"status": "skip", "reason": why, "seconds": 0.0}
            else:
                from torch.testing._internal.distributed import distributed_test as dt

                deadline = 120 + dt.CUSTOM_PG_TIMEOUT.get(name, dt.default_pg_timeout)
                status, detail = combine(pair.run(name, deadline, lift=gated))
                res = {"status": status, "reason": detail, "seconds": round(time.monotonic() - s0, 2)}
                if status == "error":
                    st2, det2 = alone(a.backend, a.world_size, name, root, lift=gated)
                    res = {"status": st2, "reason": det2, "seconds": round(time.monotonic() - s0, 2),
                           "shared": {"status": status, "reason": detail}}
                if gated:
                    res["lifted"] = why
            results[name] = res
            mark = res["status"] + (" (failed in the shared processes, run alone)" if "shared" in res else "")
            if "lifted" in res:
                mark += f" (gate lifted: {res['lifted']})"
            print(f"[{i}/{len(names)}] {name}: {mark} ({res['seconds']:.1f} s)", flush=True)
            if res["status"] == "error":
                print("    " + res["reason"].strip().replace("\n", "\n    ")[-3000:], flush=True)
        pair.stop()
        plain = {n: r for n, r in results.items() if "lifted" not in r}
        lifted = {n: r for n, r in results.items() if "lifted" in r}
        count = {s: sum(1 for r in plain.values() if r["status"] == s) for s in ("ok", "skip", "error")}
        wall = time.monotonic() - t0
        summary = {"backend": a.backend, "torch": torch.__version__, "world_size": a.world_size,
                   "tests": len(results), **count, "seconds": round(wall, 1), "process_pairs": pair.starts,
                   "run_alone": sorted(n for n, r in results.items() if "shared" in r),
                   "lifted_ok": sorted(n for n, r in lifted.items() if r["status"] == "ok"),
                   "lifted_failed": sorted(n for n, r in lifted.items() if r["status"] != "ok")}
        lifted_note = f" (+{len(summary['lifted_ok'])} ok with a backend list's skip lifted)" if lifted else ""
        print(f"SUITE backend={a.backend} torch={torch.__version__} ranks={a.world_size}: {len(results)} tests, "
              f"{count['ok']} ok{lifted_note}, {count['skip']} skipped, {count['error']} failed in {wall:.0f} s "
              f"({pair.starts} process pair(s); run alone after failing shared: {len(summary['run_alone'])})",
              flush=True)
        if lifted:
            print(f"LIFTED {len(lifted)} test(s) skipped for {a.backend} by a backend list but passing with "
                  f"{other['summary']['backend']}, run with that skip taken off: {len(summary['lifted_ok'])} ok, "
                  f"{len(summary['lifted_failed'])} not: {', '.join(summary['lifted_failed']) or 'none'}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"summary": summary, "tests": results}, f, indent=1, sort_keys=True)
        behind = []
        if other:
            compare(a.backend, results, other)
            # Every test that passes with the other backend passes here (with --lift-gates, those
            # a backend list skips for this one too).
            behind = [n for n, r in results.items()
                      if r["status"] != "ok" and other["tests"].get(n, {}).get("status") == "ok"
                      and (a.lift_gates or "lifted" not in r)]
            if a.lift_gates and behind:
                print(f"BEHIND {other['summary']['backend']}: {len(behind)} test(s) pass with it and not here: "
                      f"{', '.join(sorted(behind))}", flush=True)
        return 1 if count["error"] or (a.lift_gates and behind) else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def compare(backend, mine, other):
    """Every test whose outcome differs from the other backend's, with both reasons."""
    theirs = other["tests"]
    ob = other["summary"]["backend"]
    diff = [n for n in sorted(mine) if mine[n].get("status") != theirs.get(n, {}).get("status")]
    print(f"COMPARE {backend} against {ob}: {len(diff)} test(s) differ")
    for n in diff:
        m, t = mine.get(n, {}), theirs.get(n, {})
        gate = f" (gate lifted: {m['lifted']})" if "lifted" in m else ""
        print(f"  {n}: {backend} {m.get('status', 'absent')}{gate} [{first_line(m.get('reason'))}]; "
              f"{ob} {t.get('status', 'absent')} [{first_line(t.get('reason'))}]")


def first_line(s):
    lines = [ln for ln in (s or "").strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


if __name__ == "__main__":
    sys.exit(main())
