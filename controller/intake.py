"""What the controller takes in over NATS: summaries, health, vLLM phase records and findings.

Each callback decodes strictly (:mod:`skewd.wire`), checks the message against its subject, the
clock and the node budget (:mod:`skewd.controller.ingest`, "what the controller trusts"), counts
and logs what it refuses, and hands the rest on: a summary to the aligner, timelines and
:class:`~skewd.controller.storefeed.StoreFeed`, a finding to the correlator and KV (acked only
once stored, so JetStream redelivers what a KV outage interrupted). Kept apart from evaluation so
the trust boundary reads in one place.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from skewd import wire
from skewd.model import GROUP_SCOPES

from . import ingest
from . import messages as M
from .layouts import IntakePlan
from .roles import ROLE_LEADER, ROLE_PARTITION
from .silence import agent_open
from .state import STATE_VALUE_BYTES
from .storefeed import BURST_BYTES, BURST_STARTS

log = logging.getLogger("skewd.controller")
_NAN = float("nan")
#: summary subjects whose verdict is remembered (a few per node; cleared when full)
_SUBJECTS_KEPT = 1 << 16
#: directly delivered summaries taken in one go before the event loop's other work has its turn
#: (nats-py reads 32 KB, ~110 binary summaries, a turn), and the most time that may take: the
#: reads must keep up so the backlog holds the newest summaries and sheds the oldest (a slice of
#: 256 slow summaries, 2 ms each, let the server queue 0.5 s of them behind the backlog)
TAKE_BATCH = 256
TAKE_SLICE_S = 0.005
#: the most time a turn of the intake gives to the store's queued slab growths (WindowStore's
#: defer_prepare: made between ticks instead of in the tick's flush); at least one a turn
PREPARE_SLICE_S = 0.002


def _finite_sum(ts: list[float]) -> bool:
    """Whether the starts add up to a finite number: no NaN, no infinity, nothing so large the
    sum overflows (those take the aligner's long way; ``math.fsum`` raised OverflowError on
    them, and the summary was lost as an error)."""
    s = sum(ts)
    return s - s == 0.0


class Intake:
    """The controller's NATS callbacks and input loops (summary, health, phase, findings, KV
    watch), and :meth:`ingest_summary`, which replay and tests call directly.

    A part of :class:`~skewd.controller.service.Controller`, which declares every field in
    its ``__init__``; this class adds behaviour only."""

    def _reject(self, kind: str, reason: str, subject: str, detail: str, n: int = 1) -> None:
        """Count (status and the per-kind counter) and log ``n`` rejected messages (the first
        on ``subject``)."""
        self.rejections.reject(kind, reason, subject, detail, n)
        if kind == "summary":
            self.stats.summaries_rejected += n
        elif kind == "finding":
            self.stats.findings_rejected += 1
        elif kind == "phase":
            self.stats.phase_rejected += 1
        elif kind == "health":
            self.stats.health_rejected += 1

    def _heard(self, node: str, interval: float | None = None) -> bool:
        """Note a message from ``node``'s agent; False when it is a new node and
        ``ingest.max_nodes`` are live (the message is then rejected)."""
        if not self.nodes.admit(node, self.wall(), interval):
            return False
        self._unconfirmed.discard(node)
        return True

    def summary_dropped(self, subject: str, n: int = 1) -> None:
        """A summary on ``subject`` (and ``n - 1`` more after it) was dropped unread: the
        intake's backlog of summaries received and not yet taken in was over
        ``ingest.summary_backlog_bytes`` (service.py sheds the oldest; nats-py's own limit,
        should it ever be reached, drops the newest). The intake is
        behind its input; bounding the backlog keeps it seconds behind instead of minutes, and its
        memory bounded, and the node's next interval replaces what was dropped."""
        self._reject("summary", ingest.BACKLOG_FULL, subject,
                     f"{self.cfg.summary_backlog_bytes} bytes of summaries wait to be taken in "
                     "(ingest.summary_backlog_bytes): this controller cannot keep up with its summaries; "
                     "add workers (scaleout.partitions, docs/controller.md) or give it more CPU", n)

    def subscribes(self, sub: Any) -> bool:
        """Whether ``sub`` (a nats-py subscription) is one of this controller's."""
        return any(s is sub for s in self._subs)

    async def _on_summary(self, msg: Any, held: list | None = None, share: int = 0) -> None:
        """A summary from NATS. ``held``: the subscription that delivered it (service.py), whose
        client-side backlog over ``share`` bytes makes this summary - the oldest - shed."""
        if held is not None and held[0].pending_bytes > share:
            self.summary_dropped(msg.subject)
            return
        if self._ticking:  # its state is on the tick thread (evaluation.py)
            await self._tick_idle()
        self._take_summary(msg.subject, msg.data)
        if self.store.preparations_queued:  # slab growths queued by the last flush (made between ticks)
            self._prepare_slabs()
        if self.feed.defer_flush and self.feed.due:  # FLUSH_ROWS between ticks: off the event loop too
            await self._off_loop(self.feed.flush)

    async def _take_summaries(self) -> None:
        """The intake loop of directly delivered summaries (service.py, natsutil.direct_delivery):
        oldest first, as :meth:`_on_summary` takes them from the subscription's callback, the
        same checks and the same shedding - a summary with more than the controller's share of
        ``ingest.summary_backlog_bytes`` waiting behind it is dropped and counted. Up to
        :data:`TAKE_BATCH` at a time and for :data:`TAKE_SLICE_S` at most, then the event
        loop's other work (the reads that fill the backlog) gets its turn."""
        b = self._backlog
        items = b.items
        while True:
            if not items:
                b.ready.clear()
                await b.ready.wait()
                continue
            if self._ticking:  # its state is on the tick thread (evaluation.py)
                await self._tick_idle()
            if b.bytes > self._summary_share:
                self._shed(b)
            until = time.perf_counter() + TAKE_SLICE_S
            # nothing else runs meanwhile (no tick starts, no read adds to the backlog), so none of
            # these has more than the share behind it
            for i in range(min(TAKE_BATCH, len(items))):
                if i & 7 == 7 and time.perf_counter() > until:
                    break
                subject, data = items.popleft()
                b.bytes -= len(data)
                # (not UTF-8: refused by the subject check)
                self._take_summary(subject.decode(errors="replace"), data)
            if self.store.preparations_queued:  # as _on_summary
                self._prepare_slabs()
            if self.feed.defer_flush and self.feed.due:  # as _on_summary
                await self._off_loop(self.feed.flush)
            await asyncio.sleep(0)

    def _shed(self, b: Any) -> None:
        """Drop (counted, :meth:`summary_dropped`) the oldest summaries of the direct-delivery
        backlog ``b`` while one has more than the controller's share of
        ``ingest.summary_backlog_bytes`` behind it, all at once: counted together and logged in
        one line, since an intake that sheds has no CPU to spare (one by one, the count and the
        log's rate limit cost ~0.6 µs a summary, a few per cent of a saturated worker)."""
        items, share = b.items, self._summary_share
        first, n = None, 0
        while items:
            size = len(items[0][1])
            if b.bytes - size <= share:
                break
            subject = items.popleft()[0]
            b.bytes -= size
            if first is None:
                first = subject
            n += 1
        if first is not None:
            self.summary_dropped(first.decode(errors="replace"), n)

    def _prepare_slabs(self) -> None:
        """Make the store's queued slab growth preparations (WindowStore.defer_prepare), for
        :data:`PREPARE_SLICE_S` at most (at least one; a large slab may run past it): called
        by the intake between ticks, with no tick on the tick thread."""
        until = time.perf_counter() + PREPARE_SLICE_S
        left = self.store.prepare_next()
        while left and time.perf_counter() < until:
            left = self.store.prepare_next()

    def _take_summary(self, subject: str, data: bytes) -> None:
        """One summary's body, binary or JSON, however it was delivered."""
        if data[:3] == wire.BINARY_MAGIC:  # no JSON starts so (skewd/wire/binsummary.py)
            self._take_binary(subject, data)
        else:
            self._take_json(subject, data)

    def _take_json(self, subject: str, data: bytes) -> None:
        try:
            s = wire.summary_view(data)  # the typed decoder's object: read-only from here on
        except wire.WireError as e:
            self._reject("summary", ingest.reason_of(e), subject, str(e))
            return
        try:
            if self._summary_refused(subject, s.cluster, s.node, s.t) or not self._summary_heard(subject, s.node,
                                                                                                  s.interval):
                return
            self.ingest_summary(s, s.labels)  # the decoder checked: an object of strings
        except Exception:  # noqa: BLE001 - a callback must not die on one message; counted and shown
            self.stats.errors += 1
            log.exception("summary on %s not taken in", subject)

    def _take_binary(self, subject: str, data: bytes) -> None:
        """A binary summary (docs/wire.md, *Binary summaries*): the same checks as a JSON one,
        and its layout must be known (carried, or learned from an earlier summary).

        A node's summaries are alike: the same subject, cluster and layout interval after
        interval. Once one has passed every check, the node's next ones that match it on those
        (its lane, kept until the node is forgotten) skip the checks whose verdict they decide:
        the subject's, the layout's lookup and keeping, the node budget's (the node is live).
        Their own fields are still checked (:func:`skewd.wire.read_binary`,
        :func:`~skewd.wire.read_values`), and so is their clock; the state they leave is the
        same (tests/controller/test_intake_lanes.py)."""
        try:
            h = wire.read_binary(data)
            lane = self._lanes.get(h.node)
            if lane is not None and lane[0] == subject and lane[1] == h.cluster:
                plan = lane[2]
                if h.layout_id == plan.id and (not h.layout or h.layout == plan.layout.raw) and h.node in self.nodes:
                    if self.cfg.max_clock_skew > 0 and self._summary_refused(subject, h.cluster, h.node, h.t):
                        return
                    vals, complete = wire.read_values(h, plan.layout)
                    self._ingest_guarded(subject, h, plan, vals, complete, True)
                    return
            lay = self.layouts.resolve(h)
            values = None if lay is None else wire.read_values(h, lay)
        except wire.WireError as e:
            self._reject("summary", ingest.reason_of(e), subject, str(e))
            return
        try:
            if self._summary_refused(subject, h.cluster, h.node, h.t):
                return
            if lay is None:
                self._reject("summary", ingest.LAYOUT_UNKNOWN, subject,
                             f"layout {h.layout_id} of node {h.node!r} is not known (yet): the node's next summary "
                             f"that carries it teaches it (publish.summary_layout_every)")
                return
            if not self._summary_heard(subject, h.node, h.interval):
                return
            plan = self.layouts.keep(h.node, lay)
            self._lanes.pop(h.node, None)
        except Exception:  # noqa: BLE001 - a callback must not die on one message; counted and shown
            self.stats.errors += 1
            log.exception("summary on %s not taken in", subject)
            return
        if self._ingest_guarded(subject, h, plan, *values, False):  # type: ignore[misc]
            self._lanes[h.node] = (subject, h.cluster, plan)

    def _ingest_guarded(self, subject: str, h: wire.BinarySummary, plan: IntakePlan, vals: list[float],
                        complete: bool, on_lane: bool) -> bool:
        """:meth:`ingest_binary`, guarded: whether it took the summary in. ``on_lane``: its node
        is live (its lane's summary was admitted), and is noted as heard here."""
        try:
            if on_lane:
                self.nodes.admit(h.node, self.wall(), h.interval)
                if self.role == ROLE_PARTITION:
                    self._check_placement(subject, h.node)
            self.ingest_binary(h, plan, vals, complete)
            return True
        except Exception:  # noqa: BLE001 - a callback must not die on one message; counted and shown
            self.stats.errors += 1
            log.exception("summary on %s not taken in", subject)
            return False

    def _summary_refused(self, subject: str, cluster: str, node: str, t: float) -> bool:
        """Refuse (counted, logged) a summary whose body does not belong on its subject or
        whose time is implausible."""
        if self._subject_ok.get(subject) != (cluster, node):  # (the verdict depends on these only)
            why = ingest.subject_mismatch(subject, wire.MessageKind.SUMMARY, cluster, node)
            if why is not None:
                self._reject("summary", ingest.SUBJECT_MISMATCH, subject, why)
                return True
            if len(self._subject_ok) >= _SUBJECTS_KEPT:
                self._subject_ok.clear()  # subjects of nodes long gone
            self._subject_ok[subject] = (cluster, node)
        if self.cfg.max_clock_skew <= 0:
            return False
        why = ingest.summary_clock_problem(t, self.wall(), self.cfg.max_clock_skew)
        if why is not None:
            self._reject("summary", ingest.CLOCK_SKEW, subject, why)
            return True
        return False

    def _summary_heard(self, subject: str, node: str, interval: float) -> bool:
        """Note the summary's node as heard (False, refused, when it is new and too many nodes
        are live); a partition worker checks its placement."""
        if not self._heard(node, interval):
            self._reject("summary", ingest.TOO_MANY_NODES, subject,
                         f"node {node!r} is new and {self.cfg.max_nodes} nodes are live (ingest.max_nodes)")
            return False
        if self.role == ROLE_PARTITION:
            self._check_placement(subject, node)
        return True

    def ingest_summary(self, s: wire.Summary, labels: dict[str, str] | None = None) -> None:
        """Take one node summary (public so replay and tests can feed summaries directly)."""
        self.stats.summaries += 1
        if labels:
            self.topology.observe(s.node, labels)
        starts = s.signals.get(BURST_STARTS)
        nbytes = s.signals.get(BURST_BYTES)
        observed = False
        if not nbytes and (not starts or None not in starts.values()):
            # the common shapes: starts without bytes, as the agent sends them, or none. Sorted
            # as the tuples below would be (a NaN start, which JSON cannot carry, goes the long way)
            ts = sorted(map(float, starts.values())) if starts else []
            if not ts or _finite_sum(ts):
                self.aligner.observe_starts(s.node, s.t, s.clock_sync.synced, s.clock_sync.max_error_s, ts)
                observed = True
        if not observed:
            nbytes = nbytes or {}
            bursts = []
            for k, v in (starts or {}).items():
                if v is None:
                    continue
                b = nbytes.get(k)
                bursts.append((float(v), float(b) if b is not None else float("nan")))
            bursts.sort()
            self.aligner.observe(s.node, s.t, s.clock_sync.synced, s.clock_sync.max_error_s, bursts)
        self.timelines.add_summary(s.node, s.t, s.signals)
        # buffered: one store ingest per tick (or per FLUSH_ROWS) instead of one per summary
        names, ents_of, values = self.feed.samples(s.node, s.signals)
        if values:
            names, ents_of = self.feed.add(s.node, s.t, names, ents_of, values)
        if self.role == ROLE_PARTITION:  # the leader's copy, sent with the next digest
            self._digest_rows[s.node] = (s.t, s.interval, labels or {}, s.signals)
        self._advance(s.node, s.t)

    def ingest_binary(self, h: wire.BinarySummary, plan: IntakePlan, vals: list[float], complete: bool) -> None:
        """:meth:`ingest_summary` of a binary summary, its values read against its layout's
        ``plan`` (:func:`skewd.wire.read_values`: as floats, and whether none is NaN): the
        controller's state ends up exactly as after the same summary sent as JSON
        (tests/controller/test_binary_intake.py), without building the signals' dicts."""
        self.stats.summaries += 1
        node, t = h.node, h.t
        if h.labels:
            self.topology.observe(node, h.labels)
        self._observe_bursts(h)
        samples = None
        if complete or plan.complete(vals):
            samples = h.values if plan.sample_idx is None else plan.sample_bytes(h.values)
        self._take_values(node, t, plan, vals, samples)
        if self.role == ROLE_PARTITION:  # the leader's copy: the digest carries the values as they came
            self._digest_rows[node] = (t, h.interval, h.labels or {}, (plan.layout, h.values))
        self._advance(node, t)

    def _take_values(self, node: str, t: float, plan: IntakePlan, vals: list[float], samples: bytes | None) -> None:
        """A summary's values read against its layout's ``plan`` into the engine timelines and
        the store feed: ``samples``, the store samples' float64 bytes when none is NaN, go in as
        one row; else (None) the missing ones (JSON's null) are left out, as
        :meth:`ingest_summary` leaves out None. The binary intake and the leader's intake of
        digests (controller/exchange.py) both take values this way."""
        self.timelines.add_values(node, t, plan.timeline, vals)
        if samples is not None:
            if plan.names:
                self.feed.add_row(node, t, plan.id, plan.names, plan.entities, samples)
        else:
            names, ents, vs = plan.samples(vals)
            if vs:
                self.feed.add(node, t, names, ents, vs)

    def _observe_bursts(self, h: wire.BinarySummary) -> None:
        """The aligner's part of a binary summary, taken as :meth:`ingest_summary` takes the same
        bursts from JSON (a NaN start or byte count there is ``null``)."""
        starts = wire.starts_of(h)
        if not h.burst_bytes:  # (never without starts: read_binary)
            ts = sorted(starts) if starts else starts
            if not ts or _finite_sum(ts):  # NaN (JSON's null) or too large: the long way
                self.aligner.observe_starts(h.node, h.t, h.synced, h.max_error_s, ts)
                return
        nbytes = wire.floats(h.burst_bytes) if h.burst_bytes else None
        bursts = []
        for k, v in enumerate(starts):
            if v != v:
                continue
            b = _NAN if nbytes is None else nbytes[k]
            bursts.append((v, b if b == b else float("nan")))
        bursts.sort()
        self.aligner.observe(h.node, h.t, h.synced, h.max_error_s, bursts)

    def _advance(self, node: str, t: float) -> None:
        """A node's data at ``t`` arrived: the evaluation grid starts and the watermark moves."""
        if node not in self.store.registry.node_labels:
            self._labels_version = -1
        if self.first_t is None:
            self.first_t = t
            self.next_eval = math.ceil(t / self.cfg.evaluation_interval) * self.cfg.evaluation_interval
        if t > self.watermark:
            self.watermark = t
            self._wake.set()

    async def _on_health(self, msg: Any) -> None:
        if self._ticking:  # its state is on the tick thread (evaluation.py)
            await self._tick_idle()
        try:
            h = wire.decode_health(msg.data)
        except wire.WireError as e:
            self._reject("health", ingest.reason_of(e), msg.subject, str(e))
            return
        why = ingest.subject_mismatch(msg.subject, wire.MessageKind.HEALTH, h.cluster, h.node)
        if why is not None:
            self._reject("health", ingest.SUBJECT_MISMATCH, msg.subject, why)
            return
        if not self._heard(h.node):
            self._reject("health", ingest.TOO_MANY_NODES, msg.subject, f"node {h.node!r} is new and "
                         f"{self.cfg.max_nodes} nodes are live (ingest.max_nodes)")
            return
        self.stats.health += 1
        self._health[h.node] = h

    async def _on_phase(self, msg: Any) -> None:
        if self._ticking:  # its state is on the tick thread (evaluation.py)
            await self._tick_idle()
        if self.role == ROLE_PARTITION:  # only the engines on this partition's nodes
            parsed = ingest.parsed_subject(msg.subject)
            if not isinstance(parsed, wire.ParsedSubject) or parsed.tokens.get("node") not in self.aligner.clocks:
                return
        try:
            rec = M.decode(msg.data, M.Kind.PHASE)
        except wire.WireError as e:
            self._reject("phase", ingest.reason_of(e), msg.subject, str(e))
            return
        why = ingest.subject_mismatch(msg.subject, wire.MessageKind.PHASE, rec.cluster, rec.node,  # type: ignore[union-attr]
                                      engine=rec.engine)  # type: ignore[union-attr]
        if why is not None:
            self._reject("phase", ingest.SUBJECT_MISMATCH, msg.subject, why)
            return
        # the vLLM plugin is not the agent: its records say nothing about the agent's liveness,
        # and create no node state beyond the engine's bounded timeline
        if rec.node not in self.nodes and len(self.nodes) >= self.cfg.max_nodes:  # type: ignore[union-attr]
            self._reject("phase", ingest.TOO_MANY_NODES, msg.subject, f"node {rec.node!r} is not live and "  # type: ignore[union-attr]
                         f"{self.cfg.max_nodes} nodes are (ingest.max_nodes)")
            return
        try:
            self.timelines.add_record(rec)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - a callback must not die on one message
            self.stats.errors += 1
            log.exception("phase record on %s not taken in", msg.subject)
            return
        self.stats.phase_records += 1

    async def _findings_loop(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        cfg = self.cfg
        sub = await self.js.pull_subscribe(
            wire.subject_filter("finding", cluster=cfg.cluster), durable=cfg.durable, stream=wire.FINDINGS_STREAM.name,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=cfg.ack_wait, max_deliver=-1,
                                  deliver_policy=DeliverPolicy.ALL, max_ack_pending=10000))
        while not self._stopping:
            try:
                msgs = await sub.fetch(cfg.batch, timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - fetch timeout (nothing new) or a reconnect in progress
                continue
            for m in msgs:
                await self._take_finding_msg(m)

    async def _refuse(self, m: Any, reason: str, detail: str) -> None:
        """Reject a finding for good: counted, logged, and terminated so JetStream never
        redelivers it (a malformed, spoofed or mistimed message never becomes acceptable)."""
        self._reject("finding", reason, m.subject, detail)
        try:
            await m.term()
        except Exception as e:  # noqa: BLE001 - no connection: it comes back after ack_wait and is refused again
            log.debug("term of a rejected finding failed: %s", e)

    async def _take_finding_msg(self, m: Any) -> None:
        if self._ticking:  # its state is on the tick thread (evaluation.py)
            await self._tick_idle()
        try:
            f = wire.decode_finding(m.data)
        except wire.WireError as e:
            await self._refuse(m, ingest.reason_of(e), str(e))
            return
        why = ingest.subject_mismatch(m.subject, wire.MessageKind.FINDING, f.cluster, f.node, rule=f.rule_id)
        if why is not None:
            await self._refuse(m, ingest.SUBJECT_MISMATCH, why)
            return
        why = ingest.finding_clock_problem(f, self.wall(), self.cfg.max_clock_skew, wire.FINDINGS_STREAM.max_age_s)
        if why is not None:
            await self._refuse(m, ingest.CLOCK_SKEW, why)
            return
        if f.scope not in GROUP_SCOPES and not self._heard(f.node):
            # not lost: JetStream offers it again once silent nodes have made room
            self._reject("finding", ingest.TOO_MANY_NODES, m.subject, f"node {f.node!r} is new and "
                         f"{self.cfg.max_nodes} nodes are live (ingest.max_nodes); redelivered later")
            try:
                await m.nak(delay=self.nodes.silent_after(f.node))
            except Exception:  # noqa: BLE001 - then ack_wait brings it back
                pass
            return
        self.stats.findings_in += 1
        try:
            async with self._lock:
                if self.correlator.observe(f):
                    if agent_open(f):  # re-announced after its node's silence: it is open again
                        self._silenced.pop(f.id, None)
                    await self.state.put_finding(f)  # type: ignore[union-attr]
                else:
                    self.stats.findings_duplicate += 1
            await m.ack()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - KV unavailable: leave unacked, JetStream redelivers
            self.stats.errors += 1
            log.warning("finding %s not stored yet (%s); it will be redelivered", f.event_id, e)

    async def _kv_watch_loop(self) -> None:
        """Findings other replicas stored: every replica correlates over all of them."""
        assert self.state is not None
        while not self._stopping:
            try:
                leader = self.role == ROLE_LEADER
                w = await self.state.kv.watch(f"{self.state.prefix}.finding.>", ignore_deletes=not leader)
                async for e in w:
                    if e is None:
                        continue
                    if not e.value:
                        if leader and e.operation in ("DEL", "PURGE"):
                            self._forget_lapsed(e.key.rsplit(".", 1)[-1])
                        continue
                    try:
                        f = wire.finding_from_dict(wire.load_json(e.value, max_bytes=STATE_VALUE_BYTES))
                    except wire.WireError as err:
                        log.warning("KV finding %s unreadable, skipped: %s", e.key, err)
                        continue
                    async with self._lock:
                        self.correlator.observe(f)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - watcher lost with the connection: start again
                log.debug("kv watch restarting: %s", e)
                await asyncio.sleep(1.0)
