"""Write a simulated run as a capture bundle, so ``skewd replay`` runs it like a recording.

One segment holds every node (replay routes batches by node), written as the nodes' agents
would have recorded it: the collectors' batches in the order the simulator produced them, an
evaluation tick every ``eval_interval``, and every ``summary_interval`` each node's summary -
both as a batch of ``summary_*`` samples (the agent feeds its summary back into its own store)
and as a line of ``summaries.jsonl`` carrying the node's clock error bound and every collective
burst start (the controller's alignment input). Plus the rule files to evaluate with, the
cluster's node labels, and - in ``meta.json`` under ``fault_lab`` - the scenario, the seed and
the ground truth, so a replayed finding can be checked against what was injected.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from skewd import wire
from skewd.agent import bundle
from skewd.agent import summary as summary_mod
from skewd.catalogue import full_catalogue
from skewd.rules.loader import rule_files
from skewd.rules.store import WindowStore

from .sim.simulator import Simulation


def write_bundle(sim: Simulation, directory: str | Path, rules: Sequence[str | Path] = (),
                 eval_interval: float = 1.0, summary_interval: float = 1.0, lookback: float = 60.0,
                 horizon: float = 600.0, bursts: str = "every") -> Path:
    """Run ``sim`` to its end into ``directory/seg-000001``; returns the segment path.
    ``bursts``: the summaries' collective bursts from the simulator's timeline ("every") or
    as the agent derives them from its pkt samples ("agent"), as in the harness."""
    from skewd.rules.cli import PACKS

    paths = rule_files(list(rules) or [PACKS])
    texts = [(str(p), Path(p).read_text()) for p in paths]
    cat = full_catalogue()
    labels = {n: {"cluster": sim.cluster.name, **lab} for n, lab in sim.node_labels().items()}
    meta = {"cluster": sim.cluster.name, "node_labels": labels, "nodes": sim.node_names,
            "recorder_node": "fault-lab",
            "settings": {"evaluation_interval": eval_interval, "summary_interval": summary_interval,
                         "lookback": lookback, "horizon": horizon},
            "fault_lab": {"scenario": sim.scenario.name, "seed": sim.seed,
                          "truth": [t.to_dict() for t in sim.truth]}}
    seg = Path(directory) / "seg-000001"
    w = bundle.SegmentWriter(seg, meta, texts)
    signals: set[str] = set()
    stores = {n: WindowStore(cat, horizon=horizon) for n in sim.node_names}
    next_tick = sim.start + eval_interval
    next_sum = sim.start + summary_interval
    last_sum = {n: sim.start for n in sim.node_names}
    try:
        while sim.t + 1.0 <= sim.end + 1e-9:
            items = sim.step()
            batches = [b for _, _, b in items]
            for _, node, b in items:
                signals.update(b.signals())
                stores[node].ingest(b)
            w.write_samples(batches)
            t = sim.t
            if t >= next_tick - 1e-9:
                w.write_ticks([(t, w.batches, 0)])
                next_tick += eval_interval
            if t >= next_sum - 1e-9:
                next_sum += summary_interval
                lines, own = [], []
                for node in sim.node_names:
                    msg = summary_mod.make_summary(stores[node], node, sim.cluster.name, t, t - last_sum[node],
                                                   clock_error=sim.clock_error[node])
                    last_sum[node] = t
                    vals = {k: v[""] for k, v in msg.signals.items() if "" in v}
                    b = summary_mod.to_batch(node, t, vals)
                    stores[node].ingest(b)
                    own.append(b)
                    signals.update(vals)
                    if bursts != "every":  # what the agent derived from its pkt samples
                        lines.append(wire.encode(msg).decode("utf-8"))
                        continue
                    bs = sim.collective_bursts(node, t - summary_interval, t)
                    msg.signals.pop("collective_burst_starts", None)
                    msg.signals.pop("collective_burst_bytes", None)
                    if bs:
                        msg.signals["collective_burst_starts"] = {str(k): x for k, (x, _) in enumerate(bs)}
                        msg.signals["collective_burst_bytes"] = {str(k): y for k, (_, y) in enumerate(bs)}
                    lines.append(wire.encode(msg).decode("utf-8"))
                w.write_samples(own)  # after the tick: the next evaluation sees them, as live
                w.write_lines(bundle.SUMMARIES, lines, [t] * len(lines))
    finally:
        w.close([cat[s] for s in sorted(signals) if s in cat])
    return seg
