"""A restarted controller restores exactly what its KV bucket holds (real nats-server): once in
seven restarts the state once came back empty while KV held 45 keys, because nats-py's KV
watcher may signal "initial values done" before delivering them (nats-io/nats.py#842).
``StateStore.load`` checks the watch against the server's key list and fetches what it missed."""
from __future__ import annotations

import asyncio
import json

import nats
import pytest

from skewd.controller.service import Controller
from skewd.controller.state import StateStore
from skewd.model import Layer, Scope, State

from .helpers import config, wait_for
from .sim import finding

pytestmark = pytest.mark.timeout(240)

FINDINGS, DELETED, REMAPS, INCIDENTS = 600, 100, 60, 40


async def _fill(url: str, cluster: str) -> StateStore:
    nc = await nats.connect(url)
    js = nc.jetstream()
    st = await StateStore.open(js, "SKEWD_CONTROLLER", cluster, 3600.0, nc=nc)
    for i in range(FINDINGS):
        f = finding(f"n{i % 50}", f"R-{i}", "GPU-2", Layer.ENGINE, 1_800_000_000.0 + i, cluster=cluster,
                    entity="engine0", scope=Scope.ENGINE, state=State.RESOLVED if i % 3 else State.FIRING)
        await st.put_finding(f)
        if i < DELETED:
            await st.delete_finding(f.fingerprint)  # a delete marker: listed by the server, not a value
    for i in range(REMAPS):
        assert await st.create_remap(f"k{i}", {"status": "expired", "suggestion": None})
    for i in range(INCIDENTS):
        await st.put_incident_id(f"node:n{i}:GPU-2", f"inc{i}", 1_800_000_000.0 + i)
    await st.put_incident_id("gone", "inc-gone", 1.0)
    await st.delete_incident_id("gone")
    st.nc = None  # the store's connection closes here; tests reopen their own
    await nc.close()
    return st


async def test_many_restarts_restore_every_key_the_bucket_holds(nats_server) -> None:
    url, cluster = nats_server.url, "restore"
    await _fill(url, cluster)
    for _ in range(12):
        ctl = Controller(config(url, cluster))
        await asyncio.wait_for(ctl.start(), 30)
        try:
            assert len(ctl.correlator.findings) == FINDINGS - DELETED
            assert len(ctl.remaps) == REMAPS and len(ctl.correlator.ids) == INCIDENTS
            # what the first watch missed came from a second watch pass or was read singly (a
            # second pass can deliver them on a busy host: then none is read singly)
            load = ctl.status()["state_load"]
            assert load["read_singly"] <= load["missed_by_watch"], load
        finally:
            await ctl.stop()


class _EarlyMarker(StateStore):
    """The race of nats.py#842, made to happen: the first watch pass ends (its "done" marker)
    after half of the keys."""

    passes = 0

    async def _watch_into(self, values, deleted) -> None:
        type(self).passes += 1
        if type(self).passes > 1:
            return await super()._watch_into(values, deleted)
        # the real race can also strike this pass on a busy host (CI once saw it deliver
        # nothing): watch until the pass is whole, so the half it keeps is exactly half
        got: dict = {}
        for _ in range(10):
            await super()._watch_into(got, deleted)
            if await self.keys() <= got.keys() | deleted:
                break
        for k in sorted(got)[: len(got) // 2]:
            values[k] = got[k]


async def test_keys_a_watch_missed_are_found_from_the_server_s_key_list(nats_server) -> None:
    url, cluster = nats_server.url, "early"
    await _fill(url, cluster)
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value("SKEWD_CONTROLLER")
        st = _EarlyMarker(kv, cluster, nc=nc, bucket="SKEWD_CONTROLLER")
        saved = await st.load()
        assert len(saved["finding"]) == FINDINGS - DELETED and len(saved["remap"]) == REMAPS
        assert len(saved["incident"]) == INCIDENTS
        # (the race may strike a later pass too on a busy host: CI saw 3 passes once)
        assert st.load_report["missed_by_watch"] == 300 and st.load_report["watch_passes"] >= 2
        assert st.load_report["read_singly"] == 0  # a later watch pass brought them
        # without a second pass (the watch keeps missing them) they are read one by one
        _EarlyMarker.passes = 0
        import skewd.controller.state as state_mod

        old, state_mod.LOAD_WATCH_ATTEMPTS = state_mod.LOAD_WATCH_ATTEMPTS, 1
        try:
            st2 = _EarlyMarker(kv, cluster, nc=nc, bucket="SKEWD_CONTROLLER")
            saved2 = await st2.load()
        finally:
            state_mod.LOAD_WATCH_ATTEMPTS = old
        assert saved2 == saved and st2.load_report["read_singly"] == st2.load_report["missed_by_watch"] == 300
    finally:
        await nc.close()


async def test_damaged_state_values_cost_themselves_not_the_start(nats_server) -> None:
    """KV is the controller's own, but a damaged or foreign value (50,000 levels of JSON, a
    finding with labels [1, 2], an incident record without its id) is skipped with a warning,
    at start and by the watch that follows other replicas' findings."""
    url, cluster = nats_server.url, "damaged"
    st = await _fill(url, cluster)
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value("SKEWD_CONTROLLER")
        good = finding("n1", "R-good", "GPU-2", Layer.ENGINE, 1_800_000_000.0, cluster=cluster, entity="engine0",
                       scope=Scope.ENGINE).to_dict()
        bad = dict(good, labels=[1, 2])
        await kv.put(st.key("finding", "deep"), b"[" * 50_000 + b"]" * 50_000)
        await kv.put(st.key("finding", "labels"), json.dumps(bad).encode())
        await kv.put(st.key("incident", "noid"), b'{"group_key": "x"}')
        ctl = Controller(config(url, cluster))
        await asyncio.wait_for(ctl.start(), 30)
        try:
            assert len(ctl.correlator.findings) == FINDINGS - DELETED
            assert len(ctl.correlator.ids) == INCIDENTS
            await kv.put(st.key("finding", "deep2"), b"{" * 50_000)  # while it runs: the KV watch
            late = finding("n1", "R-late", "GPU-2", Layer.ENGINE, 1_800_000_000.0, cluster=cluster,
                           entity="engine0", scope=Scope.ENGINE)
            await kv.put(st.key("finding", late.fingerprint), json.dumps(late.to_dict()).encode())
            await wait_for(lambda: _true(late.fingerprint in ctl.correlator.findings), 10,
                           "the watch to take the finding stored after the damaged one")
            assert ctl.status()["loops"]["kvwatch"]["restarts"] == 0
        finally:
            await ctl.stop()
    finally:
        await nc.close()


async def _true(v: bool) -> bool:
    return v
