"""Incidents to Prometheus Alertmanager (v2 API, ``POST /api/v2/alerts``), for sites that route
alerts there (``alertmanager.url`` in the controller config; off by default).

The sink reads the controller's incident stream like any client (:func:`client.subscribe`,
``deliver="all"``, so a restarted controller knows which incidents are still open) and speaks
Alertmanager the way Prometheus does:

- an open incident is a firing alert, sent when it changes and re-sent every
  ``resend_interval`` with ``endsAt`` = now + 4 intervals: if skewd stops, Alertmanager resolves
  it by itself;
- a resolved (or inhibited: explained by another incident) incident is sent once more with
  ``endsAt`` = when it ended, and re-sent for ``RESOLVED_KEEP_S`` so a briefly unreachable
  Alertmanager still learns it;
- labels identify the alert (``alertname`` = the incident's rule, ``incident``, ``cluster``,
  ``pathology``, the culprit's ``node`` / ``tp_group``, the cause ``layer``, the incident's
  grouping labels, then the configured static ``labels`` where they do not clash);
  annotations carry the summary and the attributed cause;
- with several URLs (an Alertmanager cluster) every alert goes to each, as Prometheus does.

Failed posts are counted and retried at the next attempt (every ``min(resend_interval, 5 s)``
while something is unsent). Wall-clock time is read here, at the edge (Alertmanager wants
absolute times), never by the engine or the correlator.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from . import client
from . import messages
from .configtypes import AlertmanagerConfig

log = logging.getLogger("skewd.controller.alertmanager")

#: how long a resolved incident keeps being re-sent (Prometheus keeps resolved alerts 15 min)
RESOLVED_KEEP_S = 900.0
#: pause before retrying after a failed post, when shorter than resend_interval
RETRY_S = 5.0


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _label_value(v: Any) -> str:
    return str(v)


def alert_for(inc: messages.Incident, cfg: AlertmanagerConfig, now: float) -> dict[str, Any]:
    """The v2 ``postableAlert`` for ``inc`` as of wall time ``now`` (pure)."""
    labels: dict[str, str] = dict(cfg.labels)
    labels.update({k: _label_value(v) for k, v in sorted(inc.group.items()) if v})
    labels.update({"alertname": inc.rule_id or inc.pathology, "pathology": inc.pathology, "cluster": inc.cluster,
                   "incident": inc.id})
    if inc.culprit is not None:
        for k in ("node", "tp_group", "pp_group", "engine", "model"):
            v = getattr(inc.culprit, k)
            if v:
                labels[k] = v
    if inc.cause is not None:
        labels["layer"] = inc.cause.layer
    annotations = {"summary": inc.summary}
    if inc.cause is not None:
        annotations["cause"] = f"{inc.cause.layer}: {inc.cause.reason} (confidence {inc.cause.confidence:.2f})"
    if inc.victims:
        annotations["victims"] = ", ".join(inc.victims)
    if inc.state == "inhibited" and inc.inhibited_by:
        annotations["inhibited_by"] = inc.inhibited_by
    alert: dict[str, Any] = {"labels": labels, "annotations": annotations, "startsAt": rfc3339(inc.opened_at)}
    if inc.state == "open":
        alert["endsAt"] = rfc3339(now + 4 * cfg.resend_interval)
    else:
        alert["endsAt"] = rfc3339(max(inc.resolved_at or inc.updated_at, inc.opened_at))
    if cfg.generator_url:
        alert["generatorURL"] = cfg.generator_url.format(cluster=inc.cluster, incident=inc.id)
    return alert


def _post(url: str, body: bytes, timeout: float) -> None:
    req = urllib.request.Request(f"{url}/api/v2/alerts", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "skewd-controller"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - operator-configured http(s) URL
        resp.read()


class AlertmanagerSink:
    """Owns the alert state sent to Alertmanager for one cluster; started and stopped by
    ``skewd controller`` (controller/main.py) next to the controller."""

    def __init__(self, cfg: AlertmanagerConfig, cluster: str, *, wall_clock: Callable[[], float] = time.time,
                 post: Callable[[str, bytes, float], None] = _post) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.wall = wall_clock
        self.post = post
        self.incidents: dict[str, messages.Incident] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.posts = 0
        self.post_errors = 0
        self.alerts_sent = 0
        self.last_error = ""

    def stats(self) -> dict[str, float]:
        """For /metrics: counts since start, and the firing alerts now."""
        return {"posts": self.posts, "post_errors": self.post_errors, "alerts_sent": self.alerts_sent,
                "alerts_firing": sum(1 for i in self.incidents.values() if i.state == "open")}

    async def start(self, nc: Any) -> None:
        """Begin following incidents on the connected client ``nc``; returns at once."""
        if self._tasks:
            return
        self._tasks = [asyncio.create_task(self._follow(nc), name="skewd-am-follow"),
                       asyncio.create_task(self._send_loop(), name="skewd-am-send")]

    async def stop(self) -> None:
        """Stop following and sending (idempotent; safe before start). Firing alerts are not
        resolved: Alertmanager ends them 4 resend intervals after the last send."""
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)
        self._tasks = []

    def observe(self, inc: messages.Incident) -> None:
        """Take one incident message (latest state wins) and mark it for sending."""
        old = self.incidents.get(inc.id)
        if old is not None and old.updated_at > inc.updated_at:
            return
        self.incidents[inc.id] = inc
        self._dirty.add(inc.id)
        self._wake.set()

    async def _follow(self, nc: Any) -> None:
        while True:
            try:
                async for ev in client.subscribe(nc, self.cluster, kinds=["incident"], deliver="all"):
                    self.observe(ev)  # type: ignore[arg-type]
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - reconnecting: subscribe again (replays; latest wins)
                log.debug("incident subscription restarting: %s", e)
                await asyncio.sleep(1.0)

    def due(self, now: float, resend_all: bool) -> list[dict[str, Any]]:
        """Alerts to send now: every changed incident, and on a resend every open one and every
        one that ended within ``RESOLVED_KEEP_S``. Forgets incidents that ended before that."""
        out = []
        for iid, inc in list(self.incidents.items()):
            ended = None if inc.state == "open" else (inc.resolved_at or inc.updated_at)
            if ended is not None and now - ended > RESOLVED_KEEP_S:
                del self.incidents[iid]
                self._dirty.discard(iid)
                continue
            if resend_all or iid in self._dirty:
                out.append(alert_for(inc, self.cfg, now))
        return out

    async def send_now(self, resend_all: bool) -> bool:
        """One attempt; True when every URL took the alerts (or there was nothing to send)."""
        now = self.wall()
        alerts = self.due(now, resend_all)
        if not alerts:
            return True
        sent_ids = set(self._dirty)
        body = json.dumps(alerts).encode()
        ok = True
        for url in self.cfg.urls:
            self.posts += 1
            try:
                await asyncio.to_thread(self.post, url, body, self.cfg.timeout)
            except (urllib.error.URLError, OSError, ValueError) as e:
                ok = False
                self.post_errors += 1
                self.last_error = f"{url}: {e}"
                log.warning("Alertmanager at %s did not take %d alert(s): %s", url, len(alerts), e)
        if ok:
            self.alerts_sent += len(alerts)
            self._dirty -= sent_ids
        return ok

    async def _send_loop(self) -> None:
        last_full = -float("inf")
        while True:
            now = time.monotonic()
            full = now - last_full >= self.cfg.resend_interval
            ok = await self.send_now(resend_all=full)
            if full and ok:
                last_full = now
            wait = self.cfg.resend_interval - (time.monotonic() - last_full)
            if not ok:
                wait = min(wait, RETRY_S)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.05, wait))
            except asyncio.TimeoutError:
                pass
