"""Scale-out: what a partition worker hands the leader, and what the leader takes in.

With ``controller.partitions`` set, each partition's Controller evaluates the TP-group rules of
its nodes and, at each tick, publishes a digest (:mod:`skewd.controller.digest`: the nodes'
latest samples, the ``ctl_*`` values the cluster-wide rules read, the groups' alignment reports);
the leader takes the digests in at its next tick instead of summaries. This module holds both
ends of that exchange on the Controller, and the checks that say when a deployment splits a
group over partitions (a node's placement token, summaries on the unmapped subject). The worker
process that holds partitions and the leader lease is :mod:`skewd.controller.scaleout`.
"""
from __future__ import annotations

import logging
from typing import Any

from skewd import wire
from skewd.model import Scope, State

from . import ingest
from .catalogue import NAMES as CTL_SIGNALS

log = logging.getLogger("skewd.controller")


def digest_rows(rows: dict[str, tuple]) -> dict[str, tuple]:
    """The nodes' latest summaries as :func:`~skewd.controller.digest.encode_digests` takes
    them: a binary summary's row holds its (plan, values), whose signals' dict is made here,
    once per digest, instead of once per summary."""
    return {n: r if type(r[3]) is dict else (r[0], r[1], r[2], r[3][0].signals(r[3][1])) for n, r in rows.items()}


class PartitionExchange:
    """Partition → leader digests, the leader's intake of them, and placement checks.

    A part of :class:`~skewd.controller.service.Controller`, which declares every field in
    its ``__init__``; this class adds behaviour only."""

    def _check_placement(self, subject: str, node: str) -> None:
        """A partition worker notes a node whose summaries carry another placement token than
        its configured TP group or pipeline: such a group may be split over partitions (the
        agent lacks its ``tp_group``/``pp_group`` label), and its alignment would be blind."""
        if self._placed_version != self.topology.version:
            self._placed_version, self._placed = self.topology.version, set()
        if node in self._placed:
            return
        self._placed.add(node)
        if self.topology.group_of(node) is None:
            return
        parsed = ingest.parsed_subject(subject)
        got = parsed.tokens.get("placement") if isinstance(parsed, wire.ParsedSubject) else None
        want = {self.topology.group_of(node).name}  # type: ignore[union-attr]
        want |= {name for name, p in self.topology.pp_groups().items()
                 if any(node in self.topology.stage_members(st) for st in p.stages)}
        if got is not None and got not in want:
            self.misplaced[node] = (f"summaries placed by {got!r}, the config puts {node} in {sorted(want)}: set the "
                                    f"agent's labels (tp_group/pp_group) so its group shares one partition")
            log.warning("partition %s: %s", self.partition, self.misplaced[node])

    async def _publish_digest(self, t: float, derived: dict[str, dict[str, float]]) -> None:
        """Hand the leader what it needs of this partition at ``t`` (controller/scaleout.py)."""
        from .digest import encode_digests

        rows, self._digest_rows = digest_rows(self._digest_rows), {}
        if self._leader_ctl is None:  # the ctl_* values the cluster-wide rules read: all the leader needs of them
            self._leader_ctl = frozenset(s for r in self.engine.rules.rules if r.scope is Scope.CLUSTER
                                         for s in r.requires if s in CTL_SIGNALS)
        derived = {n: {k: v for k, v in vals.items() if k in self._leader_ctl} for n, vals in derived.items()}
        derived = {n: vals for n, vals in derived.items() if vals}
        for data in encode_digests(self.cfg.cluster, self.partition or 0, t, rows, derived, self.aligner.reports):
            try:
                await self.nc.publish(wire.digest_subject(self.cfg.cluster, self.partition or 0), data)
            except Exception as e:  # noqa: BLE001 - the next digest carries fresh values
                self.stats.errors += 1
                log.warning("partition %s: digest not published: %s", self.partition, e)

    async def _on_digest(self, msg: Any) -> None:
        from .digest import decode_digest

        if self._ticking:  # its state is on the tick thread (evaluation.py)
            await self._tick_idle()

        try:
            d = decode_digest(msg.data)
        except ValueError as e:
            self.stats.errors += 1
            log.warning("digest on %s unreadable: %s", msg.subject, e)
            return
        if d.cluster != self.cfg.cluster:
            return
        self.digests_in += 1
        self._digests.append(d)
        for r in d.rows:
            if self._heard(r.node, r.interval):
                self._advance(r.node, r.t)

    async def _on_unpartitioned(self, msg: Any) -> None:
        """A summary on the unmapped subject while workers own partitions: the server lacks the
        partition mapping, so no worker receives it (said once a minute in the log)."""
        self.unpartitioned += 1
        if self.unpartitioned in (1, 100) or self.unpartitioned % 60000 == 0:
            log.error("%d summaries arrived unpartitioned (e.g. on %s): the NATS server has no partition mapping "
                      "(`skewd nats-auth --partitions %d`); no worker takes them in", self.unpartitioned,
                      msg.subject, self.cfg.partitions)

    def _take_digests(self) -> None:
        """Leader: the digests received since the last tick into topology, timelines and store."""
        from .align import GroupReport

        digests, self._digests = self._digests, []
        for d in digests:
            for r in d.rows:  # as ingest_summary takes a summary, less the bursts
                if r.node not in self.nodes:
                    continue  # refused at arrival (ingest.max_nodes)
                if r.labels:
                    self.topology.observe(r.node, r.labels)
                self.timelines.add_summary(r.node, r.t, r.signals)
                names, ents, values = self.feed.samples(r.node, r.signals)
                if values:
                    self.feed.add(r.node, r.t, names, ents, values)
            if d.derived:
                self.feed.flush()
                self.feed.ingest_derived(d.t, d.derived)
            for g, rep in d.reports.items():
                try:
                    self._reports[g] = GroupReport(**rep)
                except TypeError:
                    continue

    def _forget_lapsed(self, fingerprint: str) -> None:
        """Leader: a partition deleted the KV record of a pending group finding its engine
        dropped (:meth:`_drop_lapsed_pending`): drop it here too, or it would hold its TP
        group's victims for ever (``Correlator.culprit_pending``)."""
        f = self.correlator.findings.get(fingerprint)
        if f is not None and f.state is State.PENDING and f.scope is Scope.TP_GROUP:
            del self.correlator.findings[fingerprint]
