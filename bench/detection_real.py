"""Real-traffic detection benchmark: the lab's scenarios through the real product, scored, and the
"Real traffic" section of docs/detection.md rewritten (only that section).

    sudo .venv/bin/python bench/detection_real.py                 # the full matrix (~2.5 h)
    sudo .venv/bin/python bench/detection_real.py --quick         # one short run per scenario, no docs
    sudo .venv/bin/python bench/detection_real.py --only straggler --runs 3 --no-write
    .venv/bin/python bench/detection_real.py --rescore bench-runs/real-20261126-1400   # no new runs

The matrix: healthy runs totalling >= 30 minutes x 4 nodes (3 x 10 min), 10 straggler runs,
3 each of slow link, deep queue, drops and CPU-quota stragglers; seeds B..B+N-1 per scenario
(``--seed-base B``, default 1),
each drawing its own step period, message size, port layout, faulty node, lag and onset
(:mod:`skewd.lab.netlab.scenario`). Runs go one after another (the machine's two cores are
the lab's budget); each is ``python -m skewd.lab.netlab run`` in its own process, so a crash
tears its lab down and the next run starts clean. Run directories are kept (``--runs-dir``):
messages, truth, step logs and process logs of every run, for reading what fired and why.

Exit status is non-zero only when the benchmark could not run (not root, no nats-server);
misses and failed runs are results, reported in the table.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "detection.md"

#: scenario -> (runs, duration) of the full matrix
MATRIX: dict[str, tuple[int, str]] = {
    "healthy": (3, "10m"),
    "straggler": (10, "4m"),
    "straggler-cpu": (3, "4m"),
    "slow-link": (3, "4m"),
    "deep-queue": (3, "4m"),
    "drops": (3, "4m"),
    "ingress-drops": (3, "4m"),
}
QUICK_DURATION = "150s"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one 150 s run per scenario; prints, writes no docs")
    ap.add_argument("--only", nargs="+", choices=sorted(MATRIX), help="run only these scenarios")
    ap.add_argument("--runs", type=int, help="runs per scenario (default: the matrix's)")
    ap.add_argument("--duration", help="every run this long (default: the matrix's)")
    ap.add_argument("--seed-base", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--runs-dir", help="keep run directories here (default bench-runs/real-<time>)")
    ap.add_argument("--rescore", help="score the run directories under this dir instead of running")
    ap.add_argument("--out", default=str(DOC), help="markdown page whose Real traffic section is rewritten")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write docs")
    ap.add_argument("--json", help="also write every run's score here")
    ap.add_argument("--prefix", help="netns prefix (default the lab's: $SKEWD_LAB_NETNS_PREFIX or skwr-)")
    ap.add_argument("--subnet", help="IPv4 subnet (default the lab's: $SKEWD_LAB_SUBNET or 10.79.0.0/16)")
    ap.add_argument("--backend", choices=("auto", "torch", "ring"), default="auto")
    ap.add_argument("--torch-python")
    return ap.parse_args(list(argv))


def plan_jobs(a: argparse.Namespace) -> list[tuple[str, int, str]]:
    jobs = []
    for scen, (runs, dur) in MATRIX.items():
        if a.only and scen not in a.only:
            continue
        n = a.runs or (1 if a.quick else runs)
        d = a.duration or (QUICK_DURATION if a.quick else dur)
        jobs += [(scen, a.seed_base + k, d) for k in range(n)]
    return jobs


def run_one(a: argparse.Namespace, runs_dir: Path, scen: str, seed: int, duration: str) -> dict[str, Any]:
    parent = runs_dir / f"{scen}-s{seed}"
    cmd = [sys.executable, "-m", "skewd.lab.netlab", "run", scen, "--seed", str(seed), "--duration", duration,
           "--nodes", str(a.nodes), "--out", str(parent), "--backend", a.backend]
    for opt in ("prefix", "subnet", "torch_python"):
        if getattr(a, opt):
            cmd += [f"--{opt.replace('_', '-')}", getattr(a, opt)]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    (runs_dir / f"{scen}-s{seed}.out").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
    res = load_result(parent)
    if res is None:
        return {"scenario": scen, "seed": seed, "error": (p.stderr.strip().splitlines() or ["no score"])[-1][:300]}
    res["wall_s"] = time.time() - t
    return res


def load_result(parent: Path) -> dict[str, Any] | None:
    runs = sorted(d for d in parent.glob("*") if (d / "score.json").exists()) if parent.exists() else []
    if not runs:
        return None
    res = json.loads((runs[-1] / "score.json").read_text())
    truth = json.loads((runs[-1] / "truth.json").read_text())
    res["backend"] = truth.get("ranks", {}).get("detail")
    res["kernel_tcp"] = truth.get("kernel_tcp", {})
    res["plan"] = truth.get("plan", {})
    res["product_commit"] = truth.get("product_commit")
    return res


def kernel_healthy(results: list[dict[str, Any]]) -> dict[str, float]:
    """Per node-minute TCP counters over the healthy runs."""
    tot: dict[str, float] = {}
    minutes = 0.0
    for r in results:
        if r.get("error") or r.get("fault") is not None:
            continue
        minutes += r["duration_s"] / 60 * r["nodes"]
        for node in r.get("kernel_tcp", {}).values():
            for k, v in node.items():
                tot[k] = tot.get(k, 0) + v
    return {k: v / minutes for k, v in tot.items()} if minutes else {}


def git_commit() -> str:
    try:
        c = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "lab", "bench"],
                               capture_output=True, text=True, timeout=10).stdout
        return c + ("+local changes" if dirty.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    from skewd.lab.netlab.report import render, replace_section
    from skewd.lab.netlab.run import product_commit

    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    t0 = time.time()
    load0 = os.getloadavg()[0]
    commit = git_commit()  # the lab and scorer: later commits during a long matrix do not count
    results: list[dict[str, Any]] = []
    if a.rescore:
        from skewd.lab.netlab.score import score_run

        base = Path(a.rescore)
        for parent in sorted(p for p in base.iterdir() if p.is_dir()):
            for d in sorted(x for x in parent.iterdir() if (x / "truth.json").exists()):
                (d / "score.json").write_text(json.dumps(score_run(d), indent=1))
            r = load_result(parent)
            if r is not None:
                results.append(r)
        runs_dir = base
    else:
        if os.geteuid() != 0:
            print("detection_real: the lab needs root (namespaces, qdiscs, cgroups)", file=sys.stderr)
            return 2
        runs_dir = Path(a.runs_dir or ROOT / "bench-runs" / f"real-{time.strftime('%Y%m%d-%H%M%S')}")
        runs_dir.mkdir(parents=True, exist_ok=True)
        jobs = plan_jobs(a)
        print(f"{len(jobs)} runs into {runs_dir}", file=sys.stderr)
        for k, (scen, seed, dur) in enumerate(jobs, 1):
            r = run_one(a, runs_dir, scen, seed, dur)
            results.append(r)
            print(f"  [{k}/{len(jobs)}] {scen} seed {seed}: " + (
                f"ERROR {r['error']}" if r.get("error") else
                f"found {r['found']} {json.dumps({i: d['latency_s'] for i, d in r['detected'].items()})}, "
                f"{r['false_findings']} other findings, {r['incidents_naming_healthy']} incidents / "
                f"{r['remaps_naming_healthy']} remaps naming a healthy node"), file=sys.stderr, flush=True)
    ok = [r for r in results if not r.get("error")]
    shown = [x for i, x in enumerate(argv) if not (x in ("--json", "--runs-dir", "--rescore")
                                                   or (i and argv[i - 1] in ("--json", "--runs-dir", "--rescore")))]
    meta = {
        "command": "python bench/detection_real.py" + ("" if not shown else " " + " ".join(shown)),
        "commit": commit,
        # what was measured: the product as the runs ran it (recorded per run; older runs did not)
        "product_commit": ", ".join(sorted({r.get("product_commit") or product_commit() for r in ok})) or product_commit(),
        "runs": len(results),
        "run_minutes": sum(r["duration_s"] for r in ok) / 60,
        "node_hours": sum(r["node_hours"] for r in ok),
        "nodes": a.nodes,
        "backend": ", ".join(sorted({r.get("backend") or "?" for r in ok})) or "-",
        "machine": f"{platform.machine()} {os.cpu_count()} cores (shared), Linux {platform.release()}, "
                   f"Python {platform.python_version()}"
                   + ("" if a.rescore else f", load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"),
        "wall_minutes": (time.time() - t0) / 60 if not a.rescore else sum(r.get("wall_s", 0) for r in ok) / 60,
        "date": _dt.date.today().isoformat(),
        "kernel_healthy": kernel_healthy(results),
    }
    text = render(results, meta)
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "runs": results}, indent=1, default=str))
    print(text)
    if not (a.no_write or a.quick):
        out = Path(a.out)
        out.write_text(replace_section(out.read_text() if out.exists() else "", text))
        print(f"wrote the Real traffic section of {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
