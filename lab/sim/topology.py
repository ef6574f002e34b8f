"""Cluster shape for the fault lab: nodes, GPUs, NICs, replicas, TP/PP groups, addresses.

Everything here is derived from the scenario's ``cluster`` section and fixed for a run: entity
names follow the collectors' conventions (``gpu3``, ``eth0``, ``mlx5_1/1``, ``0000:18:00.0``,
``cpu7``, ``engine0``) so the samples the simulator emits are the ones a real node would send.

Hardware figures are public datasheet values (H100 SXM5 80 GB: 700 W, 1980 MHz boost, 18 NVLink
links, PCIe Gen5 x16; L40S: 350 W, no NVLink, Gen4 x16; ConnectX-7 NDR 400 Gb/s); model figures
(KV bytes per token, step times) are rough public numbers for the model class, chosen to give
realistic orders of magnitude, not measurements.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# ------------------------------------------------------------------------------------------------
# Presets
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    name: str
    mem_total: float  # bytes NVML reports as total
    power_limit: float  # W
    power_idle: float  # W
    power_busy_decode: float  # W at full decode batch (memory bound)
    power_busy_prefill: float  # W during compute-bound prefill
    sm_clock_max: float  # Hz
    sm_clock_idle: float  # Hz
    nvlink_links: int  # 0 = no NVLink (PCIe-only P2P)
    pcie_gen: int
    pcie_width: int
    temp_idle: float
    temp_per_watt: float  # steady-state degrees per watt above idle
    mem_speed: float = 1.0  # memory bandwidth relative to an H100 SXM (decode steps scale with it)
    compute_speed: float = 1.0  # dense bf16 throughput relative to an H100 SXM (prefill)


GPUS: dict[str, GpuModel] = {
    "h100-sxm": GpuModel("h100-sxm", 81559 * 2**20, 700.0, 72.0, 430.0, 680.0, 1980e6, 345e6, 18, 5, 16, 31.0, 0.055),
    "a100-sxm": GpuModel("a100-sxm", 81920 * 2**20, 400.0, 55.0, 280.0, 390.0, 1410e6, 210e6, 12, 4, 16, 30.0, 0.09,
                         0.6, 0.32),
    "l40s": GpuModel("l40s", 46068 * 2**20, 350.0, 34.0, 230.0, 340.0, 2520e6, 210e6, 0, 4, 16, 28.0, 0.12,
                     0.26, 0.37),
}


@dataclass(frozen=True)
class ModelSpec:
    """A served model class: what one decode step costs and how much KV a token holds."""

    name: str
    kv_bytes_per_token: float  # all layers, all KV heads (divide by TP for one GPU's shard)
    weights_gb: float
    step_base_s: float  # decode step floor at TP=tp_ref (kernel launches, weights read)
    step_per_seq_s: float  # per running sequence
    step_per_ctx_token_s: float  # per token of context held (attention reads)
    prefill_tokens_per_s: float  # compute-bound prefill throughput of one replica
    hidden: int
    layers: int
    tp_ref: int


MODELS: dict[str, ModelSpec] = {
    # Step costs from memory bandwidth (weights and KV read once per step, 3.35 TB/s per H100)
    # and compute (2 FLOP per parameter per token at ~50 % of peak); prefill likewise.
    # 405B-class dense model, FP8 weights, bf16 KV (vLLM's default kv_cache_dtype), TP8
    "dense-405b-fp8": ModelSpec("dense-405b-fp8", 516096, 405, 0.017, 0.000085, 1.0e-8, 7000, 16384, 126, 8),
    # the same model in bf16 (KV bf16), served with TP16 across two nodes or TP8 x PP2
    "dense-405b": ModelSpec("dense-405b", 516096, 810, 0.017, 0.00017, 1.0e-8, 7000, 16384, 126, 16),
    # 70B-class dense model (GQA, 80 layers, 8 KV heads x 128, bf16 KV), TP8
    "dense-70b": ModelSpec("dense-70b", 327680, 140, 0.010, 0.00003, 1.2e-8, 25000, 8192, 80, 8),
    # 8B-class dense model (32 layers, 8 KV heads x 128, bf16 KV), one GPU per replica
    "dense-8b": ModelSpec("dense-8b", 131072, 16, 0.007, 0.000027, 3.9e-8, 25000, 4096, 32, 1),
}

#: plausible HGX-board bus ids (GPUs) and adjacent ConnectX ports; numa halves of the board
GPU_BUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
RDMA_BUS = ["19", "3b", "9b", "bb", "1a", "2b", "5e", "dc"]
FRONT_BUS = "c1"


@dataclass
class Replica:
    """One model replica (one vLLM engine): its GPUs across nodes and its stages."""

    id: int
    engine_node: int  # node whose vLLM endpoint serves the replica
    engine: str  # vllm entity on that node
    stages: list[list[int]]  # per PP stage: node indices (TP spans them in rank order)
    gpus: list[tuple[int, int]]  # (node, gpu index) of every rank
    role: str = "mixed"  # mixed | prefill | decode (disaggregated serving)

    @property
    def nodes(self) -> list[int]:
        return sorted({n for st in self.stages for n in st})

    @property
    def cross_node_tp(self) -> bool:
        return any(len(st) > 1 for st in self.stages)


@dataclass
class Node:
    index: int
    name: str
    gpus: list[str]
    gpu_pci: list[str]
    gpu_numa: list[int]
    rdma_ports: list[str]  # mlx5_k/1
    rdma_netdevs: list[str]  # their netdevs (RoCE ports)
    rdma_pci: list[str]
    front: str  # frontend netdev
    front_pci: str
    cpus: int
    front_ip: str
    rdma_ips: list[str]
    replicas: list[int] = field(default_factory=list)  # replicas with ranks here
    engines: list[str] = field(default_factory=list)  # vllm entities served from here
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def netdevs(self) -> list[str]:
        return [self.front] + self.rdma_netdevs

    @property
    def pci_devices(self) -> list[str]:
        return self.gpu_pci + self.rdma_pci + [self.front_pci]


@dataclass
class Cluster:
    name: str
    gpu: GpuModel
    model: ModelSpec
    nodes: list[Node]
    replicas: list[Replica]
    tp: int
    pp: int
    gpus_per_node: int
    rdma_speed: float  # bytes/s per port
    front_speed: float  # bytes/s
    kv_offload: bool
    gpu_memory_utilization: float
    max_num_seqs: int
    kv_capacity_tokens: int  # per replica
    pkt_ports: str  # "all" | "front" | "rdma"
    dpu: bool = False  # BlueField DPUs with DOCA Telemetry Service scraped by the exporter collector
    clock: str = "ptp"  # node clock discipline: ptp (ConnectX PHC, ~us), ntp (~ms) or none (unsynced, ~s)
    #: how the TP collectives travel: roce (NCCL over RDMA) or tcp (gloo / NCCL sockets): their
    #: pauses inside a collective differ (lab/sim/steps.py)
    collective_transport: str = "roce"

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def replicas_on(self, node: int) -> list[Replica]:
        return [r for r in self.replicas if node in r.nodes]

    def tp_peers(self, node: int) -> list[int]:
        """Nodes sharing a TP group with ``node`` (itself included), or [node]."""
        for r in self.replicas:
            for st in r.stages:
                if node in st:
                    return list(st)
        return [node]


def build_cluster(*, name: str, nodes: int, gpus_per_node: int, gpu: str, model: str, tp: int, pp: int,
                  rdma_nics: int, rdma_speed: float, front_speed: float, cpus: int, kv_offload: bool,
                  gpu_memory_utilization: float, max_num_seqs: int, disaggregated: bool = False,
                  pkt_ports: str = "all", dpu: bool = False, clock: str = "ptp",
                  collective_transport: str = "roce") -> Cluster:
    """Lay out replicas over nodes: a replica needs ``tp * pp`` GPUs; when that exceeds a node,
    each PP stage spans ``tp / gpus_per_node`` nodes (cross-node TP), stages on further nodes."""
    g = GPUS[gpu]
    m = MODELS[model]
    per_replica = tp * pp
    if per_replica >= gpus_per_node:
        if tp % gpus_per_node and tp > gpus_per_node:
            raise ValueError(f"tp={tp} must be a multiple of gpus_per_node={gpus_per_node} when TP spans nodes")
        nodes_per_stage = max(1, tp // gpus_per_node)
        stages_per_node = max(1, gpus_per_node // tp)
        nodes_per_replica = max(1, (pp * nodes_per_stage) // stages_per_node)
        if nodes % nodes_per_replica:
            raise ValueError(f"{nodes} nodes do not divide into replicas of {nodes_per_replica} nodes (tp={tp}, pp={pp})")
        n_rep = nodes // nodes_per_replica
        reps_per_node = 1
    else:
        if gpus_per_node % per_replica:
            raise ValueError(f"gpus_per_node={gpus_per_node} is not a multiple of tp*pp={per_replica}")
        nodes_per_stage = 1
        stages_per_node = pp
        nodes_per_replica = 1
        reps_per_node = gpus_per_node // per_replica
        n_rep = nodes * reps_per_node
    node_objs: list[Node] = []
    for i in range(nodes):
        node_objs.append(Node(
            index=i, name=f"node{i}", gpus=[f"gpu{k}" for k in range(gpus_per_node)],
            gpu_pci=[f"0000:{GPU_BUS[k % 8]}:00.0" if k < 8 else f"0001:{GPU_BUS[k % 8]}:00.0" for k in range(gpus_per_node)],
            gpu_numa=[0 if k < max(1, gpus_per_node // 2) else 1 for k in range(gpus_per_node)],
            rdma_ports=[f"mlx5_{k}/1" for k in range(rdma_nics)],
            rdma_netdevs=[f"eth{k + 1}" for k in range(rdma_nics)],
            rdma_pci=[f"0000:{RDMA_BUS[k % 8]}:00.0" for k in range(rdma_nics)],
            front="eth0", front_pci=f"0000:{FRONT_BUS}:00.0", cpus=cpus,
            front_ip=f"10.0.0.{10 + i}", rdma_ips=[f"10.{10 + k}.0.{10 + i}" for k in range(rdma_nics)],
        ))
    replicas: list[Replica] = []
    if reps_per_node > 1:
        for i in range(nodes):
            for j in range(reps_per_node):
                rid = len(replicas)
                gpus_ = [(i, j * per_replica + k) for k in range(per_replica)]
                eng = f"vllm{j}"
                replicas.append(Replica(rid, i, eng, [[i] for _ in range(pp)], gpus_))
    else:
        for r in range(n_rep):
            base = r * nodes_per_replica
            stages: list[list[int]] = []
            gpus_: list[tuple[int, int]] = []
            for s in range(pp):
                if nodes_per_stage > 1:
                    st = [base + s * nodes_per_stage + k for k in range(nodes_per_stage)]
                    gpus_ += [(n, k) for n in st for k in range(gpus_per_node)]
                else:
                    n = base + s // stages_per_node
                    st = [n]
                    off = (s % stages_per_node) * tp
                    gpus_ += [(n, off + k) for k in range(tp)]
                stages.append(st)
            replicas.append(Replica(r, base, "engine0", stages, gpus_))
    if disaggregated:
        if len(replicas) < 2:
            raise ValueError("disaggregated serving needs at least two replicas (prefill and decode)")
        half = len(replicas) // 2
        for r in replicas[:half]:
            r.role = "prefill"
        for r in replicas[half:]:
            r.role = "decode"
    for r in replicas:
        for n in r.nodes:
            node_objs[n].replicas.append(r.id)
        node_objs[r.engine_node].engines.append(r.engine)
        for s, st in enumerate(r.stages):
            for rank, n in enumerate(st):
                lab = node_objs[n].labels
                lab.setdefault("model", m.name)
                if r.cross_node_tp:
                    lab["tp_group"] = f"r{r.id}s{s}"
                    lab["tp_rank"] = str(rank)
                if len(r.nodes) > 1 and pp > 1:
                    lab["pp_group"] = f"r{r.id}"
                    lab["pp_stage"] = str(s)
                if r.role != "mixed":
                    lab["role"] = r.role
    # KV capacity of a replica: what gpu_memory_utilization leaves after weights, over its GPUs
    per_gpu_kv = max(1.0, g.mem_total * gpu_memory_utilization - m.weights_gb * 1e9 / per_replica - 2.5e9)
    kv_tokens = int(per_gpu_kv * per_replica / m.kv_bytes_per_token)
    return Cluster(name, g, m, node_objs, replicas, tp, pp, gpus_per_node, rdma_speed, front_speed, kv_offload,
                   gpu_memory_utilization, max_num_seqs, kv_tokens, pkt_ports, dpu, clock, collective_transport)
