"""What is true on one simulated node during one interval, before anything measures it.

:class:`NodeState` holds the physical quantities (utilisation, power, PCIe byte rates and their
duty cycle, NIC and RDMA traffic, CPU time, packets) that :meth:`NodeSim.baseline
<skewd.lab.sim.node.NodeSim.baseline>` derives from the engines' step timelines and that fault
injectors (:mod:`.faults`) edit; :mod:`.measure` turns it into the samples the collectors would
produce. Nothing here is a counter or a reading: those belong to the measurement.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import pktfeat
from .qdisc import QueueTruth
from .workload import EngineSim, TickOut


@dataclass
class RoceFlow:
    """One RoCE flow of the node (a queue pair's traffic to one peer) and its packet-feature state."""

    name: str
    port: int  # rdma port index
    egress: bool
    peer: int  # peer node index
    kind: str  # "tp" | "pp" | "kv"
    state: pktfeat.RoceFlowState = field(default_factory=pktfeat.RoceFlowState)


@dataclass
class NodeState:
    """True quantities of one interval, before measurement. Injectors edit these."""

    t0: float
    t1: float
    # per GPU
    util: np.ndarray
    mem_util: np.ndarray
    mem_used: np.ndarray
    power: np.ndarray
    power_limit: np.ndarray
    clock: np.ndarray
    temp_target: np.ndarray
    reasons: np.ndarray  # int bitmask, on top of the ones derived from power/idle
    nvlink_active: np.ndarray
    responding: np.ndarray
    pcie_rx: np.ndarray  # mean bytes/s
    pcie_tx: np.ndarray
    pcie_duty: np.ndarray  # share of time the transfers are on (shapes the 20 ms window samples)
    pcie_period: np.ndarray  # seconds between transfer pulses
    pcie_gen: np.ndarray
    pcie_width: np.ndarray
    replay_inc: np.ndarray
    nvml_err_inc: np.ndarray  # (G, 3) correctable, nonfatal, fatal
    recov_inc: np.ndarray
    xid: list[tuple[int, int]]  # (gpu, code) events in this interval
    # per PCI device (gpus, rdma nics, front nic)
    pci_width: dict[str, int]
    pci_gen: dict[str, int]
    aer_inc: dict[str, dict[str, float]]
    # netdevs
    net: dict[str, dict[str, float]]  # dev → increments of counters (bytes/packets/errors)
    qdisc: dict[str, dict[str, float]]  # dev → backlog, qlen, drops, overlimits, requeues (increments for counters)
    oper_up: dict[str, bool]
    carrier_inc: dict[str, float]
    # rdma ports
    rdma: list[dict[str, float]]
    rdma_active: list[bool]
    tlp_bytes: np.ndarray  # mean payload bytes per host-to-device TLP (DPU view; pinned DMAs fill max payload)
    rdma_mrs: list[float]  # memory regions registered per device right now
    rdma_qps: list[float]
    # host
    cpu: np.ndarray  # (cpus, 7) seconds in user, system, irq, softirq, iowait, steal, idle
    softirq_rx: np.ndarray
    softirq_tx: np.ndarray
    tcp: dict[str, float]
    udp: dict[str, float]
    procs_running: float
    procs_blocked: float
    # engines on this node: entity → (TickOut, EngineSim)
    engines: dict[str, tuple[TickOut, EngineSim]]
    vllm_up: dict[str, bool]
    # front-end packets (explicit): flow idx, ts ns, wire bytes, retransmission, fin
    fe_flow: np.ndarray
    fe_ts: np.ndarray
    fe_wl: np.ndarray
    fe_rtx: np.ndarray
    fe_fin: np.ndarray
    # RoCE bursts per flow: flow index → (starts, durs, bytes); per flow retransmits / ecn marks
    roce: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]
    roce_rtx: dict[int, float]
    roce_ecn: dict[int, float]
    # collective bursts of this node (what the controller aligns): (start, bytes)
    bursts: list[tuple[float, float]] = field(default_factory=list)
    # silences of its collective traffic that ended in the interval (lab/sim/steps.py)
    silences: Any = None
    bulk: list[dict] = field(default_factory=list)  # bulk TCP transfers on the front end (name, egress, bytes, packets)
    notes: dict[str, float] = field(default_factory=dict)
    # egress queues with lock-step dynamics an injector set (dev → truth), and root-qdisc shaping
    # rates (dev → bytes/s); what the collector sees of them is derived in _emit_net (.qdisc)
    queue: dict[str, QueueTruth] = field(default_factory=dict)
    shaped: dict[str, float] = field(default_factory=dict)
