"""Hostile input never stops the controller (issue 21), with a real nats-server and the
controller as a real process: after each poison message an agent could send on its own subject
(50,000-level JSON, wrong types, NaN/Infinity/1e400/10**400 times, a summary at t = 1e17, a
year ahead or Infinity) the next good finding still becomes an incident, also after a restart,
and the controller's CPU stays idle (its own CPU time, read from /proc, not wall timing).
Also: rejections are counted, terminated and never redelivered; a crashed consumer loop is
restarted and shown; shutdown takes at most 2 s with the broker gone."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
import yaml

from skewd import wire
from skewd.controller import client
from skewd.controller import messages
from skewd.controller.service import Controller
from skewd.model import Finding, Layer, Scope

from .helpers import RULES, Heartbeats, config, incidents, wait_for
from .sim import finding, publish_finding

pytestmark = pytest.mark.timeout(300)

YEAR = 365 * 86400.0
DEEP = "[" * 50_000 + "]" * 50_000


def _good(node: str, rule: str, cluster: str) -> Finding:
    """A GPU-3 (engine stall) finding as an agent publishes it, stamped now."""
    return finding(node, rule, "GPU-3", Layer.ENGINE, time.time(), cluster=cluster, entity="engine0",
                   scope=Scope.ENGINE)


def _raw(d: dict, key: str, raw_json: str) -> bytes:
    d = dict(d)
    d[key] = "@@X@@"
    return json.dumps(d).replace('"@@X@@"', raw_json).encode()


def poisons(cluster: str) -> list[tuple[str, str, bytes]]:
    """(name, subject, payload): each a message an agent for n1 can publish on its own subjects."""
    f = json.loads(wire.encode(_good("n1", "GPU-3-poison", cluster)))
    f.pop("id"), f.pop("fingerprint")
    fs = wire.finding_subject(cluster, "n1", "GPU-3-poison")
    now = time.time()
    summ = wire.to_dict(wire.Summary(node="n1", cluster=cluster, t=now, interval=1.0,
                                     signals={"summary_gpu_util_mean_ratio": {"": 0.5}},
                                     clock_sync=wire.ClockSync(True, 0.001), agent_version="test"))
    ss = wire.summary_subject(cluster, "n1")
    return [
        ("deep JSON", fs, _raw(f, "labels", DEEP)),
        ("labels [1, 2]", fs, _raw(f, "labels", "[1, 2]")),
        ("active_at NaN", fs, _raw(f, "active_at", "NaN")),
        ("active_at Infinity", fs, _raw(f, "active_at", "Infinity")),
        ("active_at 1e400", fs, _raw(f, "active_at", "1e400")),
        ("active_at 10**400", fs, _raw(f, "active_at", str(10 ** 400))),
        ("evidence of lists", fs, _raw(f, "evidence", '{"v": [[1]]}')),
        ("severity 7", fs, _raw(f, "severity", "7")),
        ("finding a year ahead", fs, _raw(f, "evaluated_at", repr(now + YEAR))),
        ("summary t=1e17", ss, _raw(summ, "t", "1e17")),
        ("summary a year ahead", ss, _raw(summ, "t", repr(now + YEAR))),
        ("summary t=Infinity", ss, _raw(summ, "t", "Infinity")),
        ("summary deep JSON", ss, _raw(summ, "signals", '{"x": ' + DEEP + "}")),
    ]


def _config_file(tmp: Path, url: str, cluster: str, **over) -> Path:
    doc = {"cluster": cluster, "controller_id": f"{cluster}-proc", "nats": {"servers": url, "reconnect_time_wait": 0.2},
           "rules": [RULES], "warmup": "2s", "correlation": {"group_wait": "1s"}, "consumer": {"ack_wait": "2s"},
           "topology": {"tp_groups": {"tp0": {"nodes": ["n0", "n1", "n2", "n3"], "model": "m1"}},
                        "models": {"m1": {"max_num_seqs": 256}}}, **over}
    p = tmp / f"{cluster}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


class Proc:
    """``skewd controller --config FILE`` as a child process, with its CPU time."""

    def __init__(self, cfg: Path, log: Path) -> None:
        self.cfg, self.log = cfg, log
        self.p: subprocess.Popen | None = None

    def start(self) -> None:
        self.fh = open(self.log, "ab")
        self.p = subprocess.Popen([sys.executable, "-m", "skewd.cli", "controller", "--config", str(self.cfg)],
                                  stdout=self.fh, stderr=subprocess.STDOUT, cwd=str(Path(__file__).parents[2]),
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def cpu_seconds(self) -> float:
        """utime + stime of the process (every thread), from /proc/<pid>/stat."""
        with open(f"/proc/{self.p.pid}/stat") as fh:  # type: ignore[union-attr]
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        if not self.fh.closed:
            self.fh.close()
        return self.p.returncode if self.p else None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


async def _ready(nc, cluster: str, proc: Proc) -> None:
    async def answered():
        assert proc.p.poll() is None, proc.text()[-3000:]
        try:
            r = await client.reject(nc, "probe", consumer="test", cluster=cluster, timeout=0.5)
            return r.status is messages.ReceiptStatus.UNKNOWN
        except client.ReplyError:
            return False
    await wait_for(answered, 60, "the controller process to come up")


async def _incident_for(url: str, cluster: str, f: Finding, timeout: float = 20.0) -> messages.Incident:
    async def shown():
        return next((i for i in await incidents(url, cluster) if f.id in i.findings and i.state == "open"), None)
    return await wait_for(shown, timeout, f"an incident for {f.rule_id}", every=0.3)


async def _idle_cpu(proc: Proc, seconds: float = 3.0) -> float:
    c0 = proc.cpu_seconds()
    await asyncio.sleep(seconds)
    return proc.cpu_seconds() - c0


async def test_after_every_poison_the_next_good_finding_is_an_incident_and_the_cpu_idles(nats_server, tmp_path) -> None:
    url, cluster = nats_server.url, "hostile"
    proc = Proc(_config_file(tmp_path, url, cluster), tmp_path / "ctl.log")
    nc = await nats.connect(url)
    js = nc.jetstream()
    beats = Heartbeats(nc, cluster)
    try:
        proc.start()
        await _ready(nc, cluster, proc)
        beats.start()
        await asyncio.sleep(3.0)  # warmup: the controller evaluates on the summaries' clock
        for k, (name, subject, payload) in enumerate(poisons(cluster)):
            if ".finding." in subject:
                await js.publish(subject, payload)
            else:
                await nc.publish(subject, payload)
            good = _good("n1", f"GPU-3-after-{k}", cluster)
            await publish_finding(js, good)
            await _incident_for(url, cluster, good)
        # the controller is idle: a t = 1e17 summary once made evaluate_due loop for ever
        # (100 % of a core); a healthy one spends a few ms a second on 4 nodes
        spent = await _idle_cpu(proc)
        assert spent < 0.5, f"controller used {spent:.2f} s CPU in 3 s after the poison messages"

        # a restart: terminated poison is not redelivered, and ingestion still works
        assert proc.stop() == 0
        proc.start()
        await _ready(nc, cluster, proc)
        for k, (name, subject, payload) in enumerate(poisons(cluster)[:3] + poisons(cluster)[9:10]):
            await (js.publish(subject, payload) if ".finding." in subject else nc.publish(subject, payload))
            good = _good("n1", f"GPU-3-restart-{k}", cluster)
            await publish_finding(js, good)
            await _incident_for(url, cluster, good)
        spent = await _idle_cpu(proc)
        assert spent < 0.5, f"controller used {spent:.2f} s CPU in 3 s after the restart"
        log = proc.text()
        assert "loop crashed" not in log and "Traceback" not in log, log[-3000:]
        assert "finding rejected (malformed)" in log and "summary rejected (clock_skew)" in log
    finally:
        await beats.stop()
        await nc.close()
        proc.stop()


async def test_rejections_are_counted_terminated_and_never_redelivered(nats_server) -> None:
    url, cluster = nats_server.url, "poisoncount"
    ctl = Controller(config(url, cluster, correlation={"group_wait": "1s"}))
    await asyncio.wait_for(ctl.start(), 30)
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        sent = poisons(cluster)
        for _, subject, payload in sent:
            await (js.publish(subject, payload) if ".finding." in subject else nc.publish(subject, payload))
        await nc.flush()
        n_findings = sum(1 for _, s, _ in sent if ".finding." in s)
        await wait_for(lambda: _true(ctl.stats.findings_rejected == n_findings), 10, "the poison findings")
        await wait_for(lambda: _true(ctl.stats.summaries_rejected == len(sent) - n_findings), 10, "the summaries")
        rej = ctl.status()["rejected"]
        assert rej["finding"] == {"malformed": n_findings - 1, "clock_skew": 1}, rej
        assert rej["summary"] == {"malformed": 3, "clock_skew": 1}, rej
        # terminated: nothing pending, and nothing comes back after ack_wait (2 s)
        await asyncio.sleep(3.0)
        info = await js.consumer_info(wire.FINDINGS_STREAM.name, ctl.cfg.durable)
        assert info.num_ack_pending == 0 and info.num_redelivered == 0
        assert ctl.stats.findings_rejected == n_findings
        assert all(not h["restarts"] and h["running"] for h in ctl.status()["loops"].values())
    finally:
        await nc.close()
        await ctl.stop()


async def _true(v: bool) -> bool:
    return v


async def test_a_spoofed_finding_or_summary_changes_nothing_and_is_counted(nats_server) -> None:
    """An agent for n1 names n3 in a finding on its own subject: no incident and no remap for
    n3 (before this check the controller published reroute and drain_reclaim for the named
    node). The same finding sent honestly, as a control, does produce them."""
    url, cluster = nats_server.url, "spoof"
    ctl = Controller(config(url, cluster, correlation={"group_wait": "1s"}, warmup="1s"))
    await asyncio.wait_for(ctl.start(), 30)
    nc = await nats.connect(url)
    js = nc.jetstream()
    beats = Heartbeats(nc, cluster).start()
    try:
        await asyncio.sleep(2.5)
        lie = _good("n3", "GPU-3-spoof", cluster)
        await js.publish(wire.finding_subject(cluster, "n1", "GPU-3-spoof"), wire.encode(lie),
                         headers=wire.headers_for(lie))
        lie_summary = json.loads(Heartbeats(nc, cluster).group.summary(5, "n1"))
        lie_summary["node"] = "n99"
        await nc.publish(wire.summary_subject(cluster, "n1"), json.dumps(lie_summary).encode())
        honest = _good("n2", "GPU-3-honest", cluster)
        await publish_finding(js, honest)
        inc = await _incident_for(url, cluster, honest)
        assert inc.culprit.node == "n2"
        await wait_for(lambda: _has_remap_for(url, cluster, "n2"), 20, "the control's suggestion")
        await asyncio.sleep(2.0)  # the spoofed finding had as long as the honest one
        assert not any(f.node == "n3" for f in ctl.correlator.findings.values())
        assert not any("n3" in (i.culprit.node if i.culprit else "") for i in await incidents(url, cluster))
        assert not await _has_remap_for(url, cluster, "n3")
        assert "n99" not in ctl.aligner.clocks and "n99" not in ctl.nodes
        assert ctl.status()["rejected"] == {"finding": {"subject_mismatch": 1}, "summary": {"subject_mismatch": 1}}
    finally:
        await beats.stop()
        await nc.close()
        await ctl.stop()


async def _has_remap_for(url: str, cluster: str, node: str) -> bool:
    from .helpers import remaps

    return any(a.target.node == node for s in await remaps(url, cluster) for a in s.actions)


async def test_a_crashed_consumer_loop_is_restarted_and_shown(nats_server) -> None:
    """Fault injection: the findings loop raises once (nothing in the code path does any
    more: the decoders are total). It is restarted, the crash shows in status(), and the next
    finding is taken in."""
    url, cluster = nats_server.url, "supervise"
    ctl = Controller(config(url, cluster))
    real = ctl._take_finding_msg
    boom = [True]

    async def once(m) -> None:
        if boom[0]:
            boom[0] = False
            raise RuntimeError("injected")
        await real(m)

    ctl._take_finding_msg = once  # type: ignore[method-assign]
    await asyncio.wait_for(ctl.start(), 30)
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        first, second = _good("n1", "GPU-3-a", cluster), _good("n2", "GPU-3-b", cluster)
        await publish_finding(js, first)
        await publish_finding(js, second)
        await wait_for(lambda: _true(len(ctl.correlator.findings) == 2), 20, "both findings (one redelivered)")
        loop = ctl.status()["loops"]["findings"]
        assert loop["restarts"] == 1 and loop["running"] and "injected" in loop["last_error"]
    finally:
        await nc.close()
        await ctl.stop()


async def test_shutdown_with_the_broker_gone_takes_at_most_two_seconds(nats_server_factory, tmp_path) -> None:
    srv = nats_server_factory()
    cluster = "bye"
    proc = Proc(_config_file(tmp_path, srv.url, cluster), tmp_path / "ctl.log")
    nc = await nats.connect(srv.url)
    beats = Heartbeats(nc, cluster)
    try:
        proc.start()
        await _ready(nc, cluster, proc)
        beats.start()
        await asyncio.sleep(4.0)  # evaluating: there is an engine snapshot to save at stop
        await beats.stop()
        await nc.close()
        srv.stop()
        await asyncio.sleep(2.0)  # the controller is reconnecting now
        t0 = time.monotonic()
        rc = proc.stop(timeout=10.0)
        took = time.monotonic() - t0
        assert rc == 0 and took <= 2.0, (rc, took, proc.text()[-2000:])
    finally:
        if not nc.is_closed:
            await nc.close()
        proc.stop()


def _offline_controller() -> Controller:
    from skewd.controller.config import load_config
    from skewd.lab.harness import CaptureJetStream, MemoryState

    cfg = load_config(None, env={}, overrides={"cluster": "sched", "rules": [RULES], "warmup": "1s"})
    ctl = Controller(cfg, wall_clock=lambda: 0.0)
    ctl.state = MemoryState(cfg.cluster)
    ctl.js = CaptureJetStream()
    return ctl


def _summary(t: float) -> wire.Summary:
    return wire.Summary(node="n0", cluster="sched", t=t, interval=1.0, signals={"summary_gpu_util_mean_ratio": {"": 0.5}},
                        clock_sync=wire.ClockSync(True, 0.001), agent_version="test")


def test_evaluation_scheduling_cannot_spin_on_a_huge_time() -> None:
    """ingest_summary is public (replay, the lab): even a time where t + 1 == t (1e17) passes
    the scheduler once, and the next grid time is later than it."""
    ctl = _offline_controller()
    ctl.ingest_summary(_summary(1e17))
    ctl._wake.clear()  # the evaluation loop's wake-up, taken
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(ctl.evaluate_due(), 10))
    finally:
        loop.close()
    assert ctl.now == 1e17 and ctl.next_eval > 1e17 and not ctl._wake.is_set()


def test_a_catch_up_evaluates_at_most_ten_grid_times_per_wake_up() -> None:
    ctl = _offline_controller()
    t0 = 1_800_000_000.0
    ctl.ingest_summary(_summary(t0))
    ctl.ingest_summary(_summary(t0 + 10.0))  # 11 grid times due: t0 .. t0 + 10 (not 10 behind: all evaluated)
    ctl._wake.clear()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(ctl.evaluate_due())
        assert ctl.now == t0 + 9 and ctl._wake.is_set() and ctl.stats.evaluations_deferred == 1
        loop.run_until_complete(ctl.evaluate_due())  # the next wake-up finishes the catch-up
        assert ctl.now == t0 + 10 and ctl.next_eval == t0 + 11
    finally:
        loop.close()


def test_a_node_that_was_honest_on_its_subject_is_still_checked_on_every_summary() -> None:
    """The intake remembers which (cluster, node) matched a subject, so the subject is parsed
    once per node: a later summary on the same subject that names another node or cluster is
    still refused, and the honest node's summaries are still taken in."""
    import asyncio as aio
    import dataclasses as dc
    from types import SimpleNamespace

    ctl = _offline_controller()
    subject = wire.summary_subject("sched", "n0")

    def send(s: wire.Summary) -> None:
        aio.run(ctl._on_summary(SimpleNamespace(subject=subject, data=wire.encode(s))))

    send(_summary(100.0))
    send(dc.replace(_summary(101.0), node="n9"))
    send(dc.replace(_summary(102.0), cluster="other"))
    send(_summary(103.0))
    assert ctl.stats.summaries == 2 and "n9" not in ctl.nodes
    assert ctl.status()["rejected"] == {"summary": {"subject_mismatch": 2}}
