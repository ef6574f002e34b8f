"""A controller behind more summaries than it can take in stays seconds behind, not minutes:
its summary subscription holds at most ``ingest.summary_backlog_bytes`` of summaries received
and not yet taken in, drops the newest beyond that, and counts every one it dropped.

Against a real nats-server, with the agents' flood published from another process."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import nats
import pytest

from skewd import wire
from skewd.controller.service import Controller

from .helpers import config, wait_for
from .sim import ScriptedGroup

pytestmark = pytest.mark.timeout(180)

FLOOD = 6000  # summaries, published as fast as one process can
COST_S = 0.002  # CPU each summary costs the slowed intake: it takes in at most 500 a second
BACKLOG = 1 << 16  # the smallest backlog the config accepts: about 50 of these summaries

PUBLISHER = (
    "import asyncio, json, sys, time, nats\n"
    "async def main():\n"
    "    nc = await nats.connect(sys.argv[1]); flood = json.loads(sys.stdin.read())\n"
    "    for s, d in flood[:-1]:\n"
    "        await nc.publish(s, d.encode())\n"
    "    await nc.flush()\n"
    "    s, d = flood[-1]\n"
    "    print(time.monotonic(), flush=True)  # the marker: the last summary, sent after the flood\n"
    "    await nc.publish(s, d.encode()); await nc.flush(); await nc.close()\n"
    "asyncio.run(main())\n")


def test_an_overloaded_intake_drops_and_counts_instead_of_falling_minutes_behind(nats_server) -> None:
    cluster = "backlog"
    t0 = float(int(time.time()))
    g = ScriptedGroup(nodes=("n0", "n1", "n2", "n3"), cluster=cluster, t0=t0, seed=5)
    flood = [(wire.summary_subject(cluster, n, "tp0"), g.summary(i, n)) for i in range(FLOOD // 4) for n in g.nodes]
    marker = ScriptedGroup(nodes=("late",), cluster=cluster, t0=t0, seed=6)
    flood.append((wire.summary_subject(cluster, "late"), marker.summary(FLOOD // 4, "late")))
    size = sum(len(d) for _, d in flood) / len(flood)
    assert BACKLOG / size < FLOOD / 20  # the backlog holds a small part of the flood

    async def run() -> None:
        ctl = Controller(config(nats_server.url, cluster, ingest={"summary_backlog_bytes": BACKLOG, "max_clock_skew": "0s"}))
        taken_at: dict[str, float] = {}
        orig = Controller.ingest_summary

        def slow_ingest(self, s, labels=None):  # CPU the event loop cannot serve anything else in
            time.sleep(COST_S)
            taken_at[s.node] = time.monotonic()
            orig(self, s, labels)

        await ctl.start()
        try:
            Controller.ingest_summary = slow_ingest  # type: ignore[method-assign]
            pub = await asyncio.create_subprocess_exec(sys.executable, "-c", PUBLISHER, nats_server.url,
                                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            out, _ = await pub.communicate(json.dumps([(s, d.decode()) for s, d in flood]).encode())
            assert pub.returncode == 0
            sent_at = float(out.decode().split()[0])
            await wait_for(lambda: asyncio.sleep(0, "late" in taken_at), 60, "the summary sent after the flood")
            dropped = ctl.rejections.counts.get("summary", {}).get("backlog_full", 0)
            # seconds behind, not the ~12 s the whole flood costs at 2 ms a summary
            assert taken_at["late"] - sent_at < FLOOD * COST_S / 3, (taken_at["late"] - sent_at, dropped)
            await asyncio.sleep(0.5)
            # every summary is taken in or counted as dropped: none lost without a count (a server
            # that closed the connection as a slow consumer would lose them silently)
            assert dropped > FLOOD / 2
            assert ctl.stats.summaries + dropped == len(flood), (ctl.stats.summaries, dropped)
            assert ctl.stats.summaries_rejected == dropped
            assert ctl.intake_nc.stats["reconnects"] == 0
        finally:
            Controller.ingest_summary = orig  # type: ignore[method-assign]
            await ctl.stop()

    asyncio.run(asyncio.wait_for(run(), 150))


def test_the_oldest_summaries_beyond_the_share_are_shed_at_once_and_logged_in_one_line(caplog) -> None:
    """The intake loop (no server: its backlog filled as direct delivery fills it) drops the
    oldest summaries while more than its share of the backlog waits behind one, takes in the
    rest, counts every dropped one and logs them in one line naming how many."""
    cluster = "backlog"
    g = ScriptedGroup(nodes=("n0", "n1", "n2", "n3"), cluster=cluster, t0=float(int(time.time())), seed=7)
    msgs = [(wire.summary_subject(cluster, n, "tp0").encode(), g.summary(i, n)) for i in range(40) for n in g.nodes]
    share = sum(len(d) for _, d in msgs[-49:])  # at most this much behind: the newest 50 are taken

    async def run() -> tuple[Controller, list[str]]:
        # (the URL is never dialled: the controller is not started, its intake loop runs alone)
        ctl = Controller(config("nats://127.0.0.1:1", cluster, ingest={"max_clock_skew": "0s"}))
        ctl._summary_share = share
        taken: list[str] = []
        orig = ctl._take_summary
        ctl._take_summary = lambda subject, data: (taken.append(subject), orig(subject, data))  # type: ignore[method-assign]
        b = ctl._backlog
        for s, d in msgs:
            b.items.append((s, d))
            b.bytes += len(d)
        task = asyncio.create_task(ctl._take_summaries())
        await wait_for(lambda: asyncio.sleep(0, not b.items), 10, "the backlog taken")
        task.cancel()
        assert b.bytes == 0
        return ctl, taken

    with caplog.at_level("INFO", logger="skewd.controller"):
        ctl, taken = asyncio.run(run())
    dropped = ctl.rejections.counts["summary"]["backlog_full"]
    assert dropped == len(msgs) - 50 == 110 and ctl.stats.summaries_rejected == dropped
    assert taken == [s.decode() for s, _ in msgs[-50:]] and ctl.stats.summaries == 50  # the newest, in order
    lines = [r.getMessage() for r in caplog.records if "backlog_full" in r.getMessage()]
    first = wire.summary_subject(cluster, "n0", "tp0")
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"110 summary messages rejected (backlog_full), the first on {first}: ")
    assert "ingest.summary_backlog_bytes" in lines[0]  # what to do about it
