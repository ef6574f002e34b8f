"""East-west injectors (EW-1 … EW-9): the collectives and transfers between the nodes of a TP/PP
group over the RDMA fabric.
"""
from __future__ import annotations

import numpy as np

from .base import Injector, add_rdma, cross_tp_nodes, rdma_nodes

#: tokens: the context window of today's 70B-class models (Llama 3.1 70B: 128k)
LONG_CONTEXT = 131072


class EW1(Injector):
    """TP straggler: one node of a TP group reaches every collective late (skewed GPU load,
    PCIe starvation, memory pressure): its bursts start after its peers', the group waits."""

    id = "EW-1"
    variants = ("gpu_load_skew", "pcie_starvation", "memory_pressure")

    @classmethod
    def eligible_nodes(cls, c):
        return cross_tp_nodes(c)

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
        return cross_tp_nodes(c)

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
        return rdma_nodes(c)

    def setup(self):
        nodes = [self.c.node(n).index for n in rdma_nodes(self.c)]
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
            add_rdma(st, p, np_ecn_marked_roce_packets=ecn, np_cnp_sent=ecn * 0.35,
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
        return rdma_nodes(c)

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
        add_rdma(st, self.port, xmit_wait=float(self.rng.poisson(self.lerp(2e6, 8e7))))
        if self.variant == "queue_exhaustion":
            add_rdma(st, self.port, out_of_buffer=float(self.rng.poisson(self.lerp(20, 2000))))


class EW6(Injector):
    """Loss / retransmit storm on one port: bad optics (symbol errors), lossless config broken
    (drops without link errors), or a flapping link; RoCE retransmits and timeouts follow."""

    id = "EW-6"
    target = "rdma_port"
    variants = ("bad_optics", "pfc_misconfig", "link_flap")

    @classmethod
    def eligible_nodes(cls, c):
        return rdma_nodes(c)

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
        add_rdma(st, p, out_of_sequence=float(self.rng.poisson(lost * 0.8)),
                  packet_seq_err=float(self.rng.poisson(lost * 0.3)),
                  roce_adp_retrans=float(self.rng.poisson(lost * 0.5)),
                  local_ack_timeout_err=float(self.rng.poisson(lost * 0.02)),
                  duplicate_request=float(self.rng.poisson(lost * 0.2)),
                  roce_slow_restart=float(self.rng.poisson(lost * 0.01)))
        if self.variant == "bad_optics":
            add_rdma(st, p, symbol_error=float(self.rng.poisson(self.lerp(20, 3000))),
                      rcv_errors=float(self.rng.poisson(lost * 0.5)),
                      link_error_recovery=float(self.rng.poisson(0.05 + 0.2 * self.s)))
        elif self.variant == "link_flap":
            k = int(t0 - self.onset)
            if k in self.flap_at:
                add_rdma(st, p, link_downed=1.0, link_error_recovery=1.0)
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
        return rdma_nodes(c)

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
        add_rdma(st, self.port, xmit_wait=float(self.rng.poisson(self.lerp(5e7, 6e8))))
        if self.variant == "receiver_not_ready":
            add_rdma(st, self.port, rnr_nak_retry_err=float(self.rng.poisson(self.lerp(10, 800))))


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
            # long prompts: longer ones than the healthy load's cap, or the cap clips the cause away
            # (every prompt above 32k tokens became 32k: the largest KV transfer stayed the healthy
            # one's, 10.5 GB in 65 ms over four 400G rails, and nothing was oversized). Up to the
            # model's context (128k tokens for a 70B: 42 GB, ~260 ms on those rails)
            effs[rid].prompt_scale *= self.mult
            effs[rid].prompt_cap = max(effs[rid].prompt_cap, LONG_CONTEXT)

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
        return cross_tp_nodes(c)

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
