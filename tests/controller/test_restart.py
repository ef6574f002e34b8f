"""Kill the controller (SIGKILL, a real process) mid-stream and start it again: no suggestion
is lost and none is repeated, and an acknowledgement given before the crash stays recorded."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import nats
import pytest
import yaml

from skewd.controller import client
from skewd.controller import messages as M
from skewd.controller.state import StateStore

from .helpers import CULPRIT_EVIDENCE, RULES, incidents, play, remaps, wait_for
from .sim import ScriptedGroup

pytestmark = pytest.mark.timeout(240)


def _config_file(tmp: Path, url: str, cluster: str) -> Path:
    doc = {
        "cluster": cluster, "controller_id": f"{cluster}-proc", "nats": {"servers": url, "reconnect_time_wait": 0.2},
        "rules": [RULES], "warmup": "3s", "alignment": {"window": "4s"},
        "correlation": {"group_wait": "8s", "effect_window": "10s", "culprit_evidence": CULPRIT_EVIDENCE},
        "consumer": {"ack_wait": "2s"},
        "topology": {"tp_groups": {"tp0": {"nodes": ["n0", "n1", "n2", "n3"], "model": "m1", "engine": "n0/engine0"}},
                     "models": {"m1": {"max_num_seqs": 256}}},
    }
    p = tmp / f"{cluster}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


class Proc:
    """``skewd controller --config FILE`` as a child process."""

    def __init__(self, cfg: Path, log: Path) -> None:
        self.cfg, self.log = cfg, log
        self.p: subprocess.Popen | None = None

    def start(self) -> None:
        self.fh = open(self.log, "ab")
        self.p = subprocess.Popen([sys.executable, "-m", "skewd.cli", "controller", "--config", str(self.cfg)],
                                  stdout=self.fh, stderr=subprocess.STDOUT, cwd=str(Path(__file__).parents[2]),
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def kill(self) -> None:
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(10)
        self.fh.close()

    def stop(self) -> int | None:
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        if not self.fh.closed:
            self.fh.close()
        return self.p.returncode if self.p else None


async def _ready(nc, cluster: str, proc: Proc) -> None:
    """The controller answers on its reply subject only after it subscribed to everything."""
    async def answered():
        assert proc.p.poll() is None, proc.log.read_text()[-3000:]
        try:
            r = await client.reject(nc, "probe", consumer="test", cluster=cluster, timeout=0.5)
            return r.status is M.ReceiptStatus.UNKNOWN
        except client.ReplyError:
            return False
    await wait_for(answered, 60, "the controller process to come up")


async def test_kill_before_the_suggestion_then_restart_publishes_it_once(nats_server, tmp_path) -> None:
    url, cluster = nats_server.url, "rs1"
    proc = Proc(_config_file(tmp_path, url, cluster), tmp_path / "ctl.log")
    nc = await nats.connect(url)
    g = ScriptedGroup(cluster=cluster, late_from=8)
    try:
        proc.start()
        await _ready(nc, cluster, proc)
        await play(nc, g, 0, 16, victims_at=12)  # EW-1 fires, the incident opens; group_wait not over
        # the incident is held (not published before group_wait), its id already in KV
        async def held_in_kv():
            saved = await StateStore(await nc.jetstream().key_value("SKEWD_CONTROLLER"), cluster).load()
            return [v for v in saved["incident"].values() if v["group_key"] == "tp:tp0:culprit:n2"]
        (before,) = await wait_for(held_in_kv, 10, "the held incident's id in KV")
        assert before["published"] is False, proc.log.read_text()[-3000:]
        assert await incidents(url, cluster) == [] and await remaps(url, cluster) == []
        proc.kill()
        await play(nc, g, 16, 18, victims_at=None)  # nobody listening: these are lost, as in life
        proc.start()
        await _ready(nc, cluster, proc)
        await play(nc, g, 18, 45, victims_at=None)
        sugs = await wait_for(lambda: remaps(url, cluster), 30, "the suggestion after the restart")
        await play(nc, g, 45, 50, victims_at=None)
        await asyncio.sleep(1.0)
        sugs = await remaps(url, cluster)
        assert len(sugs) == 1, [s.summary for s in sugs]
        # the restarted controller resumed the incident it had opened (and held), not a new one
        assert sugs[0].incident == before["id"] and sugs[0].culprit.node == "n2"
        # the victims' findings (taken in before the crash) are still inhibited, not planned
        assert sugs[0].pathology == "EW-1"
        # what subscribers were shown: that incident, first when its hold ended; never the
        # victims' own incidents, which the culprit took over while they were held
        incs = await incidents(url, cluster)
        assert incs and {i.id for i in incs} == {before["id"]}, [(i.pathology, i.group, i.state) for i in incs]
        assert incs[0].state == "open" and incs[0].opened_at == before["opened_at"]
        assert incs[0].updated_at - incs[0].opened_at >= 8.0
    finally:
        await nc.close()
        proc.stop()


async def test_kill_after_publish_and_ack_then_restart_repeats_nothing(nats_server, tmp_path) -> None:
    url, cluster = nats_server.url, "rs2"
    proc = Proc(_config_file(tmp_path, url, cluster), tmp_path / "ctl.log")
    nc = await nats.connect(url)
    g = ScriptedGroup(cluster=cluster, late_from=8)
    try:
        proc.start()
        await _ready(nc, cluster, proc)
        await play(nc, g, 0, 24, victims_at=12)
        sugs = await wait_for(lambda: remaps(url, cluster), 30, "the first suggestion")
        receipt = await client.ack(nc, sugs[0], consumer="router-7")
        assert receipt.status is M.ReceiptStatus.RECORDED
        proc.kill()
        proc.start()
        await _ready(nc, cluster, proc)
        await play(nc, g, 24, 60, victims_at=None)  # the straggler keeps straggling for 36 s more
        await asyncio.sleep(1.0)
        after = await remaps(url, cluster)
        assert [s.key for s in after] == [sugs[0].key], [s.summary for s in after]
        rec = await client.suggestion_record(nc, cluster, sugs[0].key)
        assert rec["status"] == "acked" and [r["consumer"] for r in rec["replies"]] == ["router-7"]
        culprit_ids = {i.id for i in await incidents(url, cluster) if i.culprit and i.culprit.node == "n2"
                       and i.group.get("tp_group")}
        assert culprit_ids == {sugs[0].incident}
        assert proc.stop() == 0  # a clean SIGTERM stop exits 0
    finally:
        await nc.close()
        proc.stop()
