"""How the fault lab measures a simulated node: the samples each collector would produce from its
true state (names, units, scopes, entities of the catalogues).

:class:`NodeMeasure` measures a :class:`~skewd.lab.sim.state.NodeState` the way the real
collectors do: counters accumulate from a random base, NVML PCIe throughput is a 20 ms window
sample in whole KB/s, /proc CPU time is in USER_HZ ticks, RDMA data counters count 4-byte words,
the vLLM quantiles come from bucket increases of genuine vLLM bucket bounds, and the ``pkt``
features from the packets themselves (:mod:`.pktfeat`). It is mixed into
:class:`~skewd.lab.sim.node.NodeSim`, which owns the counters and random streams it reads, so
the draws of a seeded run happen in the same order as ever.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from skewd.collectors.host.parse import NETSTAT
from skewd.collectors.vllm.parse import PhaseThresholds
from skewd.collectors.vllm.parse import phase as engine_phase
from skewd.model import SampleBatch

from . import pktfeat
from .qdisc import healthy_view, observe
from .state import NodeState, RoceFlow
from .topology import Cluster, Node
from .workload import HISTS

#: the host collector's /proc/net/netstat TCP counters, as keys of the node's TCP counter dict
TCP_EXT = tuple(sig[len("host_tcp_"):-len("_total")] for sig in NETSTAT.values() if sig.startswith("host_tcp_"))

# collector → phase of its collection inside the second (ms); each node adds its own offset
PHASE = {"gpu": 0.011, "pcie": 0.017, "netdev": 0.003, "rdma": 0.006, "host": 0.002, "vllm": 0.024, "pkt": 0.0}

HOST_MODES = ("user", "system", "irq", "softirq", "iowait", "steal", "idle", "busy")
RDMA_HW = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err", "out_of_buffer",
           "duplicate_request", "implied_nak_seq_err", "np_ecn_marked_roce_packets", "np_cnp_sent",
           "rp_cnp_handled", "rp_cnp_ignored", "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart",
           "req_transport_retries_exceeded", "req_rnr_retries_exceeded")
RDMA_ERR = ("xmit_discards", "rcv_errors", "rcv_remote_physical_errors", "symbol_error", "link_downed",
            "link_error_recovery", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
            "vl15_dropped", "xmit_constraint_errors", "rcv_constraint_errors", "rcv_switch_relay_errors")
NET_ERR = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_missed", "rx_length_errors", "rx_over_errors",
           "rx_crc_errors", "rx_frame_errors", "rx_fifo_errors", "tx_aborted_errors", "tx_carrier_errors",
           "tx_fifo_errors", "tx_heartbeat_errors", "tx_window_errors", "collisions")
AER = ("correctable_errors", "nonfatal_errors", "fatal_errors", "receiver_errors", "bad_tlp", "bad_dllp",
       "replay_rollover", "replay_timeout", "data_link_protocol_errors", "surprise_down_errors", "poisoned_tlp",
       "completion_timeout", "malformed_tlp")
REASON_BITS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80}
GEN_GTS = {1: 2.5e9, 2: 5e9, 3: 8e9, 4: 16e9, 5: 32e9, 6: 64e9}


class _Out:
    """Columnar batch assembly: whole arrays per (signal, timestamp), scalars batched too."""

    def __init__(self, node: str, only: set[str] | frozenset[str] | None = None) -> None:
        self.node = node
        self.only = only
        self.t: list[float] = []
        self.e: list[np.ndarray] = []
        self.s: list[str] = []
        self.v: list[np.ndarray] = []
        self.n: list[int] = []
        self.st: list[float] = []
        self.se: list[str] = []
        self.ss: list[str] = []
        self.sv: list[float] = []
        self.x: list[tuple[float, np.ndarray, str, str, np.ndarray]] = []  # see at()

    def add(self, t: float, entities: np.ndarray, name: str, values: np.ndarray) -> None:
        if self.only is not None and name not in self.only:
            return
        self.t.append(t)
        self.e.append(entities)
        self.s.append(name)
        self.v.append(np.asarray(values, dtype=float))
        self.n.append(len(entities))

    def one(self, t: float, entity: str, name: str, value: float) -> None:
        if self.only is not None and name not in self.only:
            return
        self.st.append(t)
        self.se.append(entity)
        self.ss.append(name)
        self.sv.append(value)

    def at(self, t: float, stamps: np.ndarray, entity: str, name: str, values: np.ndarray) -> None:
        """Samples with their own timestamps ``stamps`` in the batch of the collection at ``t``
        (after its other samples), as the pkt collector sends every ended burst."""
        if (self.only is not None and name not in self.only) or not len(stamps):
            return
        self.x.append((t, np.asarray(stamps, float), entity, name, np.asarray(values, float)))

    def build(self) -> list[SampleBatch]:
        """One batch per collection time, i.e. per collector, as the live agent ingests them."""
        lens = np.array(self.n, dtype=np.int64)
        sig = np.empty(len(self.s) + len(self.ss), dtype=object)
        sig[: len(self.s)] = self.s
        sig[len(self.s):] = self.ss
        ents = np.empty(len(self.se), dtype=object)
        ents[:] = self.se
        t = np.concatenate((np.repeat(np.array(self.t, dtype=float), lens), np.array(self.st, dtype=float)))
        s = np.concatenate((np.repeat(sig[: len(self.s)], lens), sig[len(self.s):]))
        e = np.concatenate(self.e + [ents]) if self.e else ents
        v = np.concatenate(self.v + [np.array(self.sv, dtype=float)])
        ok = ~np.isnan(v)
        if not ok.all():
            t, s, e, v = t[ok], s[ok], e[ok], v[ok]
        out = []
        for tt in sorted(set(self.t) | set(self.st)):
            m = t == tt
            if not m.any():
                continue
            bt, be, bs, bv = t[m], e[m].astype(object), s[m].astype(object), v[m]
            extra = [x for x in self.x if x[0] == tt]
            if extra:
                bt = np.concatenate([bt] + [x[1] for x in extra])
                be = np.concatenate([be] + [np.full(len(x[1]), x[2], dtype=object) for x in extra])
                bs = np.concatenate([bs] + [np.full(len(x[1]), x[3], dtype=object) for x in extra])
                bv = np.concatenate([bv] + [x[4] for x in extra])
            node = np.empty(len(bt), dtype=object)
            node[:] = self.node
            out.append(SampleBatch(bt, node, be, bs, bv))
        return out


def hist_quantiles(qs: tuple[float, ...], bounds: np.ndarray, counts: np.ndarray) -> list[float]:
    """Prometheus histogram_quantile over cumulative bucket ``counts`` (the last bound +Inf):
    the arithmetic of ``collectors/vllm/parse.histogram_quantile``, for several quantiles."""
    c = np.maximum.accumulate(np.asarray(counts, float))
    total = c[-1]
    out = []
    for q in qs:
        if total <= 0 or len(bounds) < 2:
            out.append(math.nan)
            continue
        rank = q * total
        i = int(np.searchsorted(c, rank, side="left"))
        if i == len(bounds) - 1:
            out.append(float(bounds[-2]))
            continue
        if i == 0 and bounds[0] <= 0:
            out.append(float(bounds[0]))
            continue
        start = 0.0 if i == 0 else float(bounds[i - 1])
        below = 0.0 if i == 0 else float(c[i - 1])
        inb = float(c[i]) - below
        out.append(float(bounds[i]) if inb <= 0 else start + (float(bounds[i]) - start) * (rank - below) / inb)
    return out


def _objs(names: list[str]) -> np.ndarray:
    a = np.empty(len(names), dtype=object)
    a[:] = names
    return a


class NodeMeasure:
    """Measurement half of :class:`~skewd.lab.sim.node.NodeSim`: :meth:`emit` and one method per
    collector. Reads the node's identity, its cumulative counters (``c_*``, drawn at
    construction) and its random streams, all set by ``NodeSim.__init__``."""

    c: Cluster
    n: Node
    G: int
    rng: np.random.Generator
    qrng: np.random.Generator
    phase: dict[str, float]
    roce_flows: list[RoceFlow]
    _rname: dict[str, int]
    last_packets: tuple | None
    last_phase: dict[str, float]
    # ... and the counters and pkt state NodeSim.__init__ lists

    # ------------------------------------------------------------------------------------------
    # Measurement: everything the collectors would emit for this interval
    # ------------------------------------------------------------------------------------------
    def emit(self, st: NodeState, only: set[str] | frozenset[str] | None = None) -> list[SampleBatch]:
        """The interval's samples, one batch per collector (each stamped with its collection
        time); ``only`` keeps just those signals (a consumer that reads no other signal gets the
        same values, cheaper)."""
        o = _Out(self.n.name, only)
        self._emit_gpu(o, st)
        self._emit_pcie(o, st)
        self._emit_net(o, st)
        self._emit_rdma(o, st)
        self._emit_host(o, st)
        self._emit_vllm(o, st)
        self._emit_pkt(o, st)
        if self.c.dpu:
            self._emit_dpu(o, st)
        return o.build()

    def _emit_dpu(self, o: _Out, st: NodeState) -> None:
        """The exporter collector scraping DTS every 5 s: the DPU's view of the host PCIe link
        towards each GPU behind it (entity: the GPU's PCI address)."""
        if st.t1 + 1e-9 < self.exporter_next:
            return
        self.exporter_next += 5.0
        t = st.t1 + 0.031
        inb = st.pcie_rx * np.exp(0.05 * self.rng.standard_normal(self.G))
        tlps = inb / np.maximum(st.tlp_bytes, 1.0)
        ok = st.responding
        E = _objs([p for p, k in zip(self.n.gpu_pci, ok) if k])
        o.add(t, E, "dpu_pcie_inbound_bytes_per_second", np.round(inb[ok]))
        o.add(t, E, "dpu_pcie_inbound_tlps_per_second", np.round(tlps[ok]))
        o.one(t, "doca-telemetry-service", "exporter_up", 1.0)

    def _emit_gpu(self, o: _Out, st: NodeState) -> None:
        g, G, t = self.c.gpu, self.G, st.t1 + self.phase["gpu"]
        dt = st.t1 - st.t0
        ok = st.responding
        # temperature follows power with a ~40 s time constant
        a = 1 - math.exp(-dt / 40.0)
        self.temp = self.temp + a * (st.temp_target - self.temp)
        temp = np.round(self.temp)
        reasons = st.reasons.copy()
        near_cap = st.power > st.power_limit * 0.97
        reasons |= np.where(near_cap, 0x4, 0)
        clock = np.where(near_cap, st.clock * (st.power_limit / np.maximum(st.power, 1)) ** 0.6, st.clock)
        reasons |= np.where(st.util < 0.02, 0x1, 0)
        hw = (reasons & (0x40 | 0x80)) > 0
        reasons |= np.where(hw, 0x8, 0)
        power = np.minimum(st.power, st.power_limit * 1.01)
        util = np.round(st.util * 100) / 100  # NVML reports whole percent
        mem_util = np.round(st.mem_util * 100) / 100
        clock = np.round(clock / 15e6) * 15e6  # 15 MHz clock steps
        E = self.ent_gpu[ok]
        vals = {
            "gpu_utilization_ratio": util, "gpu_memory_utilization_ratio": mem_util,
            "gpu_memory_used_bytes": np.round(st.mem_used / 2**20) * 2**20,
            "gpu_memory_total_bytes": np.full(G, g.mem_total), "gpu_power_watts": np.round(power * 1000) / 1000,
            "gpu_power_limit_watts": st.power_limit, "gpu_sm_clock_hz": clock,
            "gpu_sm_clock_max_hz": np.full(G, g.sm_clock_max), "gpu_temperature_celsius": temp,
            "gpu_clocks_event_reasons": reasons.astype(float),
            "gpu_xid_errors_total": None, "gpu_xid_last_code": None,
        }
        for code, bit in REASON_BITS.items():
            vals[f"gpu_clocks_event_{code}"] = ((reasons & bit) > 0).astype(float)
        for gpu, code in st.xid:
            self.c_xid[gpu] += 1
            self.xid_last[gpu] = code
        vals["gpu_xid_errors_total"] = self.c_xid.copy()
        vals["gpu_xid_last_code"] = self.xid_last.copy()
        if g.nvlink_links:
            vals["gpu_nvlink_links"] = np.full(G, float(g.nvlink_links))
            vals["gpu_nvlink_links_active"] = st.nvlink_active.astype(float)
        for name, v in vals.items():
            o.add(t, E, name, np.asarray(v, float)[ok])
        o.add(t, self.ent_gpu, "gpu_responding", ok.astype(float))

    def _window_sample(self, mean: np.ndarray, duty: np.ndarray, period: np.ndarray) -> np.ndarray:
        """NVML's PCIe throughput: bytes moved in one 20 ms window / 20 ms. Transfers come in
        pulses (one per step, ``duty`` of the period), so a window catches more or less of them."""
        W = 0.02
        G = len(mean)
        P_ = np.maximum(period, 1e-3)
        w = np.clip(duty, 0.01, 1.0) * P_
        u = self.rng.random(G) * P_  # window start relative to a pulse start
        # overlap of [u, u+W] with pulses [kP, kP+w], k = 0, 1, 2, ...
        def covered(x: np.ndarray) -> np.ndarray:  # pulse time in [0, x]
            k = np.floor(x / P_)
            return k * w + np.minimum(x - k * P_, w)
        ov = covered(u + W) - covered(u)
        inst = mean / np.clip(duty, 0.01, 1.0)
        val = inst * ov / W * np.exp(0.15 * self.rng.standard_normal(G))
        return np.floor(val / 1024) * 1024  # whole KB/s

    def _emit_pcie(self, o: _Out, st: NodeState) -> None:
        n, g, t = self.n, self.c.gpu, st.t1 + self.phase["pcie"]
        ok = st.responding
        E = self.ent_gpu[ok]
        rx = self._window_sample(st.pcie_rx, st.pcie_duty, st.pcie_period)
        tx = self._window_sample(st.pcie_tx, st.pcie_duty, st.pcie_period)
        self.c_replay = (self.c_replay + st.replay_inc) % 2**32
        self.c_nvml_err += st.nvml_err_inc
        self.c_recov += st.recov_inc
        down = ((st.pcie_gen < g.pcie_gen) | (st.pcie_width < g.pcie_width)).astype(float)
        vals = {"pcie_gpu_rx_bytes_per_second": rx, "pcie_gpu_tx_bytes_per_second": tx,
                "pcie_gpu_replays_total": self.c_replay, "pcie_gpu_current_link_gen": st.pcie_gen.astype(float),
                "pcie_gpu_max_link_gen": np.full(self.G, float(g.pcie_gen)),
                "pcie_gpu_current_link_width": st.pcie_width.astype(float),
                "pcie_gpu_max_link_width": np.full(self.G, float(g.pcie_width)), "pcie_gpu_link_downtrained": down,
                "pcie_gpu_correctable_errors_total": self.c_nvml_err[:, 0],
                "pcie_gpu_nonfatal_errors_total": self.c_nvml_err[:, 1],
                "pcie_gpu_fatal_errors_total": self.c_nvml_err[:, 2],
                "pcie_gpu_link_recoveries_total": self.c_recov}
        for name, v in vals.items():
            o.add(t, E, name, np.asarray(v, float)[ok])
        # sysfs view of every PCI device
        devs = n.pci_devices
        gen = np.array([st.pci_gen[d] for d in devs], float)
        width = np.array([st.pci_width[d] for d in devs], float)
        maxgen = np.array([g.pcie_gen if d in n.gpu_pci else 5 if d in n.rdma_pci else 4 for d in devs], float)
        maxw = np.full(len(devs), 16.0)
        for d in devs:
            for k, v in st.aer_inc.get(d, {}).items():
                self.c_aer[d][k] += v
        numa = np.array([n.gpu_numa[n.gpu_pci.index(d)] if d in n.gpu_pci else
                         (0 if i < len(n.rdma_pci) // 2 else 1) for i, d in enumerate(devs)], float)
        sv = {"pcie_current_link_transfers_per_second": np.array([GEN_GTS[int(x)] for x in gen]),
              "pcie_max_link_transfers_per_second": np.array([GEN_GTS[int(x)] for x in maxgen]),
              "pcie_current_link_gen": gen, "pcie_max_link_gen": maxgen, "pcie_current_link_width": width,
              "pcie_max_link_width": maxw, "pcie_link_downtrained": ((gen < maxgen) | (width < maxw)).astype(float),
              "pcie_numa_node": numa}
        for k in AER:
            sv[f"pcie_aer_{k}_total"] = np.array([self.c_aer[d][k] for d in devs])
        for name, v in sv.items():
            o.add(t, self.ent_pci, name, v)

    def _emit_net(self, o: _Out, st: NodeState) -> None:
        n, t = self.n, st.t1 + self.phase["netdev"]
        for d in n.netdevs:
            inc = st.net[d]
            for k, v in inc.items():
                self.c_net[d][k] += max(0.0, v)
            self.c_carrier[d] += st.carrier_inc.get(d, 0.0)
            q = st.qdisc[d]
            self.c_qdisc[d]["drops"] += q.get("drops", 0.0)
            self.c_qdisc[d]["overlimits"] += q.get("overlimits", 0.0)
            self.c_qdisc[d]["requeues"] += q.get("requeues", 0.0)
            self.c_qdisc[d]["sent_bytes"] += inc.get("tx_bytes", 0.0) + 14 * inc.get("tx_packets", 0.0)
            self.c_qdisc[d]["sent_packets"] += inc.get("tx_packets", 0.0)
        devs = n.netdevs
        E = self.ent_net
        for k in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets") + NET_ERR:
            name = {"rx_missed": "netdev_rx_missed_total", "collisions": "netdev_collisions_total"}.get(k, f"netdev_{k}_total")
            o.add(t, E, name, np.array([round(self.c_net[d][k]) for d in devs], float))
        o.add(t, E, "netdev_rx_multicast_total", np.array([round(self.c_net[d]["rx_multicast"]) for d in devs], float))
        o.add(t, E, "netdev_carrier_changes_total", np.array([self.c_carrier[d] for d in devs]))
        up = np.array([st.oper_up[d] for d in devs])
        o.add(t, E, "netdev_operstate", np.where(up, 6.0, 2.0))
        o.add(t, E, "netdev_up", up.astype(float))
        front = st.notes.get("front_speed", self.c.front_speed)
        speed = np.array([front if d == n.front else self.c.rdma_speed for d in devs])
        o.add(t, E[up], "netdev_link_speed_bytes", speed[up])
        # the egress queue as netdev's 20 Hz sampler and its dump see it (.qdisc)
        views = []
        for d, sp in zip(devs, speed):
            if d in st.queue:
                views.append(observe(self.qrng, st.queue[d]))
            else:
                v = healthy_view(self.qrng, d == n.front and st.net[d].get("tx_packets", 0.0) > 500, float(sp))
                v.backlog, v.qlen = st.qdisc[d]["backlog"], st.qdisc[d]["qlen"]  # the dump's instant
                v.peak = max(v.peak, v.backlog)
                views.append(v)
        o.add(t, E, "netdev_qdisc_backlog_bytes", np.array([v.backlog for v in views]))
        o.add(t, E, "netdev_qdisc_qlen_packets", np.array([v.qlen for v in views]))
        shaped = np.array([st.shaped.get(d, np.inf) for d in devs])
        if np.isfinite(shaped).any():
            o.add(t, E[np.isfinite(shaped)], "netdev_qdisc_rate_bytes", shaped[np.isfinite(shaped)])
        peak = np.array([v.peak for v in views])
        drain = np.minimum(np.array([v.drain for v in views]), np.minimum(shaped, speed))
        o.add(t, E, "netdev_qdisc_backlog_max_bytes", peak)
        o.add(t, E, "netdev_qdisc_backlog_mean_bytes", np.array([v.mean for v in views]))
        o.add(t, E, "netdev_qdisc_busy_ratio", np.array([v.busy for v in views]))
        o.add(t, E, "netdev_qdisc_delay_max_seconds", np.where(peak > 0, peak / np.maximum(drain, 1.0), 0.0))
        for k in ("drops", "overlimits", "requeues"):
            o.add(t, E, f"netdev_qdisc_{k}_total", np.array([self.c_qdisc[d][k] for d in devs]))
        o.add(t, E, "netdev_qdisc_sent_bytes_total", np.array([round(self.c_qdisc[d]["sent_bytes"]) for d in devs], float))
        o.add(t, E, "netdev_qdisc_sent_packets_total", np.array([round(self.c_qdisc[d]["sent_packets"]) for d in devs], float))

    def _emit_rdma(self, o: _Out, st: NodeState) -> None:
        n, t = self.n, st.t1 + self.phase["rdma"]
        if not n.rdma_ports:
            return
        for p, inc in enumerate(st.rdma):
            for k, v in inc.items():
                self.c_rdma[p][k] = self.c_rdma[p].get(k, 0.0) + max(0.0, v)
        for p in range(len(n.rdma_ports)):
            c = self.c_rdma[p]
            c["xmit_bytes"] -= c["xmit_bytes"] % 4  # port_xmit_data counts 4-byte words
            c["rcv_bytes"] -= c["rcv_bytes"] % 4
            c["xmit_wait"] = min(c["xmit_wait"], 2**32 - 1)  # 32-bit IBA counter saturates
        E = self.ent_rdma
        R = range(len(n.rdma_ports))
        for k in ("xmit_bytes", "rcv_bytes", "xmit_packets", "rcv_packets", "xmit_wait"):
            o.add(t, E, f"rdma_port_{k}_total", np.array([round(self.c_rdma[p][k]) for p in R], float))
        o.add(t, E, "rdma_port_unicast_xmit_packets_total", np.array([round(self.c_rdma[p]["xmit_packets"]) for p in R], float))
        o.add(t, E, "rdma_port_unicast_rcv_packets_total", np.array([round(self.c_rdma[p]["rcv_packets"]) for p in R], float))
        o.add(t, E, "rdma_port_multicast_xmit_packets_total", np.zeros(len(R)))
        o.add(t, E, "rdma_port_multicast_rcv_packets_total", np.zeros(len(R)))
        for k in RDMA_ERR:
            o.add(t, E, f"rdma_port_{k}_total", np.array([round(self.c_rdma[p][k]) for p in R], float))
        for k in RDMA_HW:
            o.add(t, E, f"rdma_port_{k}_total", np.array([round(self.c_rdma[p][k]) for p in R], float))
        act = np.array(st.rdma_active)
        o.add(t, E, "rdma_port_state", np.where(act, 4.0, 1.0))
        o.add(t, E, "rdma_port_active", act.astype(float))
        o.add(t, E, "rdma_port_phys_state", np.where(act, 5.0, 2.0))
        o.add(t, E, "rdma_port_rate_bytes", np.full(len(R), self.c.rdma_speed))
        o.add(t, E, "rdma_port_link_layer", np.full(len(R), 2.0))
        dev = _objs([p.split("/")[0] for p in n.rdma_ports])
        # resource tracking changes only when buffers are (de)registered; a little churn is normal
        mrs = np.array(st.rdma_mrs) + self.rng.poisson(0.05, len(R)) * self.rng.choice([-1, 1], len(R))
        o.add(t, dev, "rdma_dev_mrs", np.maximum(mrs, 0))
        o.add(t, dev, "rdma_dev_qps", np.array(st.rdma_qps))

    def _emit_host(self, o: _Out, st: NodeState) -> None:
        t = st.t1 + self.phase["host"]
        self.c_cpu += np.round(st.cpu * 100) / 100
        self.c_cpu = np.round(self.c_cpu * 100) / 100
        self.c_softirq_rx += st.softirq_rx
        self.c_softirq_tx += st.softirq_tx
        for k, v in st.tcp.items():
            self.c_tcp[k] += max(0.0, v)
        for k, v in st.udp.items():
            self.c_udp[k] += v
        cols = {"user": 0, "system": 1, "irq": 2, "softirq": 3, "iowait": 4, "steal": 5, "idle": 6}
        busy = self.c_cpu[:, :4].sum(1)
        for mode in HOST_MODES:
            v = busy if mode == "busy" else self.c_cpu[:, cols[mode]]
            o.add(t, self.ent_cpu, f"host_cpu_{mode}_seconds_total", np.round(v * 100) / 100)
            o.one(t, "", f"host_node_cpu_{mode}_seconds_total", round(float(v.sum()), 2))
        o.add(t, self.ent_cpu, "host_softirq_net_rx_total", self.c_softirq_rx)
        o.add(t, self.ent_cpu, "host_softirq_net_tx_total", self.c_softirq_tx)
        o.one(t, "", "host_cpus_online", float(self.n.cpus))
        o.one(t, "", "host_procs_running", st.procs_running)
        o.one(t, "", "host_procs_blocked", st.procs_blocked)
        for k, v in self.c_tcp.items():
            o.one(t, "", f"host_tcp_{k}_total", float(round(v)))
        o.one(t, "", "host_ip_in_ce_packets_total", self.c_ce)  # the fabric's CE marks are not modelled here
        for k, v in self.c_udp.items():
            o.one(t, "", f"host_udp_{k}_total", float(round(v)))
        dt = st.t1 - st.t0
        for i, tau in enumerate((60.0, 300.0, 900.0)):
            a = math.exp(-dt / tau)
            self.load[i] = self.load[i] * a + st.procs_running * (1 - a)
        o.one(t, "", "host_load1", round(float(self.load[0]), 2))
        o.one(t, "", "host_load5", round(float(self.load[1]), 2))
        o.one(t, "", "host_load15", round(float(self.load[2]), 2))

    def _emit_vllm(self, o: _Out, st: NodeState) -> None:
        t = st.t1 + self.phase["vllm"]
        dt = st.t1 - st.t0
        for ent, (out, eng) in st.engines.items():
            up = st.vllm_up.get(ent, True)
            o.one(t, ent, "vllm_up", 1.0 if up else 0.0)
            if not up:
                self.prev_vllm.pop(ent, None)  # the restarted engine's counters start over
                eng.c_prompt = eng.c_gen = eng.c_preempt = eng.c_success = eng.c_prefix_q = eng.c_prefix_h = 0.0
                eng.c_steps = 0.0
                for k in eng.hist_counts:
                    eng.hist_counts[k][:] = 0
                    eng.hist_sum[k] = 0.0
                continue
            o.one(t, ent, "vllm_requests_running", float(out.running))
            o.one(t, ent, "vllm_requests_waiting", float(out.waiting))
            o.one(t, ent, "vllm_kv_cache_usage_ratio", round(out.kv, 6))
            cnt = {"vllm_preemptions_total": eng.c_preempt, "vllm_prompt_tokens_total": eng.c_prompt,
                   "vllm_generation_tokens_total": eng.c_gen, "vllm_prefix_cache_queries_total": eng.c_prefix_q,
                   "vllm_prefix_cache_hits_total": round(eng.c_prefix_h), "vllm_request_success_total": eng.c_success,
                   "vllm_iterations_total": eng.c_steps}
            for k, v in cnt.items():
                o.one(t, ent, k, float(v))
            prev = self.prev_vllm.get(ent)
            for h, bounds in HISTS.items():
                cum = eng.hist_counts[h]
                o.one(t, ent, f"vllm_{h}_observations_total", float(cum[-1]))
                win = cum - prev[1][h] if prev is not None else cum
                if win[-1] > 0:
                    for qn, v in zip(("p50", "p99"), hist_quantiles((0.5, 0.99), bounds, win)):
                        if not math.isnan(v):
                            o.one(t, ent, f"vllm_{h}_{qn}_seconds", v)
            if prev is not None:
                pr = (eng.c_prompt - prev[0][0]) / dt
                gr = (eng.c_gen - prev[0][1]) / dt
                o.one(t, ent, "vllm_prompt_tokens_per_second", pr)
                o.one(t, ent, "vllm_generation_tokens_per_second", gr)
                # by time, as the collector derives it from vLLM's prefill and decode time
                # histograms: the seconds the requests that finished in the interval spent in each
                spent = [eng.hist_sum[h] - prev[2][h] for h in ("prefill_time", "decode_time")]
                ph = engine_phase(pr, gr, PhaseThresholds(), *spent)
                ph = self.last_phase.get(ent) if ph is None else float(ph)
                if ph is not None:
                    self.last_phase[ent] = ph
                    o.one(t, ent, "vllm_phase", ph)
            self.prev_vllm[ent] = ((eng.c_prompt, eng.c_gen), {h: eng.hist_counts[h].copy() for h in HISTS},
                                   dict(eng.hist_sum))

    def _emit_pkt(self, o: _Out, st: NodeState) -> None:
        n, t = self.n, st.t1 + self.phase["pkt"]
        ports = self.c.pkt_ports
        if ports in ("all", "front"):
            # kept so tests can hand the very same packets to the real pkt collector's tracker
            self.last_packets = (st.fe_flow, st.fe_ts, st.fe_wl, st.fe_rtx, st.fe_fin, st.t0, st.t1)
            rows, cols, closed = self.flows.update(st.fe_flow, st.fe_ts, st.fe_wl, st.fe_rtx, st.fe_fin, st.t0, st.t1)
            E = _objs([self.flows.names[i] for i in rows.tolist()])
            tot = float(cols["bytes"].sum())
            cols["pkt_flow_bytes_share_ratio"] = np.where(cols["packets"] > 0, cols["bytes"] / tot, np.nan) \
                if tot > 0 else np.full(len(rows), np.nan)
            for k, v in cols.items():
                if k.startswith("pkt_"):
                    o.add(t, E, k, v)
            eg = np.array(self.flows.egress, bool)
            ingress = ~eg[st.fe_flow] if len(st.fe_flow) else np.zeros(0, bool)
            ends = cols["pkt_flow_end_seconds"][closed]
            fbytes = cols["bytes"]
            bulk_rows = []
            for b in st.bulk:  # a bulk transfer: one continuous burst, frames back to back
                bs = self.bulk_state.setdefault(b["name"], pktfeat.RoceFlowState())
                dt = st.t1 - st.t0
                f = pktfeat.roce_flow_features(bs, np.array([st.t0]), np.array([dt * 0.999]), np.array([b["bytes"]]), 1,
                                               max(b["bytes"] / dt, 1.0), 0.0, 0.0, st.t0, st.t1, self.rng)
                f["pkt_flow_egress"] = 1.0 if b["egress"] else 0.0
                f["pkt_flow_tcp_retransmits_total"] = 0.0
                f["pkt_flow_tcp_spurious_retransmits_total"] = 0.0
                f["pkt_flow_closed"] = 0.0
                f.pop("pkt_flow_roce_retransmits_total", None)
                bulk_rows.append((b["name"], f))
                fbytes = np.r_[fbytes, b["bytes"]]
            pf = pktfeat.port_features(self.front_port, st.fe_ts, st.fe_wl, ingress, fbytes,
                                       int(cols["rtx"].sum()), ends, st.t0, st.t1)
            for name, f in bulk_rows:
                tot_b = float(fbytes.sum())
                for k, v in f.items():
                    if k.startswith("pkt_"):
                        o.one(t, name, k, v)
                o.one(t, name, "pkt_flow_bytes_share_ratio", f["_bytes"] / tot_b if tot_b > 0 else np.nan)
                self.front_port.packets += int(f["_packets"])
                self.front_port.bytes += int(f["_bytes"])
                pf["pkt_packets_total"] = self.front_port.packets
                pf["pkt_bytes_total"] = self.front_port.bytes
                if not f["pkt_flow_egress"]:
                    dt = st.t1 - st.t0
                    pf["pkt_ingress_packets_per_second"] = pf.get("pkt_ingress_packets_per_second", 0.0) + f["_packets"] / dt
                    pf["pkt_ingress_bytes_per_second"] = pf.get("pkt_ingress_bytes_per_second", 0.0) + f["_bytes"] / dt
                    pf["pkt_ingress_gap_p99_seconds"] = min(pf.get("pkt_ingress_gap_p99_seconds", 1.0),
                                                            f.get("pkt_flow_gap_p99_seconds", 1.0))
            for k, v in pf.items():
                o.one(t, n.front, k, v)
        if ports in ("all", "rdma") and n.rdma_ports:
            self._emit_roce(o, st, t)

    def _emit_roce(self, o: _Out, st: NodeState, t: float) -> None:
        n = self.n
        layers = self.c.model.layers
        per_port: dict[int, list[dict[str, float]]] = {p: [] for p in range(len(n.rdma_ports))}
        names: list[str] = []
        rows: list[dict[str, float]] = []
        empty = (np.zeros(0), np.zeros(0), np.zeros(0))
        memo: dict[tuple, tuple[dict, pktfeat.RoceFlowState]] = {}
        for fi, f in enumerate(self.roce_flows):
            tup = st.roce.get(fi, empty)
            starts, durs, nb = tup
            if not len(starts) and (math.isnan(f.state.last) or st.t1 - f.state.last > pktfeat.FLOW_TIMEOUT):
                continue
            rtx, ecn = st.roce_rtx.get(fi, 0.0), st.roce_ecn.get(fi, 0.0)
            # flows with the same history and the same bursts get the same features: compute once
            fs = f.state
            key = (id(tup), fs.packets, fs.bytes, fs.bursts, fs.rtx, fs.ecn, fs.first, fs.last, fs.b_start,
                   fs.b_bytes, fs.b_gap, rtx, ecn)
            hit = memo.get(key)
            if hit is not None:
                feats, f.state = dict(hit[0]), copy.copy(hit[1])
            else:
                feats = pktfeat.roce_flow_features(f.state, starts, durs, nb, layers, self.c.rdma_speed, rtx, ecn,
                                                   st.t0, st.t1, self.rng)
                memo[key] = (dict(feats), copy.copy(f.state))
            if feats["_packets"] > 0:
                feats["pkt_flow_egress"] = 1.0 if f.egress else 0.0
            feats["_ingress"] = 0.0 if f.egress else 1.0
            names.append(f.name)
            rows.append(feats)
            per_port[f.port].append(feats)
        if rows:
            keys = sorted({k for r in rows for k in r if k.startswith("pkt_")})
            E = _objs(names)
            port_of = [self.roce_flows[self._roce_index_by_name(nm)].port for nm in names]
            port_bytes = {p: sum(r["_bytes"] for r in per_port[p]) for p in per_port}
            for k in keys:
                o.add(t, E, k, np.array([r.get(k, np.nan) for r in rows]))
            o.add(t, E, "pkt_flow_bytes_share_ratio",
                  np.array([r["_bytes"] / port_bytes[p] if port_bytes[p] > 0 and r["_packets"] > 0 else np.nan
                            for r, p in zip(rows, port_of)]))
        dt = st.t1 - st.t0
        by_port: dict[int, list[int]] = {}
        for fi, tup in st.roce.items():
            if len(tup[0]):
                by_port.setdefault(self.roce_flows[fi].port, []).append(fi)
        for p, dev in enumerate(n.rdma_netdevs):
            agg = self.roce_ports[p]
            fr = per_port[p]
            b = np.array([r["_bytes"] for r in fr]) if fr else np.zeros(0)
            pk = sum(r["_packets"] for r in fr)
            agg.packets += int(pk) + int(self.rng.poisson(3))
            agg.bytes += int(b.sum()) + int(self.rng.poisson(400))
            agg.other += int(self.rng.poisson(1))
            out = {"pkt_packets_total": agg.packets, "pkt_bytes_total": agg.bytes, "pkt_other_packets_total": agg.other,
                   "pkt_kernel_drops_total": 0.0, "pkt_tcp_retransmits_total": 0.0}
            bb = b[b > 0]
            out["pkt_flows"] = float(len(bb))
            if len(bb):
                out["pkt_flow_bytes_share_max_ratio"] = float(bb.max() / bb.sum())
                sb = np.sort(bb)
                k = np.arange(1, len(sb) + 1)
                out["pkt_flow_bytes_gini_ratio"] = float(2 * (k * sb).sum() / (len(sb) * sb.sum()) - (len(sb) + 1) / len(sb))
            ing = [r for r in fr if r["_ingress"]]
            ip = sum(r["_packets"] for r in ing)
            out["pkt_ingress_packets_per_second"] = ip / dt
            out["pkt_ingress_bytes_per_second"] = sum(r["_bytes"] for r in ing) / dt
            if ing:
                out["pkt_ingress_gap_p99_seconds"] = float(np.nanmax([r.get("pkt_flow_gap_p99_seconds", np.nan) for r in ing]
                                                                       + [0.0])) / max(1, len(ing)) ** 0.5
                out["pkt_ingress_gap_max_seconds"] = float(np.nanmin([r.get("pkt_flow_gap_max_seconds", np.nan) for r in ing]
                                                                       + [np.inf]))
                if not np.isfinite(out["pkt_ingress_gap_max_seconds"]):
                    del out["pkt_ingress_gap_max_seconds"]
            # aggregate bursts of the port: all its flows burst together each step
            mine = by_port.get(p, [])
            if mine:
                sts = np.concatenate([st.roce[fi][0] for fi in mine])
                order = np.argsort(sts, kind="stable")
                s_sorted = sts[order]
                e_sorted = np.concatenate([st.roce[fi][0] + st.roce[fi][1] for fi in mine])[order]
                b_sorted = np.concatenate([st.roce[fi][2] for fi in mine])[order]
                run_end = np.maximum.accumulate(e_sorted)
                prev_end = np.concatenate(([agg.last_ns / pktfeat.NS if agg.last_ns >= 0 else -np.inf], run_end[:-1]))
                new = (s_sorted - prev_end) >= pktfeat.BURST_GAP
                agg.bursts += int(new.sum())
                ks = np.flatnonzero(new)
                if len(ks):
                    k = ks[-1]
                    agg.b_start = float(s_sorted[k])
                    agg.b_bytes = float(b_sorted[k:].sum())
                    agg.b_gap = float(s_sorted[k] - prev_end[k]) if np.isfinite(prev_end[k]) else math.nan
                else:
                    agg.b_bytes = (0.0 if math.isnan(agg.b_bytes) else agg.b_bytes) + float(b_sorted.sum())
                if len(run_end):
                    agg.last_ns = int(run_end[-1] * pktfeat.NS)
            out.update(pktfeat._burst_out(agg))
            self._emit_silences(o, st, t, dev, 1.0 / len(n.rdma_ports))
            for k, v in out.items():
                o.one(t, dev, k, float(v))

    def _emit_silences(self, o: _Out, st: NodeState, t: float, dev: str, share: float) -> None:
        """The silences of the node's collective traffic on one of its ports (every RDMA port
        carries its share of every collective at the same times), stamped on the node's clock."""
        sl = st.silences
        if sl is None or not len(sl.end):
            return
        # the connections the collectives use on this port: one per TP peer and channel
        port = self.n.rdma_netdevs.index(dev) if dev in self.n.rdma_netdevs else -1
        conns = sum(1 for f in self.roce_flows if f.egress and f.port == port and f.kind == "tp")
        if not conns:  # a pipeline stage of one node: its hand-off connections
            conns = sum(1 for f in self.roce_flows if f.egress and f.port == port and f.kind == "pp")
        if conns:
            o.one(t, dev, "pkt_collective_connections", float(conns))
        end = sl.end + getattr(self, "clock_offset", 0.0)
        o.at(t, end, dev, "pkt_collective_silence_seconds", sl.length)
        o.at(t, end, dev, "pkt_collective_silence_by_send", sl.by_send.astype(np.float64))
        o.at(t, end, dev, "pkt_collective_sent_bytes", sl.sent * share)

    def _roce_index_by_name(self, name: str) -> int:
        if len(self._rname) != len(self.roce_flows):
            self._rname = {f.name: i for i, f in enumerate(self.roce_flows)}
        return self._rname[name]
