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
