"""Durable controller state in a JetStream key-value bucket.

What must survive a restart (or be shared by replicas) lives here, one key per item, under a
per-cluster prefix:

``<c>.finding.<fingerprint>``  latest transition of every finding taken in (the correlator's input)
``<c>.incident.<hash>``       id, open time, published flag and hold start of each open incident
                              (ids stay stable; a held incident's hold resumes after a restart)
``<c>.engine``                 the group rule engine's alert states (pending/firing, active_at)
``<c>.remap.<key>``            every suggestion: body, status, publish sequence, replies

``<c>`` is the cluster's subject token with ``%`` written as ``=`` (KV keys allow ``=``, never
produced by :func:`skewd.wire.token`, so the mapping stays injective).

Suggestions are created with ``kv.create`` (fails if the key exists): of several replicas
planning the same suggestion exactly one owns its publication; updates use compare-and-set on
the revision so concurrent replies are never lost.

A restart restores exactly what the bucket holds: nats-py's KV watcher can signal "initial
values done" before it delivered them (nats-io/nats.py#842; once in seven restarts the state
came back empty while KV held 45 keys), so :meth:`StateStore.load` checks what the watch
delivered against the bucket's key list, which the server gives from the stream's subjects,
watches again for what is missing and reads any still missing one by one.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import asdict
from typing import Any, Awaitable, Callable

from skewd import wire
from skewd.model import Finding, State
from skewd.rules.engine import AlertState, Engine

log = logging.getLogger("skewd.controller.state")


def cluster_key(cluster: str) -> str:
    return wire.token(cluster).replace("%", "=")


def _dumps(d: Any) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


#: a KV value is bounded by the server's max_payload; this only caps what one parse may take
STATE_VALUE_BYTES = 64 << 20
#: watch passes over the bucket before missing keys are read one by one (see load)
LOAD_WATCH_ATTEMPTS = 3
#: how long one watch pass may wait for its "initial values done" marker
LOAD_WATCH_TIMEOUT_S = 10.0


class StateStore:
    """The controller's KV bucket, keyed per cluster (see the module doc); owned by the
    controller service, which writes after every step and reads it all back at start."""

    def __init__(self, kv: Any, cluster: str, nc: Any = None, bucket: str = "") -> None:
        self.kv = kv
        self.cluster = cluster
        self.prefix = cluster_key(cluster)
        self.writes = 0
        self.conflicts = 0
        self.nc = nc  # for the bucket's key list (stream info); found through the kv handle when None
        self.bucket = bucket
        #: what the last load needed: watch passes, keys read one by one, keys the watches missed
        self.load_report: dict[str, int] = {}

    @classmethod
    async def open(cls, js: Any, bucket: str, cluster: str, max_age: float, nc: Any = None) -> "StateStore":
        from nats.js.errors import BucketNotFoundError

        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            # direct gets: a read names its key in the subject, so a NATS user can be allowed to
            # read suggestion records and nothing else of the bucket (docs/security.md)
            kv = await js.create_key_value(bucket=bucket, history=1, ttl=max_age, direct=True,
                                           description="skewd controller state (findings, incidents, remaps)")
        return cls(kv, cluster, nc=nc, bucket=bucket)

    def key(self, *parts: str) -> str:
        return ".".join((self.prefix, *parts))

    # -- generic ---------------------------------------------------------------------------
    async def _put(self, key: str, value: dict[str, Any]) -> int:
        self.writes += 1
        return await self.kv.put(key, _dumps(value))

    async def get(self, key: str) -> tuple[dict[str, Any], int] | None:
        from nats.js.errors import KeyNotFoundError

        try:
            e = await self.kv.get(key)
        except KeyNotFoundError:
            return None
        if not e.value:
            return None
        return json.loads(e.value), e.revision

    async def load(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Everything under this cluster's prefix, by section: {"finding": {fp: value}, ...},
        checked against the bucket's key list (module doc): a watch pass, then the keys the
        server lists that it did not deliver are watched again (up to
        :data:`LOAD_WATCH_ATTEMPTS` passes) and finally read one by one."""
        values: dict[str, bytes] = {}
        deleted: set[str] = set()  # keys whose latest entry is a delete/purge marker
        report = {"watch_passes": 0, "read_singly": 0, "missed_by_watch": 0}
        listed: set[str] | None = None
        for attempt in range(LOAD_WATCH_ATTEMPTS):
            report["watch_passes"] += 1
            await self._watch_into(values, deleted)
            listed = await self.keys()
            missing = listed - values.keys() - deleted
            if attempt == 0:
                report["missed_by_watch"] = len(missing)
            if not missing:
                break
            log.info("state load: the KV watch delivered %d of %d keys (nats.py#842); watching again",
                     len(listed & values.keys()), len(listed))
        for key in sorted((listed or set()) - values.keys() - deleted):
            cur = await self.get_raw(key)
            report["read_singly"] += 1
            if cur is not None:
                values[key] = cur
        self.load_report = report
        if report["missed_by_watch"]:
            log.warning("state load: the first KV watch missed %d of %d keys; restored them (%s)",
                        report["missed_by_watch"], len(values), report)
        out: dict[str, dict[str, dict[str, Any]]] = {"finding": {}, "incident": {}, "remap": {}, "engine": {}}
        for key, raw in values.items():
            rest = key[len(self.prefix) + 1:]
            section, _, name = rest.partition(".")
            try:
                out.setdefault(section, {})[name or section] = wire.load_json(raw, max_bytes=STATE_VALUE_BYTES)
            except wire.WireError as e:
                log.warning("ignoring unreadable state key %s: %s", key, e)
        return out

    async def _watch_into(self, values: dict[str, bytes], deleted: set[str]) -> None:
        """One watch pass over this cluster's keys (latest entry each, delete markers too, so
        a deleted key is not mistaken for a missed one), until the watcher's end marker or
        :data:`LOAD_WATCH_TIMEOUT_S`."""
        w = await self.kv.watch(f"{self.prefix}.>")
        try:
            while True:
                try:
                    e = await asyncio.wait_for(w.updates(timeout=LOAD_WATCH_TIMEOUT_S), LOAD_WATCH_TIMEOUT_S + 1)
                except Exception:  # noqa: BLE001 - nats TimeoutError: no marker came; the key list decides
                    break
                if e is None:
                    break
                if e.value and e.operation is None:
                    values[e.key] = e.value
                    deleted.discard(e.key)
                else:
                    values.pop(e.key, None)
                    deleted.add(e.key)
        finally:
            await w.stop()

    async def keys(self) -> set[str]:
        """The bucket's keys under this cluster's prefix, as the server lists them (the
        stream's subjects, paged), without deleted or purged ones."""
        stream = f"KV_{self.bucket or self.kv._name}"
        kv_prefix = f"$KV.{self.bucket or self.kv._name}."
        nc = self.nc if self.nc is not None else self.kv._js._nc
        subjects: dict[str, int] = {}
        offset = 0
        while True:
            req = {"subjects_filter": f"{kv_prefix}{self.prefix}.>", "offset": offset}
            resp = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", json.dumps(req).encode(),
                                                timeout=5.0)).data)
            if "error" in resp:
                raise RuntimeError(f"stream info for {stream}: {resp['error']}")
            page = (resp.get("state") or {}).get("subjects") or {}
            subjects.update(page)
            total = int(resp.get("total") or 0)
            offset += len(page)
            if not page or offset >= total:
                break
        # a deleted or purged key keeps its subject (the marker is its last message): the watch
        # reports those, and a one-by-one read finds them gone
        return {s[len(kv_prefix):] for s in subjects}

    async def get_raw(self, key: str) -> bytes | None:
        """The value of ``key``; None when it is deleted, purged or gone."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            e = await self.kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return e.value or None

    # -- findings ----------------------------------------------------------------------------
    async def put_finding(self, f: Finding) -> None:
        await self._put(self.key("finding", f.fingerprint), f.to_dict())

    async def delete_finding(self, fingerprint: str) -> None:
        await self.kv.delete(self.key("finding", fingerprint))

    # -- incidents ---------------------------------------------------------------------------
    @staticmethod
    def incident_slot(group_key: str) -> str:
        return hashlib.sha256(group_key.encode()).hexdigest()[:24]

    async def put_incident_id(self, group_key: str, incident_id: str, opened_at: float, published: bool = True,
                              held_from: float | None = None) -> None:
        """``published`` False: the incident is still held (``correlation.group_wait``) since
        ``held_from``; a record without the flag (older controllers published at once) counts
        as published."""
        rec = {"group_key": group_key, "id": incident_id, "opened_at": opened_at, "published": published}
        if held_from is not None:
            rec["held_from"] = held_from
        await self._put(self.key("incident", self.incident_slot(group_key)), rec)

    async def delete_incident_id(self, group_key: str) -> None:
        await self.kv.delete(self.key("incident", self.incident_slot(group_key)))

    # -- engine ------------------------------------------------------------------------------
    async def put_engine(self, engine: Engine, t: float) -> None:
        await self._put(self.key("engine"), engine_snapshot(engine, t))

    # -- remaps ------------------------------------------------------------------------------
    async def create_remap(self, key: str, record: dict[str, Any]) -> bool:
        """Store a new suggestion record; False when one with this key exists already."""
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            await self.kv.create(self.key("remap", key), _dumps(record))
            self.writes += 1
            return True
        except KeyWrongLastSequenceError:
            return False

    async def update_remap(self, key: str, fn: Callable[[dict[str, Any]], dict[str, Any] | None],
                           attempts: int = 20) -> dict[str, Any] | None:
        """Compare-and-set update; ``fn`` gets the current record and returns the new one (or
        None to leave it). Returns the stored record, None if the key does not exist."""
        from nats.js.errors import KeyWrongLastSequenceError

        k = self.key("remap", key)
        for _ in range(attempts):
            cur = await self.get(k)
            if cur is None:
                return None
            rec, rev = cur
            new = fn(json.loads(json.dumps(rec)))
            if new is None:
                return rec
            try:
                await self.kv.update(k, _dumps(new), last=rev)
                self.writes += 1
                return new
            except KeyWrongLastSequenceError:
                self.conflicts += 1
        raise RuntimeError(f"remap {key}: too many concurrent updates")

    async def get_remap(self, key: str) -> dict[str, Any] | None:
        cur = await self.get(self.key("remap", key))
        return cur[0] if cur else None


def engine_snapshot(engine: Engine, t: float) -> dict[str, Any]:
    """The alert states of every rule, with the rule digest they belong to."""
    digests = {r.id: r.digest for r in engine.rules.rules}
    rules = {}
    for rid, states in engine.states.items():
        if not states or rid not in digests:
            continue
        rules[rid] = {"digest": digests[rid], "states": {fp: {**asdict(st), "state": st.state.value}
                                                         for fp, st in states.items()}}
    return {"t": t, "rules": rules}


def restore_engine(engine: Engine, snap: dict[str, Any]) -> int:
    """Put saved alert states back for rules whose definition is unchanged (as a hot reload
    does): a firing alert keeps its ``active_at``, so its finding keeps its id and nothing is
    re-planned. Returns how many states were restored."""
    digests = {r.id: r.digest for r in engine.rules.rules}
    n = 0
    if isinstance(snap.get("t"), (int, float)):
        engine.resume_from(float(snap["t"]))  # a restored firing alert is held while windows refill
    for rid, saved in (snap.get("rules") or {}).items():
        if digests.get(rid) != saved.get("digest"):
            continue
        states = engine.states.setdefault(rid, {})
        for fp, d in (saved.get("states") or {}).items():
            d = dict(d)
            d["state"] = State(d["state"])
            states[fp] = AlertState(**d)
            n += 1
    return n


Saver = Callable[[], Awaitable[None]]
