"""What a user pays outside the kernels: eager calls and the start of a process.

``eager``: one eager call of ``nvfp4_ops.moe`` (V4-Flash, T = 1, wperm weights) and of
``nvfp4_ops.linear`` (M = 1, (N, K) = (7168, 18432), prepared weights), timed with CUDA events
around the Python call (what a caller that does not capture graphs sees: host work plus device
time), median over ``--reps`` calls after warm-up, next to the same call as a CUDA-graph
replay (device time only) in the same process. Both with the per-call value checks off (the
default) and on (``NVFP4_OPS_VALUE_CHECKS=1``). Also the host time of the Python call alone
(``time.perf_counter`` around it, no synchronisation), split by stage with the torch profiler
when ``--profile`` is given. Eager figures are host-bound, so the run also records the host's
speed on a fixed piece of pure Python (``host_speed_us``).

``startup``: the kernel cache (``NVFP4_OPS_CACHE_DIR``) and Triton's (``TRITON_CACHE_DIR``) both
point into a fresh folder. First ``python -m nvfp4_ops precompile --shape v4-flash --jobs N``
fills them (cold: every variant compiled, in ``N`` worker processes). Then, twice, a fresh
process imports ``nvfp4_ops`` and runs ``nvfp4_ops.warmup(["v4-flash"])`` (every CuTeDSL and
Triton variant the shape reaches, loaded and run once): the warm start a server pays.

Run on a GPU: ``python benchmarks/bench_overhead.py eager startup --out
benchmarks/results/overhead_h200.json``. Needs CUDA; prints one table per mode.
``--processes N`` repeats ``eager`` in N fresh processes (its figures move between processes
on one machine) and prints each, then one line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import capture, git_commit, replay_median_us  # noqa: E402


def _events_median_us(fn, reps: int) -> float:
    """Median µs between CUDA events recorded right before and right after ``fn()`` (its
    host work and its device work, as an eager caller sees them)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _host_median_us(fn, reps: int) -> float:
    """Median µs of the Python call alone (no synchronisation inside the timed span)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def host_speed_us(calls: int = 20000) -> float:
    """The host's speed as µs of a fixed piece of pure Python (200 dict lookups, best of 5
    rounds). Eager calls are host-bound, and the machines lent for a run differ by ~2-3x in
    it, so an eager figure is only comparable with this next to it."""
    table: dict[int, int] = {}

    def work():
        return [table.get(i) for i in range(200)]

    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            work()
        best = min(best, (time.perf_counter() - t0) / (calls // 5) * 1e6)
    return best


def _cases():
    import nvfp4_ops
    from nvfp4_ops.testing import fast_random_experts, random_routing

    gen = torch.Generator(device="cuda").manual_seed(0)
    s = nvfp4_ops.get_shape("v4-flash")
    e, h, i = s.experts, s.hidden, s.intermediate
    moe_weights = fast_random_experts(e, h, i, device="cuda")
    nvfp4_ops.to_wperm_(moe_weights.w13)
    nvfp4_ops.to_wperm_(moe_weights.w2)
    experts = moe_weights.args()
    x1 = torch.randn(1, h, device="cuda", generator=gen).to(torch.bfloat16)
    ids, weights = random_routing(1, e, s.top_k, device="cuda")
    n, k = 7168, 18432
    w = nvfp4_ops.to_wfrag_(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda",
                                          generator=gen))
    ws = (torch.rand(n, k // 16, device="cuda", generator=gen) + 0.5).to(torch.float8_e4m3fn)
    wg = torch.full((), 1e-3, device="cuda")
    xl = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    return {
        "moe V4-Flash T=1": lambda: nvfp4_ops.moe(x1, ids, weights, *experts,
                                                  global_num_experts=e,
                                                  swiglu_limit=s.swiglu_limit, wperm=True),
        "linear (7168, 18432) M=1": lambda: nvfp4_ops.linear(xl, w, ws, wg, wfrag=True),
    }


def _cprofile(name: str, fn, calls: int = 300) -> None:
    """The Python functions an eager call spends its host time in (cProfile, by own time)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(28)
    print(f"--- {name}: cProfile over {calls} eager calls (own time)\n{buf.getvalue()}")


def run_eager(reps: int, profile: bool, cprofile: bool = False) -> list[dict]:
    from nvfp4_ops import set_value_checks

    rows = []
    for name, fn in _cases().items():
        for _ in range(5):
            fn()  # compile / load, allocator warm
        torch.cuda.synchronize()
        graph = capture([fn])
        replay = replay_median_us(graph, reps)
        row = {"case": name, "graph_replay_us": replay}
        for checks in (False, True):
            set_value_checks(checks)
            try:
                for _ in range(3):
                    fn()
                row[f"eager_us{'_checks' if checks else ''}"] = _events_median_us(fn, reps)
                row[f"host_us{'_checks' if checks else ''}"] = _host_median_us(fn, reps)
            finally:
                set_value_checks(None)  # back to NVFP4_OPS_VALUE_CHECKS (default off)
        rows.append(row)
        if cprofile:
            _cprofile(name, fn)
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as prof

            with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            print(f"--- {name}: torch profiler, 20 eager calls")
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    print(f"{'case':28s} {'replay':>8s} {'eager':>8s} {'host':>8s} {'eager+chk':>10s} "
          f"{'host+chk':>9s}  (µs)")
    for r in rows:
        print(f"{r['case']:28s} {r['graph_replay_us']:8.1f} {r['eager_us']:8.1f} "
              f"{r['host_us']:8.1f} {r['eager_us_checks']:10.1f} {r['host_us_checks']:9.1f}")
    return rows


_STARTUP = """
import time
t0 = time.perf_counter()
import torch, nvfp4_ops
torch.cuda.init()
t1 = time.perf_counter()
names = nvfp4_ops.warmup(["v4-flash"])
torch.cuda.synchronize()
t2 = time.perf_counter()
from nvfp4_ops import _compile
print("STARTUP", t1 - t0, t2 - t1, len(names), _compile.compile_count())
"""


def run_startup(jobs: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="nvfp4_startup_") as root:
        env = dict(os.environ, NVFP4_OPS_CACHE_DIR=str(Path(root) / "nvfp4"),
                   TRITON_CACHE_DIR=str(Path(root) / "triton"))
        env.pop("NVFP4_OPS_DISK_CACHE", None)
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "nvfp4_ops", "precompile", "--shape",
                              "v4-flash", "--jobs", str(jobs)], env=env, text=True,
                             capture_output=True, timeout=1500)
        wall = time.perf_counter() - t0
        print(f"precompile --jobs {jobs} (cold caches): {wall:.1f} s, rc {res.returncode}; "
              + (res.stdout.strip().splitlines() or [""])[-1], flush=True)
        rows.append({"cache": f"cold: precompile --jobs {jobs}", "process_s": wall,
                     "failed": res.returncode != 0})
        for label in ("warm", "warm again"):
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", _STARTUP], env=env, text=True,
                                 capture_output=True, timeout=1500)
            wall = time.perf_counter() - t0
            line = [ln for ln in res.stdout.splitlines() if ln.startswith("STARTUP")]
            if res.returncode != 0 or not line:
                print(f"startup ({label}) failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
                rows.append({"cache": label, "failed": True})
                continue
            _, imp, warm, variants, compiles = line[0].split()
            rows.append({"cache": label, "process_s": wall, "import_s": float(imp),
                         "warmup_s": float(warm), "variants": int(variants),
                         "cutedsl_compiles": int(compiles)})
    print(f"{'caches':24s} {'process s':>10s} {'import s':>9s} {'warmup s':>9s} "
          f"{'variants':>9s} {'compiles':>9s}")
    for r in rows:
        if "import_s" in r:
            print(f"{r['cache']:24s} {r['process_s']:10.1f} {r['import_s']:9.1f} "
                  f"{r['warmup_s']:9.1f} {r['variants']:9d} {r['cutedsl_compiles']:9d}")
        else:
            print(f"{r['cache']:24s} {r['process_s']:10.1f}")
    return rows


def run_eager_processes(processes: int, reps: int) -> list[dict]:
    """``eager`` in ``processes`` fresh processes, one after the other; prints each one's
    table as it finishes and a summary per case. Returns each process's result."""
    results = []
    with tempfile.TemporaryDirectory(prefix="nvfp4_eager_") as root:
        for i in range(processes):
            out = Path(root) / f"eager_{i}.json"
            res = subprocess.run([sys.executable, __file__, "eager", "--reps", str(reps),
                                  "--out", str(out)], text=True, capture_output=True,
                                 timeout=900)
            print(f"--- process {i + 1} of {processes} (rc {res.returncode})\n"
                  f"{res.stdout.strip()}", flush=True)
            if res.returncode != 0 or not out.exists():
                print(res.stderr[-3000:])
                results.append({"failed": True})
                continue
            results.append(json.loads(out.read_text()))
    done = [r for r in results if "eager" in r]
    print(f"{'case':28s} {'replay µs':>14s}  eager µs per process (host speed µs)")
    for case in dict.fromkeys(row["case"] for r in done for row in r["eager"]):
        rows = [(r["host_speed_us"], row) for r in done for row in r["eager"]
                if row["case"] == case]
        replays = [row["graph_replay_us"] for _, row in rows]
        eager = ", ".join(f"{row['eager_us']:.1f} ({speed:.1f})" for speed, row in rows)
        print(f"{case:28s} {min(replays):6.1f}-{max(replays):6.1f}  {eager}")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("modes", nargs="+", choices=("eager", "startup"))
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--profile", action="store_true", help="a torch-profiler table per case")
    p.add_argument("--cprofile", action="store_true",
                   help="the Python functions of an eager call, by own time (cProfile)")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="compile workers of the cold precompile (startup)")
    p.add_argument("--processes", type=int, default=1,
                   help="eager: repeat the measurement in this many fresh processes, one "
                        "after the other, and report each (an eager call's host time moves "
                        "between processes)")
    p.add_argument("--out", type=Path, help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error(f"--reps must be >= 1, got {args.reps}")
    if args.processes < 1:
        p.error(f"--processes must be >= 1, got {args.processes}")
    if not torch.cuda.is_available():
        print("bench_overhead: needs a CUDA GPU; nothing to measure here")
        return 0
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    result["commit"] = git_commit()
    if "startup" in args.modes:  # first: a fresh process each, before this one warms anything
        result["startup"] = run_startup(args.jobs)
    if "eager" in args.modes and args.processes > 1:
        result["processes"] = run_eager_processes(args.processes, args.reps)
    elif "eager" in args.modes:
        result["host_speed_us"] = host_speed_us()
        print(f"host speed: {result['host_speed_us']:.2f} µs per 200 dict lookups in Python "
              "(eager figures are host-bound: compare machines by this)")
        result["eager"] = run_eager(args.reps, args.profile, args.cprofile)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
