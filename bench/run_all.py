"""Run every benchmark, one after the other, and print their figures with the machine they ran on.

    python bench/run_all.py [--quick] [--only NAME ...] [--footprint-minutes 10] [--replay-hours 1]
                            [--out results.json]

Each benchmark runs as its own process (``bench/<name>.py``), so one's memory and threads never
bias another's. ``--quick`` runs tiny configurations (seconds each: a smoke run, the figures
mean nothing). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, set on some machines here for old
OpenBLAS builds, slow a current numpy; they are removed from the benchmarks' environment only
(the tests never change them). Exit status: the number of benchmarks that could not run (0 = all
ran); a missed goal is reported, never an error.
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

HERE = Path(__file__).resolve().parent

#: name → (arguments for the full run, arguments for --quick)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    # --json: the figures reach results.json. --quick: scapy took 10-20 s for 20,000 packets on the
    # loaded 2-core machine; a 2,000-packet prefix (its rate is per packet) keeps the smoke run short
    "pkt_offline": (["--json"], ["--packets", "20000", "--repeat", "1", "--scapy-packets", "2000", "--json"]),
    "live_capture": (["--json"], ["--seconds", "1", "--json"]),
    "qdisc_sampler": (["--json"], ["--seconds", "0.5", "--rates", "20", "--json"]),
    "rule_engine": (["--json"], ["--ticks", "3", "--json"]),
    "replay_speed": (["--json"], ["--hours", "0.01", "--json"]),
    "agent_footprint": (["--json"], ["--minutes", "0.1", "--warmup", "5", "--json"]),
    "controller_ingest": (["--json"], ["--seconds", "1", "--nodes", "64", "--json"]),
    "e2e_latency": (["--json"], ["--groups", "1", "--first-onset", "2", "--spread", "0", "--tail", "3",
                                 "--json"]),
}


def machine() -> dict[str, str]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": str(os.cpu_count()), "cpu": model, "kernel": platform.release(),
            "python": platform.python_version(), "date": _dt.date.today().isoformat()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny configurations (smoke run)")
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    ap.add_argument("--footprint-minutes", type=float, help="agent footprint duration (default 10)")
    ap.add_argument("--replay-hours", type=float, help="recorded hours for the replay benchmark (default 1)")
    ap.add_argument("--out", help="write every benchmark's output and JSON figures to this file")
    a = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    dropped = sorted(set(os.environ) - set(env))
    m = machine()
    print(f"machine: {m['nproc']} cores, {m['cpu']}, Linux {m['kernel']}, Python {m['python']}, {m['date']}"
          + (f"; removed {', '.join(dropped)} from the benchmarks' environment" if dropped else ""))
    results: dict[str, dict] = {}
    failed = 0
    for name, (full, quick) in BENCHMARKS.items():
        if a.only and name not in a.only:
            continue
        args = list(quick if a.quick else full)
        if name == "agent_footprint" and a.footprint_minutes is not None:
            args += ["--minutes", str(a.footprint_minutes)]
        if name == "replay_speed" and a.replay_hours is not None:
            args += ["--hours", str(a.replay_hours)]
        cmd = [sys.executable, str(HERE / f"{name}.py"), *args]
        print(f"\n== {name}: {' '.join(['python', f'bench/{name}.py', *args])}", flush=True)
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        took = time.monotonic() - t0
        figures = None
        lines = []
        for line in p.stdout.splitlines():
            if line.startswith("{") and '"benchmark"' in line:
                try:
                    figures = json.loads(line)
                    continue
                except ValueError:
                    pass
            lines.append(line)
        print("\n".join(lines))
        if p.returncode != 0:
            failed += 1
            print(f"!! {name} could not run (exit {p.returncode}):\n{p.stderr[-3000:]}")
        print(f"   ({took:.0f} s)", flush=True)
        results[name] = {"exit": p.returncode, "seconds": took, "output": lines, "figures": figures,
                         "stderr": p.stderr[-3000:] if p.returncode else ""}
    if a.out:
        Path(a.out).write_text(json.dumps({"machine": m, "quick": a.quick, "results": results}, indent=1,
                                          default=str))
    print(f"\n{len(results) - failed} of {len(results)} benchmarks ran" + (f"; {failed} could not run" if failed else ""))
    return failed


if __name__ == "__main__":
    sys.exit(main())
