"""Scripted real-traffic scenarios, and the seeded draw of what a real cluster varies.

A scenario names a fault (or none); the seed draws everything else a production TP group
varies and that the rules must not depend on: the step period (20-100 ms), the all-reduce
message (0.25-8 MB, log-uniform), whether collectives have a port of their own or share the
front end's, which node is faulty, when the fault starts, and the fault's own size (a
straggler's lag of 10-30 ms per step, a shaper's rate as a fraction of what the collective
needs). Anything may be pinned with an override (the CI smoke pins a mid-range straggler).

One limit is this machine's, not a cluster's: every node, agent and rank shares two cores, so a
draw whose collective would move more than :data:`MAX_RANK_BYTES_PER_S` per rank gets a
smaller message (recorded in the plan as ``message_capped``).
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

#: per-rank collective bytes on the wire per second this 2-core lab sustains beside 4 agents
#: (measured: 2 MB every 46 ms over 4 gloo ranks = 65 MB/s per rank at ~15 % of a core each)
MAX_RANK_BYTES_PER_S = 80e6


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str | None  # a key of skewd.lab.netlab.faults.FAULTS, None = healthy
    desc: str


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", None, "collectives, token streams and NATS on every node; no fault: every finding is false"),
    Scenario("straggler", "straggler", "one rank computes 10-30 ms longer every step (extra sleep): EW-1 on that node"),
    Scenario("straggler-cpu", "straggler_cpu",
             "one rank's CPU quota (cgroup cpu.max / cfs_quota_us) cut so its steps take 10-30 ms longer: EW-1"),
    Scenario("slow-link", "slow_link",
             "the node's collective port shaped (tbf) to 30-60 % of what its all-reduce needs, NIC-ring-sized "
             "queue: NS-9 (or NS-5)"),
    Scenario("deep-queue", "deep_queue",
             "tbf at 60-90 % of the collective's need with a 1-2 s queue: bursts wait in the qdisc, NS-5"),
    Scenario("drops", "drops",
             "htb at 110-160 % of the need over a pfifo of 10-35 % of a step's burst (2-16 packets): every step's "
             "burst is tail-dropped, "
             "NS-7 (EW-6)"),
    Scenario("ingress-drops", "ingress_drops",
             "the same tiny queue on the switch port into the node's collective port: bursts are tail-dropped on "
             "their way in, the node's peers resend to it; NS-4 on that node, and no peer named for it"),
)}


@dataclass
class Plan:
    """One run, fully drawn: what the runner builds and what truth.json restates."""

    scenario: str
    fault: str | None
    seed: int
    duration_s: float
    nodes: int
    period_s: float
    message_bytes: int
    message_capped: bool
    dedicated_port: bool
    faulty_node: int | None
    onset_s: float | None  # after the agents are up
    lag_s: float | None  # straggler: extra compute per step
    rate_fraction: float | None  # shapers: tbf rate / the collective's measured need
    queue: str | None  # shapers: tbf queue ("latency 1.5s" / "limit 4542")
    streams_per_node: int
    overrides: dict[str, Any] = field(default_factory=dict)
    #: the fault is removed this long after onset (None: it lasts to the end). Pinned only, never
    #: drawn, so every seed's other draws stay what they were
    fault_duration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank_wire_bytes_per_step(nodes: int, message_bytes: int) -> float:
    """What one rank sends per ring all-reduce: reduce-scatter + all-gather, 2(N-1)/N of it."""
    return 2 * (nodes - 1) / nodes * message_bytes


#: the largest GSO super-packet the kernel hands a qdisc (gso_max_size of a veth and most NICs)
GSO_MAX_BYTES = 65536


def drops_queue_packets(nodes: int, message_bytes: int, share: float) -> int:
    """The pfifo limit, in packets, of a ``drops`` fault: ``share`` of one step's burst on the
    port counted in full GSO super-packets, between 2 and 16. A fixed 4-10 packets, as before,
    was about the whole burst of a small message (360 KB over 4 ranks: 8 super-packets against a
    limit of 7), and that fault dropped 2 packets in 150 s: no fault at all. 16 x 64 KiB (1 MiB)
    stays under what TCP small queues let one flow keep in the qdisc (tcp_limit_output_bytes),
    so a big burst still meets a full queue."""
    burst = rank_wire_bytes_per_step(nodes, message_bytes) / GSO_MAX_BYTES
    return max(2, min(16, round(share * burst)))


def make_plan(name: str, seed: int, duration_s: float = 300.0, nodes: int = 4,
              overrides: dict[str, Any] | None = None) -> Plan:
    """Draw a run of scenario ``name`` from ``seed``. ``overrides`` pins any drawn field
    (period_s, message_bytes, dedicated_port, faulty_node, onset_s, lag_s, rate_fraction, queue)."""
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    sc = SCENARIOS[name]
    ov = dict(overrides or {})
    rnd = random.Random(f"{name}/{seed}")
    period = rnd.uniform(0.020, 0.100)
    msg = int(math.exp(rnd.uniform(math.log(0.25e6), math.log(8e6))))
    dedicated = rnd.random() < 0.5
    faulty = rnd.randrange(nodes)
    onset = max(60.0, rnd.uniform(0.30, 0.45) * duration_s)
    lag = rnd.uniform(0.010, 0.030)
    rate_fraction: float | None = None
    queue: str | None = None
    queue_share = 0.0
    if sc.fault == "slow_link":
        rate_fraction = rnd.uniform(0.30, 0.60)
        queue = f"limit {100 * 1514}"  # a NIC ring's worth of full-size frames
    elif sc.fault == "deep_queue":
        rate_fraction = rnd.uniform(0.60, 0.90)
        queue = f"latency {rnd.uniform(1.0, 2.0):.2f}s"
    elif sc.fault in ("drops", "ingress_drops"):
        # above the average need: the loss comes from the step's burst meeting a tiny queue,
        # a fraction of the burst (sized below, once the message size is final)
        rate_fraction = rnd.uniform(1.1, 1.6)
        queue_share = rnd.uniform(0.10, 0.35)
    period = float(ov.pop("period_s", period))
    msg = int(ov.pop("message_bytes", msg))
    capped = False
    cap = int(MAX_RANK_BYTES_PER_S * period / rank_wire_bytes_per_step(nodes, 1))
    if msg > cap and "message_bytes" not in (overrides or {}):
        msg, capped = cap, True
    if sc.fault in ("drops", "ingress_drops"):  # a node receives what it sends in a ring all-reduce
        queue = f"limit {drops_queue_packets(nodes, msg, queue_share)}"
    plan = Plan(
        scenario=name, fault=sc.fault, seed=seed, duration_s=float(duration_s), nodes=nodes,
        period_s=period, message_bytes=msg, message_capped=capped,
        dedicated_port=bool(ov.pop("dedicated_port", dedicated)),
        faulty_node=int(ov.pop("faulty_node", faulty)) if sc.fault else None,
        onset_s=float(ov.pop("onset_s", onset)) if sc.fault else None,
        lag_s=float(ov.pop("lag_s", lag)) if sc.fault in ("straggler", "straggler_cpu") else None,
        rate_fraction=float(ov.pop("rate_fraction", rate_fraction)) if rate_fraction is not None else None,
        queue=str(ov.pop("queue", queue)) if queue is not None else None,
        streams_per_node=int(ov.pop("streams_per_node", 4)),
        overrides=dict(overrides or {}),
        fault_duration_s=float(ov.pop("fault_duration_s")) if ov.get("fault_duration_s") is not None else None,
    )
    ov.pop("fault_duration_s", None)
    for k in ("lag_s", "rate_fraction", "queue", "faulty_node", "onset_s"):
        ov.pop(k, None)  # pinned for a scenario that does not use it: harmless
    if ov:
        raise KeyError(f"unknown override(s) {sorted(ov)}")
    if plan.onset_s is not None and plan.onset_s >= plan.duration_s - 30:
        raise ValueError(f"onset {plan.onset_s:.0f}s leaves under 30 s of a {plan.duration_s:.0f}s run")
    if plan.fault_duration_s is not None and (plan.fault is None or plan.onset_s is None
                                              or plan.onset_s + plan.fault_duration_s >= plan.duration_s - 60):
        raise ValueError(f"fault duration {plan.fault_duration_s:.0f}s: a fault must end at least 60 s before "
                         f"the run does (onset {plan.onset_s}s, run {plan.duration_s:.0f}s) so recovery is seen")
    if plan.faulty_node is not None and not 0 <= plan.faulty_node < nodes:
        raise ValueError(f"faulty_node {plan.faulty_node}: the run has nodes 0..{nodes - 1}")
    return plan
