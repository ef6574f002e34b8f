"""Ships an agent's findings, summaries and health to NATS.

Findings take the durable path: :meth:`Publisher.publish_finding` only appends to the
:class:`~skewd.agent.spool.Spool` (a local disk write, never a network wait), and one drain task
publishes the spool head to JetStream, in order, one record at a time, acking the spool only on
the server's PubAck. So ordering holds, nothing accepted is lost while NATS is away (up to the
spool's bound, beyond which the oldest are evicted and counted), and a record that was sent but
whose PubAck was lost is simply sent again: ``Nats-Msg-Id`` = ``Finding.event_id`` makes the
stream drop the copy (``duplicates`` counts those).

Summaries, health (and phase records) take the best-effort path: a core NATS publish while
connected, dropped and counted while not. They are periodic snapshots — the next one supersedes
a lost one, and replaying minutes of stale summaries after an outage would only delay fresh
ones — so they get no spool (see :mod:`skewd.wire` for the full rationale).

Connection: unlimited reconnects (``max_reconnect_attempts=-1``); an unreachable server is
"temporarily unavailable" (spool, retry quietly, log once per outage), a refused credential
"needs an operator" (logged as an error naming the config key to fix, counted in
``auth_errors``, and raised by :meth:`Publisher.wait_connected`).

Disk trouble: the spool holds what the disk refuses in memory and publishes it from there
(see :mod:`skewd.agent.spool`); :meth:`Publisher.publish_finding` never raises, whatever the
spool does, and a background task calls :meth:`Spool.maintain` every ``fsync_interval`` so the
spool returns to disk once space is back and the ``"interval"`` fsync policy holds when idle.
The counts (held in memory, lost, disk errors) are on ``/metrics`` and in the health message's
``drops["spool_error"]``.

Threading: call ``publish_*`` from the event loop's thread; :meth:`Publisher.publish_finding`
may also be called from another thread (the spool is locked, the wake-up is thread-safe).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from skewd import wire
from skewd.agent.spool import RecordTooLarge, Spool
from skewd.collectors.base import Connection
from skewd.model import Finding
from skewd.natsutil import (NatsConfig, NatsConfigError, NatsError, NatsUnavailableError, connect,
                            describe_error, ensure_streams, redact_url, refusal, socket_endpoints)

log = logging.getLogger("skewd.agent.publisher")

#: JetStream API error code: "message size exceeds maximum allowed" (stream max_msg_size).
_ERR_MSG_EXCEEDS_MAXIMUM = 10054


@dataclass
class PublisherStats:
    """Counters since the publisher started (``/metrics`` exposes them with the spool's)."""

    published: int = 0  # findings acknowledged by JetStream (duplicates included)
    duplicates: int = 0  # of those, PubAcks flagged duplicate (a re-send the stream dropped)
    publish_errors: int = 0  # failed JetStream publish attempts (retried)
    reannounced: int = 0  # open findings sent again after a reconnect (see Publisher.reconnected_since)
    rejected: int = 0  # findings refused for good (too large for the spool or the server), dropped
    spool_errors: int = 0  # findings lost because the spool could not write (disk full, I/O error)
    best_effort_published: int = 0  # summaries/health/phase sent
    best_effort_dropped: int = 0  # summaries/health/phase not sent (disconnected or error)
    reconnects: int = 0
    disconnects: int = 0
    auth_errors: int = 0  # refusals that need an operator: credentials, TLS, config
    connected: bool = False
    last_error: str = ""


class Publisher:
    """Agent-side NATS publisher (see module doc).

    ``cluster`` fills the subject's cluster token when a message's own ``cluster`` is empty.
    ``streams`` are created if missing on every (re)connect when ``manage_streams`` is set
    (idempotent). An existing stream whose config differs is left alone unless
    ``update_streams``: with many agents, the operator's or the controller's limits must not be
    reset by every agent that reconnects.
    """

    def __init__(self, config: NatsConfig, spool: Spool, *, cluster: str,
                 streams: Sequence[wire.StreamSpec] = (wire.FINDINGS_STREAM,),
                 manage_streams: bool = True, update_streams: bool = False,
                 pub_ack_timeout: float = 5.0, batch: int = 64,
                 retry_backoff: tuple[float, float] = (0.1, 5.0), summary_encoding: str = "json",
                 summary_layout_every: float = 10.0) -> None:
        self.config = config
        self.spool = spool
        self.cluster = cluster
        self.streams = tuple(streams)
        self.manage_streams = manage_streams
        self.update_streams = update_streams
        self.pub_ack_timeout = pub_ack_timeout
        self.batch = batch
        self.retry_backoff = retry_backoff
        #: summaries in the binary encoding (``publish.summary_encoding: binary``), else JSON
        self.summary_encoder = wire.SummaryEncoder(summary_layout_every) if summary_encoding == "binary" else None
        self._encoder_reconnects = 0  # stats.reconnects when the encoder last sent layouts afresh
        self.stats = PublisherStats()
        self._nc: Any = None
        self._js: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._work: asyncio.Event | None = None
        self._connected: asyncio.Event | None = None
        self._refused: asyncio.Event | None = None
        self._refusal: NatsError | None = None
        self._streams_ready = False
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self._outage_logged = False
        #: called with the connection's ends on every (re)connect (see add_connect_listener)
        self._connect_listeners: list[Callable[[Connection], None]] = []
        #: ends of the current connection, None while disconnected or unknown
        self.endpoints: Connection | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Begin connecting and draining in the background; returns at once, also when NATS is
        down (findings spool meanwhile). Use :meth:`wait_connected` to insist on a connection."""
        if self._tasks:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._work = asyncio.Event()
        self._connected = asyncio.Event()
        self._refused = asyncio.Event()
        self._closing = False
        if self.spool.depth:
            self._work.set()
        self._tasks = [asyncio.create_task(self._connect_task(), name="skewd-nats-connect"),
                       asyncio.create_task(self._drain_task(), name="skewd-nats-drain"),
                       asyncio.create_task(self._maintain_task(), name="skewd-spool-maintain")]

    async def wait_connected(self, timeout: float) -> None:
        """Wait until connected. Raises :class:`~skewd.natsutil.NatsAuthError` /
        :class:`~skewd.natsutil.NatsTLSError` / :class:`~skewd.natsutil.NatsConfigError` as soon
        as the server refuses us or the config cannot work, :class:`NatsUnavailableError` after
        ``timeout`` seconds otherwise. The background loop keeps trying after a refusal (a
        fixed creds file or a server-side fix is picked up without a restart)."""
        assert self._connected is not None and self._refused is not None, "call start() first"
        if self._connected.is_set():
            return
        waits = [asyncio.ensure_future(self._connected.wait()), asyncio.ensure_future(self._refused.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self._connected.is_set():
            return
        if self._refused.is_set() and self._refusal is not None:
            raise self._refusal
        raise NatsUnavailableError(self.stats.last_error or
                                   f"NATS at {', '.join(map(redact_url, self.config.servers))}: not connected "
                                   f"after {timeout:g}s")

    async def wait_drained(self, timeout: float) -> bool:
        """Wait until the spool is empty (everything acknowledged); False on timeout."""
        deadline = time.monotonic() + timeout
        while self.spool.depth:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def stop(self, drain_timeout: float = 0.0) -> None:
        """Stop publishing. With ``drain_timeout`` > 0, first give the spool that long to empty.
        Whatever is left stays in the spool for the next start. Does not close the spool (its
        owner does). Idempotent."""
        if drain_timeout > 0 and self._connected is not None and self._connected.is_set():
            await self.wait_drained(drain_timeout)
        self._closing = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        self._tasks = []
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            try:
                await asyncio.wait_for(nc.close(), 5.0)
            except Exception as e:  # noqa: BLE001 - best effort on shutdown
                log.debug("closing NATS connection: %s", e)
        self.stats.connected = False
        if self._connected is not None:
            self._connected.clear()

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    def metrics(self) -> dict[str, float]:
        """Flat numbers for ``/metrics``: the stats plus spool depth/bytes/dropped."""
        d: dict[str, float] = {k: float(v) for k, v in asdict(self.stats).items() if not isinstance(v, str)}
        d.update({"spool_depth": float(self.spool.depth), "spool_bytes": float(self.spool.bytes),
                  "spool_dropped": float(self.spool.dropped), "spool_in_memory": float(self.spool.in_memory),
                  "spool_lost": float(self.spool.lost), "spool_write_errors": float(self.spool.write_errors),
                  "spool_degraded": float(self.spool.degraded)})
        return d

    def drops(self) -> dict[str, int]:
        """Discarded-message counts by reason, in the shape of :attr:`skewd.wire.Health.drops`."""
        return {"spool_full": self.spool.dropped, "rejected": self.stats.rejected,
                "spool_error": self.stats.spool_errors, "best_effort": self.stats.best_effort_dropped}

    # ---- publishing ---------------------------------------------------------------------------

    def publish_finding(self, finding: Finding, *, again: bool = False) -> int | None:
        """Queue a finding for JetStream (spool append; never waits for the network). Returns
        its spool seq, or None if it could not be queued (too large, or the spool cannot write:
        logged and counted, never raised into the agent's evaluation loop).

        ``again``: a re-announcement of a transition already sent (the alert is still open, see
        :meth:`reconnected_since`). Its ``Nats-Msg-Id`` carries its evaluation time, or the
        stream would drop it as a copy of the first within its duplicate window; a controller
        that still holds the transition drops it by ``event_id`` instead."""
        try:
            subject = wire.subject_for(finding, self.cluster)
            headers = wire.headers_for(finding)
            if again:
                headers[wire.HDR_MSG_ID] = f"{finding.event_id}@{int(round(finding.evaluated_at * 1000))}"
            seq = self.spool.append(subject, headers, wire.encode(finding))
        except RecordTooLarge as e:
            self.stats.rejected += 1
            log.error("finding %s not published: %s", finding.event_id, e)
            return None
        except Exception as e:  # noqa: BLE001 - disk full, I/O error, a bug: count it, keep evaluating
            self.stats.spool_errors += 1
            log.error("finding %s lost, the spool cannot store it: %s: %s", getattr(finding, "event_id", "?"),
                      type(e).__name__, e)
            return None
        if again:
            self.stats.reannounced += 1
        self._wake()
        return seq

    def reconnected_since(self, seen: int) -> bool:
        """Whether the connection came back after an outage since the caller saw ``seen``
        reconnects (compare with ``stats.reconnects``). While an agent is cut off, its summaries
        are dropped and the controller resolves its open findings "node silent"
        (``ingest.silent_intervals``); an alert that kept firing makes no new transition, so the
        agent re-announces its open alerts after a reconnect (:meth:`publish_finding` ``again``)."""
        return self.stats.reconnects != seen

    async def publish_summary(self, summary: wire.Summary) -> bool:
        """Best effort: True if handed to the connection, False if dropped (counted). In the
        binary encoding, the summaries after a reconnect or a dropped one carry their layouts
        again (a controller may have restarted meanwhile, or missed the one that carried it)."""
        enc = self.summary_encoder
        if enc is None:
            return await self._best_effort(wire.subject_for(summary, self.cluster), wire.headers_for(summary),
                                           wire.encode(summary))
        if self.stats.reconnects != self._encoder_reconnects:
            self._encoder_reconnects = self.stats.reconnects
            enc.resend_layout()
        ok = await self._best_effort(wire.subject_for(summary, self.cluster), wire.headers_for(summary),
                                     enc.encode(summary))
        if not ok:
            enc.resend_layout()
        return ok

    async def publish_health(self, health: wire.Health) -> bool:
        """Best effort, like :meth:`publish_summary`."""
        return await self._best_effort(wire.subject_for(health, self.cluster), wire.headers_for(health),
                                       wire.encode(health))

    async def publish_raw(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> bool:
        """Best-effort publish of an already-encoded message (e.g. phase records)."""
        return await self._best_effort(subject, headers or {}, payload)

    async def _best_effort(self, subject: str, headers: dict[str, str], payload: bytes) -> bool:
        nc = self._nc
        if nc is None or not nc.is_connected:
            self.stats.best_effort_dropped += 1
            return False
        try:
            await nc.publish(subject, payload, headers=headers)
        except Exception as e:  # noqa: BLE001 - best effort: count, never raise into the agent
            self.stats.best_effort_dropped += 1
            log.debug("best-effort publish to %s failed: %s", subject, e)
            return False
        self.stats.best_effort_published += 1
        return True

    def _wake(self) -> None:
        if self._work is None or self._loop is None:
            return  # not started: the drain picks the spool up on start()
        if threading.get_ident() == self._loop_thread:
            self._work.set()
        else:
            self._loop.call_soon_threadsafe(self._work.set)

    # ---- connection ---------------------------------------------------------------------------

    async def _connect_task(self) -> None:
        try:
            self._nc = await connect(self.config, initial_timeout=None, fail_fast=False,
                                     error_cb=self._on_error, disconnected_cb=self._on_disconnected,
                                     reconnected_cb=self._on_reconnected, closed_cb=self._on_closed)
        except asyncio.CancelledError:
            raise
        except NatsConfigError as e:  # files, nkeys: nothing to retry until the config changes
            self.stats.last_error = str(e)
            self.stats.auth_errors += 1
            log.error("NATS publisher cannot start: %s", e)
            assert self._refused is not None
            self._refusal = e
            self._refused.set()
            return
        self._js = self._nc.jetstream(timeout=self.pub_ack_timeout)
        log.info("connected to NATS at %s", redact_url(str(self._nc.connected_url.geturl())))
        self._set_connected()

    def add_connect_listener(self, fn: Callable[[Connection], None]) -> None:
        """Call ``fn((local, peer))`` with the ends of the TCP connection each time one is made
        (first connect and every reconnect; not when the ends cannot be read). The agent uses
        it to keep its own NATS connection out of the packet features."""
        self._connect_listeners.append(fn)
        if self.endpoints is not None:
            fn(self.endpoints)

    def _set_connected(self) -> None:
        assert self._connected is not None and self._refused is not None
        self.endpoints = socket_endpoints(self._nc)
        if self.endpoints is not None:
            for fn in self._connect_listeners:
                try:
                    fn(self.endpoints)
                except Exception:  # a listener's bug must not stop publishing
                    log.exception("NATS connect listener failed")
        self.stats.connected = True
        self._streams_ready = not (self.manage_streams and self.streams)
        self._outage_logged = False
        self.stats.last_error = ""
        self._refused.clear()
        self._refusal = None
        self._connected.set()
        self._wake()

    async def _on_error(self, e: Exception) -> None:
        msg = describe_error(e, self.config)
        changed = msg != self.stats.last_error
        refused = refusal(e, self.config)
        # a refusal needs an operator: the server resetting our next retry must not hide it
        if refused is not None or self._refusal is None:
            self.stats.last_error = msg
        if refused is not None:
            self.stats.auth_errors += 1
            assert self._refused is not None
            self._refusal = refused
            self._refused.set()
            if changed:
                log.error("%s", msg)
        elif not self._outage_logged:
            self._outage_logged = True
            log.warning("%s; findings are spooled until it is back (%d waiting)", msg, self.spool.depth)
        else:
            log.debug("%s", msg)

    async def _on_disconnected(self) -> None:
        self.endpoints = None
        if self.stats.connected and not self._closing:
            self.stats.disconnects += 1
            log.warning("disconnected from NATS; spooling findings (%d waiting)", self.spool.depth)
        self.stats.connected = False
        if self._connected is not None:
            self._connected.clear()

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        log.info("reconnected to NATS at %s; draining %d spooled finding(s)",
                 redact_url(str(self._nc.connected_url.geturl())) if self._nc else "?", self.spool.depth)
        self._set_connected()

    async def _on_closed(self) -> None:
        self.stats.connected = False
        if self._connected is not None:
            self._connected.clear()

    # ---- drain --------------------------------------------------------------------------------

    async def _drain_task(self) -> None:
        """The only consumer of the spool: head first, one PubAck at a time (ordering). Never
        dies on an unexpected error (a spool read failing, say): logs it and retries."""
        assert self._work is not None and self._connected is not None
        backoff = self.retry_backoff[0]
        while not self._closing:
            try:
                if not self.spool.depth:
                    self._work.clear()
                    await self._work.wait()
                    continue
                if not self._connected.is_set() or self._js is None:
                    await self._connected.wait()
                    continue
                if not self._streams_ready:
                    await self._ensure_streams()
                ok = await self._publish_batch()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep draining whatever went wrong once
                log.exception("publisher drain loop error; retrying in %.1fs", backoff)
                self.stats.publish_errors += 1
                ok = False
            if ok:
                backoff = self.retry_backoff[0]
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.retry_backoff[1])

    async def _maintain_task(self) -> None:
        """Spool upkeep on a timer (see :meth:`Spool.maintain`), off the event loop's thread:
        an fsync may take a while on a busy disk."""
        interval = max(0.05, float(getattr(self.spool, "fsync_interval", 1.0)))
        while not self._closing:
            await asyncio.sleep(interval)
            try:
                was_degraded = self.spool.degraded
                await asyncio.to_thread(self.spool.maintain)
                if was_degraded and self.spool.depth:
                    self._wake()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - upkeep must not die; the spool logs disk errors itself
                log.exception("spool upkeep failed; retrying in %.1fs", interval)

    async def _ensure_streams(self) -> None:
        try:
            res = await ensure_streams(self._js, self.streams, update=self.update_streams)
            log.debug("streams: %s", res)
        except Exception as e:  # noqa: BLE001 - e.g. subjects overlap an operator's own stream
            self.stats.publish_errors += 1
            log.warning("cannot ensure JetStream streams %s: %s; publishing anyway",
                        [s.name for s in self.streams], e)
        # whichever way: a stream may exist under another name, and the publish will tell
        self._streams_ready = True

    async def _publish_batch(self) -> bool:
        """Publish up to ``batch`` records from the head; False when one failed and the caller
        should back off before retrying it (it stays at the head: order is kept)."""
        import nats.errors
        import nats.js.errors

        for rec in self.spool.peek(self.batch):
            if self._closing:
                return True
            try:
                ack = await self._js.publish(rec.subject, rec.payload, headers=rec.headers,
                                             timeout=self.pub_ack_timeout)
            except asyncio.CancelledError:
                raise
            except nats.errors.MaxPayloadError:
                self._reject(rec.seq, rec.subject, f"payload of {len(rec.payload)} bytes exceeds "
                             "the server's max_payload")
                continue
            except nats.js.errors.APIError as e:
                if e.err_code == _ERR_MSG_EXCEEDS_MAXIMUM:
                    self._reject(rec.seq, rec.subject, str(e))  # larger than the stream's max_msg_size
                    continue
                self._publish_failed(e)
                return False
            except nats.js.errors.NoStreamResponseError as e:
                self._streams_ready = not self.manage_streams  # server lost the stream? recreate
                self._publish_failed(e, "no JetStream stream answers on this subject")
                return False
            except Exception as e:  # noqa: BLE001 - timeouts, disconnects: retry the same record
                self._publish_failed(e)
                return False
            self.spool.ack(rec.seq)
            self.stats.published += 1
            if ack.duplicate:
                self.stats.duplicates += 1
        return True

    def _reject(self, seq: int, subject: str, why: str) -> None:
        self.spool.ack(seq)
        self.stats.rejected += 1
        log.error("finding on %s dropped, the server will never accept it: %s", subject, why)

    def _publish_failed(self, e: BaseException, why: str | None = None) -> None:
        self.stats.publish_errors += 1
        msg = why or f"{type(e).__name__}: {e}".rstrip(": ")
        log.debug("JetStream publish failed (will retry in order): %s", msg)
        if self.connected:  # connected yet failing: worth a visible line, once per distinct cause
            if msg != self.stats.last_error:
                log.warning("JetStream publish failed, retrying: %s", msg)
            self.stats.last_error = msg
