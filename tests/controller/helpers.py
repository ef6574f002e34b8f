"""Shared pieces of the controller's NATS tests: config, scripted streams, stream readers."""
from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import nats

from skewd import wire
from skewd.controller import messages as M
from skewd.controller.config import ControllerConfig, load_config
from skewd.model import Layer

from .sim import ScriptedGroup, finding, publish_finding

RULES = str(Path(__file__).parent / "rules")
#: where the test rules' findings hold their culprit measurement (controller/culprit.py)
CULPRIT_EVIDENCE = {
    "EW-1-tp-straggler-test": {"measure": "ctl_arrival_lag_excess_seconds", "above": "lag",
                               "steps": "ctl_aligned_steps", "min_steps": "min_steps"},
    "EW-9-early-stop-test": {"measure": "ctl_step_missing_ratio", "above": "share"},
    "EW-3-bytes-skew-test": {"measure": "ctl_collective_bytes_dev_ratio", "above": "dev", "abs": True},
}


def offline_controller(**over: Any) -> "Controller":
    """A controller driven by hand, no NATS: summaries handed to ``_on_summary``, ticks by
    ``evaluate_due``; its KV state and JetStream publications kept in memory. Summary times are
    invented, so the clock check against this machine's clock is off (``max_clock_skew`` 0)."""
    from skewd.controller.service import Controller
    from skewd.lab.harness import CaptureJetStream, MemoryState

    cfg = load_config(None, env={}, overrides={"cluster": "c1", "warmup": "2s", "rules": [RULES],
                                              "ingest": {"max_clock_skew": "0s"}, **over})
    ctl = Controller(cfg, wall_clock=lambda: 0.0)
    ctl.state = MemoryState(cfg.cluster)
    ctl.js = CaptureJetStream()
    return ctl


def arrival_order(rng: random.Random, seconds: int, nodes: Sequence[str],
                  make: Callable[[int, str], Any]) -> list:
    """Second by second, each node's message ``make(second, node)`` (None: the node is silent
    that second) in arrival order, and None for an evaluation after each second: a message is
    sometimes sent twice, a second's messages arrive shuffled, and one is sometimes held back
    a second."""
    out: list = []
    for i in range(seconds):
        batch = []
        for node in nodes:
            m = make(i, node)
            if m is None:
                continue
            batch.append(m)
            if rng.random() < 0.03:
                batch.append(m)  # sent twice
        rng.shuffle(batch)
        if out and rng.random() < 0.1:  # one summary held back a second
            out.insert(len(out) - rng.randint(1, 5), batch.pop())
        out.extend(batch)
        out.append(None)  # an evaluation
    return out


def config(url: str, cluster: str, **over: Any) -> ControllerConfig:
    base: dict[str, Any] = {
        "cluster": cluster, "nats": {"servers": url, "reconnect_time_wait": 0.2}, "rules": [RULES],
        "warmup": "3s", "alignment": {"window": "4s"},
        "correlation": {"group_wait": "8s", "effect_window": "10s", "culprit_evidence": CULPRIT_EVIDENCE},
        "consumer": {"ack_wait": "2s"},
        "topology": {"tp_groups": {"tp0": {"nodes": ["n0", "n1", "n2", "n3"], "model": "m1", "engine": "n0/engine0"}},
                     "models": {"m1": {"max_num_seqs": 256, "max_model_len": 8192}}},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return load_config(None, env={}, overrides=base)


def config_yaml(cfg_over: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(cfg_over, sort_keys=False)


async def play(nc: Any, g: ScriptedGroup, start: int, stop: int, *, victims_at: int | None = 12,
               pace: float = 0.03) -> None:
    """Publish intervals [start, stop) of the scripted group: summaries for every node, the
    front end's phase record, and at ``victims_at`` the findings a real agent would raise:
    GPU-8 (throughput erosion) on the waiting peers, PCIE-1 (H2D starvation) on the straggler."""
    js = nc.jetstream()
    for i in range(start, stop):
        for n in g.nodes:
            await nc.publish(wire.summary_subject(g.cluster, n), g.summary(i, n))
        await nc.publish(wire.phase_subject(g.cluster, "n0", "engine0"), g.phase(i))
        if victims_at is not None and i == victims_at:
            await publish_victims(js, g, i)
        await nc.flush()
        await asyncio.sleep(pace)


async def publish_victims(js: Any, g: ScriptedGroup, i: int) -> None:
    """The findings real agents raise at interval ``i`` of a straggling group: GPU-8 (throughput
    erosion) on the waiting peers, PCIE-1 (H2D starvation) on the straggler - what corroborates
    an incubating culprit claim (controller/correlator.py)."""
    for n in g.nodes:
        if n == g.late_node:
            await publish_finding(js, finding(n, "PCIE-1-test", "PCIE-1", Layer.PCIE, g.t0 + i,
                                              cluster=g.cluster, entity="0000:3b:00.0"))
        else:
            await publish_finding(js, finding(n, "GPU-8-test", "GPU-8", Layer.ENGINE, g.t0 + i,
                                              cluster=g.cluster, entity="engine0"))


async def stored(url: str, stream: str, subject: str, timeout: float = 3.0) -> list[Any]:
    """Every message stored on ``subject`` (raw nats messages, stream order)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        sub = await js.pull_subscribe(subject, durable=None, stream=stream,
                                      config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                                                            inactive_threshold=10.0))
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(256, timeout=0.3)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):  # nats-py raises the bare one when the deadline ran out between its two requests
                break
            out.extend(msgs)
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
        return out
    finally:
        await nc.close()


async def remaps(url: str, cluster: str) -> list[M.RemapSuggestion]:
    return [M.decode(m.data, M.Kind.REMAP) for m in await stored(url, wire.REMAPS_STREAM.name,
                                                                 wire.remap_subject(cluster))]  # type: ignore[misc]


async def incidents(url: str, cluster: str) -> list[M.Incident]:
    return [M.decode(m.data, M.Kind.INCIDENT) for m in await stored(url, M.INCIDENTS_STREAM.name,
                                                                    M.incident_subject(cluster))]  # type: ignore[misc]


async def wait_for(pred, timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = await pred()
        if v:
            return v
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def dumps(x: Any) -> str:
    return json.dumps(x, indent=1, default=str)[:4000]


class Heartbeats:
    """Scripted agents' summaries at the wall clock's pace (what live agents send every
    interval, stamped with the real time: the controller checks it against its own clock).
    ``live`` is the set of nodes that keep talking; remove one to make it fall silent."""

    def __init__(self, nc: Any, cluster: str, nodes: tuple[str, ...] = ("n0", "n1", "n2", "n3"),
                 every: float = 0.25) -> None:
        self.nc, self.every = nc, every
        self.group = ScriptedGroup(nodes=nodes, cluster=cluster, late_s=0.0, t0=float(int(time.time())) - 1)
        self.live = set(nodes)
        self.sent: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    async def beat(self) -> None:
        """Publish every live node's summaries up to the current second, once each."""
        g = self.group
        now_i = int(time.time() - g.t0)
        for n in sorted(self.live):
            for i in range(self.sent.get(n, now_i - 1) + 1, now_i + 1):
                await self.nc.publish(wire.summary_subject(g.cluster, n), g.summary(i, n))
                self.sent[n] = i
        await self.nc.flush()

    async def _run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self.every)

    def start(self) -> "Heartbeats":
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the connection may be closed
                pass
            self._task = None


def same_store_and_timelines(a: Any, b: Any) -> None:
    """Two controllers hold the same window store (blocks, entities in id order, times and
    values bit for bit) and engine timelines (every engine's and node's points, TTFT, ITL)."""
    assert sorted(a.store.blocks) == sorted(b.store.blocks)
    for sig, per in a.store.blocks.items():
        assert sorted(per) == sorted(b.store.blocks[sig])
        assert list(a.store.entities(sig)) == list(b.store.entities(sig))
        for node, blk in per.items():
            other = b.store.blocks[sig][node]
            assert blk.rows == other.rows, (sig, node)
            ta, va = a.store.series(sig, node)
            tb, vb = b.store.series(sig, node)
            assert ta.tobytes() == tb.tobytes() and va.tobytes() == vb.tobytes(), (sig, node)
    assert sorted(a.timelines.engines) == sorted(b.timelines.engines)
    for key, tl in a.timelines.engines.items():
        other = b.timelines.engines[key]
        assert tl.source == other.source
        assert list(tl.points) == list(other.points), key
        assert list(tl.ttft) == list(other.ttft) and list(tl.itl) == list(other.itl), key
