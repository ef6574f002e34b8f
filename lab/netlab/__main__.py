"""``python -m skewd.lab.netlab {run,list,cleanup,score}``: the real-traffic lab's command line.

    python -m skewd.lab.netlab list
    python -m skewd.lab.netlab run straggler --seed 3 --duration 5m --out runs/
    python -m skewd.lab.netlab run healthy --nodes 4 --port dedicated
    python -m skewd.lab.netlab cleanup                # remove leftover lab namespaces (by prefix)
    python -m skewd.lab.netlab score runs/straggler-s3-...

Needs root (namespaces, qdiscs, cgroups). ``--prefix`` / ``--subnet`` (defaults
``$SKEWD_LAB_NETNS_PREFIX`` or ``skwr-``, ``$SKEWD_LAB_SUBNET`` or ``10.79.0.0/16``) let several
labs share one machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from skewd.model import parse_duration

from .faults import FAULTS
from .scenario import SCENARIOS, make_plan
from .topology import DEFAULT_PREFIX, DEFAULT_SUBNET, TopologyError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m skewd.lab.netlab", description="Real-traffic fault lab.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the scenarios and what each should raise")
    r = sub.add_parser("run", help="run one scenario")
    r.add_argument("scenario", choices=sorted(SCENARIOS))
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--duration", default="5m", help="time the agents run (default 5m)")
    r.add_argument("--out", default="netlab-runs", help="parent directory of the run directory")
    r.add_argument("--nodes", type=int, default=4, help="nodes = collective ranks (2-8, default 4)")
    r.add_argument("--port", choices=("dedicated", "shared", "drawn"), default="drawn",
                   help="collectives on their own port (eth1) or sharing eth0 (default: drawn from the seed)")
    r.add_argument("--period-ms", type=float, help="pin the step period (default: drawn, 20-100 ms)")
    r.add_argument("--message-mb", type=float, help="pin the all-reduce message (default: drawn, 0.25-8 MB)")
    r.add_argument("--lag-ms", type=float, help="straggler: pin the extra compute per step (default: drawn 10-30)")
    r.add_argument("--onset", help="pin the fault's onset after the agents are up (e.g. 90s)")
    r.add_argument("--fault-duration", help="remove the fault this long after its onset (e.g. 90s): the run then "
                                            "shows recovery; default: the fault lasts to the end")
    r.add_argument("--faulty-node", type=int, help="pin the faulty node's index")
    r.add_argument("--record", action="store_true",
                   help="agents record what they see into RUN/record/<node> (replay it with `skewd replay`)")
    add_lab_options(r)
    c = sub.add_parser("cleanup", help="remove the lab's leftover namespaces and cgroups (by prefix)")
    c.add_argument("--prefix", default=DEFAULT_PREFIX)
    s = sub.add_parser("score", help="(re)score run directories")
    s.add_argument("runs", nargs="+")
    return p


def add_lab_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"netns name prefix (default {DEFAULT_PREFIX})")
    p.add_argument("--subnet", default=DEFAULT_SUBNET, help=f"IPv4 subnet, at least a /23 (default {DEFAULT_SUBNET})")
    p.add_argument("--backend", choices=("auto", "torch", "ring"), default="auto",
                   help="collective library: torch gloo, the plain ring fallback, or auto (torch where found)")
    p.add_argument("--torch-python", help="interpreter with torch (default $SKEWD_LAB_TORCH_PYTHON, then the "
                                          "vLLM CPU venv)")


def plan_from_args(a: argparse.Namespace):
    ov: dict = {}
    if a.port != "drawn":
        ov["dedicated_port"] = a.port == "dedicated"
    if a.period_ms is not None:
        ov["period_s"] = a.period_ms / 1e3
    if a.message_mb is not None:
        ov["message_bytes"] = int(a.message_mb * 1e6)
    if a.lag_ms is not None:
        ov["lag_s"] = a.lag_ms / 1e3
    if a.onset is not None:
        ov["onset_s"] = parse_duration(a.onset)
    if a.faulty_node is not None:
        ov["faulty_node"] = a.faulty_node
    if a.fault_duration is not None:
        ov["fault_duration_s"] = parse_duration(a.fault_duration)
    return make_plan(a.scenario, a.seed, parse_duration(a.duration), a.nodes, ov)


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.cmd == "list":
        for s in SCENARIOS.values():
            exp = ", ".join(FAULTS[s.fault].expected) if s.fault else "nothing"
            print(f"{s.name:14} expects {exp:10} {s.desc}")
        return 0
    if a.cmd == "cleanup":
        from .topology import cleanup

        try:
            gone = cleanup(a.prefix)
        except TopologyError as e:
            print(f"netlab: {e}", file=sys.stderr)
            return 2
        print("\n".join(gone) if gone else f"nothing left with prefix {a.prefix}")
        return 0
    if a.cmd == "score":
        from .score import firing_table, score_run

        for r in a.runs:
            res = score_run(Path(r))
            Path(r, "score.json").write_text(json.dumps(res, indent=1))
            print(summary_line(res))
            print(firing_table(res))
        return 0
    from .run import LabOptions, run
    from .score import firing_table

    try:
        plan = plan_from_args(a)
    except (KeyError, ValueError) as e:
        print(f"netlab: {e}", file=sys.stderr)
        return 2
    out = Path(a.out) / f"{plan.scenario}-s{plan.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    opts = LabOptions(prefix=a.prefix, subnet=a.subnet, backend=a.backend, torch_python=a.torch_python,
                      record=a.record)
    print(f"run {out}: {json.dumps(plan.to_dict())}", flush=True)
    try:
        run(plan, out, opts, log=lambda s: print(s, flush=True))
    except (TopologyError, RuntimeError, TimeoutError) as e:
        print(f"netlab: run failed: {e}", file=sys.stderr)
        return 1
    res = json.loads((out / "score.json").read_text())
    print(summary_line(res))
    print(firing_table(res))
    return 0


def summary_line(res: dict) -> str:
    det = "; ".join(f"{k} {'found in ' + str(v['latency_s']) + 's' if v['found'] else 'missed'}"
                    for k, v in res["detected"].items()) or "healthy"
    return (f"{res['run']}: {det}; false findings {res['false_findings']} "
            f"({res['false_per_node_hour']}/node-h); incidents {res['incidents']} "
            f"({res['incidents_naming_healthy']} naming a healthy node); remaps {res['remaps']} "
            f"({res['remaps_naming_healthy']} naming a healthy node)")


if __name__ == "__main__":
    sys.exit(main())
