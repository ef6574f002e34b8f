"""Client library for inference controllers (routers, autoscalers, schedulers).

::

    from skewd.controller import client

    async for ev in client.subscribe("nats://nats:4222", "prod", kinds=["remap", "incident"]):
        if isinstance(ev, client.RemapSuggestion):
            first = ev.actions[0]                       # least disruptive first
            if first.type is client.ActionType.REROUTE:
                await router.set_weight(first.target.tp_group, first.params["weight"])
                await client.ack(nc, ev, consumer="router-1")
            else:
                await client.reject(nc, ev, consumer="router-1", reason="not automated here")

Events are the typed messages themselves: :class:`~skewd.model.Finding`,
:class:`RemapSuggestion`, :class:`Incident`, :class:`~skewd.wire.Summary`,
:class:`~skewd.wire.Health`, :class:`PhaseRecord`; each has ``.kind``. Durable kinds (finding,
remap, incident) come from JetStream: by default only new ones (``deliver="new"``), or
everything stored (``"all"``), or, with ``durable="my-router"``, from where this consumer name
left off (a message is acknowledged to JetStream when the loop asks for the next one; if the
loop stops while handling one, it is handed back, so it is delivered again next time). Best-effort kinds (summary, health, phase) are live only.
An incident's first message arrives ``correlation.group_wait`` after it opened (the controller
holds it so that its cause can take it over first; held incidents that resolve or are taken
over are never published), and before any suggestion for it.
See docs/client.md for the schemas.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator, Callable, Iterable, Union

from skewd import wire
from skewd.model import Finding
from skewd.wire import Health, Summary, WireError

from . import messages
from .messages import (ActionType, Decision, Incident, PhaseRecord, ReceiptStatus, RemapAction, RemapReceipt,
                       RemapReply, RemapSuggestion, Target)

__all__ = ["subscribe", "ack", "reject", "reply", "suggestion_record", "Event", "KINDS", "ActionType", "Decision",
           "Incident", "PhaseRecord", "ReceiptStatus", "RemapAction", "RemapReceipt", "RemapSuggestion", "Target",
           "Finding", "Summary", "Health", "ReplyError"]

log = logging.getLogger("skewd.client")

Event = Union[Finding, RemapSuggestion, Incident, Summary, Health, PhaseRecord]
KINDS = ("finding", "remap", "incident", "summary", "health", "phase")
_DURABLE = {"finding": wire.FINDINGS_STREAM.name, "remap": wire.REMAPS_STREAM.name,
            "incident": messages.INCIDENTS_STREAM.name}


class ReplyError(Exception):
    """The controller did not answer (no controller running for that cluster, or a timeout)."""


def _subject(kind: str, cluster: str) -> str:
    if kind == "incident":
        return messages.incident_subject(cluster)
    if kind == "remap":
        return wire.remap_subject(cluster)
    return wire.subject_filter(kind, cluster=cluster)


def _decode(kind: str, data: bytes, summaries: wire.BinarySummaryReader) -> Event:
    if kind == "finding":
        return wire.decode_finding(data)
    if kind == "summary":  # JSON, or binary (the reader learns the layouts as they come)
        return summaries.read(data)
    if kind == "health":
        return wire.decode_health(data)
    return messages.decode(data, kind)  # type: ignore[return-value]


async def _nc(nc_or_url: Any) -> tuple[Any, bool]:
    if isinstance(nc_or_url, str):
        import nats

        return await nats.connect(nc_or_url, max_reconnect_attempts=-1, reconnect_time_wait=1.0), True
    return nc_or_url, False


async def subscribe(nc_or_url: Any, cluster: str, kinds: Iterable[str] = ("remap", "incident"), *,
                    deliver: str = "new", durable: str | None = None, max_pending: int = 10000,
                    on_error: Callable[[str, Exception], None] | None = None) -> AsyncIterator[Event]:
    """Typed events of ``cluster``, in arrival order (per kind: stream order).

    ``nc_or_url``: a connected ``nats.aio.client.Client`` (left open) or a server URL (this
    call connects and closes). ``deliver``: ``"new"``, ``"all"`` or ``"last"`` (the latest
    stored message per subject) for the durable kinds. A message that does not decode is
    skipped and reported to ``on_error(kind, exc)`` (logged otherwise).
    """
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    kinds = list(dict.fromkeys(kinds))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown kinds {unknown}; choose from {', '.join(KINDS)}")
    policy = {"new": DeliverPolicy.NEW, "all": DeliverPolicy.ALL, "last": DeliverPolicy.LAST_PER_SUBJECT}.get(deliver)
    if policy is None:
        raise ValueError("deliver must be 'new', 'all' or 'last'")
    nc, owned = await _nc(nc_or_url)
    js = nc.jetstream()
    q: asyncio.Queue = asyncio.Queue(maxsize=max_pending)
    subs: list[Any] = []

    def handler(kind: str) -> Callable[[Any], Any]:
        async def cb(msg: Any) -> None:
            await q.put((kind, msg))
        return cb

    summaries = wire.BinarySummaryReader()
    unacked: Any = None  # a durable message handed out but not yet acknowledged
    pullers: list[asyncio.Task] = []
    try:
        for kind in kinds:
            subject = _subject(kind, cluster)
            if kind in _DURABLE:
                if durable:  # a durable pull consumer: resumable, and any process may take it over
                    cfg = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=policy, ack_wait=30.0)
                    psub = await js.pull_subscribe(subject, durable=f"{durable}-{kind}", stream=_DURABLE[kind],
                                                   config=cfg)
                    subs.append(psub)
                    pullers.append(asyncio.create_task(_pull(psub, kind, q)))
                else:
                    subs.append(await js.subscribe(subject, stream=_DURABLE[kind], cb=handler(kind),
                                                   ordered_consumer=True, deliver_policy=policy))
            elif kind == "summary":  # with placement, and partitioned by a scaled-out deployment's server
                for subject in wire.summary_filters(cluster):
                    subs.append(await nc.subscribe(subject, cb=handler(kind)))
            else:
                subs.append(await nc.subscribe(subject, cb=handler(kind)))
        while True:
            kind, msg = await q.get()
            try:
                ev = _decode(kind, msg.data, summaries)
            except WireError as e:
                (on_error or (lambda k, x: log.warning("skewd %s message skipped: %s", k, x)))(kind, e)
                if durable and kind in _DURABLE:
                    await msg.term()
                continue
            if durable and kind in _DURABLE:
                unacked = msg
            yield ev
            if unacked is not None:
                await unacked.ack()
                unacked = None
    finally:
        for t in pullers:
            t.cancel()
        if pullers:
            await asyncio.wait(pullers, timeout=2.0)
        # the loop stopped: hand back the one it was handling and those fetched but not yet
        # handed out, so the next session gets them at once instead of after ack_wait. Drop the
        # subscriptions first: a puller's fetch leaves a pull request waiting on the server for
        # up to its expiry, and a message handed back while that request waits is redelivered
        # into it - into an inbox about to go away, lost until ack_wait. Without interest in
        # the inbox the server drops that request. What reached the inbox meanwhile is handed
        # back too.
        for s in subs:
            try:
                await s.unsubscribe()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        back = [unacked] if unacked is not None else []
        while durable and not q.empty():
            k, m = q.get_nowait()
            if k in _DURABLE:
                back.append(m)
        if durable:
            back.extend(_left_in_inbox(subs))
        for m in back:
            try:
                await m.nak()
            except Exception:  # noqa: BLE001 - connection gone: JetStream redelivers after ack_wait
                pass
        if owned:
            await nc.close()


def _left_in_inbox(subs: list[Any]) -> list[Any]:
    """Stream messages that reached a pull subscription's inbox but no fetch took (status
    messages, which carry no reply subject to acknowledge, are left out). nats-py has no public
    call for them: this reads its subscription's pending queue, and finds nothing - they wait
    out ack_wait, as before - if that ever moves (tests/controller/test_client.py checks it)."""
    left = []
    for s in subs:
        inner = getattr(s, "_sub", None)
        pending = getattr(inner, "_pending_queue", None)
        if not hasattr(s, "fetch") or pending is None:
            continue
        while not pending.empty():
            m = pending.get_nowait()
            if m.reply and m.reply.startswith("$JS.ACK."):
                left.append(m)
    return left


async def _pull(sub: Any, kind: str, q: asyncio.Queue) -> None:
    while True:
        try:
            msgs = await sub.fetch(16, timeout=1.0)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - fetch timeout (nothing new) or reconnecting
            continue
        for m in msgs:
            await q.put((kind, m))


async def reply(nc_or_url: Any, suggestion: RemapSuggestion | str, decision: Decision | str, *, consumer: str,
                cluster: str | None = None, reason: str = "", actions: Iterable[str] = (),
                timeout: float = 5.0) -> RemapReceipt:
    """Send an ack or reject for a suggestion (object or key) and return the controller's
    receipt. Raises :class:`ReplyError` when no controller answers within ``timeout``."""
    if isinstance(suggestion, RemapSuggestion):
        key, cluster = suggestion.key, cluster or suggestion.cluster
    else:
        key = suggestion
    if not cluster:
        raise ValueError("cluster is required when replying by key")
    msg = RemapReply(key=key, decision=Decision(decision), consumer=consumer, reason=reason, t=time.time(),
                     actions=list(actions))
    nc, owned = await _nc(nc_or_url)
    try:
        try:
            resp = await nc.request(messages.reply_subject(cluster), messages.encode(msg), timeout=timeout,
                                    headers=messages.headers(msg))
        except Exception as e:  # noqa: BLE001 - nats TimeoutError / NoRespondersError
            raise ReplyError(f"no skewd controller for cluster {cluster!r} answered within {timeout:g}s "
                             f"({type(e).__name__})") from None
        return messages.decode(resp.data, messages.Kind.REMAP_RECEIPT)  # type: ignore[return-value]
    finally:
        if owned:
            await nc.close()


async def ack(nc_or_url: Any, suggestion: RemapSuggestion | str, *, consumer: str, **kw: Any) -> RemapReceipt:
    """Acknowledge (accept) a suggestion; see :func:`reply`."""
    return await reply(nc_or_url, suggestion, Decision.ACK, consumer=consumer, **kw)


async def reject(nc_or_url: Any, suggestion: RemapSuggestion | str, *, consumer: str, **kw: Any) -> RemapReceipt:
    """Reject a suggestion (say why in ``reason``); see :func:`reply`."""
    return await reply(nc_or_url, suggestion, Decision.REJECT, consumer=consumer, **kw)


async def suggestion_record(nc_or_url: Any, cluster: str, key: str, bucket: str = "SKEWD_CONTROLLER") -> dict | None:
    """The controller's stored record of a suggestion: ``status`` (planned, published, acked,
    rejected, expired), ``replies`` and the ``suggestion`` body. None if unknown."""
    from nats.js.errors import KeyNotFoundError

    from .state import cluster_key

    nc, owned = await _nc(nc_or_url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        try:
            e = await kv.get(f"{cluster_key(cluster)}.remap.{key}")
        except KeyNotFoundError:
            return None
        return json.loads(e.value) if e.value else None
    finally:
        if owned:
            await nc.close()
