"""Which end of a lossy path: the node that several lossy flows share.

A TCP flow that loses segments shows it at both ends: its sender resends what was never
confirmed (``NS-7-egress-retransmits``, the flow named from the sender's node) and its receiver
receives resends of data it never had (``NS-4-ingress-retransmits``, the same flow named from
the receiver's node). One flow cannot say where on the path the loss was. Several can: a lossy
switch port or cable in front of a node takes segments from every peer that sends to it, while
a lossy port behind a node takes segments of every flow it sends. So:

* an **ingress end**: flows from two or more sending nodes lose into one address, and none of
  those senders loses towards any other address. The senders' egress-loss findings on those
  flows (and their node-level loss storm, ``EW-6-tcp-loss-storm``, when every lossy flow of the
  sender goes there) are the receiver's trouble: they join the incident of the receiver's own
  ingress-loss finding. Real lab, ``ingress-drops`` seed 502 (a 3-packet queue on the switch
  port into n2): NS-4 on n2, NS-7 on both of its ring neighbours n1 and n3, EW-6 on n3; without
  this, three incidents named the two healthy neighbours.
* an **egress end**: one sender's flows lose towards two or more receiving nodes, and each of
  those receivers loses only from it. The receivers' ingress-loss findings on those flows join
  the incident of the sender's egress-loss finding.

A single lossy flow (one sender, one receiver) stays ambiguous and both ends keep their
findings' incidents, as before. Nothing is attributed to a node that has no finding of its own
to hold the incident: the holder is always a firing loss finding on the common end's node.
Addresses map to nodes through the findings themselves (an egress-loss finding's node sends
from the flow's source address, an ingress-loss finding's node receives at its destination).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from skewd.collectors.pkt.flowkey import hosts_of
from skewd.model import Finding, Scope

from .configtypes import LossPaths


def attribute(firing: Sequence[Finding], paths: LossPaths) -> dict[str, Finding]:
    """Fingerprint of each finding that a common end explains → the finding on that end's node
    whose incident it joins (see the module doc). ``firing``: the correlator's firing findings."""
    flows: list[tuple[Finding, str, str, bool]] = []  # (finding, src, dst, seen at the receiver)
    owner: dict[str, str] = {}  # address -> the node a loss finding puts there
    for f in firing:
        inbound = f.pathology in paths.ingress
        if f.scope is not Scope.FLOW or not (inbound or f.pathology in paths.egress):
            continue
        h = hosts_of(f.entity)
        if h is None:
            continue
        flows.append((f, h[0], h[1], inbound))
        owner.setdefault(h[1] if inbound else h[0], f.node)
    if len(flows) < 2:
        return {}

    def who(addr: str) -> str:  # a node where one is known, else the address itself
        return owner.get(addr, addr)

    into: dict[str, set[str]] = defaultdict(set)  # receiving node -> sending nodes that lose into it
    out: dict[str, set[str]] = defaultdict(set)  # sending node -> receiving nodes it loses towards
    for _, s, d, _ in flows:
        into[who(d)].add(who(s))
        out[who(s)].add(who(d))
    ingress_end = {r for r, senders in into.items() if len(senders) >= 2 and all(out[s] == {r} for s in senders)}
    egress_end = {s for s, receivers in out.items() if len(receivers) >= 2 and all(into[r] == {s} for r in receivers)}
    # the finding that holds each end's incident: its own loss finding of that direction, first fired
    holder: dict[tuple[str, bool], Finding] = {}
    for f, s, d, inbound in sorted(flows, key=lambda x: (x[0].active_at, x[0].fingerprint)):
        end = who(d) if inbound else who(s)
        if end == f.node:
            holder.setdefault((end, inbound), f)
    out_map: dict[str, Finding] = {}
    for f, s, d, inbound in flows:
        if not inbound and who(d) in ingress_end and f.node != who(d):
            h = holder.get((who(d), True))
            if h is not None:
                out_map[f.fingerprint] = h
        elif inbound and who(s) in egress_end and f.node != who(s):
            h = holder.get((who(s), False))
            if h is not None:
                out_map[f.fingerprint] = h
    # a sender's node-level storm, when every lossy flow it sends goes to one ingress end
    for f in firing:
        if f.pathology in paths.node and f.scope is Scope.NODE and out.get(f.node):
            (r,) = out[f.node] if len(out[f.node]) == 1 else (None,)
            h = holder.get((r, True)) if r in ingress_end else None
            if h is not None and h.node != f.node:
                out_map[f.fingerprint] = h
    return out_map
