"""One simulated node: its physical state derived from its engines' step timelines (the true
:class:`~skewd.lab.sim.state.NodeState`), then measured as the samples each collector would
produce (:mod:`.measure`).

Per interval the simulator (1) builds a :class:`NodeState` of *true* quantities (utilisation,
power, PCIe byte rates and their duty cycle, NIC and RDMA traffic, CPU time, packets), (2) lets
fault injectors change it, (3) calls :meth:`NodeSim.emit`, which measures it the way the real
collectors do: counters accumulate from a random base, NVML PCIe throughput is a 20 ms window
sample in whole KB/s, /proc CPU time is in USER_HZ ticks, RDMA data counters count 4-byte words,
the vLLM quantiles come from bucket increases of genuine vLLM bucket bounds, and the ``pkt``
features from the packets themselves (:mod:`.pktfeat`).
"""
from __future__ import annotations

import math
import zlib

import numpy as np

from . import pktfeat
from .measure import AER, NET_ERR, PHASE, RDMA_ERR, RDMA_HW, TCP_EXT, NodeMeasure, _objs
from .state import NodeState, RoceFlow
from .topology import Cluster, Node
from .workload import EngineSim, TickOut

class NodeSim(NodeMeasure):
    """One simulated node: owns its counters, flow tables and random streams; the simulator calls
    :meth:`baseline` for an interval's true state, lets injectors edit it, then ``emit`` (measure)."""

    def __init__(self, cluster: Cluster, node: Node, rng: np.random.Generator, t_start: float,
                 qrng: np.random.Generator | None = None) -> None:
        self.c = cluster
        self.n = node
        self.rng = rng
        # the qdisc sampler's randomness (sample phases): its own stream, so that measuring queues
        # changes no other draw of the run
        self.qrng = qrng if qrng is not None else np.random.default_rng(zlib.crc32(node.name.encode()))
        G = len(node.gpus)
        g = cluster.gpu
        self.G = G
        self.phase = {k: v + rng.uniform(0, 0.004) for k, v in PHASE.items()}
        self.ent_gpu = _objs(node.gpus)
        self.ent_pci = _objs(node.pci_devices)
        self.ent_net = _objs(node.netdevs)
        self.ent_rdma = _objs(node.rdma_ports)
        self.ent_cpu = _objs([f"cpu{i}" for i in range(node.cpus)])
        # silicon lottery and airflow: fixed per GPU
        self.gpu_power_k = 1.0 + 0.03 * rng.standard_normal(G)
        self.gpu_temp_off = rng.normal(0, 1.5, G) + np.linspace(0, 4, G)
        # large pinned DMAs fill the 256/512-byte max payload; control writes pull the mean down
        self.tlp = rng.uniform(210, 420, G)
        self.exporter_next = t_start + 5.0
        self.temp = g.temp_idle + self.gpu_temp_off
        self.mem_base = np.full(G, np.nan)
        # cumulative counters with plausible starting values (the node has been up a while)
        up = rng.uniform(2e5, 3e6)  # seconds of uptime
        self.uptime = up
        self.c_replay = rng.integers(0, 40, G).astype(float)
        self.c_nvml_err = np.zeros((G, 3))
        self.c_nvml_err[:, 0] = rng.integers(0, 5, G)
        self.c_recov = rng.integers(0, 3, G).astype(float)
        self.c_xid = np.zeros(G)
        self.xid_last = np.zeros(G)
        self.c_aer = {d: {k: 0.0 for k in AER} for d in node.pci_devices}
        for d in node.pci_devices:  # a few historical correctable errors are normal
            k = float(rng.poisson(0.5))
            self.c_aer[d]["correctable_errors"] = k
            self.c_aer[d]["receiver_errors"] = k
        self.c_net = {dev: {k: 0.0 for k in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_multicast") + NET_ERR}
                      for dev in node.netdevs}
        for dev in node.netdevs:
            self.c_net[dev]["rx_bytes"] = up * rng.uniform(2e6, 4e7)
            self.c_net[dev]["tx_bytes"] = up * rng.uniform(2e6, 4e7)
            self.c_net[dev]["rx_packets"] = self.c_net[dev]["rx_bytes"] / 900
            self.c_net[dev]["tx_packets"] = self.c_net[dev]["tx_bytes"] / 700
            self.c_net[dev]["rx_multicast"] = up * 0.3
            self.c_net[dev]["rx_dropped"] = float(rng.integers(0, 200))
        self.c_carrier = {dev: float(rng.integers(1, 4) * 2) for dev in node.netdevs}
        self.c_qdisc = {dev: {"drops": 0.0, "overlimits": 0.0, "requeues": float(rng.integers(0, 500)),
                              "sent_bytes": self.c_net[dev]["tx_bytes"], "sent_packets": self.c_net[dev]["tx_packets"]}
                        for dev in node.netdevs}
        R = len(node.rdma_ports)
        self.c_rdma = [{"xmit_bytes": up * rng.uniform(1e8, 2e9), "rcv_bytes": up * rng.uniform(1e8, 2e9),
                        "xmit_packets": 0.0, "rcv_packets": 0.0,
                        # 32-bit and saturating on real ports; start well below the ceiling
                        "xmit_wait": rng.uniform(1e7, 1.5e9),
                        **{k: 0.0 for k in RDMA_ERR}, **{k: 0.0 for k in RDMA_HW}} for _ in range(R)]
        for d in self.c_rdma:
            d["xmit_packets"] = d["xmit_bytes"] / 4000
            d["rcv_packets"] = d["rcv_bytes"] / 4000
            d["xmit_bytes"] -= d["xmit_bytes"] % 4
            d["rcv_bytes"] -= d["rcv_bytes"] % 4
            d["np_ecn_marked_roce_packets"] = up * rng.uniform(0.5, 20)
            d["np_cnp_sent"] = d["np_ecn_marked_roce_packets"] * 0.3
            d["rp_cnp_handled"] = d["np_cnp_sent"] * rng.uniform(0.8, 1.2)
            d["symbol_error"] = float(rng.integers(0, 3))
            d["link_error_recovery"] = float(rng.integers(0, 2))
            d["out_of_sequence"] = float(rng.integers(0, 20))
            d["duplicate_request"] = float(rng.integers(0, 10))
        C = node.cpus
        # NCCL registers its buffers once: a steady MR count per device (plus a few for the agent's
        # own verbs users), QPs: channels x peers
        self.mrs = [float(rng.integers(40, 400)) if R else 0.0 for _ in range(R)]
        self.qps = [float(rng.integers(8, 64)) for _ in range(R)]
        self.c_cpu = np.zeros((C, 7))
        self.c_cpu[:, 6] = up * rng.uniform(0.5, 0.7, C)
        self.c_cpu[:, 0] = up * rng.uniform(0.2, 0.4, C)
        self.c_cpu[:, 1] = up * 0.03
        self.c_cpu[:, 3] = up * 0.01
        self.c_cpu = np.round(self.c_cpu * 100) / 100
        self.c_softirq_rx = np.round(up * rng.uniform(50, 500, C))
        self.c_softirq_tx = np.round(up * rng.uniform(5, 50, C))
        self.c_tcp = {"in_segs": up * 2000, "out_segs": up * 2500, "retrans_segs": up * 0.5, "in_errs": 3.0,
                      "out_rsts": up * 0.2, **{k: 0.0 for k in TCP_EXT}}
        self.c_tcp.update(loss_probes=up * 0.4, dsack_recv_segs=up * 0.45, dsack_recv=up * 0.4,
                          orig_data_sent=up * 2000)
        self.c_ce = 0.0
        self.c_udp = {"in_errors": 0.0, "rcvbuf_errors": 0.0, "sndbuf_errors": 0.0}
        self.load = np.array([8.0, 8.0, 8.0])
        # pkt state
        self.flows = pktfeat.FlowTable()
        self.front_port = pktfeat.PortAgg(node.front)
        self.roce_ports = [pktfeat.PortAgg(d) for d in node.rdma_netdevs]
        self.roce_flows: list[RoceFlow] = []
        self._roce_index: dict[tuple[int, int, str, int], int] = {}
        self.fe_carry: tuple | None = None
        self.bulk_state: dict[str, pktfeat.RoceFlowState] = {}
        self._conn_tab: dict[int, dict[int, tuple[int, int]]] = {}
        self.prev_vllm: dict[str, tuple] = {}
        #: each engine's last measured phase, held while no request finishes (as the collector does)
        self.last_phase: dict[str, float] = {}
        self.vllm_seen: set[str] = set()
        self.t_start = t_start
        self._rname: dict[str, int] = {}  # RoCE flow name → index, rebuilt when flows are added
        #: the front-end packets of the last interval measured (tests compare features against them)
        self.last_packets: tuple | None = None

    # ------------------------------------------------------------------------------------------
    # RoCE flow table
    # ------------------------------------------------------------------------------------------
    def roce_flow(self, port: int, peer: int, kind: str, egress: bool, channel: int, peer_ip: str) -> int:
        key = (port, peer, kind + ("o" if egress else "i"), channel)
        i = self._roce_index.get(key)
        if i is None:
            my = self.n.rdma_ips[port]
            sport = 49152 + zlib.crc32(f"{self.n.index}/{peer}/{port}/{channel}/{kind}/{egress}".encode()) % 16000
            name = f"udp {my}:{sport}>{peer_ip}:4791" if egress else f"udp {peer_ip}:{sport}>{my}:4791"
            i = self._roce_index[key] = len(self.roce_flows)
            self.roce_flows.append(RoceFlow(name, port, egress, peer, kind))
        return i

    # ------------------------------------------------------------------------------------------
    # Baseline physical state
    # ------------------------------------------------------------------------------------------
    def baseline(self, t0: float, t1: float, engines: dict[int, tuple[TickOut, EngineSim]],
                 roce: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]], bursts: list[tuple[float, float]]
                 ) -> NodeState:
        c, n, g, rng = self.c, self.n, self.c.gpu, self.rng
        G, dt = self.G, t1 - t0
        util = np.zeros(G)
        prefill = np.zeros(G)
        batch = np.zeros(G)
        step = np.full(G, 0.03)
        gen_tok = np.zeros(G)
        pre_tok = np.zeros(G)
        kv = np.zeros(G)
        serving = np.zeros(G, bool)
        for rid, (out, eng) in engines.items():
            rep = c.replicas[rid]
            idx = [k for (nn, k) in rep.gpus if nn == n.index]
            if not idx:
                continue
            ii = np.array(idx)
            # NCCL kernels spin while a rank waits for its peers: waiting counts as busy
            util[ii] = out.busy
            prefill[ii] = out.prefill_share
            batch[ii] = np.mean(out.steps.batch) if len(out.steps.batch) else 0.0
            step[ii] = np.mean(out.steps.durs) if len(out.steps.durs) else 0.03
            # every rank holds its heads' share of every token's KV
            gen_tok[ii] = out.gen_tokens / max(1, len(rep.stages))
            pre_tok[ii] = out.prompt_tokens / max(1, len(rep.stages))
            kv[ii] = out.kv
            serving[ii] = out.serving
        util = np.clip(util * (0.985 + 0.01 * rng.random(G)), 0, 1)
        util = np.where(util > 0.02, util, rng.uniform(0, 0.01, G) * (util > 0))
        busy_w = g.power_busy_decode + (g.power_busy_prefill - g.power_busy_decode) * prefill
        load_w = 0.55 + 0.45 * np.minimum(1.0, batch / max(16.0, c.max_num_seqs * 0.6))
        power = (g.power_idle + (busy_w - g.power_idle) * util * load_w) * self.gpu_power_k
        power = power * (1 + 0.02 * rng.standard_normal(G))
        power_limit = np.full(G, g.power_limit)
        clock = np.where(util > 0.05, g.sm_clock_max, g.sm_clock_idle)
        # vLLM holds gpu_memory_utilization of the framebuffer while serving
        mem = np.where(serving, g.mem_total * c.gpu_memory_utilization + 0.55e9, 0.6e9)
        mem_util = np.clip(util * (0.45 + 0.35 * (1 - prefill)) * (0.8 + 0.2 * kv), 0, 1)
        temp_target = g.temp_idle + self.gpu_temp_off + g.temp_per_watt * (power - g.power_idle)
        # ---- PCIe: control + KV offload + GPUDirect RDMA (the NIC writes into GPU memory)
        kvb = c.model.kv_bytes_per_token / max(1, c.tp)
        ctl = 2e6 + 3e4 * batch / np.maximum(step, 1e-3) * 0.01
        rx = ctl.copy()
        tx = 0.2e6 + 0.02 * ctl
        if c.kv_offload:
            tx += (gen_tok + pre_tok) * kvb  # write-back of new KV blocks to the host tier
            rx += pre_tok * kvb * 0.35  # prefix blocks loaded back from the host tier
        gpus_per_nic = max(1, G // max(1, len(n.rdma_ports)))
        rd_tx = np.zeros(len(n.rdma_ports))
        rd_rx = np.zeros(len(n.rdma_ports))
        for fi, (st, du, by) in roce.items():
            f = self.roce_flows[fi]
            if f.egress:
                rd_tx[f.port] += float(by.sum())
            else:
                rd_rx[f.port] += float(by.sum())
        for p in range(len(n.rdma_ports)):
            for k in range(p * gpus_per_nic, min(G, (p + 1) * gpus_per_nic)):
                rx[k] += rd_rx[p] / gpus_per_nic / dt
                tx[k] += rd_tx[p] / gpus_per_nic / dt
        duty = np.where(rd_rx[np.minimum(np.arange(G) // gpus_per_nic, len(rd_rx) - 1)] > 0, 0.75, 0.3) \
            if len(rd_rx) else np.full(G, 0.3)
        # idle GPUs drop the link to Gen1 to save power (NVML and sysfs both show it)
        gen = np.where(util > 0.02, g.pcie_gen, 1)
        width = np.full(G, g.pcie_width)
        pci_width = {d: (g.pcie_width if d in n.gpu_pci else 16) for d in n.pci_devices}
        pci_gen = {d: (int(gen[n.gpu_pci.index(d)]) if d in n.gpu_pci else 5 if d in n.rdma_pci else 4)
                   for d in n.pci_devices}
        aer_inc = {d: {} for d in n.pci_devices}
        # ---- front-end packets
        fe = self._frontend_packets(t0, t1, engines)
        # ---- netdevs
        net: dict[str, dict[str, float]] = {d: {} for d in n.netdevs}
        fe_in = fe["ingress"]
        net[n.front]["rx_bytes"] = float(fe["wl"][fe_in].sum()) - 4.0 * fe_in.sum() + rng.poisson(3000)
        net[n.front]["tx_bytes"] = float(fe["wl"][~fe_in].sum()) - 4.0 * (~fe_in).sum() + rng.poisson(2500)
        net[n.front]["rx_packets"] = float(fe_in.sum()) + rng.poisson(12)
        net[n.front]["tx_packets"] = float((~fe_in).sum()) + rng.poisson(10)
        for dev in n.rdma_netdevs:  # RoCE bypasses the kernel: only LLDP, ARP, NCCL bootstrap
            net[dev]["rx_bytes"] = float(rng.poisson(300))
            net[dev]["tx_bytes"] = float(rng.poisson(250))
            net[dev]["rx_packets"] = float(rng.poisson(3))
            net[dev]["tx_packets"] = float(rng.poisson(2))
        for dev in n.netdevs:
            net[dev]["rx_multicast"] = float(rng.poisson(0.3))
        qdisc = {d: {"backlog": 0.0, "qlen": 0.0, "drops": 0.0, "overlimits": 0.0,
                     "requeues": float(rng.poisson(0.02))} for d in n.netdevs}
        # a busy front end now and then has a few packets queued at the instant of the dump
        if rng.random() < 0.05 and net[n.front]["tx_packets"] > 500:
            q = int(rng.integers(1, 6))
            qdisc[n.front]["qlen"] = float(q)
            qdisc[n.front]["backlog"] = float(q * rng.integers(90, 1500))
        # ---- RDMA ports
        rdma: list[dict[str, float]] = []
        for p in range(len(n.rdma_ports)):
            xb, rb = rd_tx[p], rd_rx[p]
            busy_share = min(1.0, (xb + rb) / dt / c.rdma_speed)
            d = {"xmit_bytes": xb * 1.014, "rcv_bytes": rb * 1.014, "xmit_packets": math.ceil(xb / pktfeat.ROCE_FRAME),
                 "rcv_packets": math.ceil(rb / pktfeat.ROCE_FRAME),
                 # some back-pressure is normal under collectives (incast at the all-reduce)
                 "xmit_wait": float(rng.poisson(2e5 * busy_share + 50)),
                 "np_ecn_marked_roce_packets": float(rng.poisson(30 * busy_share)),
                 }
            d["np_cnp_sent"] = float(rng.binomial(int(d["np_ecn_marked_roce_packets"]), 0.3))
            d["rp_cnp_handled"] = float(rng.poisson(d["np_cnp_sent"] + 0.01))
            d["xmit_packets"] += rng.poisson(1)
            d["rcv_packets"] += rng.poisson(1)
            rdma.append(d)
        # ---- host CPU: workers spin on their GPU, the engine core and API server, softirq for packets
        C = n.cpus
        cpu = np.zeros((C, 7))
        pkts = float(len(fe["ts"]))
        any_serving = any(o.serving for o, _ in engines.values()) if engines else False
        for k in range(min(G, C)):
            b = 0.92 if serving[k] else 0.02
            cpu[k, 0] = b * 0.9
            cpu[k, 1] = b * 0.08
        api = min(C - 1, G)
        eng_core = min(C - 1, G + 1)
        if any_serving:
            cpu[eng_core, 0] += 0.85
            cpu[eng_core, 1] += 0.06
            cpu[api, 0] += min(0.9, 0.15 + pkts * 4e-5)
            cpu[api, 1] += min(0.3, 0.03 + pkts * 1e-5)
        irq_cpus = np.arange(C - 8, C) if C > 16 else np.arange(C)
        soft = pkts * 2.5e-6
        cpu[irq_cpus, 3] += soft / len(irq_cpus)
        cpu[irq_cpus, 2] += soft / len(irq_cpus) * 0.2
        other = rng.gamma(0.5, 0.02, C)  # sshd, node exporter, kubelet, skewd itself...
        cpu[:, 0] += other
        cpu[:, 1] += other * 0.3
        cpu[:, 4] = rng.gamma(0.3, 0.003, C)
        busy = cpu[:, :6].sum(1)
        scale = np.where(busy > 1.0, 1.0 / busy, 1.0)
        cpu[:, :6] *= scale[:, None]
        cpu[:, 6] = np.maximum(0.0, 1.0 - cpu[:, :6].sum(1))
        cpu *= dt
        softirq_rx = np.zeros(C)
        softirq_rx[irq_cpus] = rng.poisson(max(1.0, float(fe_in.sum())) / len(irq_cpus) / 8 + 20, len(irq_cpus))
        softirq_rx += rng.poisson(2, C)
        softirq_tx = rng.poisson(0.5, C).astype(float)
        softirq_tx[irq_cpus] += rng.poisson(max(1.0, float((~fe_in).sum())) / len(irq_cpus) / 30, len(irq_cpus))
        in_segs = float(fe_in.sum()) + rng.poisson(40)
        out_segs = float((~fe_in).sum()) + rng.poisson(40)
        # a healthy node's few resends are spurious (tail-loss probes answered by D-SACKs: real
        # lab, healthy namespaces: 407 of 441 resent segments D-SACKed); the faults' are losses
        spurious = float(rng.binomial(int(out_segs), 2e-5))
        lost = float(fe["rtx"][~fe_in].sum())
        tcp = {"in_segs": in_segs, "out_segs": out_segs - lost, "retrans_segs": lost + spurious,
               "in_errs": float(rng.poisson(0.001)),
               "out_rsts": float(rng.poisson(0.02 + 0.005 * sum(o.finished for o, _ in engines.values()))),
               **{k: 0.0 for k in TCP_EXT}}
        tcp.update(loss_probes=spurious, dsack_recv_segs=spurious, dsack_recv=spurious, fast_retransmits=lost,
                   orig_data_sent=float(((~fe_in) & (fe["wl"] > 66)).sum()) - lost)
        udp = {"in_errors": 0.0, "rcvbuf_errors": 0.0, "sndbuf_errors": 0.0}
        running = int(np.sum(serving[: min(G, C)])) + (2 if any_serving else 0) + int(rng.poisson(0.6))
        st = NodeState(
            t0=t0, t1=t1, util=util, mem_util=mem_util, mem_used=mem, power=power, power_limit=power_limit,
            clock=clock, temp_target=temp_target, reasons=np.zeros(G, np.int64), nvlink_active=np.full(G, g.nvlink_links),
            responding=np.ones(G, bool), pcie_rx=rx, pcie_tx=tx, pcie_duty=duty, pcie_period=step,
            pcie_gen=gen, pcie_width=width, replay_inc=np.zeros(G), nvml_err_inc=np.zeros((G, 3)),
            recov_inc=np.zeros(G), xid=[], pci_width=pci_width, pci_gen=pci_gen, aer_inc=aer_inc, net=net, qdisc=qdisc,
            oper_up={d: True for d in n.netdevs}, carrier_inc={d: 0.0 for d in n.netdevs}, rdma=rdma,
            rdma_active=[True] * len(n.rdma_ports), tlp_bytes=self.tlp.copy(), rdma_mrs=list(self.mrs), rdma_qps=list(self.qps), cpu=cpu, softirq_rx=softirq_rx, softirq_tx=softirq_tx, tcp=tcp,
            udp=udp, procs_running=float(running), procs_blocked=float(rng.poisson(0.1)),
            engines={c.replicas[rid].engine: v for rid, v in engines.items() if c.replicas[rid].engine_node == n.index},
            vllm_up={c.replicas[rid].engine: v[0].serving for rid, v in engines.items()
                     if c.replicas[rid].engine_node == n.index},
            fe_flow=fe["flow"], fe_ts=fe["ts"], fe_wl=fe["wl"], fe_rtx=fe["rtx"], fe_fin=fe["fin"],
            roce=roce, roce_rtx={}, roce_ecn={}, bursts=list(bursts))
        return st

    # ------------------------------------------------------------------------------------------
    # Front-end TCP packets (gateway <-> vLLM API server), one keep-alive connection per request
    # ------------------------------------------------------------------------------------------
    def conn_flows(self, eidx: int, conn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ingress flow idx, egress flow idx) of gateway connections ``conn`` to engine ``eidx``."""
        tab = self._conn_tab.setdefault(eidx, {})
        ing = np.empty(len(conn), np.int64)
        egr = np.empty(len(conn), np.int64)
        for i, cc in enumerate(conn.tolist()):
            pair = tab.get(cc)
            if pair is None:
                cip = f"10.1.{eidx}.{2 + cc % 8}"
                # pooled keep-alive connections use 40000-59999; per-request ones 20000-39999
                cport = 40000 + (cc * 37) % 20000 if cc < 100_000 else 20000 + (cc - 100_000) % 20000
                sport = 8000 + eidx
                ip = self.n.front_ip
                pair = tab[cc] = (self.flows.flow(f"tcp {cip}:{cport}>{ip}:{sport}", False, 0),
                                  self.flows.flow(f"tcp {ip}:{sport}>{cip}:{cport}", True, 0))
            ing[i], egr[i] = pair
        return ing, egr

    def _frontend_packets(self, t0: float, t1: float, engines: dict[int, tuple[TickOut, EngineSim]]) -> dict:
        rng = self.rng
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []

        def add(f: np.ndarray, t: np.ndarray, w: np.ndarray, is_fin: bool = False) -> None:
            parts.append((np.asarray(f, np.int64), np.asarray(t, float), np.asarray(w, float),
                          np.full(len(f), is_fin)))

        for rid, (out, eng) in engines.items():
            rep = self.c.replicas[rid]
            if rep.engine_node != self.n.index:
                continue
            eidx = self.n.engines.index(rep.engine)
            ends = out.steps.starts + out.steps.durs
            # request upload: prompt text (~4.2 bytes/token) + JSON/HTTP headers, MSS 1448
            if len(out.arr_t):
                ing, egr = self.conn_flows(eidx, out.arr_conn)
                size = out.arr_prompt * 4.2 + 420
                nseg = np.maximum(1, np.ceil(size / 1448)).astype(np.int64)
                k = np.repeat(np.arange(len(nseg)), nseg)
                off = np.arange(len(k)) - np.repeat(np.cumsum(nseg) - nseg, nseg)
                t = out.arr_t[k] + off * 2e-6
                seg = np.full(len(k), 1448.0)
                last = np.cumsum(nseg) - 1
                seg[last] = size - (nseg - 1) * 1448
                add(ing[k], t, 66 + seg)
                a = off % 2 == 1  # the server ACKs every second segment
                add(egr[k[a]], t[a] + 3e-5, np.full(int(a.sum()), 66.0))
            # token stream: one SSE event per token, sent when the step that produced it ends
            if len(out.tok_conn) and len(ends):
                ing, egr = self.conn_flows(eidx, out.tok_conn)
                k = np.repeat(np.arange(len(out.tok_n)), out.tok_n)
                off = np.arange(len(k)) - np.repeat(np.cumsum(out.tok_n) - out.tok_n, out.tok_n)
                sidx = np.minimum(out.tok_first[k] + off, len(ends) - 1)
                # the API server serialises sends: a per-request offset behind the step end
                t = ends[sidx] + 2e-4 + rng.gamma(2.0, 2.5e-4, len(k)) + (out.tok_conn[k] % 64) * 6e-6
                add(egr[k], t, 66 + rng.integers(150, 230, len(k)).astype(float))
                a = off % 2 == 1  # the gateway's delayed ACK: every second data segment
                add(ing[k[a]], t[a] + 4e-5, np.full(int(a.sum()), 66.0))
            if len(out.fin_conn):  # usage chunk + [DONE]
                ing, egr = self.conn_flows(eidx, out.fin_conn)
                add(egr, out.fin_t + 5e-4, np.full(len(egr), 66.0 + 310))
                if out.conn_close:  # the client closes: FIN both ways
                    add(ing, out.fin_t + 9e-4, np.full(len(ing), 66.0), True)
                    add(egr, out.fin_t + 1.0e-3, np.full(len(egr), 66.0), True)
        if self.fe_carry is not None:  # packets sent just after the previous interval ended
            parts.append(self.fe_carry)
            self.fe_carry = None
        if parts:
            f = np.concatenate([p[0] for p in parts])
            tt = np.concatenate([p[1] for p in parts])
            w = np.concatenate([p[2] for p in parts])
            fn = np.concatenate([p[3] for p in parts])
        else:
            f, tt, w, fn = np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, bool)
        later = tt >= t1
        if later.any():
            self.fe_carry = (f[later], tt[later], w[later], fn[later])
        keep = (tt >= t0) & (tt < t1)
        f, tt, w, fn = f[keep], tt[keep], w[keep], fn[keep]
        eg = np.array(self.flows.egress, bool)
        ingress = ~eg[f] if len(f) else np.zeros(0, bool)
        return {"flow": f, "ts": np.round(tt * pktfeat.NS).astype(np.int64), "wl": np.round(w).astype(np.int64),
                "rtx": np.zeros(len(f), bool), "fin": fn, "ingress": ingress}
