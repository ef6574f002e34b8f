"""The shipped NATS server config (deploy/nats/nats-cluster.conf + the users `skewd nats-auth`
generates) against the real code: a real nats-server with TLS, real agents' connections (one
nkey per node), the real controller and the real client library.

Every flow the product needs works (agent → controller → inference controller: finding,
incident, remap, ack, reject), and every abuse an operator relies on the server to stop is
stopped, with the server's own "Permissions Violation" and no effect on the streams, the
controller's consumer or its KV state.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from skewd import wire
from skewd.agent.publisher import Publisher
from skewd.agent.spool import Spool
from skewd.controller import client
from skewd.controller.alertmanager import AlertmanagerSink
from skewd.controller.config import AlertmanagerConfig
from skewd.controller import messages as M
from skewd.controller.service import Controller
from skewd.model import Finding, Layer
from skewd.natsauth import generate
from skewd.natsutil import (EmbeddedNatsServer, NatsAuthError, NatsConfig, NatsTLSError, NatsUnavailableError,
                            connect, ensure_streams, inbox_prefix)

from ..controller.helpers import config
from ..controller.sim import ScriptedGroup, finding, publish_finding
from .tls import make_ca_and_server

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "nats" / "nats-cluster.conf"
CLUSTER = "prod-a"
NODES = ("n0", "n1", "n2", "n3")


def _substitute(text: str, old: str, new: str) -> str:
    """Replace a site-specific value that must occur exactly once (so the test notices when the
    shipped file changes shape rather than silently testing something else)."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {SHIPPED}"
    return text.replace(old, new)


def local_config(shipped: str, tls_dir: Path, store: Path) -> str:
    """The shipped config with only deployment-site values swapped for this machine's: paths,
    the server name and the listen address. The cluster block goes: a lone member of a
    3-member JetStream cluster has no quorum, and its routes name hosts that do not exist here.
    Accounts, users, permissions and TLS settings are the shipped ones, unchanged."""
    t = _substitute(shipped, "server_name: $SERVER_NAME", "server_name: nats-0")
    t = _substitute(t, "listen: 0.0.0.0:4222", "listen: 127.0.0.1:4222")  # -a/-p set the real port
    t = _substitute(t, "http: 127.0.0.1:8222", "http: 127.0.0.1:0")
    t = _substitute(t, "store_dir: /data/jetstream", f"store_dir: {json.dumps(str(store))}")
    start = t.index("\ncluster {")
    end = t.index("\n}\n", start) + 3
    assert "routes" in t[start:end]
    t = t[:start] + "\n" + t[end:]
    t = t.replace("/etc/nats/tls/", f"{tls_dir}/")
    assert "/etc/nats" not in t and "include ./skewd-auth.conf" in t
    return t


class Principal:
    """One credential's connection with the server's error reports collected."""

    def __init__(self, name: str, nc: Any, errors: list[str]) -> None:
        self.name, self.nc, self.errors = name, nc, errors
        self.js = nc.jetstream(timeout=2.0)

    async def denied(self, what: str, timeout: float = 3.0) -> str:
        """Wait for the server's permissions violation naming ``what``; return it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for e in self.errors:  # nats-py lower-cases the server's text
                if "permissions violation" in e.lower() and what.lower() in e.lower():
                    self.errors.remove(e)
                    return e
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.name}: no permissions violation for {what!r}; errors: {self.errors}")

    async def publish_denied(self, subject: str, data: bytes = b"{}", **kw: Any) -> None:
        await self.nc.publish(subject, data, **kw)
        await self.nc.flush()
        await self.denied(f'Publish to "{subject}"')

    async def request_denied(self, subject: str, data: bytes = b"") -> None:
        """A JetStream API (or other) request the server must not even deliver."""
        with pytest.raises(Exception):  # noqa: B017 - no responders / timeout: the request went nowhere
            await self.nc.request(subject, data, timeout=1.0)
        await self.denied(f'Publish to "{subject}"')

    async def subscribe_denied(self, subject: str) -> None:
        got: list[Any] = []

        async def cb(m: Any) -> None:
            got.append(m)

        sub = await self.nc.subscribe(subject, cb=cb)
        await self.nc.flush()
        await self.denied(f'Subscription to "{subject}"')
        await sub.unsubscribe()


@pytest.fixture(scope="module")
def secured(nats_server_bin: str, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("secured-nats")
    seeds = base  # skewd-auth.conf must sit beside the server config (include is relative)
    users = generate(seeds, CLUSTER, NODES, ["router-1", "router-2"])
    tls = make_ca_and_server(base / "tls", server="server")
    make_ca_and_server(base / "unused", server="route")  # the (removed) cluster block's files
    text = local_config(SHIPPED.read_text(), base / "tls", base / "js")
    # jetstream=False: the shipped config enables JetStream itself (no -js/-sd flags on top)
    srv = EmbeddedNatsServer(store_dir=base / "js", config_text=text, binary=nats_server_bin, jetstream=False)
    # EmbeddedNatsServer writes the config beside the store: base/nats-<port>.conf, next to skewd-auth.conf
    srv.start()
    yield {"server": srv, "seeds": seeds, "ca": tls["ca"], "users": users,
           "url": f"tls://127.0.0.1:{srv.port}"}
    srv.stop()


def nats_cfg(s: dict, stem: str, prefix: str | None = None) -> NatsConfig:
    return NatsConfig(servers=(s["url"],), nkey_seed_file=str(s["seeds"] / f"{stem}.nk"),
                      tls_ca_file=str(s["ca"]), inbox_prefix=prefix, reconnect_time_wait=0.2)


async def principal(s: dict, stem: str, prefix: str) -> Principal:
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    nc = await connect(nats_cfg(s, stem, prefix), initial_timeout=10, error_cb=on_error)
    return Principal(stem, nc, errors)


async def agent(s: dict, node: str) -> Principal:
    return await principal(s, f"agent-{node}", inbox_prefix("agent", CLUSTER, node))


async def inference(s: dict, name: str) -> Principal:
    return await principal(s, f"inference-{name}", inbox_prefix("inference", CLUSTER, name))


def controller_config(s: dict, **over: Any):
    return config(s["url"], CLUSTER, nats={"servers": s["url"], "nkey_seed_file": str(s["seeds"] / "controller.nk"),
                                           "tls_ca_file": str(s["ca"]), "reconnect_time_wait": 0.2}, **over)


async def _collect(nc: Any, kinds: list[str], out: list[Any], **kw: Any) -> None:
    async for ev in client.subscribe(nc, CLUSTER, kinds=kinds, **kw):
        out.append(ev)


async def _wait(pred, timeout: float, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        v = pred()
        if v:
            return v
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


async def test_every_flow_the_product_needs_works(secured, tmp_path) -> None:
    """agent → controller → inference controllers under the shipped permissions: agents create
    the findings stream and publish their own node's summaries, phases and findings; the
    controller publishes the incident and the remap; inference controllers receive both
    (durable and ordered consumers), ack and reject, and read the suggestion's record."""
    s = secured
    agents = {n: await agent(s, n) for n in NODES}
    r1, r2 = await inference(s, "router-1"), await inference(s, "router-2")
    ctl = Controller(controller_config(s))
    tasks: list[asyncio.Task] = []
    publishers: dict[str, Publisher] = {}
    sink: AlertmanagerSink | None = None
    try:
        # an agent that connects first creates the findings stream (docs/wire.md)
        created = await ensure_streams(agents["n0"].js, [wire.FINDINGS_STREAM], update=False)
        assert created[wire.FINDINGS_STREAM.name] in ("created", "unchanged")
        await asyncio.wait_for(ctl.start(), 30)
        for n in NODES:  # the agent's publisher, configured as the agent runner does (inbox by default)
            ncfg = NatsConfig.from_dict({"url": s["url"], "nkey_seed_file": str(s["seeds"] / f"agent-{n}.nk"),
                                         "tls_ca_file": str(s["ca"])})
            publishers[n] = Publisher(ncfg.with_default_inbox(inbox_prefix("agent", CLUSTER, n)),
                                      Spool(tmp_path / "spool" / n), cluster=CLUSTER)
            await publishers[n].start()
            await publishers[n].wait_connected(10)
        # the Alertmanager sink follows incidents on the controller's own connection (its
        # transport to Alertmanager is captured here; tests/controller/test_alertmanager.py
        # runs it against a real Alertmanager)
        posted: list[dict] = []
        sink = AlertmanagerSink(AlertmanagerConfig(urls=("http://alertmanager.invalid",)), CLUSTER,
                                post=lambda url, body, timeout: posted.extend(json.loads(body)))
        await sink.start(ctl.nc)
        got1: list[Any] = []
        got2: list[Any] = []
        tasks.append(asyncio.create_task(_collect(r1.nc, ["remap", "incident"], got1, durable="router-1")))
        tasks.append(asyncio.create_task(_collect(r2.nc, ["remap", "incident", "finding"], got2)))
        await asyncio.sleep(0.5)

        g = ScriptedGroup(cluster=CLUSTER, late_s=0.008, late_from=8)
        for i in range(45):
            for n in NODES:
                await agents[n].nc.publish(wire.summary_subject(CLUSTER, n), g.summary(i, n))
            await agents["n0"].nc.publish(wire.phase_subject(CLUSTER, "n0", "engine0"), g.phase(i))
            if i == 12:  # each node's agent publisher sends its own finding (spool → JetStream → PubAck)
                for n in NODES:
                    f = (finding(n, "PCIE-1-test", "PCIE-1", Layer.PCIE, g.t0 + i, cluster=CLUSTER, entity="0000:3b:00.0")
                         if n == g.late_node else
                         finding(n, "GPU-8-test", "GPU-8", Layer.ENGINE, g.t0 + i, cluster=CLUSTER, entity="engine0"))
                    publishers[n].publish_finding(f)
                for n in NODES:
                    assert await publishers[n].wait_drained(10), (n, publishers[n].stats)
            for n in NODES:
                await agents[n].nc.flush()
            await asyncio.sleep(0.03)

        remap = await _wait(lambda: next((e for e in got1 if isinstance(e, M.RemapSuggestion)), None), 20,
                            "router-1's remap suggestion")
        assert remap.culprit is not None and remap.culprit.node == "n2"
        assert any(isinstance(e, M.Incident) and e.id == remap.incident for e in got1)
        await _wait(lambda: any(isinstance(e, M.RemapSuggestion) for e in got2), 10, "router-2's remap (ordered consumer)")
        assert {e.node for e in got2 if isinstance(e, Finding)} >= set(NODES)  # findings, read-only
        assert ctl.stats.findings_in >= 4 and ctl.stats.incidents_published >= 1 and ctl.stats.remaps_published == 1

        await _wait(lambda: any(a["labels"]["incident"] == remap.incident for a in posted), 10,
                    "the incident's alert (sink under the controller's permissions)")
        ack = await client.ack(r1.nc, remap, consumer="router-1", reason="rerouted")
        assert ack.status is M.ReceiptStatus.RECORDED, ack
        rej = await client.reject(r2.nc, remap, consumer="router-2", reason="not automated here")
        assert rej.status is M.ReceiptStatus.RECORDED, rej
        rec = await client.suggestion_record(r1.nc, CLUSTER, remap.key)
        assert rec is not None and {(x["consumer"], x["decision"]) for x in rec["replies"]} == {
            ("router-1", "ack"), ("router-2", "reject")}
        for p in (*agents.values(), r1, r2):
            assert not [e for e in p.errors if "permissions violation" in e.lower()], (p.name, p.errors)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if sink is not None:
            await sink.stop()
        await ctl.stop()
        for pub in publishers.values():
            await pub.close()
            pub.spool.close()
        for p in (*agents.values(), r1, r2):
            await p.nc.close()


async def _stream_count(js: Any, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


async def test_every_abuse_an_operator_relies_on_is_denied(secured) -> None:
    s = secured
    ctl = Controller(controller_config(s))
    await asyncio.wait_for(ctl.start(), 30)
    a1, a2 = await agent(s, "n1"), await agent(s, "n2")
    r1, r2 = await inference(s, "router-1"), await inference(s, "router-2")
    durable = ctl.cfg.durable
    bucket = ctl.cfg.bucket
    findings, remaps, incidents = wire.FINDINGS_STREAM.name, wire.REMAPS_STREAM.name, M.INCIDENTS_STREAM.name
    kvp = ctl.state.prefix
    try:
        n_find = await _stream_count(a1.js, findings)
        n_remap = await _stream_count(r1.js, remaps)
        n_inc = await _stream_count(r1.js, incidents)
        seen: list[Any] = []

        async def watch(m: Any) -> None:
            seen.append(m.subject)

        spy = await r1.nc.subscribe(f"skewd.v1.summary.{CLUSTER}.*", cb=watch)  # a legitimate reader
        await r1.nc.flush()

        # -- agents publish only their own node's subjects, and only agent subjects -------------
        other = finding("n2", "GPU-8-test", "GPU-8", Layer.ENGINE, 1.7e9, cluster=CLUSTER, entity="engine0")
        with pytest.raises(Exception):  # noqa: B017 - no PubAck: the server dropped it
            await a1.js.publish(wire.subject_for(other), wire.encode(other), headers=wire.headers_for(other), timeout=1.0)
        await a1.denied(f'Publish to "{wire.subject_for(other)}"')
        await a1.publish_denied(wire.summary_subject(CLUSTER, "n2"), b'{"schema":1}')
        await a1.publish_denied(wire.health_subject(CLUSTER, "n2"))
        await a1.publish_denied(wire.phase_subject(CLUSTER, "n2", "engine0"))
        await a1.publish_denied(wire.summary_subject("other-cluster", "n1"))
        await a1.publish_denied(wire.finding_subject("other-cluster", "n1", "R"))
        for subj in (wire.remap_subject(CLUSTER), f"skewd.v1.remap.{CLUSTER}.ack.x", M.incident_subject(CLUSTER),
                     M.reply_subject(CLUSTER)):
            await a1.publish_denied(subj)
        # ... and may not change or remove the streams the controller relies on
        for api in (f"STREAM.DELETE.{findings}", f"STREAM.UPDATE.{findings}", f"STREAM.PURGE.{findings}",
                    f"STREAM.DELETE.{remaps}", f"CONSUMER.DELETE.{findings}.{durable}",
                    f"CONSUMER.MSG.NEXT.{findings}.{durable}", f"CONSUMER.CREATE.{findings}", f"STREAM.LIST"):
            await a1.request_denied(f"$JS.API.{api}")

        # -- no role reads or forges another's inbox replies ----------------------------------
        for p, own in ((a1, inbox_prefix("agent", CLUSTER, "n1")), (r2, inbox_prefix("inference", CLUSTER, "router-2"))):
            for subj in ("_INBOX.>", "_INBOX.*", f"{inbox_prefix('controller', CLUSTER)}.>",
                         f"{inbox_prefix('agent', CLUSTER, 'n2')}.>", f"{inbox_prefix('inference', CLUSTER, 'router-1')}.>",
                         "skewd.v1.>", M.reply_subject(CLUSTER), ">"):
                if not subj.startswith(own):
                    await p.subscribe_denied(subj)
            for subj in (f"{inbox_prefix('inference', CLUSTER, 'router-1')}.x.y", f"{inbox_prefix('controller', CLUSTER)}.x",
                         "_INBOX.abc.def"):
                await p.publish_denied(subj, b'{"schema":1,"kind":"remap_receipt","status":"recorded"}')
        await a2.subscribe_denied(f"{inbox_prefix('agent', CLUSTER, 'n1')}.>")

        # -- only the controller touches its consumer and its KV state ------------------------
        for p in (r2, a1):
            await p.request_denied(f"$JS.API.CONSUMER.DELETE.{findings}.{durable}")
            await p.request_denied(f"$JS.API.CONSUMER.MSG.NEXT.{findings}.{durable}", b'{"batch":1}')
            await p.request_denied(f"$JS.API.CONSUMER.CREATE.{findings}.{durable}.skewd.v1.finding.{CLUSTER}.>",
                                   b"{}")
            await p.request_denied(f"$JS.API.CONSUMER.DURABLE.CREATE.{findings}.{durable}", b"{}")
            await p.publish_denied(f"$JS.ACK.{findings}.{durable}.1.1.1.1.1")
            await p.publish_denied(f"$KV.{bucket}.{kvp}.finding.forged", b'{"x":1}')
            await p.publish_denied(f"$KV.{bucket}.{kvp}.remap.forged", b'{"x":1}')
            await p.request_denied(f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{kvp}.finding.x")
            await p.request_denied(f"$JS.API.STREAM.MSG.GET.KV_{bucket}", b'{"last_by_subj":"$KV.x"}')
            await p.request_denied(f"$JS.API.CONSUMER.CREATE.KV_{bucket}", b"{}")
            await p.request_denied(f"$JS.API.STREAM.DELETE.KV_{bucket}")
        # an ephemeral consumer create carrying the controller's durable name is refused by the
        # server itself: a durable needs its name in the subject, which only the controller may use
        req = {"stream_name": findings, "config": {"durable_name": durable, "deliver_policy": "all",
                                                   "ack_policy": "none", "filter_subject": "skewd.v1.finding.>"}}
        resp = await r2.nc.request(f"$JS.API.CONSUMER.CREATE.{findings}", json.dumps(req).encode(), timeout=3)
        assert "error" in json.loads(resp.data), resp.data
        # one inference controller cannot take over another's durable consumer either
        await r2.request_denied(f"$JS.API.CONSUMER.MSG.NEXT.{remaps}.router-1-remap", b'{"batch":1}')
        await r2.request_denied(f"$JS.API.CONSUMER.CREATE.{remaps}.router-1-remap.skewd.v1.remap.{CLUSTER}", b"{}")

        # -- nothing lands in SKEWD_REMAPS / SKEWD_INCIDENTS but the controller's messages ------
        for p in (r1, r2):
            for subj in (wire.remap_subject(CLUSTER), f"skewd.v1.remap.{CLUSTER}.ack.router", M.incident_subject(CLUSTER),
                         wire.finding_subject(CLUSTER, "n1", "R"), wire.summary_subject(CLUSTER, "n1")):
                await p.publish_denied(subj)
        # the controller's user is for its own cluster only, and reads no one else's inbox
        cp = await principal(s, "controller", inbox_prefix("controller", CLUSTER))
        await cp.publish_denied(wire.remap_subject("other-cluster"))
        await cp.publish_denied(wire.summary_subject(CLUSTER, "n1"))
        await cp.subscribe_denied("_INBOX.>")
        await cp.subscribe_denied(f"{inbox_prefix('inference', CLUSTER, 'router-1')}.>")
        await cp.nc.close()

        # -- effects: none of the above changed anything -----------------------------------------
        await asyncio.sleep(0.3)
        assert await _stream_count(a1.js, findings) == n_find
        assert await _stream_count(r1.js, remaps) == n_remap
        assert await _stream_count(r1.js, incidents) == n_inc
        assert not [x for x in seen if x.endswith(".n2")], seen  # no summary in n2's name reached a reader
        info = await ctl.js.consumer_info(findings, durable)
        assert info.config.filter_subject == wire.subject_filter("finding", cluster=CLUSTER)
        # the controller still takes in findings through its consumer after all that
        before = ctl.stats.findings_in
        f = finding("n1", "GPU-8-test", "GPU-8", Layer.ENGINE, time.time(), cluster=CLUSTER, entity="engine0")
        await publish_finding(a1.js, f)
        await _wait(lambda: ctl.stats.findings_in > before, 10, "the controller to take in n1's finding")
        await spy.unsubscribe()
    finally:
        await ctl.stop()
        for p in (a1, a2, r1, r2):
            await p.nc.close()


async def test_unknown_or_missing_credentials_and_plaintext_are_refused(secured, tmp_path) -> None:
    import nkeys

    s = secured
    with pytest.raises(NatsAuthError):  # no credentials at all
        await connect(NatsConfig(servers=(s["url"],), tls_ca_file=str(s["ca"])), initial_timeout=5)
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(nkeys.encode_seed(b"\x01" * 32, nkeys.PREFIX_BYTE_USER))
    with pytest.raises(NatsAuthError):  # a well-formed key the server does not know
        await connect(NatsConfig(servers=(s["url"],), tls_ca_file=str(s["ca"]), nkey_seed_file=str(stranger)),
                      initial_timeout=5)
    plain = s["url"].replace("tls://", "nats://")
    with pytest.raises((NatsTLSError, NatsAuthError, NatsUnavailableError)):  # TLS is required
        await connect(NatsConfig(servers=(plain,), nkey_seed_file=str(s["seeds"] / "agent-n1.nk")), initial_timeout=5)
    # the generated file lists each principal once and no password anywhere
    conf = (s["seeds"] / "skewd-auth.conf").read_text()
    assert len(re.findall(r"nkey: \"U[A-Z0-9]{55}\"", conf)) == len(s["users"])
    assert "password" not in conf


async def test_vllm_plugin_publishes_phases_with_its_nodes_seed(secured, monkeypatch) -> None:
    """The in-engine plugin connects with the node's agent seed (environment) and may publish
    that node's phase records, not another node's."""
    from skewd.controller import vllm_plugin

    s = secured
    monkeypatch.setenv("SKEWD_NATS_NKEY_SEED_FILE", str(s["seeds"] / "agent-n1.nk"))
    monkeypatch.setenv("SKEWD_NATS_TLS_CA_FILE", str(s["ca"]))
    reader = await inference(s, "router-1")
    got: list[str] = []

    async def cb(m: Any) -> None:
        got.append(m.subject)

    await reader.nc.subscribe(f"skewd.v1.phase.{CLUSTER}.>", cb=cb)
    await reader.nc.flush()
    pub = vllm_plugin._Publisher(s["url"], interval=0.05, max_steps=16, maxsize=64)
    try:
        await _wait(lambda: pub.connected, 10, "the plugin to connect with the node's seed")
        for node in ("n1", "n2"):
            pub.put(((CLUSTER, node, "engine0", "m1"), 1.7e9, None, [], [0.1], (0, 0.0, None)))
        await _wait(lambda: wire.phase_subject(CLUSTER, "n1", "engine0") in got, 10, "n1's phase record")
        await asyncio.sleep(0.5)
        assert wire.phase_subject(CLUSTER, "n2", "engine0") not in got
    finally:
        await asyncio.to_thread(pub.close)
        await reader.nc.close()
