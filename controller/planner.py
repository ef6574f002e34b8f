"""Planner: an open incident becomes one remap suggestion — typed actions, least disruptive first.

Which actions fit follows the runbooks' "suggested action" column, refined by the attributed
cause: a straggler whose host cannot feed its GPUs gets the host command first, one with a
throttling GPU gets traffic moved off it and then its rank moved; a saturated KV cache gets a
concurrency cap. Every action carries its target, rationale, evidence (finding ids), a
confidence, the expected effect, a TTL and an idempotency key; every key is derived from the
cluster, the incident id and the action's type and target, so any replica, before or after a
restart, plans the same suggestion under the same key.

Pure: no I/O, no clock (``now`` is an argument).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from skewd.model import Finding, Scope

from .configtypes import ControllerConfig
from .messages import ActionType, Incident, RemapAction, RemapSuggestion, Target, stable_key

_PCI = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")

#: node-local pathologies a remap can help with, and the actions (unordered; sorted later)
NODE_ACTIONS: dict[str, tuple[ActionType, ...]] = {
    "GPU-1": (ActionType.DRAIN_RECLAIM,),
    "GPU-2": (ActionType.CAP_CONCURRENCY, ActionType.REROUTE),
    "GPU-3": (ActionType.REROUTE, ActionType.DRAIN_RECLAIM),
    "GPU-4": (ActionType.CAP_CONCURRENCY,),
    "GPU-5": (ActionType.REROUTE, ActionType.MOVE_TP_RANK),
    "GPU-6": (ActionType.REROUTE, ActionType.DRAIN_RECLAIM),
    "GPU-8": (ActionType.CAP_CONCURRENCY,),
    "PCIE-1": (ActionType.HOST_TUNING,),
    "PCIE-3": (ActionType.HOST_TUNING,),
    "PCIE-4": (ActionType.HOST_TUNING, ActionType.REBALANCE_SHARDS),
    "PCIE-8": (ActionType.HOST_TUNING,),
    "NS-1": (ActionType.REROUTE,),
    "NS-2": (ActionType.REROUTE,),
    "NS-8": (ActionType.REROUTE,),
}


@dataclass(frozen=True)
class _Candidate:
    type: ActionType
    confidence: float
    rationale: str
    expected: str
    params: dict[str, Any]
    command: str = ""


def host_command(incident: Incident) -> tuple[str, str]:
    """(command, what it does) for host tuning, concrete for the cause we attributed."""
    layer = incident.cause.layer if incident.cause else ""
    pci = next((e for e in ([incident.culprit.entity] if incident.culprit else []) if _PCI.match(e or "")), "")
    if layer == "pcie" or incident.pathology.startswith("PCIE-1"):
        if pci:
            numa = f"$(cat /sys/bus/pci/devices/{pci}/numa_node)"
            return (f"numactl --cpunodebind={numa} --membind={numa} -- <engine command>",
                    f"run the engine on the NUMA node of GPU {pci} so host buffers are local to its PCIe root")
        return ("nvidia-smi topo -m  # then: numactl --cpunodebind=<GPU NUMA node> --membind=<same> -- <engine command>",
                "bind the engine's CPU threads and host memory to the GPUs' NUMA node (pinned, local buffers)")
    return ("tuned-adm profile network-latency",
            "performance CPU governor and no deep C-states, so the feeding threads and IRQs are not starved")


def dropping_ports(inc: Incident, members: Sequence[Finding]) -> list[str]:
    """The ports of the incident's node whose own egress counters dropped packets: NS-7
    findings at port scope (qdisc drops, driver tx drops, counted by that node's kernel) from a
    rule that is not sandbox. A flow's retransmits alone are no such evidence: the packet may
    have been lost anywhere on the path (a switch, the receiver), and moving traffic off this
    node then fixes nothing - a wrong remap is worse than a missed one."""
    node = inc.culprit.node if inc.culprit else ""
    return sorted({f.entity for f in members
                   if f.pathology == "NS-7" and f.scope is Scope.NIC_PORT and f.node == node and f.entity
                   and f.maturity != "sandbox"})


def egress_drop_command(port: str) -> tuple[str, str]:
    """(command, what to do) for drops at ``port``'s egress: where the packets are dropped
    (qdisc or driver) decides the fix, and both counters are on the host."""
    return (f"tc -s qdisc show dev {port}; ip -s link show dev {port}; ethtool -k {port}",
            f"find where {port} drops: a qdisc at its limit (tc 'dropped') wants a larger limit or a "
            f"shaper rate that fits the traffic; driver tx drops (ip 'TX dropped') a larger tx ring "
            f"(ethtool -G {port} tx <max>); check TSO/GSO offloads; on the fabric enable ECN so "
            "congestion marks instead of dropping")


class Planner:
    """Owns nothing but its config: turns an incident into typed remap suggestions, least
    disruptive first; the controller calls it after each correlation."""

    def __init__(self, cfg: ControllerConfig) -> None:
        self.cfg = cfg

    def candidates(self, inc: Incident, members: Sequence[Finding] = ()) -> list[_Candidate]:
        """The actions that fit ``inc``; ``members`` are its member findings (what they
        measured decides some actions, e.g. NS-7's)."""
        cause = inc.cause.layer if inc.cause else "unknown"
        conf = inc.cause.confidence if inc.cause else 0.4
        node = inc.culprit.node if inc.culprit else ""
        tp = inc.culprit.tp_group if inc.culprit else ""
        model = self.cfg.models.get(inc.culprit.model) if inc.culprit and inc.culprit.model else None
        out: list[_Candidate] = []

        def add(t: ActionType, c: float, why: str, expected: str, **params: Any) -> None:
            out.append(_Candidate(t, max(0.0, min(1.0, c)), why, expected, params))

        def cap(c: float, why: str) -> None:
            params: dict[str, Any] = {"factor": self.cfg.concurrency_factor}
            if model and model.max_num_seqs:
                params["max_num_seqs"] = max(1, int(model.max_num_seqs * self.cfg.concurrency_factor))
            if model and model.max_model_len and inc.pathology in ("GPU-2", "GPU-4"):
                params["max_model_len"] = max(256, int(model.max_model_len * self.cfg.concurrency_factor))
            add(ActionType.CAP_CONCURRENCY, c, why,
                "KV usage back under ~0.9 and the waiting queue stops growing; TTFT recovers", **params)

        reroute_target = f"TP group {tp}" if tp else node
        if inc.pathology in self.cfg.culprit_pathologies and node:
            if cause in ("host", "pcie"):
                cmd, what = host_command(inc)
                out.append(_Candidate(ActionType.HOST_TUNING, conf, f"{inc.cause.reason if inc.cause else ''}; {what}",
                                      f"{node}'s bursts arrive with its peers again; the group's step spread "
                                      "shrinks to the fabric's", {}, cmd))
            add(ActionType.REROUTE, conf * 0.9,
                f"every step of {reroute_target} waits for {node}; less traffic on the group lowers the "
                "time its users queue behind the straggler",
                "TTFT and ITL of the group's requests recover as load moves to other replicas; the straggler itself "
                "is not fixed", weight=self.cfg.reroute_weight)
            if inc.pathology == "EW-3":
                add(ActionType.REBALANCE_SHARDS, conf * 0.8, f"{node} moves more bytes per collective than its peers",
                    "equal bytes per rank; the group's collectives end together")
            if inc.pathology == "EW-2":
                add(ActionType.MOVE_PP_RANK, conf * 0.7, f"the pipeline stage of {node} opens bubbles downstream",
                    "stage hand-off gaps back to the pipeline's median")
            elif cause in ("gpu", "pcie", "network", "unknown") or inc.pathology in ("EW-1", "EW-9"):
                rank = None
                grp = self.cfg.tp_groups.get(tp)
                if grp and node in grp.nodes:
                    rank = grp.nodes.index(node)
                params = {"from_node": node, **({"rank": rank} if rank is not None else {})}
                add(ActionType.MOVE_TP_RANK, conf * (0.8 if cause != "unknown" else 0.5),
                    f"{node} is the group's straggler (cause {cause}); a spare node in its place removes the wait",
                    "arrival spread of the group's collectives drops to the fabric's jitter", **params)
            if cause == "engine":
                cap(conf * 0.8, f"{node}'s engine carries more requests than its peers")
            if cause == "gpu":
                add(ActionType.DRAIN_RECLAIM, conf * 0.6, f"{node}'s GPU keeps throttling; take it out of service",
                    "the group runs on healthy GPUs; the drained GPU can be inspected (cooling, power)")
        elif inc.pathology == "NS-7":
            # egress drops/retransmits (runbook: check offloads, enable ECN/PFC): only when the
            # node's own port counted the drops, never on retransmits alone (dropping_ports)
            for port in dropping_ports(inc, members)[:1]:
                cmd, what = egress_drop_command(port)
                out.append(_Candidate(ActionType.HOST_TUNING, conf, f"NS-7 on {node}: {port} drops packets at "
                                      f"its egress; {what}",
                                      f"{port}'s drop counters stop rising; the retransmits and stream gaps "
                                      "they cause end, ITL recovers", {"port": port}, cmd))
                add(ActionType.REROUTE, conf * 0.8,
                    f"NS-7 on {node}: its responses lose packets at {port}'s egress; send it less traffic "
                    "until the port is fixed",
                    f"less traffic queues at {port}, so it drops less; TTFT and ITL of the moved requests "
                    "recover (the port itself is not fixed)", weight=self.cfg.reroute_weight, port=port)
        elif inc.pathology in NODE_ACTIONS:
            for t in NODE_ACTIONS[inc.pathology]:
                if t is ActionType.CAP_CONCURRENCY:
                    cap(conf, inc.summary or inc.pathology)
                elif t is ActionType.HOST_TUNING:
                    cmd, what = host_command(inc)
                    out.append(_Candidate(t, conf, f"{inc.pathology} on {node}: {what}",
                                          "GPU feed steady again, utilisation recovers", {}, cmd))
                elif t is ActionType.REROUTE:
                    add(t, conf * 0.9, f"{inc.pathology} on {node}: send it less traffic",
                        "queueing on the node drains; TTFT recovers", weight=self.cfg.reroute_weight)
                elif t is ActionType.DRAIN_RECLAIM:
                    add(t, conf * 0.8, f"{inc.pathology} on {node}: the GPU is not serving usefully",
                        "capacity returns to the scheduler")
                elif t is ActionType.MOVE_TP_RANK:
                    add(t, conf * 0.6, f"{inc.pathology}: {node} slows its TP group", "group step time recovers",
                        from_node=node)
                elif t is ActionType.REBALANCE_SHARDS:
                    add(t, conf * 0.6, f"{inc.pathology}: uneven work on {node}'s GPUs", "even per-GPU feed")
        return out

    def plan(self, inc: Incident, now: float, controller: str = "",
             members: Sequence[Finding] = ()) -> RemapSuggestion | None:
        """The suggestion for ``inc``, or None when nothing fits (or nothing is confident enough).
        ``members``: the incident's member findings (:meth:`candidates`)."""
        cands = [c for c in self.candidates(inc, members) if c.confidence >= self.cfg.min_confidence]
        if not cands:
            return None
        # least disruptive first; among equals the more confident
        cands.sort(key=lambda c: (c.type.disruption, -c.confidence, c.type.value))
        ttl = self.cfg.remap_ttl
        target = inc.culprit or Target()
        evidence = tuple(inc.findings)
        actions = []
        for c in cands:
            akey = stable_key(inc.cluster, inc.id, c.type.value, target.to_dict())
            actions.append(RemapAction(key=akey, type=c.type, target=target, rationale=c.rationale, evidence=evidence,
                                       confidence=round(c.confidence, 4), expected_effect=c.expected, ttl_s=ttl,
                                       params=dict(c.params), command=c.command))
        # one suggestion per incident: its key depends on the incident alone, so a later, richer
        # plan for the same incident (cause attributed, more findings) never publishes twice
        key = suggestion_key(inc.cluster, inc.id)
        return RemapSuggestion(
            key=key, cluster=inc.cluster, incident=inc.id, pathology=inc.pathology, created_at=now,
            expires_at=now + ttl, ttl_s=ttl, culprit=inc.culprit, cause=inc.cause, phase=inc.phase,
            effect=inc.effect, actions=actions, evidence=list(evidence),
            confidence=round(max(a.confidence for a in actions), 4), summary=inc.summary, controller=controller)


def suggestion_key(cluster: str, incident_id: str) -> str:
    return stable_key(cluster, incident_id, "remap")


def semantic_key(s: RemapSuggestion) -> str:
    """What a suggestion *does* (types and targets), regardless of which incident asked: while
    one such suggestion is live, an equivalent one is not published again (Alertmanager's
    repeat interval)."""
    return stable_key(s.cluster, sorted((a.type.value, sorted(a.target.to_dict().items())) for a in s.actions))
