"""What every fault injector shares: :class:`Injector` (placement from a scenario's fault spec, its
ground truth, the three hooks), the eligibility helpers and the edits of a node's true state
several injectors make. The injectors themselves are in one module per layer.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..spec import FaultSpec
from ..state import NodeState
from ..topology import Cluster, Node
from ..traffic import NodeTraffic, RepTraffic
from ..truth import GroundTruth
from ..workload import Effects


class Injector:
    id: ClassVar[str] = ""
    target: ClassVar[str] = "node"  # node | gpu | nic | rdma_port | engine | fabric
    variants: ClassVar[tuple[str, ...]] = ("default",)
    params: ClassVar[dict[str, float]] = {}
    severity: ClassVar[tuple[float, float]] = (0.3, 1.0)
    undetectable: ClassVar[str] = ""
    node_wide: ClassVar[bool] = False  # the culprit is the whole node even for gpu targets

    # -- what the cluster must offer -------------------------------------------------------------
    @classmethod
    def unsupported(cls, c: Cluster) -> str | None:
        if not cls.eligible_nodes(c):
            return "no node of this cluster can host it"
        return None

    @classmethod
    def eligible_nodes(cls, c: Cluster) -> list[str]:
        return c.node_names

    @classmethod
    def eligible_entities(cls, c: Cluster, n: Node) -> list[str]:
        return {"gpu": n.gpus, "nic": [n.front], "rdma_port": n.rdma_ports,
                "engine": n.engines}.get(cls.target, [""])

    # -- one placed instance -------------------------------------------------------------------
    def __init__(self, spec: FaultSpec, c: Cluster, rng: np.random.Generator, start: float) -> None:
        self.spec = spec
        self.c = c
        self.rng = rng
        self.onset = start + float(rng.uniform(*spec.onset))
        self.end = self.onset + float(rng.uniform(*spec.duration))
        self.s = float(rng.uniform(*spec.severity))
        self.variant = spec.variant if spec.variant != "any" else str(rng.choice(list(self.variants)))
        self.p = {**self.params, **spec.params}
        nodes = self.eligible_nodes(c)
        self.node_name = spec.node if spec.node != "any" else str(rng.choice(nodes))
        self.node = c.node(self.node_name)
        self.ni = self.node.index
        ents = self.eligible_entities(c, self.node)
        self.entity = spec.entity if spec.entity != "any" else (str(rng.choice(ents)) if ents else "")
        self.gi = self.node.gpus.index(self.entity) if self.entity in self.node.gpus else None
        self.port = self.node.rdma_ports.index(self.entity) if self.entity in self.node.rdma_ports else None
        self.setup()
        culprits = self.culprit_nodes()
        self.truth = GroundTruth(self.id, culprits, "" if self.node_wide else self.entity, self.onset, self.end,
                                 self.s, self.variant, dict(self.p), self.undetectable)

    def setup(self) -> None:
        """Draw the instance's fixed magnitudes (called once, after placement)."""

    def culprit_nodes(self) -> list[str]:
        return [self.node_name]

    def active(self, t: float) -> bool:
        return self.onset <= t < self.end

    def ramp(self, t: float, tau: float) -> float:
        return min(1.0, max(0.0, (t - self.onset) / tau)) if tau > 0 else 1.0

    def lerp(self, lo: float, hi: float) -> float:
        """The magnitude at this instance's severity: lo at 0, hi at 1."""
        return lo + (hi - lo) * self.s

    # helpers
    def replicas_of_node(self, ni: int | None = None) -> list[int]:
        ni = self.ni if ni is None else ni
        return [r.id for r in self.c.replicas if ni in r.nodes]

    def engine_replica(self) -> int | None:
        for r in self.c.replicas:
            if r.engine_node == self.ni and (self.target != "engine" or r.engine == self.entity):
                return r.id
        return None

    def gpu_replica(self) -> int | None:
        for r in self.c.replicas:
            if (self.ni, self.gi) in r.gpus:
                return r.id
        return None

    # hooks
    def on_engine(self, t0: float, t1: float, effs: dict[int, Effects]) -> None:
        pass

    def on_traffic(self, t0: float, t1: float, rep: dict[int, RepTraffic], node: dict[int, NodeTraffic]) -> None:
        pass

    def on_node(self, t0: float, t1: float, ni: int, st: NodeState, sim) -> None:
        pass


def serving(c: Cluster) -> list[str]:
    return [n.name for n in c.nodes if n.engines]


def rdma_nodes(c: Cluster) -> list[str]:
    out = []
    for r in c.replicas:
        if len(r.nodes) > 1 or r.role != "mixed":
            out += [c.nodes[n].name for n in r.nodes]
    return sorted(set(out), key=lambda x: c.node_names.index(x))


def cross_tp_nodes(c: Cluster) -> list[str]:
    return sorted({c.nodes[n].name for r in c.replicas for st in r.stages if len(st) > 1 for n in st},
                  key=lambda x: c.node_names.index(x))


def add_net(st: NodeState, dev: str, **inc: float) -> None:
    for k, v in inc.items():
        st.net[dev][k] = st.net[dev].get(k, 0.0) + v


def add_rdma(st: NodeState, port: int, **inc: float) -> None:
    for k, v in inc.items():
        st.rdma[port][k] = st.rdma[port].get(k, 0.0) + v


def retransmit(st: NodeState, sel: np.ndarray, rng: np.random.Generator, delay: tuple[float, float]) -> int:
    """Re-send the packets of mask ``sel`` later (TCP retransmission after RTO or dup-ACKs):
    the copies carry the retransmission flag; packets pushed past the interval are lost to it."""
    idx = np.flatnonzero(sel)
    if not len(idx):
        return 0
    t_new = st.fe_ts[idx] + (rng.uniform(*delay, len(idx)) * 1e9).astype(np.int64)
    keep = t_new < int(st.t1 * 1e9)
    idx, t_new = idx[keep], t_new[keep]
    st.fe_flow = np.r_[st.fe_flow, st.fe_flow[idx]]
    st.fe_ts = np.r_[st.fe_ts, t_new]
    st.fe_wl = np.r_[st.fe_wl, st.fe_wl[idx]]
    st.fe_rtx = np.r_[st.fe_rtx, np.ones(len(idx), bool)]
    st.fe_fin = np.r_[st.fe_fin, np.zeros(len(idx), bool)]
    return len(idx)


def egress_mask(st: NodeState, sim, ni: int) -> np.ndarray:
    eg = np.array(sim.nodes[ni].flows.egress, bool)
    return eg[st.fe_flow] if len(st.fe_flow) else np.zeros(0, bool)


# ================================================================================================
# North-south
# ================================================================================================

class GpuTarget(Injector):
    target = "gpu"

    def step_slow(self, effs: dict[int, Effects], mult: float) -> None:
        rid = self.gpu_replica()
        if rid is not None:
            effs[rid].step_mult *= mult
