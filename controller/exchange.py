"""Scale-out: what a partition worker hands the leader, and what the leader takes in.

With ``controller.partitions`` set, each partition's Controller evaluates the TP-group rules of
its nodes and, at each tick, publishes a digest (:mod:`skewd.controller.digest`: the nodes'
latest samples, the ``ctl_*`` values the cluster-wide rules read, the groups' alignment reports);
the leader takes the digests in instead of summaries, as they arrive (live; at its next tick
otherwise). This module holds both ends of that exchange on the Controller, and the checks that
say when a deployment splits a group over partitions (a node's placement token, summaries on the
unmapped subject). The worker process that holds partitions and the leader lease is
:mod:`skewd.controller.scaleout`.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from skewd import wire
from skewd.model import Scope, State

from . import ingest
from .catalogue import NAMES as CTL_SIGNALS
from .layouts import IntakePlan

log = logging.getLogger("skewd.controller")
_F8 = np.dtype("<f8")


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

        rows, self._digest_rows = self._digest_rows, {}
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
            d, layouts = decode_digest(msg.data, self.layouts.book.layouts)
        except ValueError as e:
            self.stats.errors += 1
            self.digests_refused += 1
            if self.digests_refused in (1, 100) or self.digests_refused % 10000 == 0:  # each partition, every tick
                log.error("digest on %s refused (%d so far): %s", msg.subject, self.digests_refused, e)
            return
        if d.cluster != self.cfg.cluster:
            return
        self.digests_in += 1
        self._digests.append((d, layouts))
        for b in d.blocks:
            for node, t, interval in zip(b.nodes, b.t, b.interval):
                if self._heard(node, interval):
                    self._advance(node, t)
        if self.tick_in_thread:
            # taken in now, on the tick thread, not at the next tick: the partitions' digests of
            # one evaluation arrive one after the other, and taking them all in at the tick (with
            # the store writes of every node) made the leader's tick the longest of a worker's
            # (bench/controller_ingest.py). The tick then takes only what came in meanwhile.
            try:
                await self._off_loop(self._take_digests_and_flush)
            except Exception:  # noqa: BLE001 - a callback must not die on one digest; counted and shown
                self.stats.errors += 1
                log.exception("digest on %s not taken in", msg.subject)

    def _take_digests_and_flush(self) -> None:
        self._take_digests()
        self.feed.flush()

    async def _on_unpartitioned(self, msg: Any, held: list | None = None, share: int = 0) -> None:
        """A summary on the unmapped subject while workers own partitions: the server lacks the
        partition mapping, so no worker receives it (said once a minute in the log). ``held`` and
        ``share`` as for :meth:`_on_summary` (subscribed alike); a count never sheds."""
        self.unpartitioned += 1
        if self.unpartitioned in (1, 100) or self.unpartitioned % 60000 == 0:
            log.error("%d summaries arrived unpartitioned (e.g. on %s): the NATS server has no partition mapping "
                      "(`skewd nats-auth --partitions %d`); no worker takes them in", self.unpartitioned,
                      msg.subject, self.cfg.partitions)

    def _take_digests(self) -> None:
        """Leader: the digests received since the last tick into topology, timelines and store."""
        from .align import GroupReport

        digests, self._digests = self._digests, []
        for d, layouts in digests:
            for b in d.blocks:  # as ingest_binary takes a summary's values, less the bursts
                self._take_block(b, layouts[b.layout], d.labels)
            if d.derived:
                self.feed.flush()
                self.feed.ingest_derived(d.t, d.derived)
            for g, rep in d.reports.items():
                try:
                    self._reports[g] = GroupReport(**rep)
                except TypeError:
                    continue

    def _take_block(self, b: Any, layout: wire.SummaryLayout, label_sets: list[dict[str, str]]) -> None:
        """Leader: one digest block (rows of ``layout``) into topology, timelines and store
        feed, each row as :meth:`~skewd.controller.intake.Intake.ingest_binary` takes a
        summary's values; which rows lack a store sample (NaN) is found for the block at once."""
        n = len(b.nodes)
        values = np.frombuffer(b.values, _F8).reshape(n, len(layout))
        plan = self.layouts.plans.get(layout.id) or IntakePlan(layout)  # (the nodes' own: keep, below)
        samples = values if plan.sample_idx is None else values[:, plan.sample_idx]
        complete = ~np.isnan(samples).any(axis=1)
        rows = values.tolist()
        for i, node in enumerate(b.nodes):
            if node not in self.nodes:
                continue  # refused at arrival (ingest.max_nodes)
            k = b.labels[i]
            if k >= 0 and label_sets[k]:
                self.topology.observe(node, label_sets[k])
            plan = self.layouts.keep(node, layout)
            self._take_values(node, b.t[i], plan, rows[i], samples[i].tobytes() if complete[i] else None)

    def _forget_lapsed(self, fingerprint: str) -> None:
        """Leader: a partition deleted the KV record of a pending group finding its engine
        dropped (:meth:`_drop_lapsed_pending`): drop it here too, or it would hold its TP
        group's victims for ever (``Correlator.culprit_pending``)."""
        f = self.correlator.findings.get(fingerprint)
        if f is not None and f.state is State.PENDING and f.scope is Scope.TP_GROUP:
            del self.correlator.findings[fingerprint]
