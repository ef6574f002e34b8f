"""PCIe injectors (PCIE-1 … PCIE-10): host-to-device feeds and returns, links, pinned memory,
registration churn and the host CPU that drives them.
"""
from __future__ import annotations

import numpy as np

from .base import GpuTarget, Injector, rdma_nodes, serving


class PCIE1(GpuTarget):
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


class PCIE2(GpuTarget):
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
        return serving(c)

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


class PCIE4(GpuTarget):
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


class PCIE5(GpuTarget):
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


class PCIE6(GpuTarget):
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


class PCIE7(GpuTarget):
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
        return serving(c)

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
        return rdma_nodes(c)

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


class PCIE10(GpuTarget):
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
