"""Remap suggestions, exactly once: plan, store, publish, expire, and record consumers' replies.

A suggestion is stored in KV before it is published (``kv.create`` claims it, so of several
replicas one publishes), published with ``Nats-Msg-Id`` = its key (JetStream drops a re-send),
and marked published with the stream sequence; one stored as planned but never published (a
crash in between) is published at the next start unless the stream already holds it. An
equivalent live suggestion suppresses a new one. Replies (ack/reject) arrive by request/reply
and are recorded in the suggestion's KV record by compare-and-set. See docs/controller.md.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
from typing import Any

from skewd import wire

from . import messages as M
from .planner import semantic_key, suggestion_key

log = logging.getLogger("skewd.controller")

LIVE_STATUSES = (M.SuggestionStatus.PLANNED.value, M.SuggestionStatus.PUBLISHED.value, M.SuggestionStatus.ACKED.value)


class Suggestions:
    """The suggestion lifecycle: :meth:`propose` (public: tests and the lab propose directly),
    planning for shown incidents, expiry, recovery at start and :meth:`record_reply`.

    A part of :class:`~skewd.controller.service.Controller`, which declares every field in
    its ``__init__``; this class adds behaviour only."""

    async def _recover_planned(self) -> None:
        """Suggestions stored as planned but maybe never published (crash in between): publish
        those the remap stream does not hold. Within the stream's duplicate window the
        ``Nats-Msg-Id`` would drop a copy anyway; the scan covers restarts after it."""
        planned = {k: r for k, r in self.remaps.items() if r.get("status") == M.SuggestionStatus.PLANNED.value}
        if not planned:
            return
        since = min(float(r.get("planned_wall", 0)) for r in planned.values()) - 5.0
        seen = await self._published_ids(since)
        for key, rec in planned.items():
            if key in seen:
                await self._mark_published(key, seen[key])
            else:
                await self._publish_remap(key, rec)
                self.stats.remaps_recovered += 1

    async def _published_ids(self, since_wall: float) -> dict[str, int]:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        out: dict[str, int] = {}
        start = _dt.datetime.fromtimestamp(max(0.0, since_wall), tz=_dt.timezone.utc)
        sub = await self.js.pull_subscribe(
            wire.remap_subject(self.cfg.cluster), durable=None, stream=wire.REMAPS_STREAM.name,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start,
                                  ack_policy=AckPolicy.NONE, inactive_threshold=30.0))
        try:
            while True:
                try:
                    msgs = await sub.fetch(256, timeout=0.5)
                except Exception:  # noqa: BLE001 - nats TimeoutError: nothing more stored
                    break
                for m in msgs:
                    mid = (m.headers or {}).get(wire.HDR_MSG_ID)
                    if mid:
                        out[mid] = m.metadata.sequence.stream
                if msgs and msgs[-1].metadata.num_pending == 0:
                    break
        finally:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001
                pass
        return out

    async def _on_reply(self, msg: Any) -> None:
        self.stats.replies += 1
        try:
            rep = M.decode(msg.data, M.Kind.REMAP_REPLY)
        except wire.WireError as e:
            await self._respond(msg, M.RemapReceipt(key="", status=M.ReceiptStatus.INVALID, error=str(e)))
            return
        receipt = await self.record_reply(rep)  # type: ignore[arg-type]
        await self._respond(msg, receipt)

    async def _respond(self, msg: Any, receipt: M.RemapReceipt) -> None:
        if msg.reply:
            await self.nc.publish(msg.reply, M.encode(receipt), headers=M.headers(receipt))

    async def record_reply(self, rep: M.RemapReply) -> M.RemapReceipt:
        """Record a consumer's ack/reject in the suggestion's KV record (compare-and-set)."""
        assert self.state is not None
        recorded_at = self.wall()
        outcome: dict[str, Any] = {}

        def apply(rec: dict[str, Any]) -> dict[str, Any] | None:
            replies = rec.setdefault("replies", [])
            same = [r for r in replies if r["consumer"] == rep.consumer and r["decision"] == rep.decision.value
                    and sorted(r.get("actions", [])) == sorted(rep.actions)]
            expired = float(rec["suggestion"]["expires_at"]) < max(self.now, 0.0) or rec.get("status") == "expired"
            outcome["status"] = (M.ReceiptStatus.DUPLICATE if same else
                                 M.ReceiptStatus.EXPIRED if expired else M.ReceiptStatus.RECORDED)
            if same:
                return None
            replies.append({"consumer": rep.consumer, "decision": rep.decision.value, "reason": rep.reason,
                            "t": rep.t, "actions": list(rep.actions), "recorded_at": recorded_at})
            if not expired:
                rec["status"] = (M.SuggestionStatus.ACKED if rep.decision is M.Decision.ACK
                                 else M.SuggestionStatus.REJECTED).value
            return rec

        rec = await self.state.update_remap(rep.key, apply)
        if rec is None:
            return M.RemapReceipt(key=rep.key, status=M.ReceiptStatus.UNKNOWN, decision=rep.decision.value,
                                  error=f"no suggestion with key {rep.key!r} in cluster {self.cfg.cluster!r}")
        self.remaps[rep.key] = rec
        log.info("suggestion %s: %s by %s (%s)", rep.key, rep.decision.value, rep.consumer, outcome["status"].value)
        return M.RemapReceipt(key=rep.key, status=outcome["status"], decision=rep.decision.value, recorded_at=recorded_at)

    async def propose(self, s: M.RemapSuggestion) -> bool:
        """Store then publish a suggestion, unless it (or an equivalent live one) exists.
        Returns True when this call published it."""
        assert self.state is not None
        sem = semantic_key(s)
        live = next((k for k, r in self.remaps.items() if r.get("semantic") == sem and r.get("status") in LIVE_STATUSES
                     and r.get("suggestion") and float(r["suggestion"]["expires_at"]) >= self.now), None)
        if live is not None:
            self.stats.remaps_suppressed += 1
            self.remaps[s.key] = {"status": "suppressed", "suggestion": None, "by": live}
            log.info("suggestion for incident %s suppressed: equivalent %s still live", s.incident, live)
            return False
        rec = {"suggestion": s.to_dict(), "status": M.SuggestionStatus.PLANNED.value, "semantic": sem,
               "planned_wall": self.wall(), "controller": self.cfg.controller_id, "replies": []}
        if not await self.state.create_remap(s.key, rec):
            existing = await self.state.get_remap(s.key)
            self.remaps[s.key] = existing or rec
            self.stats.remaps_deduplicated += 1
            return False
        self.remaps[s.key] = rec
        return await self._publish_remap(s.key, rec)

    async def _publish_remap(self, key: str, rec: dict[str, Any]) -> bool:
        body = json.dumps(rec["suggestion"], sort_keys=True, separators=(",", ":")).encode()
        hdr = {wire.HDR_MSG_ID: key, wire.HDR_KIND: M.Kind.REMAP.value, wire.HDR_SCHEMA: str(M.SCHEMA)}
        try:
            ack = await self.js.publish(wire.remap_subject(self.cfg.cluster), body, headers=hdr, timeout=5.0)
        except Exception as e:  # noqa: BLE001 - stays "planned": retried at the next start / by housekeeping
            self.stats.errors += 1
            log.warning("suggestion %s stored but not published yet: %s", key, e)
            return False
        if ack.duplicate:
            self.stats.remaps_deduplicated += 1
        else:
            self.stats.remaps_published += 1
            log.info("suggestion %s published (seq %d): %s", key, ack.seq, rec["suggestion"].get("summary", "")[:200])
        await self._mark_published(key, ack.seq)
        return not ack.duplicate

    async def _mark_published(self, key: str, seq: int) -> None:
        assert self.state is not None
        new = await self.state.update_remap(
            key, lambda r: {**r, "status": M.SuggestionStatus.PUBLISHED.value if r["status"] == "planned" else r["status"],
                            "seq": seq})
        if new is not None:
            self.remaps[key] = new

    async def _plan_and_expire(self, t: float) -> None:
        """After correlation at ``t``: plan a suggestion for each shown incident that may have
        one (once per incident, remembered in ``remaps`` even when there is nothing to
        suggest), and mark published or planned suggestions whose time ran out as expired."""
        assert self.state is not None
        corr = self.correlator
        for inc in sorted(corr.open_incidents(), key=lambda i: (i.opened_at, i.id)):
            if corr.is_held(inc):
                continue  # not shown yet (group_wait, or a culprit rule pending): nothing to plan
            if self._awaits_node(inc):
                continue  # restored, its node not heard from since the restart
            if t - inc.opened_at < self.cfg.group_wait:
                continue  # Alertmanager's group_wait: a culprit may still explain it
            if self.correlator.culprit_pending(inc):
                continue  # a culprit rule is pending in this incident's TP group: wait for its verdict
            if not self.correlator.plannable(inc):
                continue  # names no culprit, or rests on an incubating rule alone (docs/rules.md, Maturity)
            key = suggestion_key(self.cfg.cluster, inc.id)
            if key in self.remaps:
                continue
            s = self.planner.plan(inc, t, self.cfg.controller_id, members=self.correlator.members(inc))
            if s is None:
                self.remaps[key] = {"status": "none", "suggestion": None}  # nothing to suggest: remember that
                continue
            await self.propose(s)
        for key, rec in list(self.remaps.items()):
            sug = rec.get("suggestion")
            if sug and rec.get("status") in (M.SuggestionStatus.PUBLISHED.value, M.SuggestionStatus.PLANNED.value) \
                    and float(sug["expires_at"]) < t:
                new = await self.state.update_remap(key, lambda r: {**r, "status": M.SuggestionStatus.EXPIRED.value}
                                                    if r.get("status") in LIVE_STATUSES[:2] else None)
                if new is not None:
                    self.remaps[key] = new
