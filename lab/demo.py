"""``skewd demo [--scenario NAME] [--list] [--speed N]``: a simulated 4-node cluster, live.

The fault lab's simulator plays the nodes: each node's telemetry goes through its own agent
pipeline (the shipped rules, node scopes), findings are published to JetStream through the
agent's publisher and summaries over core NATS, exactly as real agents do; an embedded
nats-server and an embedded controller do the rest. The terminal shows findings, the culprit
the controller names and its remap suggestions. Simulated time runs ``--speed`` times faster
than the wall clock; the controller evaluates on the summaries' own clock, so nothing else
changes. It ends by itself when the scenario does.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from skewd import cliargs, wire
from skewd.agent import summary as summary_mod
from skewd.agent.pipeline import Pipeline
from skewd.agent.publisher import Publisher
from skewd.agent.spool import Spool
from skewd.agent.view import LiveView, ViewState
from skewd.catalogue import full_catalogue
from skewd.model import NODE_SCOPES, Finding
from skewd.natsutil import EmbeddedNatsServer, NatsConfig, connect
from skewd.rules.cli import PACKS
from skewd.rules.counts import rule_counts
from skewd.rules.loader import load_rules_or_raise

DEFAULT_SCENARIO = "ew1-tp-straggler"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skewd demo", description="A simulated 4-node cluster through real NATS, live.")
    p.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"scenario name or YAML file (default {DEFAULT_SCENARIO})")
    p.add_argument("--list", action="store_true", help="list the shipped scenarios and exit")
    p.add_argument("--speed", type=cliargs.speed, default=12.0,
                   help="simulated time per wall time: 4x, 12x (the x may be left out; default 12x)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--plain", action="store_true", help="print lines instead of redrawing the screen")
    p.add_argument("--debug", action="store_true", help="print the controller's status at the end")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def main(argv: list[str]) -> int:
    from .sim.scenario import list_scenarios, load_scenario

    args = parse(argv)
    if args.list:
        for path in list_scenarios():
            try:
                sc = load_scenario(path)
            except Exception as e:  # one broken scenario file must not hide the others
                print(f"{path.stem:28} INVALID: {e}")
                continue
            print(f"{sc.name:28} {' '.join(str(getattr(sc, 'description', '') or '').split())[:100]}")
        return 0
    path = Path(args.scenario)
    if not path.exists():
        matches = [p for p in list_scenarios() if p.stem == args.scenario]
        if not matches:
            hint = cliargs.did_you_mean(args.scenario, [p.stem for p in list_scenarios()])
            print(f"skewd demo: no scenario {args.scenario!r}{hint} (skewd demo --list shows them all)",
                  file=sys.stderr)
            return 2
        path = matches[0]
    try:
        return asyncio.run(run(load_scenario(path), args))
    except KeyboardInterrupt:
        return 0


async def run(scenario, args, out=None) -> int:
    from skewd.controller.main import run_embedded
    from .harness import node_available
    from .sim.simulator import Simulation

    out = out or sys.stdout
    cat = full_catalogue()
    ruleset = load_rules_or_raise([PACKS], cat)
    sim = Simulation(scenario, seed=args.seed)
    cluster = sim.cluster.name
    labels = sim.node_labels()
    tmp = tempfile.TemporaryDirectory(prefix="skewd-demo-")
    state = Path(tmp.name)
    server = EmbeddedNatsServer(store_dir=state / "js").start()
    stop = asyncio.Event()
    ctl_holder: list = []
    ready = asyncio.Event()
    ctl_task = asyncio.create_task(run_embedded(url=server.url, cluster=cluster, state_dir=state / "ctl", stop=stop,
                                                ready=ready, on_start=ctl_holder.append, recorded_time=True))
    await asyncio.wait_for(ready.wait(), 30)
    nc = await connect(NatsConfig.from_dict({"url": server.url}), initial_timeout=10)
    findings: list[Finding] = []
    suggestions: list[dict] = []
    view = LiveView(out, interactive=False if args.plain else None, keep=14)

    async def on_finding(msg) -> None:
        try:
            f = wire.decode_finding(msg.data)
        except (ValueError, wire.WireError):
            return
        if f.state.value == "pending":  # the demo shows what fired and what cleared
            return
        findings.append(f)
        view.on_finding(f)

    async def on_remap(msg) -> None:
        try:
            d = json.loads(msg.data)
        except ValueError:
            return
        for a in d.get("actions", []) or [d]:
            tgt = a.get("target", {})
            suggestions.append({"action": a.get("type", d.get("kind", "?")),
                                "target": tgt.get("node", "") if isinstance(tgt, dict) else str(tgt),
                                "confidence": a.get("confidence"), "rationale": a.get("rationale", d.get("summary", ""))})

    await nc.subscribe(wire.subject_filter(wire.MessageKind.FINDING, cluster=cluster), cb=on_finding)
    await nc.subscribe(wire.remap_subject(cluster), cb=on_remap)
    pipes: dict[str, Pipeline] = {}
    pubs: dict[str, Publisher] = {}
    for n in sim.node_names:
        p = Pipeline(cat, ruleset, node=n, cluster=cluster, labels=labels[n])
        p.engine.scopes = set(NODE_SCOPES)
        p.engine.set_available_signals(node_available(cat, sim, n))
        pipes[n] = p
        pub = Publisher(NatsConfig.from_dict({"url": server.url}), Spool(state / "spool" / n), cluster=cluster)
        await pub.start()
        await pub.wait_connected(15)
        pubs[n] = pub
    title = f"skewd demo · scenario {scenario.name} · {len(pipes)} simulated nodes · cluster {cluster}"
    truth = "; ".join(f"{g.pathology} on {','.join(g.nodes)}{'/' + g.entity if g.entity else ''} "
                      f"from +{g.onset - sim.start:.0f}s" for g in sim.truth)
    wall0 = time.monotonic()
    last_draw = 0.0
    try:
        while sim.t + 1.0 <= sim.end + 1e-9 and not stop.is_set():
            batch = sim.step()
            t = sim.t
            for _, node, b in batch:
                pipes[node].ingest(b)
            for node, p in pipes.items():
                for f in p.evaluate(t):
                    pubs[node].publish_finding(f)
                msg = summary_mod.make_summary(p.store, node, cluster, t, 1.0, clock_synced=True,
                                               clock_error=sim.clock_error[node], labels=labels[node])
                p.ingest(summary_mod.to_batch(node, t, {k: v[""] for k, v in msg.signals.items() if "" in v}))
                # the collective bursts are the agent's own: what its pkt collector listed as ended
                await pubs[node].publish_summary(msg)
            sim.prune_bursts(t - 30.0)
            # pace simulated time against the wall clock
            ahead = (t - sim.start) / args.speed - (time.monotonic() - wall0)
            # yield every step: NATS I/O and the controller share this event loop
            await asyncio.sleep(max(ahead, 0.0))
            if time.monotonic() - last_draw >= 1.0:
                last_draw = time.monotonic()
                view.update(_state(title, truth, t - sim.start, pipes, findings, suggestions))
        await asyncio.sleep(2.0)  # let the last findings and suggestions arrive
        if ctl_holder and getattr(args, "debug", False):
            out.write(json.dumps(ctl_holder[0].status(), default=str)[:3000] + "\n")
        view.update(_state(title, truth, sim.t - sim.start, pipes, findings, suggestions))
    finally:
        stop.set()
        for pub in pubs.values():
            await pub.close(drain_timeout=2.0)
        await nc.close()
        try:
            await asyncio.wait_for(ctl_task, 15)
        except (asyncio.TimeoutError, Exception):  # stopping anyway
            pass
        server.stop()
        tmp.cleanup()
    culprits = sorted({s["target"] for s in suggestions if s.get("target")})
    out.write(f"skewd demo: finished · injected {truth} · {len(findings)} finding transitions · "
              f"{len(suggestions)} suggested actions" + (f" · culprit named: {', '.join(culprits)}" if culprits else "")
              + "\n")
    return 0


def _state(title: str, truth: str, elapsed: float, pipes, findings, suggestions) -> ViewState:
    signals: dict[str, float] = {}
    for p in pipes.values():
        for name in ("summary_gpu_util_mean_ratio", "summary_kv_cache_usage_ratio", "summary_rdma_xmit_bytes_per_second"):
            blk = p.store.blocks.get(name, {}).get(p.node)
            if blk is not None and blk.n:
                v = blk.values[0, blk.n - 1]
                if not np.isnan(v):
                    signals[name] = signals.get(name, 0.0) + float(v) / len(pipes)
    # the node-scope rules the agents run: active where a node has their signals (the group
    # scopes run in the controller)
    return ViewState(title=title, collectors=[], rules=rule_counts([p.engine for p in pipes.values()]),
                     signals=signals,
                     findings=list(findings), suggestions=list(suggestions),
                     notes=[f"simulated time +{elapsed:.0f}s · injected: {truth}"])
