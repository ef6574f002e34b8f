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
"""
from __future__ import annotations

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


class StateStore:
    def __init__(self, kv: Any, cluster: str) -> None:
        self.kv = kv
        self.cluster = cluster
        self.prefix = cluster_key(cluster)
        self.writes = 0
        self.conflicts = 0

    @classmethod
    async def open(cls, js: Any, bucket: str, cluster: str, max_age: float) -> "StateStore":
        from nats.js.errors import BucketNotFoundError

        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            # direct gets: a read names its key in the subject, so a NATS user can be allowed to
            # read suggestion records and nothing else of the bucket (docs/security.md)
            kv = await js.create_key_value(bucket=bucket, history=1, ttl=max_age, direct=True,
                                           description="skewd controller state (findings, incidents, remaps)")
        return cls(kv, cluster)

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
        """Everything under this cluster's prefix, by section: {"finding": {fp: value}, ...}."""
        out: dict[str, dict[str, dict[str, Any]]] = {"finding": {}, "incident": {}, "remap": {}, "engine": {}}
        w = await self.kv.watch(f"{self.prefix}.>", ignore_deletes=True)
        try:
            async for e in w:
                if e is None:
                    break
                if not e.value:
                    continue
                rest = e.key[len(self.prefix) + 1:]
                section, _, name = rest.partition(".")
                try:
                    out.setdefault(section, {})[name or section] = json.loads(e.value)
                except ValueError:
                    log.warning("ignoring unreadable state key %s", e.key)
        finally:
            await w.stop()
        return out

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
