"""Scripted agents for controller tests: one TP group whose nodes publish real wire summaries
(with ``collective_burst_starts``) and findings, and a vLLM front end publishing phase records.

Time starts at the test's own start (``t0``, whole seconds): the controller refuses summaries
further than ``ingest.max_clock_skew`` from its clock, as it would a node with a broken clock.
All values are invented for tests (NOTE: not measured on hardware): a 10 Hz collective step,
±0.3 ms jitter, one node starting its bursts 8 ms late from ``late_from`` on, per-node summary
ticks at different phases of the second, and PCIe/NIC rates in a plausible range.
"""
from __future__ import annotations

import json
import random
import time
import zlib
from dataclasses import dataclass, field

from skewd import wire
from skewd.controller import messages as M
from skewd.model import Finding, Layer, Scope, Severity, State

T0 = 1_700_000_000.0


@dataclass
class ScriptedGroup:
    nodes: tuple[str, ...] = ("n0", "n1", "n2", "n3")
    cluster: str = "simc"
    late_node: str = "n2"
    late_s: float = 0.008
    late_from: int = 2  # interval index from which the late node lags
    period: float = 0.1
    jitter: float = 0.0003
    clock_error: float = 0.0005
    seed: int = 7
    t0: float = field(default_factory=lambda: float(int(time.time())))
    labels: bool = False  # put topology labels in the summaries (agent-declared topology)
    # a node whose capture lists its bursts in only this share of the steps (it sends every one:
    # what an agent's burst list looks like when ACKs and control traffic split its steps)
    sparse_node: str = ""
    sparse_keep: float = 0.3
    tick_phase: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        for i, n in enumerate(self.nodes):
            self.tick_phase.setdefault(n, 0.05 * i)

    def tick(self, i: int, node: str) -> float:
        return self.t0 + i + self.tick_phase[node]

    def _bursts(self, node: str, lo: float, hi: float) -> list[float]:
        out = []
        k0 = int((lo - self.t0) // self.period) - 1
        for k in range(k0, k0 + int((hi - lo) / self.period) + 3):
            step = self.t0 + k * self.period
            idx = int((step - self.t0) // 1.0)
            lag = self.late_s if node == self.late_node and idx >= self.late_from else 0.0
            r = random.Random(zlib.crc32(f"{self.seed}:{node}:{k}".encode()))
            t = step + lag + r.uniform(-self.jitter, self.jitter)
            if node == self.sparse_node and r.random() > self.sparse_keep:
                continue
            if lo < t <= hi:
                out.append(t)
        return sorted(out)

    def summary(self, i: int, node: str) -> bytes:
        """The JSON a real agent would publish for interval ``i`` (plus optional labels)."""
        t = self.tick(i, node)
        starts = self._bursts(node, t - 1.0, t)
        late = node == self.late_node and i >= self.late_from
        sig = {
            "collective_burst_starts": {str(k): v for k, v in enumerate(starts)},
            "collective_burst_bytes": {str(k): 64e6 for k in range(len(starts))},
            "summary_pcie_rx_bytes_per_second": {"": 3.0e9 if late else 12.0e9},
            "summary_net_rx_bytes_per_second": {"": 1.0e9},
            "summary_rdma_xmit_bytes_per_second": {"": 6.4e8},
            "summary_rdma_xmit_wait_per_second": {"": 100.0},
            "summary_gpu_util_mean_ratio": {"": 0.55 if not late else 0.9},
            "summary_gpu_throttled": {"": 0.0},
            "summary_engine_phase": {"": 1.0},
            "summary_kv_cache_usage_ratio": {"": 0.62},
            "summary_requests_waiting": {"": float(2 + max(0, i - self.late_from))},
        }
        msg = wire.Summary(node=node, cluster=self.cluster, t=t, interval=1.0, signals=sig,
                           clock_sync=wire.ClockSync(True, self.clock_error), agent_version="test")
        d = wire.to_dict(msg)
        if self.labels:
            d["labels"] = {"tp_group": "tpL", "tp_rank": str(self.nodes.index(node)), "model": "m1"}
        return json.dumps(d).encode()

    def phase(self, i: int, engine_node: str = "n0", engine: str = "engine0") -> bytes:
        """A plugin phase record for interval ``i``: decode-heavy; TTFT/ITL grow once the group straggles."""
        t = self.t0 + i + 0.5
        slow = i >= self.late_from
        steps = [M.StepStat(t=t - 0.5 + k * 0.1, index=i * 5 + k, ctx_reqs=0 if k else 1, ctx_tokens=0 if k else 64,
                            gen_reqs=8, gen_tokens=8, elapsed_s=0.03 if slow else 0.02, running=8,
                            waiting=2 + max(0, i - self.late_from), kv_usage_ratio=0.62) for k in range(5)]
        rec = M.PhaseRecord(node=engine_node, cluster=self.cluster, engine=engine, model="m1", t_start=t - 0.5, t=t,
                            phase=M.Phase.DECODE, steps=steps, finished=[],
                            ttft_s=[0.4 if slow else 0.1], itl_count=40, itl_sum_s=40 * (0.035 if slow else 0.02),
                            itl_max_s=0.05, dropped={})
        return M.encode(rec)


def finding(node: str, rule_id: str, pathology: str, layer: Layer, t: float, cluster: str = "simc",
            entity: str = "", scope: Scope = Scope.NODE, state: State = State.FIRING,
            maturity: str = "stable", evidence: dict[str, float | None] | None = None) -> Finding:
    """A finding as an agent (or the controller) would send it; of a stable rule unless said."""
    return Finding(rule_id=rule_id, pathology=pathology, severity=Severity.WARNING, layer=layer, scope=scope,
                   node=node, entity=entity, state=state, active_at=t - 1.0, evaluated_at=t,
                   fired_at=t if state is State.FIRING else None,
                   evidence={"v": 1.0} if evidence is None else dict(evidence),
                   summary=f"{pathology} on {node}", cluster=cluster, maturity=maturity)


async def publish_finding(js, f: Finding) -> None:
    await js.publish(wire.subject_for(f), wire.encode(f), headers=wire.headers_for(f))
