"""North-south injectors (NS-1 … NS-9): the front-end NIC, its queues and the TCP traffic of
requests and responses.
"""
from __future__ import annotations

import numpy as np

from ..qdisc import QueueTruth

from .base import Injector, add_net, egress_mask, retransmit, serving


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
        return serving(c)

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
        ing = ~egress_mask(st, sim, ni)
        pk = float(ing.sum())
        # ring overflow: the NIC drops what arrives faster than the host drains during a burst
        base = self.base if self.base is not None else pk
        self.base = 0.95 * base + 0.05 * pk
        if self.variant == "short_rx_ring" or self.s > 0.7:
            excess = max(0.0, pk - 2.5 * max(base, 50.0))
            if excess > 0:
                miss = float(self.rng.poisson(excess * self.lerp(0.01, 0.08)))
                add_net(st, self.node.front, rx_missed=miss, rx_dropped=miss * 0.1)


class NS2(Injector):
    """Ingress starvation: the load balancer hashes few sessions to this node (or the upstream
    path is jittery): it gets far less traffic than its peers, with long gaps."""

    id = "NS-2"
    target = "nic"
    variants = ("lb_hashing", "upstream_jitter")
    severity = (0.3, 1.0)

    @classmethod
    def unsupported(cls, c):
        if len(serving(c)) < 3:
            return "needs at least three serving nodes to compare with"
        return super().unsupported(c)

    @classmethod
    def eligible_nodes(cls, c):
        return serving(c)

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
        return serving(c)

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
        return serving(c)

    def setup(self):
        self.loss = self.lerp(0.005, 0.12)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        ing = ~egress_mask(st, sim, ni)
        pk = float(ing.sum())
        data = ing & (st.fe_wl > 66)
        if self.variant == "mtu_mismatch":
            data &= st.fe_wl > 1200  # full-size segments are the ones that do not fit
        lost = data & (self.rng.random(len(data)) < self.loss)
        n = retransmit(st, lost, self.rng, (0.2, 0.6))
        dev = self.node.front
        if self.variant == "link_errors":
            bad = float(self.rng.poisson(pk * self.loss * 0.5 + self.lerp(0.5, 8)))
            add_net(st, dev, rx_errors=bad, rx_crc_errors=bad, rx_dropped=float(self.rng.poisson(bad * 0.3)))
        elif self.variant == "mtu_mismatch":
            big = float(self.rng.poisson(n + self.lerp(0.3, 4)))
            add_net(st, dev, rx_length_errors=big, rx_errors=big, rx_dropped=big)
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
        return serving(c)

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
        eg = egress_mask(st, sim, ni)
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
        return serving(c)

    def setup(self):
        self.rate = self.lerp(2.0, 12.0)  # stalls per second
        self.mean = self.lerp(0.006, 0.05)  # mean stall length

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        eg = egress_mask(st, sim, ni)
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
        return serving(c)

    def setup(self):
        self.loss = self.lerp(0.002, 0.05)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        eg = egress_mask(st, sim, ni) & (st.fe_wl > 66)
        lost = eg & (self.rng.random(len(eg)) < self.loss)
        n_lost = int(lost.sum())
        n = retransmit(st, lost, self.rng, (0.03, 0.25))
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
            add_net(st, dev, tx_dropped=float(n_lost), tx_errors=float(self.rng.poisson(n_lost * 0.2)))
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
        return serving(c)

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
        return serving(c)

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
            add_net(st, dev, tx_bytes=nb, tx_packets=npk)
            peak = float(self.rng.uniform(2e5, 3e6) * self.s)
            st.queue[dev] = QueueTruth(peak=peak, drain=self.speed, period=0.7 * peak / self.speed, packet=9000)
            st.qdisc[dev]["requeues"] += float(self.rng.poisson(50))
        else:
            add_net(st, dev, rx_bytes=nb, rx_packets=npk)
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
