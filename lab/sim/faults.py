"""Fault injectors: one per pathology ID of docs/pathologies.md, each with its ground truth.

Every injector models its pathology the way the runbooks describe it (red flag, likely causes)
with natural variability: each declares *variants* (the causes the runbook lists), a natural
*severity* range (mild cases included: a mild case is part of reality, and it may be missed),
and draws timing, magnitude, culprit and variant from the run's seed. Injectors act at three
points of an interval: on the engine (request rate, step time, stall), on the RDMA traffic
(late, resized, missing or slowed bursts), and on the node's true state (GPU, PCIe, NIC, host).
They never look at rules: what a rule needs is not what an injector does.

``detectable`` on the ground truth says when a pathology's defining signal is not catalogued by
any collector (it is then still injected through its side effects, and reported as such).
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from .node import NodeState
from .qdisc import QueueTruth
from .scenario import FaultSpec, Scenario
from .simulator import GroundTruth, NodeTraffic, RepTraffic
from .topology import Cluster, Node
from .workload import Effects


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


def _serving(c: Cluster) -> list[str]:
    return [n.name for n in c.nodes if n.engines]


def _rdma_nodes(c: Cluster) -> list[str]:
    out = []
    for r in c.replicas:
        if len(r.nodes) > 1 or r.role != "mixed":
            out += [c.nodes[n].name for n in r.nodes]
    return sorted(set(out), key=lambda x: c.node_names.index(x))


def _cross_tp_nodes(c: Cluster) -> list[str]:
    return sorted({c.nodes[n].name for r in c.replicas for st in r.stages if len(st) > 1 for n in st},
                  key=lambda x: c.node_names.index(x))


def _add_net(st: NodeState, dev: str, **inc: float) -> None:
    for k, v in inc.items():
        st.net[dev][k] = st.net[dev].get(k, 0.0) + v


def _add_rdma(st: NodeState, port: int, **inc: float) -> None:
    for k, v in inc.items():
        st.rdma[port][k] = st.rdma[port].get(k, 0.0) + v


def _retransmit(st: NodeState, sel: np.ndarray, rng: np.random.Generator, delay: tuple[float, float]) -> int:
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


def _egress_mask(st: NodeState, sim, ni: int) -> np.ndarray:
    eg = np.array(sim.nodes[ni].flows.egress, bool)
    return eg[st.fe_flow] if len(st.fe_flow) else np.zeros(0, bool)


# ================================================================================================
# North-south
# ================================================================================================

class NS1(Injector):
    """Burst admission backlog: clients send in bursts (front-end batching, a spiky client); the
    engine queue builds after each burst; with a short rx ring the NIC also misses packets."""

    id = "NS-1"
    target = "nic"
    variants = ("client_spike", "frontend_batching", "short_rx_ring")
    params = {"period_s": 0.0}
    severity = (0.3, 1.0)

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.period = self.p["period_s"] or float(self.rng.uniform(8, 30))
        self.share = self.lerp(0.35, 0.9)
        self.mult = self.lerp(1.1, 1.9)
        self.base: float | None = None

    def on_engine(self, t0, t1, effs):
        for rid in [r.id for r in self.c.replicas if r.engine_node == self.ni]:
            e = effs[rid]
            e.burst = (self.period if self.variant != "frontend_batching" else self.period / 3, self.share)
            e.rate_mult *= self.mult

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        ing = ~_egress_mask(st, sim, ni)
        pk = float(ing.sum())
        # ring overflow: the NIC drops what arrives faster than the host drains during a burst
        base = self.base if self.base is not None else pk
        self.base = 0.95 * base + 0.05 * pk
        if self.variant == "short_rx_ring" or self.s > 0.7:
            excess = max(0.0, pk - 2.5 * max(base, 50.0))
            if excess > 0:
                miss = float(self.rng.poisson(excess * self.lerp(0.01, 0.08)))
                _add_net(st, self.node.front, rx_missed=miss, rx_dropped=miss * 0.1)


class NS2(Injector):
    """Ingress starvation: the load balancer hashes few sessions to this node (or the upstream
    path is jittery): it gets far less traffic than its peers, with long gaps."""

    id = "NS-2"
    target = "nic"
    variants = ("lb_hashing", "upstream_jitter")
    severity = (0.3, 1.0)

    @classmethod
    def unsupported(cls, c):
        if len(_serving(c)) < 3:
            return "needs at least three serving nodes to compare with"
        return super().unsupported(c)

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.keep = self.lerp(0.6, 0.08)

    def on_engine(self, t0, t1, effs):
        mine = [r.id for r in self.c.replicas if r.engine_node == self.ni]
        others = [r.id for r in self.c.replicas if r.engine_node != self.ni and r.role != "decode"]
        lost = (1 - self.keep) * len(mine)
        for rid in mine:
            effs[rid].rate_mult *= self.keep
            if self.variant == "upstream_jitter":
                effs[rid].burst = (float(self.rng.uniform(3, 8)), 0.95)
        for rid in others:  # the load went to the peers
            effs[rid].rate_mult *= 1 + lost / max(1, len(others))


class NS3(Injector):
    """Flow skew: session affinity or stream multiplexing puts most requests on a few
    connections of the serving port."""

    id = "NS-3"
    target = "nic"
    variants = ("session_affinity", "stream_imbalance")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.k = max(1, int(round(self.lerp(4, 1))))
        self.hot = self.lerp(0.4, 0.95)

    def on_engine(self, t0, t1, effs):
        for r in self.c.replicas:
            if r.engine_node == self.ni:
                if self.variant == "session_affinity":
                    effs[r.id].sticky_conns = self.k
                else:
                    effs[r.id].hot_share = self.hot


class NS4(Injector):
    """Ingress drop / retransmit: requests arrive retransmitted (loss upstream, MTU mismatch)
    and/or the NIC drops or rejects received frames (cabling, optics)."""

    id = "NS-4"
    target = "nic"
    variants = ("link_errors", "mtu_mismatch", "upstream_congestion")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.loss = self.lerp(0.005, 0.12)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        ing = ~_egress_mask(st, sim, ni)
        pk = float(ing.sum())
        data = ing & (st.fe_wl > 66)
        if self.variant == "mtu_mismatch":
            data &= st.fe_wl > 1200  # full-size segments are the ones that do not fit
        lost = data & (self.rng.random(len(data)) < self.loss)
        n = _retransmit(st, lost, self.rng, (0.2, 0.6))
        dev = self.node.front
        if self.variant == "link_errors":
            bad = float(self.rng.poisson(pk * self.loss * 0.5 + self.lerp(0.5, 8)))
            _add_net(st, dev, rx_errors=bad, rx_crc_errors=bad, rx_dropped=float(self.rng.poisson(bad * 0.3)))
        elif self.variant == "mtu_mismatch":
            big = float(self.rng.poisson(n + self.lerp(0.3, 4)))
            _add_net(st, dev, rx_length_errors=big, rx_errors=big, rx_dropped=big)
        st.tcp["in_segs"] += n


class NS5(Injector):
    """Egress backlog: responses pile up in the NIC/qdisc queue (CPU copy bottleneck, shaping,
    tx buffer exhaustion); tokens leave late. Lock-step: the engine's responses of each step
    arrive at the queue together, which then drains at the starved rate until empty or the next
    step (the real lab's tbf-shaped rank port: full during each step's burst, empty in between)."""

    id = "NS-5"
    target = "nic"
    variants = ("cpu_copy", "shaping", "tx_buffer_exhaustion")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.backlog = self.lerp(4e4, 4e6)
        self.drain = max(1e6, self.lerp(3e8, 3e7))  # bytes/s the queue drains at
        self.period = float(self.rng.uniform(0.02, 0.1))  # step period, as real clusters vary it

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        dev = self.node.front
        r = self.ramp(t0, 20.0)
        b = self.backlog * r * float(self.rng.lognormal(0, 0.35))
        q = st.qdisc[dev]
        st.queue[dev] = QueueTruth(peak=b, drain=self.drain, period=self.period,
                                   packet=float(self.rng.uniform(250, 900)))
        if self.variant == "shaping":
            st.shaped[dev] = self.drain  # a tbf at the rate the queue drains at
            q["overlimits"] = q.get("overlimits", 0.0) + float(self.rng.poisson(200 + b / 2000))
        q["requeues"] = q.get("requeues", 0.0) + float(self.rng.poisson(5 + b / 1e4))
        # queueing delay on every egress packet: at most the peak over the drain rate
        eg = _egress_mask(st, sim, ni)
        delay = min(0.25, b / self.drain)
        st.fe_ts[eg] = st.fe_ts[eg] + int(delay * 1e9)


class NS6(Injector):
    """Egress jitter: the serving runtime's send path stalls now and then (scheduler variance,
    CPU/NIC IRQ contention), so token packets leave in clumps."""

    id = "NS-6"
    target = "nic"
    variants = ("scheduler_variance", "irq_contention")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.rate = self.lerp(2.0, 12.0)  # stalls per second
        self.mean = self.lerp(0.006, 0.05)  # mean stall length

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        eg = _egress_mask(st, sim, ni)
        if not eg.any():
            return
        k = int(self.rng.poisson(self.rate))
        if not k:
            return
        s0 = np.sort(t0 + self.rng.random(k))
        d = self.rng.exponential(self.mean, k)
        ts = st.fe_ts[eg] / 1e9
        for a, b in zip(s0, s0 + d):  # packets due inside a stall leave when it ends
            hit = (ts >= a) & (ts < b)
            ts[hit] = b + self.rng.uniform(0, 2e-4, int(hit.sum()))
        st.fe_ts[eg] = np.round(ts * 1e9).astype(np.int64)
        if self.variant == "irq_contention":
            irq = np.arange(max(0, st.cpu.shape[0] - 8), st.cpu.shape[0])
            extra = self.lerp(0.05, 0.4)
            st.cpu[irq, 3] += extra
            st.cpu[irq, 6] = np.maximum(0, st.cpu[irq, 6] - extra)
            st.softirq_rx[irq] += self.rng.poisson(2000 * self.s, len(irq))


class NS7(Injector):
    """Egress drop / retransmit: the egress path drops response packets (a short qdisc limit, a
    driver/offload problem); TCP retransmits them."""

    id = "NS-7"
    target = "nic"
    variants = ("qdisc_drops", "offload_misconfig")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.loss = self.lerp(0.002, 0.05)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        eg = _egress_mask(st, sim, ni) & (st.fe_wl > 66)
        lost = eg & (self.rng.random(len(eg)) < self.loss)
        n_lost = int(lost.sum())
        n = _retransmit(st, lost, self.rng, (0.03, 0.25))
        dev = self.node.front
        if self.variant == "qdisc_drops":
            st.qdisc[dev]["drops"] = st.qdisc[dev].get("drops", 0.0) + n_lost
            # a short queue (its limit) that each step's burst overflows and the link drains at once
            limit = float(self.rng.uniform(2e4, 6e4))
            st.queue[dev] = QueueTruth(peak=limit, drain=st.notes.get("front_speed", self.c.front_speed),
                                       period=0.05, packet=limit / float(self.rng.integers(20, 100)))
            # the dropped originals never reached the wire (nor the capture tap)
            keep = np.ones(len(st.fe_flow), bool)
            keep[np.flatnonzero(lost)] = False
            for k in ("fe_flow", "fe_ts", "fe_wl", "fe_rtx", "fe_fin"):
                setattr(st, k, getattr(st, k)[keep])
        else:
            _add_net(st, dev, tx_dropped=float(n_lost), tx_errors=float(self.rng.poisson(n_lost * 0.2)))
        st.tcp["retrans_segs"] += n
        st.tcp["out_segs"] -= 0


class NS8(Injector):
    """Early completion skew: response streams of a batch end far apart (early stops on short
    sequences next to long generations, with no remapping of the freed slots)."""

    id = "NS-8"
    target = "engine"
    variants = ("batch_early_stop", "length_variance")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.batch = int(round(self.lerp(12, 64)))
        self.period = float(self.rng.uniform(20, 60))

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "batch_early_stop":
            e.batch_client = (self.period, self.batch)
            e.lengths_bimodal = self.lerp(0.3, 0.7)
            e.conn_close = True
        else:
            e.output_sigma_add += self.lerp(0.4, 1.3)
            e.conn_close = self.s > 0.5


class NS9(Injector):
    """Link bandwidth saturation: a bulk transfer (checkpoint upload, model pull, remote KV
    offload) shares the front-end NIC and fills it; the egress queue grows."""

    id = "NS-9"
    target = "nic"
    # shaped_link: a tbf/htb on the front port at a fraction of the PHY (a rate limit, a QoS
    # class); the bulk transfer fills the shaper, not the link (netdev_qdisc_rate_bytes)
    variants = ("bulk_egress", "bulk_ingress", "undersized_link", "shaped_link")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.util = self.lerp(0.86, 0.99)
        self.speed = self.c.front_speed if self.variant != "undersized_link" else self.c.front_speed / 4
        if self.variant == "shaped_link":
            self.speed = self.c.front_speed * float(self.rng.uniform(0.02, 0.3))

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        dev = self.node.front
        dt = t1 - t0
        nb = self.speed * self.util * float(self.rng.uniform(0.97, 1.01)) * dt
        npk = nb / 9014  # jumbo frames
        egress = self.variant != "bulk_ingress"
        # a full link keeps a standing queue: it never drains within a burst's period (the
        # sawtooth of .qdisc between 30 % and 100 % of its peak)
        if egress:
            _add_net(st, dev, tx_bytes=nb, tx_packets=npk)
            peak = float(self.rng.uniform(2e5, 3e6) * self.s)
            st.queue[dev] = QueueTruth(peak=peak, drain=self.speed, period=0.7 * peak / self.speed, packet=9000)
            st.qdisc[dev]["requeues"] += float(self.rng.poisson(50))
        else:
            _add_net(st, dev, rx_bytes=nb, rx_packets=npk)
            peak = float(self.rng.uniform(1e4, 2e5) * self.s)  # the ACKs of the incoming bulk flow
            st.queue[dev] = QueueTruth(peak=peak, drain=self.speed, period=0.7 * peak / self.speed, packet=1500)
        if self.variant == "shaped_link":
            st.shaped[dev] = self.speed
        st.bulk.append({"name": (f"tcp {self.node.front_ip}:50010>10.2.0.9:443" if egress
                                 else f"tcp 10.2.0.9:443>{self.node.front_ip}:50010"),
                        "egress": egress, "bytes": nb, "packets": npk})
        if self.variant == "undersized_link":
            st.notes["front_speed"] = self.speed


# ================================================================================================
# PCIe
# ================================================================================================

class _GpuTarget(Injector):
    target = "gpu"

    def step_slow(self, effs: dict[int, Effects], mult: float) -> None:
        rid = self.gpu_replica()
        if rid is not None:
            effs[rid].step_mult *= mult


class PCIE1(_GpuTarget):
    """H2D starvation: the GPU's host-to-device feed arrives in clustered bursts with long gaps
    (pageable buffers, a NUMA miss) or through a link running below its width; the GPU idles."""

    id = "PCIE-1"
    variants = ("pageable_buffers", "numa_miss", "link_capped")

    def setup(self):
        self.util_k = self.lerp(0.75, 0.2)
        self.period = float(self.rng.uniform(1.5, 6.0))
        self.width = int(self.rng.choice([4, 8]))

    def on_engine(self, t0, t1, effs):
        self.step_slow(effs, 1 + 0.5 * self.s)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.gi
        st.util[g] *= self.util_k
        st.power[g] = self.c.gpu.power_idle + (st.power[g] - self.c.gpu.power_idle) * self.util_k
        if self.variant == "link_capped":
            st.pcie_width[g] = self.width
            st.pci_width[self.node.gpu_pci[g]] = self.width
            st.pcie_rx[g] *= self.width / 16
        else:
            st.pcie_rx[g] *= self.lerp(1.0, 1.6)  # the same data, in staged clumps
            st.pcie_duty[g] = self.lerp(0.15, 0.04)
            st.pcie_period[g] = self.period
            if self.variant == "numa_miss":
                st.pcie_rx[g] *= 0.7


class PCIE2(_GpuTarget):
    """D2H return bottleneck: device-to-host traffic stays high while compute has stopped
    (results or KV write-back drain through a saturated or IOMMU-bound path)."""

    id = "PCIE-2"
    variants = ("iommu_contention", "kv_writeback_backlog")

    def setup(self):
        self.tx = self.lerp(2.2e9, 9e9)
        self.util_k = self.lerp(0.6, 0.12)

    def on_engine(self, t0, t1, effs):
        self.step_slow(effs, 1 + 0.8 * self.s)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        gs = [self.gi] if self.variant == "iommu_contention" else list(range(len(st.util)))
        for g in gs:
            st.pcie_tx[g] = max(st.pcie_tx[g], self.tx * float(self.rng.uniform(0.85, 1.15)))
            st.pcie_duty[g] = 0.9
            st.util[g] *= self.util_k
            st.power[g] = self.c.gpu.power_idle + (st.power[g] - self.c.gpu.power_idle) * (0.4 + 0.6 * self.util_k)

    @property
    def node_wide(self):  # noqa: D401 - the write-back variant hits every GPU of the node
        return self.variant == "kv_writeback_backlog"


class PCIE3(Injector):
    """Launch / control latency: many tiny kernels (no CUDA graphs) or a contended host core
    leave the GPUs idle between small transfers; the step rate falls."""

    id = "PCIE-3"
    target = "gpu"
    node_wide = True
    variants = ("eager_mode", "host_contention")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.idle = self.lerp(0.3, 0.75)

    def on_engine(self, t0, t1, effs):
        for rid in self.replicas_of_node():
            effs[rid].idle_share = max(effs[rid].idle_share, self.idle)
            if self.variant == "eager_mode":
                effs[rid].step_mult *= 1.3

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        C = st.cpu.shape[0]
        if self.variant == "host_contention":
            # another workload (a data loader, a co-scheduled job's threads) shares the runtime's
            # cores - they are not isolated - so the thread that launches the kernels waits for
            # its core between launches. The contention sits on the API server, the engine core
            # and a few neighbours; the rest of the host has room (a host saturated across its
            # cores is PCIE-8, the host CPU bottleneck)
            G = len(st.util)
            cores = np.arange(min(C - 1, G), min(C, G + int(round(self.lerp(3, 10)))))
            k = len(cores)
            st.cpu[cores, 0] = 0.9 + 0.05 * self.rng.random(k)
            st.cpu[cores, 1] = 0.05
            st.cpu[cores, 6] = np.maximum(0.0, 1 - st.cpu[cores, :6].sum(1))
            st.procs_running += k * 1.3
        else:
            eng = min(C - 1, len(st.util) + 1)  # the engine core spins launching kernels
            st.cpu[eng, 0] = 0.97
            st.cpu[eng, 6] = 0.0


class PCIE4(_GpuTarget):
    """Intra-node GPU skew: one GPU gets far less work than its node peers, steadily (an uneven
    split of requests across the node's replicas) or in uneven lumps (uneven microbatches: the
    router hands this GPU's replica a thin share on average that swings from second to second),
    so its PCIe feed is thin or irregular while its peers' is steady. The runbook's other cause, a
    throttled GPU, is GPU-5's scenario. A GPU that idles while it holds work, fed in clumps from
    the host (pageable buffers, a NUMA miss), is H2D starvation: PCIE-1's scenario."""

    id = "PCIE-4"
    variants = ("uneven_split", "uneven_microbatches")

    @classmethod
    def unsupported(cls, c):
        if not any(len([r for r in c.replicas if r.engine_node == n.index]) > 1 for n in c.nodes):
            return "needs nodes running several replicas (one per GPU or GPU group), e.g. shape pergpu"
        return super().unsupported(c)

    def setup(self):
        self.keep = self.lerp(0.6, 0.08)

    def on_engine(self, t0, t1, effs):
        rid = self.gpu_replica()
        if rid is None:
            return
        if self.variant == "uneven_split":
            effs[rid].rate_mult *= self.keep
        else:
            # each second's share drawn around the thin mean: many near-empty seconds, a few lumps
            effs[rid].rate_mult *= self.keep * float(self.rng.gamma(0.5, 2.0))


class PCIE5(_GpuTarget):
    """PCIe link saturation: sustained near-peak throughput (KV offload/onload storms, weight
    swaps) or ordinary traffic on a downtrained link; periodic stalls."""

    id = "PCIE-5"
    variants = ("offload_storm", "downtrained_link")

    def setup(self):
        self.util = self.lerp(0.78, 0.93)  # of the raw link rate: ~0.9 is what a link really carries
        self.width = int(self.rng.choice([4, 8]))
        self.dir_rx = bool(self.rng.random() < 0.6)

    def on_engine(self, t0, t1, effs):
        self.step_slow(effs, 1 + 0.3 * self.s)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.gi
        width = st.pcie_width[g]
        if self.variant == "downtrained_link":
            width = self.width
            st.pcie_width[g] = width
            st.pci_width[self.node.gpu_pci[g]] = width
        cap = width * 0.9846e9 * 2 ** (self.c.gpu.pcie_gen - 3)
        v = cap * self.util * float(self.rng.uniform(0.96, 1.02))
        if self.dir_rx:
            st.pcie_rx[g] = v
        else:
            st.pcie_tx[g] = v
        st.pcie_duty[g] = 0.97
        if self.rng.random() < 0.15:  # a stall: the copy engines back off
            st.util[g] *= 0.6


class PCIE6(_GpuTarget):
    """P2P throttling over PCIe: NVLink links of a GPU are down, so its peer traffic falls back
    to PCIe through a shared uplink: slow and variable transfers during collectives."""

    id = "PCIE-6"
    variants = ("nvlink_links_down", "nvlink_all_down")

    @classmethod
    def unsupported(cls, c):
        if c.tp < 2:
            return "needs tensor parallelism inside a node (peer-to-peer traffic)"
        return super().unsupported(c)

    def setup(self):
        L = max(1, self.c.gpu.nvlink_links)
        self.down = L if self.variant == "nvlink_all_down" else max(1, int(round(self.lerp(1, L - 1))))
        self.links = L

    def on_engine(self, t0, t1, effs):
        self.step_slow(effs, 1 + (0.1 + 0.9 * self.down / self.links) * self.lerp(0.3, 1.0))

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.gi
        if self.c.gpu.nvlink_links:
            st.nvlink_active[g] = self.links - self.down
        share = self.down / self.links
        p2p = self.lerp(3e9, 20e9) * share
        st.pcie_tx[g] += p2p * float(self.rng.lognormal(0, 0.6))
        st.pcie_rx[g] += p2p * float(self.rng.lognormal(0, 0.6))
        st.pcie_duty[g] = float(self.rng.uniform(0.1, 0.5))


class PCIE7(_GpuTarget):
    """Pinned-memory shortage: the pinned staging pool is too small, so host-to-device copies
    (here the KV tier's onloads) go as many small DMAs: the DPU sees small TLPs, throughput per
    byte moved drops and the GPU waits a little. Only a DPU vantage (DTS through the exporter)
    sees TLP sizes; on hosts without one only the side effects show."""

    id = "PCIE-7"
    variants = ("small_pinned_pool", "pageable_fallback")

    def setup(self):
        self.tlp = self.lerp(140, 40)
        self.onload = self.lerp(6e8, 4e9)  # bytes/s the KV tier moves back to the GPU

    def on_engine(self, t0, t1, effs):
        self.step_slow(effs, 1 + 0.15 * self.s)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.gi
        st.pcie_rx[g] += self.onload * float(self.rng.uniform(0.7, 1.3))
        st.tlp_bytes[g] = self.tlp * float(self.rng.uniform(0.85, 1.15))
        st.pcie_duty[g] = self.lerp(0.5, 0.85)  # small transfers spread over the whole step
        st.util[g] *= self.lerp(0.97, 0.85)


class PCIE8(Injector):
    """Host CPU bottleneck: the GPUs are under-fed although the links have room, because the
    host CPUs (or the cores taking the NIC/NVMe interrupts) are saturated."""

    id = "PCIE-8"
    target = "gpu"
    node_wide = True
    variants = ("cpu_saturation", "irq_affinity")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.idle = self.lerp(0.25, 0.7)

    def on_engine(self, t0, t1, effs):
        for rid in self.replicas_of_node():
            effs[rid].idle_share = max(effs[rid].idle_share, self.idle)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        C = st.cpu.shape[0]
        if self.variant == "cpu_saturation":
            k = int(C * self.lerp(0.9, 1.0))
            cores = self.rng.choice(C, k, replace=False)
            st.cpu[cores, 0] = 0.9 + 0.09 * self.rng.random(k)
            st.cpu[cores, 1] = 0.06 + 0.03 * self.rng.random(k)
            st.procs_running += k * 1.6
        else:
            # interrupts and softirq pinned onto the serving cores
            cores = np.arange(0, min(C, len(st.util) + 4))
            st.cpu[cores, 3] = self.lerp(0.3, 0.7)
            st.cpu[cores, 2] = 0.1
            st.cpu[cores, 0] = np.minimum(st.cpu[cores, 0], 1 - st.cpu[cores, 2] - st.cpu[cores, 3])
            st.softirq_rx[cores] += self.rng.poisson(30000 * self.s, len(cores))
        st.cpu[:, 6] = np.maximum(0.0, 1 - st.cpu[:, :6].sum(1))


class PCIE9(Injector):
    """Registration churn: short-lived buffers are registered and deregistered around every
    transfer, so the device's memory-region count swings from one sample to the next, RDMA
    transfers get choppier and kernel time rises."""

    id = "PCIE-9"
    target = "node"
    variants = ("short_lived_buffers", "per_request_registration")

    @classmethod
    def eligible_nodes(cls, c):
        return _rdma_nodes(c)

    def setup(self):
        self.swing = self.lerp(20, 800)  # regions registered at any instant, on top of the pool

    def on_engine(self, t0, t1, effs):
        for rid in self.replicas_of_node():
            effs[rid].step_mult *= 1 + 0.2 * self.s

    def on_traffic(self, t0, t1, rep, node):
        for p in range(len(self.node.rdma_ports)):
            node[self.ni].rate[p] = min(node[self.ni].rate.get(p, 1.0), self.lerp(0.85, 0.4))

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        for p in range(len(st.rdma_mrs)):
            st.rdma_mrs[p] += float(self.rng.poisson(self.swing * float(self.rng.uniform(0.1, 1.0))))
        st.cpu[:, 1] += self.lerp(0.02, 0.12)
        st.cpu[:, 6] = np.maximum(0.0, 1 - st.cpu[:, :6].sum(1))


class PCIE10(_GpuTarget):
    """Decode early-stop skew: during decode one GPU's replica runs out of sequences early
    (short generations, no rebalancing) and its device-to-host stream stops while peers go on."""

    id = "PCIE-10"
    variants = ("short_generations", "no_rebalancing")

    @classmethod
    def unsupported(cls, c):
        if not any(len([r for r in c.replicas if r.engine_node == n.index]) > 1 for n in c.nodes):
            return "needs nodes running several replicas (one per GPU or GPU group), e.g. shape pergpu"
        return super().unsupported(c)

    def on_engine(self, t0, t1, effs):
        rid = self.gpu_replica()
        if rid is None:
            return
        effs[rid].output_scale *= self.lerp(0.4, 0.05)
        if self.variant == "no_rebalancing":
            effs[rid].rate_mult *= self.lerp(0.7, 0.3)


# ================================================================================================
# East-west
# ================================================================================================

class EW1(Injector):
    """TP straggler: one node of a TP group reaches every collective late (skewed GPU load,
    PCIe starvation, memory pressure): its bursts start after its peers', the group waits."""

    id = "EW-1"
    variants = ("gpu_load_skew", "pcie_starvation", "memory_pressure")

    @classmethod
    def eligible_nodes(cls, c):
        return _cross_tp_nodes(c)

    def setup(self):
        self.delay = self.lerp(0.0008, 0.012)

    def on_engine(self, t0, t1, effs):
        for rid in self.replicas_of_node():
            effs[rid].step_add += self.delay

    def on_traffic(self, t0, t1, rep, node):
        for rid in self.replicas_of_node():
            rep[rid].delay[self.ni] = rep[rid].delay.get(self.ni, 0.0) + self.delay
            rep[rid].delay_jitter[self.ni] = self.delay * 0.25

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        if self.variant == "pcie_starvation":
            st.pcie_rx *= 0.6
            st.pcie_duty[:] = 0.2
        elif self.variant == "memory_pressure":
            st.procs_blocked += float(self.rng.poisson(3))
            st.cpu[:, 4] += 0.05
            st.cpu[:, 6] = np.maximum(0.0, 1 - st.cpu[:, :6].sum(1))


class EW2(Injector):
    """PP bubble: one pipeline stage takes longer than the others (stage imbalance, variable
    early exits), so the other stages idle between hand-offs and the gaps grow."""

    id = "EW-2"
    variants = ("stage_imbalance", "exit_variance")

    @classmethod
    def eligible_nodes(cls, c):
        return sorted({c.nodes[n].name for r in c.replicas if len(r.stages) > 1 and len(r.nodes) > 1
                       for n in r.nodes}, key=lambda x: c.node_names.index(x))

    def setup(self):
        self.w = self.lerp(1.2, 2.5)
        for r in self.c.replicas:
            for s, stg in enumerate(r.stages):
                if self.ni in stg:
                    self.rid, self.stage = r.id, s

    def culprit_nodes(self):
        r = self.c.replicas[self.rid]
        return [self.c.nodes[n].name for n in r.stages[self.stage]]

    def _w(self) -> float:
        if self.variant == "exit_variance":
            return 1 + (self.w - 1) * float(self.rng.uniform(0.2, 1.8))
        return self.w

    def on_engine(self, t0, t1, effs):
        self._cur = self._w()
        effs[self.rid].step_mult *= self._cur

    def on_traffic(self, t0, t1, rep, node):
        rep[self.rid].stage_weight[self.stage] = getattr(self, "_cur", self.w)


class EW3(Injector):
    """Cross-node load skew: one node's shard is larger (or smaller) than its peers', so it
    moves more (or fewer) bytes per collective."""

    id = "EW-3"
    variants = ("oversized_shard", "undersized_shard")

    @classmethod
    def eligible_nodes(cls, c):
        return _cross_tp_nodes(c)

    def setup(self):
        self.mult = self.lerp(1.25, 2.5) if self.variant == "oversized_shard" else self.lerp(0.8, 0.35)

    def on_engine(self, t0, t1, effs):
        if self.mult > 1:
            for rid in self.replicas_of_node():
                effs[rid].step_mult *= 1 + 0.15 * (self.mult - 1)

    def on_traffic(self, t0, t1, rep, node):
        for rid in self.replicas_of_node():
            rep[rid].bytes_mult[self.ni] = self.mult


class EW4(Injector):
    """Fabric congestion: an oversubscribed fabric or a hot ToR uplink: ECN marks, CNPs and
    transmit wait rise on many nodes at once and collective latency jumps around."""

    id = "EW-4"
    target = "fabric"
    node_wide = True
    variants = ("oversubscription", "hot_tor_link")

    @classmethod
    def eligible_nodes(cls, c):
        return _rdma_nodes(c)

    def setup(self):
        nodes = [self.c.node(n).index for n in _rdma_nodes(self.c)]
        if self.variant == "hot_tor_link" and len(nodes) > 2:
            k = int(self.rng.integers(2, len(nodes)))
            self.hit = sorted(self.rng.choice(nodes, k, replace=False).tolist())
            if self.ni not in self.hit:
                self.hit[0] = self.ni
                self.hit = sorted(set(self.hit))
        else:
            self.hit = nodes

    def culprit_nodes(self):
        return [self.c.nodes[i].name for i in self.hit]

    def on_engine(self, t0, t1, effs):
        for ni in self.hit:
            for rid in self.replicas_of_node(ni):
                effs[rid].step_add = max(effs[rid].step_add, self.lerp(0.0005, 0.006))

    def on_traffic(self, t0, t1, rep, node):
        for ni in self.hit:
            for rid in self.replicas_of_node(ni):
                rep[rid].delay_jitter[ni] = max(rep[rid].delay_jitter.get(ni, 0.0), self.lerp(0.0003, 0.004))
            for p in range(len(self.c.nodes[ni].rdma_ports)):
                node[ni].rate[p] = min(node[ni].rate.get(p, 1.0), self.lerp(0.85, 0.35))
                node[ni].ecn[p] = node[ni].ecn.get(p, 0.0) + self.lerp(2e3, 6e4)

    def on_node(self, t0, t1, ni, st, sim):
        if ni not in self.hit:
            return
        burst = float(self.rng.lognormal(0, 0.5))  # congestion comes and goes second to second
        for p in range(len(st.rdma)):
            ecn = float(self.rng.poisson(self.lerp(2e3, 6e4) * burst))
            _add_rdma(st, p, np_ecn_marked_roce_packets=ecn, np_cnp_sent=ecn * 0.35,
                      rp_cnp_handled=ecn * 0.35 * float(self.rng.uniform(0.8, 1.2)),
                      xmit_wait=float(self.rng.poisson(self.lerp(5e6, 2e8) * burst)))


class EW5(Injector):
    """Head-of-line blocking: some RDMA flows of a port stall (receive-queue exhaustion, RoCE
    queue imbalance) while others keep flowing; transmit wait rises."""

    id = "EW-5"
    target = "rdma_port"
    variants = ("queue_exhaustion", "roce_queue_imbalance")

    @classmethod
    def eligible_nodes(cls, c):
        return _rdma_nodes(c)

    def setup(self):
        self.share = self.lerp(0.25, 0.75)

    def on_engine(self, t0, t1, effs):
        for rid in self.replicas_of_node():
            effs[rid].step_add += self.lerp(0.0005, 0.005)

    def on_traffic(self, t0, t1, rep, node):
        node[self.ni].stall[self.port] = self.share

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        _add_rdma(st, self.port, xmit_wait=float(self.rng.poisson(self.lerp(2e6, 8e7))))
        if self.variant == "queue_exhaustion":
            _add_rdma(st, self.port, out_of_buffer=float(self.rng.poisson(self.lerp(20, 2000))))


class EW6(Injector):
    """Loss / retransmit storm on one port: bad optics (symbol errors), lossless config broken
    (drops without link errors), or a flapping link; RoCE retransmits and timeouts follow."""

    id = "EW-6"
    target = "rdma_port"
    variants = ("bad_optics", "pfc_misconfig", "link_flap")

    @classmethod
    def eligible_nodes(cls, c):
        return _rdma_nodes(c)

    def setup(self):
        self.rate = self.lerp(5, 800)  # lost packets per second
        self.flap_at = set(self.rng.choice(int(max(2, (self.end - self.onset))), size=3, replace=False).tolist())

    def on_engine(self, t0, t1, effs):
        for rid in self.replicas_of_node():
            effs[rid].step_add += self.lerp(0.0003, 0.004)

    def on_traffic(self, t0, t1, rep, node):
        node[self.ni].rtx[self.port] = node[self.ni].rtx.get(self.port, 0.0) + self.rate
        node[self.ni].rate[self.port] = min(node[self.ni].rate.get(self.port, 1.0), self.lerp(0.9, 0.5))

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        lost = float(self.rng.poisson(self.rate))
        p = self.port
        _add_rdma(st, p, out_of_sequence=float(self.rng.poisson(lost * 0.8)),
                  packet_seq_err=float(self.rng.poisson(lost * 0.3)),
                  roce_adp_retrans=float(self.rng.poisson(lost * 0.5)),
                  local_ack_timeout_err=float(self.rng.poisson(lost * 0.02)),
                  duplicate_request=float(self.rng.poisson(lost * 0.2)),
                  roce_slow_restart=float(self.rng.poisson(lost * 0.01)))
        if self.variant == "bad_optics":
            _add_rdma(st, p, symbol_error=float(self.rng.poisson(self.lerp(20, 3000))),
                      rcv_errors=float(self.rng.poisson(lost * 0.5)),
                      link_error_recovery=float(self.rng.poisson(0.05 + 0.2 * self.s)))
        elif self.variant == "link_flap":
            k = int(t0 - self.onset)
            if k in self.flap_at:
                _add_rdma(st, p, link_downed=1.0, link_error_recovery=1.0)
                st.rdma_active[p] = False
                st.carrier_inc[self.node.rdma_netdevs[p]] = 2.0
                st.oper_up[self.node.rdma_netdevs[p]] = False


class EW7(Injector):
    """Credit starvation: the port has data but no credit (small RDMA window, receiver not
    posting buffers): long waits with little data sent."""

    id = "EW-7"
    target = "rdma_port"
    variants = ("small_window", "receiver_not_ready")

    @classmethod
    def eligible_nodes(cls, c):
        return _rdma_nodes(c)

    def setup(self):
        self.rate = self.lerp(0.5, 0.08)

    def on_engine(self, t0, t1, effs):
        for rid in self.replicas_of_node():
            effs[rid].step_add += self.lerp(0.001, 0.01)

    def on_traffic(self, t0, t1, rep, node):
        node[self.ni].rate[self.port] = min(node[self.ni].rate.get(self.port, 1.0), self.rate)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        # transmit-wait ticks: most of the interval the port waits for credit
        _add_rdma(st, self.port, xmit_wait=float(self.rng.poisson(self.lerp(5e7, 6e8))))
        if self.variant == "receiver_not_ready":
            _add_rdma(st, self.port, rnr_nak_retry_err=float(self.rng.poisson(self.lerp(10, 800))))


class EW8(Injector):
    """KV-transfer bottleneck (disaggregated serving): KV shards too big for the link - long
    prompts, or transfers squeezed onto one NIC/QP - make large repeated bursts while other
    transfers wait; first tokens come late."""

    id = "EW-8"
    variants = ("oversized_kv", "single_path")

    @classmethod
    def unsupported(cls, c):
        if not any(r.role == "prefill" for r in c.replicas):
            return "needs disaggregated prefill/decode serving (shape disagg)"
        return super().unsupported(c)

    @classmethod
    def eligible_nodes(cls, c):
        return [c.nodes[r.engine_node].name for r in c.replicas if r.role == "prefill"]

    def setup(self):
        self.mult = self.lerp(2.0, 8.0)
        self.rate = self.lerp(0.4, 0.08)

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is not None and self.variant == "oversized_kv":
            effs[rid].prompt_scale *= self.mult

    def on_traffic(self, t0, t1, rep, node):
        rid = self.engine_replica()
        if rid is not None and self.variant == "single_path":
            rep[rid].kv_rate[self.ni] = self.rate


class EW9(Injector):
    """Early-stop skew across nodes: a node runs out of work part-way through (its sequences end
    early, its early exit is not masked) and goes quiet for whole steps while its peers send."""

    id = "EW-9"
    variants = ("length_divergence", "unmasked_early_exit")

    @classmethod
    def eligible_nodes(cls, c):
        return _cross_tp_nodes(c)

    def setup(self):
        self.skip = self.lerp(0.15, 0.8)

    def on_traffic(self, t0, t1, rep, node):
        for rid in self.replicas_of_node():
            sk = self.skip * (float(self.rng.uniform(0.5, 1.5)) if self.variant == "length_divergence" else 1.0)
            rep[rid].skip[self.ni] = min(0.98, sk)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        st.util *= 1 - 0.6 * self.skip
        st.power = self.c.gpu.power_idle + (st.power - self.c.gpu.power_idle) * (1 - 0.6 * self.skip)


# ================================================================================================
# GPU and engine
# ================================================================================================

class GPU1(Injector):
    """Squatter: GPUs hold their framebuffer (>95 %) but do no work for minutes - a dead engine's
    zombie process, an idle notebook, an engine drained of traffic but never released."""

    id = "GPU-1"
    target = "gpu"
    node_wide = True
    variants = ("zombie_process", "drained_engine", "idle_job")

    @classmethod
    def eligible_nodes(cls, c):
        return [c.nodes[r.engine_node].name for r in c.replicas if len(r.nodes) == 1 and r.role == "mixed"]

    def setup(self):
        self.mem = float(self.rng.uniform(0.955, 0.995))
        self.extra_w = self.lerp(20, 110)
        self.rids = [r.id for r in self.c.replicas if r.engine_node == self.ni and len(r.nodes) == 1]

    def on_engine(self, t0, t1, effs):
        for rid in self.rids:
            if self.variant == "drained_engine":
                effs[rid].rate_mult = 0.0
            else:
                effs[rid].serving = False

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.c.gpu
        gs = [k for rid in self.rids for (n, k) in self.c.replicas[rid].gpus]
        for k in gs:
            st.mem_used[k] = g.mem_total * self.mem
            st.util[k] = float(self.rng.choice([0.0, 0.0, 0.01, 0.02, 0.03]))
            st.power[k] = g.power_idle + self.extra_w * float(self.rng.uniform(0.9, 1.1))
            st.mem_util[k] = 0.0
        if self.variant == "idle_job":
            for rid in self.rids:
                st.vllm_up[self.c.replicas[rid].engine] = False


class GPU2(Injector):
    """KV saturation / queue instability: demand outgrows the KV cache (a traffic surge, long
    contexts, long generations): usage sits in the high nineties and the waiting queue grows."""

    id = "GPU-2"
    target = "engine"
    variants = ("traffic_surge", "long_context", "long_generations")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "traffic_surge":
            e.rate_mult *= self.lerp(1.6, 3.5)
        elif self.variant == "long_context":
            e.prompt_scale *= self.lerp(2.5, 6.0)
            e.rate_mult *= 1.2
        else:
            e.output_scale *= self.lerp(3.0, 8.0)
            e.rate_mult *= 1.3


class GPU3(Injector):
    """Engine stall: the engine stops stepping. A scheduler deadlock typically strikes when the
    KV cache has run full (no block can be freed or allocated): running drops to 0, the cache
    stays held and requests keep queueing. A hung collective freezes the engine core inside a
    step: the GPUs spin, and the front end keeps reporting the last stats it received."""

    id = "GPU-3"
    target = "engine"
    variants = ("scheduler_deadlock", "hung_collective")
    severity = (1.0, 1.0)

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.stalled = False
        self.max_fill = float(self.rng.uniform(30, 120))  # a deadlock can also strike before it is full

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "hung_collective":
            e.freeze = True
            return
        if not self.stalled:
            eng = self.sim.engines[rid]
            kv = eng._blocks(eng.run) / max(1, eng.capacity_blocks)
            if kv >= 0.97 or t0 - self.onset >= self.max_fill:
                self.stalled = True
            else:  # the surge that drives the cache full
                e.rate_mult *= 2.5
                e.prompt_scale *= 2.0
                return
        e.stall = True

    def on_node(self, t0, t1, ni, st, sim):
        rid = self.engine_replica()
        if rid is None or ni not in self.c.replicas[rid].nodes:
            return
        if self.variant == "scheduler_deadlock" and not self.stalled:
            return
        gs = [k for (n, k) in self.c.replicas[rid].gpus if n == ni]
        g = self.c.gpu
        for k in gs:
            if self.variant == "hung_collective":  # NCCL kernels spin: busy but no progress
                st.util[k] = 1.0
                st.power[k] = g.power_idle + 0.35 * (g.power_busy_decode - g.power_idle)
            else:
                st.util[k] = 0.0
                st.power[k] = g.power_idle * float(self.rng.uniform(1.0, 1.2))


class GPU4(Injector):
    """Preemption storm: sequences grow past what the KV cache holds (long generations, too many
    concurrent sequences), so the scheduler keeps preempting and recomputing them."""

    id = "GPU-4"
    target = "engine"
    variants = ("long_generations", "too_many_sequences")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "long_generations":
            e.output_scale *= self.lerp(6.0, 16.0)
            e.prompt_scale *= 1.5
            e.rate_mult *= 1.5
        else:
            e.prompt_scale *= self.lerp(3.0, 6.0)
            e.output_scale *= self.lerp(3.0, 6.0)
            e.rate_mult *= self.lerp(1.5, 3.0)


class GPU5(_GpuTarget):
    """Throttle skew: one GPU of a group runs slow for power or thermal reasons (cooling,
    a power brake, a lowered power cap) and reports why; its whole TP group waits for it."""

    id = "GPU-5"
    variants = ("hw_thermal", "power_brake", "sw_thermal", "power_cap")

    def setup(self):
        self.clock = {"hw_thermal": self.lerp(0.8, 0.45), "power_brake": self.lerp(0.6, 0.3),
                      "sw_thermal": self.lerp(0.93, 0.75), "power_cap": self.lerp(0.9, 0.6)}[self.variant]
        self.cycle = float(self.rng.uniform(15, 60)) if self.variant in ("hw_thermal", "sw_thermal") else 0.0

    def _on(self, t: float) -> bool:
        if not self.cycle:
            return True
        return ((t - self.onset) % self.cycle) < self.cycle * self.lerp(0.5, 0.9)

    def on_engine(self, t0, t1, effs):
        if self._on(t0):
            self.step_slow(effs, (1 / self.clock) ** 0.8)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.gi
        gp = self.c.gpu
        on = self._on(t0)
        if self.variant in ("hw_thermal", "sw_thermal"):
            st.temp_target[g] += self.lerp(25, 45) if self.variant == "hw_thermal" else self.lerp(18, 30)
        if not on:
            return
        st.clock[g] = gp.sm_clock_max * self.clock
        st.reasons[g] |= {"hw_thermal": 0x40 | 0x8, "power_brake": 0x80 | 0x8, "sw_thermal": 0x20,
                          "power_cap": 0x4}[self.variant]
        if self.variant == "power_cap":
            st.power_limit[g] = gp.power_limit * self.lerp(0.7, 0.45)
            st.power[g] = min(st.power[g], st.power_limit[g] * float(self.rng.uniform(0.97, 1.0)))
        else:
            st.power[g] *= self.clock ** 0.7


class GPU6(_GpuTarget):
    """Hardware fault signs: XID errors, PCIe replays and AER errors rising, a link trained to
    fewer lanes, or a GPU that falls off the bus."""

    id = "GPU-6"
    variants = ("xid_ecc", "replay_storm", "width_downtrain", "fell_off_bus")
    severity = (0.3, 1.0)

    def setup(self):
        self.width = int(self.rng.choice([4, 8]))
        n = max(1, int(round(self.lerp(1, 6))))
        span = max(2.0, self.end - self.onset)
        self.xid_at = sorted(self.onset + self.rng.uniform(0, span * 0.8, n)) if self.variant == "xid_ecc" else []
        self.codes = [int(self.rng.choice([48, 63, 64, 94, 95])) for _ in self.xid_at]

    def on_engine(self, t0, t1, effs):
        if self.variant == "fell_off_bus":
            rid = self.gpu_replica()
            if rid is not None:
                effs[rid].serving = False
        elif self.variant == "width_downtrain":
            self.step_slow(effs, 1.05)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.gi
        pci = self.node.gpu_pci[g]
        if self.variant == "xid_ecc":
            for ta, code in zip(self.xid_at, self.codes):
                if t0 <= ta < t1:
                    st.xid.append((g, code))
        elif self.variant == "replay_storm":
            r = float(self.rng.poisson(self.lerp(2, 400)))
            st.replay_inc[g] += r
            st.nvml_err_inc[g, 0] += r * 0.5
            st.recov_inc[g] += float(self.rng.poisson(0.02 + 0.1 * self.s))
            st.aer_inc[pci] = {"correctable_errors": r * 0.5, "bad_tlp": r * 0.3, "receiver_errors": r * 0.2,
                               "replay_timeout": r * 0.05}
        elif self.variant == "width_downtrain":
            st.pcie_width[g] = self.width
            st.pci_width[pci] = self.width
            st.replay_inc[g] += float(self.rng.poisson(0.5))
        else:
            if t0 - self.onset < 1.0:
                st.xid.append((g, 79))
            else:
                st.responding[g] = False


class GPU7(Injector):
    """Resource imbalance: a node's replica is bound by one resource while the others idle -
    memory-bound (long contexts, few sequences: KV full, compute and power low) or compute-bound
    (prefill-heavy: power high, KV empty) - unlike its peers."""

    id = "GPU-7"
    target = "engine"
    variants = ("memory_bound", "compute_bound")

    @classmethod
    def unsupported(cls, c):
        if len(_serving(c)) < 3:
            return "needs at least three serving nodes to compare with"
        return super().unsupported(c)

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "memory_bound":
            e.prompt_scale *= self.lerp(3.0, 8.0)
            e.output_scale *= self.lerp(2.0, 4.0)
            e.rate_mult *= self.lerp(0.5, 0.25)
        else:
            e.output_scale *= self.lerp(0.3, 0.05)
            e.prompt_scale *= self.lerp(1.5, 3.0)
            e.rate_mult *= self.lerp(1.5, 3.0)


class GPU8(Injector):
    """Throughput erosion: the engine generates fewer tokens per second while its running batch
    holds (creeping fragmentation, a noisy neighbour on the GPU, slow thermal creep)."""

    id = "GPU-8"
    target = "engine"
    variants = ("gradual_creep", "noisy_neighbour")

    @classmethod
    def eligible_nodes(cls, c):
        return _serving(c)

    def setup(self):
        self.mult = self.lerp(1.4, 3.5)
        self.tau = float(self.rng.uniform(60, 180))

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        if self.variant == "gradual_creep":
            m = 1 + (self.mult - 1) * self.ramp(t0, self.tau)
        else:
            m = 1 + (self.mult - 1) * float(self.rng.uniform(0.5, 1.5))
        effs[rid].step_mult *= m
        effs[rid].prefill_mult *= m


INJECTORS: dict[str, type[Injector]] = {cls.id: cls for cls in (
    NS1, NS2, NS3, NS4, NS5, NS6, NS7, NS8, NS9,
    PCIE1, PCIE2, PCIE3, PCIE4, PCIE5, PCIE6, PCIE7, PCIE8, PCIE9, PCIE10,
    EW1, EW2, EW3, EW4, EW5, EW6, EW7, EW8, EW9,
    GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7, GPU8,
)}


def make_injectors(scenario: Scenario, c: Cluster, rng: np.random.Generator, start: float) -> list[Injector]:
    return [INJECTORS[f.pathology](f, c, rng, start) for f in scenario.faults]
