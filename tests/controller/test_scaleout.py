"""A scaled-out controller against a real nats-server carrying skewd's partition mapping:
workers share the summary partitions through KV leases, TP groups stay whole, one leader
correlates and plans, and a worker killed with SIGKILL mid-run costs no incident and no
suggestion, and duplicates neither."""
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

from skewd import wire
from skewd.controller.scaleout import Worker

from .helpers import CULPRIT_EVIDENCE, RULES, config, config_yaml, incidents, publish_victims, remaps, stored, wait_for
from .sim import ScriptedGroup

pytestmark = pytest.mark.timeout(300)
PARTITIONS = 4
GROUPS = {"tp0": ("a0", "a1", "a2", "a3"), "tp1": ("b0", "b1", "b2", "b3"), "tp2": ("c0", "c1", "c2", "c3")}


@pytest.fixture(scope="module")
def mapped_server(nats_server_factory):
    """A JetStream server whose global account partitions summaries as deploy/nats/ does."""
    return nats_server_factory(config_text=wire.partition_mapping_conf(PARTITIONS))


def _topology() -> dict:
    return {"tp_groups": {g: {"nodes": list(n), "model": "m1"} for g, n in GROUPS.items()},
            "models": {"m1": {"max_num_seqs": 256, "max_model_len": 8192}}}


def _groups(cluster: str, late: dict[str, int], t0: float) -> dict[str, ScriptedGroup]:
    """Scripted TP groups; ``late``: group → interval from which its third node lags 8 ms."""
    return {g: ScriptedGroup(nodes=n, cluster=cluster, late_node=n[2], late_s=0.008 if g in late else 0.0,
                             late_from=late.get(g, 10 ** 6), t0=t0, seed=3 + k)
            for k, (g, n) in enumerate(GROUPS.items())}


async def _play(nc, groups: dict[str, ScriptedGroup], start: int, stop: int, pace: float) -> None:
    """Summaries of every node, as agents with a tp_group label publish them (placement in the
    subject); four intervals into a group's straggling, the findings its agents raise (the
    incubating test rule names a culprit only with them, as with one controller)."""
    js = nc.jetstream()
    for i in range(start, stop):
        for name, g in groups.items():
            for n in g.nodes:
                await nc.publish(wire.summary_subject(g.cluster, n, name), g.summary(i, n))
            if i == g.late_from + 4:
                await publish_victims(js, g, i)
        await nc.flush()
        await asyncio.sleep(pace)


def test_partition_function_is_the_servers(mapped_server) -> None:
    """skewd's partition_of() is what the server's partition() mapping computes, for every
    placement token (names with escaped characters included), and members of one group share it."""
    async def run() -> None:
        nc = await nats.connect(mapped_server.url)
        got: dict[str, str] = {}

        async def cb(m) -> None:
            p = wire.parse_subject(m.subject)
            got[p["node"]] = p["partition"]

        await nc.subscribe("skewd.v1.psummary.>", cb=cb)
        names = [f"tp{i}" for i in range(40)] + ["pp-llama.0", "grp/ü", "x"]
        for i, pl in enumerate(names):
            await nc.publish(wire.summary_subject("c", f"n{i}", pl), b"{}")
            await nc.publish(wire.summary_subject("c", f"m{i}", pl), b"{}")
        await nc.publish(wire.summary_subject("c", "lonely"), b"{}")  # no placement: the node places itself
        await nc.flush()
        await wait_for(lambda: asyncio.sleep(0, len(got) == 2 * len(names) + 1), 5, "mapped summaries")
        for i, pl in enumerate(names):
            assert got[f"n{i}"] == got[f"m{i}"] == str(wire.partition_of(pl, PARTITIONS)), pl
        assert got["lonely"] == str(wire.partition_of("lonely", PARTITIONS))
        assert len({got[f"n{i}"] for i in range(40)}) == PARTITIONS
        await nc.close()

    asyncio.run(asyncio.wait_for(run(), 30))


def test_two_workers_share_partitions_and_one_leader_names_the_straggler(mapped_server) -> None:
    """Two workers in one process: each holds two partitions, one leads; the straggling group's
    culprit is named (with its PCIe cause: the leader attributes from the digests) in exactly one
    suggestion, and the healthy groups get none."""
    url, cluster = mapped_server.url, "so-a"

    async def run() -> None:
        cfgs = [config(url, cluster, controller_id=f"w{k}", topology=_topology(),
                       scaleout={"partitions": PARTITIONS, "lease": "1.5s"}) for k in range(2)]
        workers = [Worker(c) for c in cfgs]
        for w in workers:
            await w.start()
        nc = await nats.connect(url)
        try:
            await wait_for(lambda: asyncio.sleep(0, sorted(len(w.partitions) for w in workers) == [2, 2]
                                                 and sum(w.leader is not None for w in workers) == 1),
                           20, "partitions shared 2/2 and one leader")
            held = [set(w.partitions) for w in workers]
            assert held[0].isdisjoint(held[1]) and held[0] | held[1] == set(range(PARTITIONS))
            groups = _groups(cluster, {"tp1": 8}, float(int(time.time())))
            await _play(nc, groups, 0, 45, pace=0.05)
            await asyncio.sleep(2.0)
            sugs = await remaps(url, cluster)
            leader = next(w for w in workers if w.leader is not None).leader
            assert len(sugs) == 1, ([s.summary for s in sugs], leader.status()["correlation"],
                                    sorted((f.rule_id, f.node, f.state.value, f.evidence)
                                           for f in leader.correlator.findings.values()))
            s = sugs[0]
            assert s.culprit is not None and s.culprit.node == "b2" and s.culprit.tp_group == "tp1"
            assert s.cause is not None and s.cause.layer == "pcie", s.cause
            assert leader.digests_in > 0 and leader.unpartitioned == 0
            # every node's summaries reached exactly one partition: the one of its group
            for w in workers:
                # a worker's controllers share its intake gate (none takes summaries in while one ticks)
                assert all(c.tick_gate is w.tick_gate for c in [*w.partitions.values(), w.leader] if c is not None)
                assert workers[0].tick_gate is not workers[1].tick_gate
                for k, ctl in w.partitions.items():
                    for g, nodes in GROUPS.items():
                        mine = wire.partition_of(g, PARTITIONS) == k
                        assert all((n in ctl.aligner.clocks) == mine for n in nodes), (k, g)
        finally:
            await nc.close()
            for w in workers:
                await w.stop()

    asyncio.run(asyncio.wait_for(run(), 200))


def _worker_config(url: str, cluster: str, wid: str) -> dict:
    return {"cluster": cluster, "controller_id": wid, "nats": {"servers": url, "reconnect_time_wait": 0.2},
            "rules": [RULES], "warmup": "3s", "alignment": {"window": "4s"},
            "correlation": {"group_wait": "8s", "effect_window": "10s", "culprit_evidence": CULPRIT_EVIDENCE},
            "consumer": {"ack_wait": "2s"},
            "topology": _topology(), "log": {"level": "info"}, "metrics": {"listen": ""},
            "scaleout": {"partitions": PARTITIONS, "lease": "1.5s"}}


async def _leader_of(url: str, cluster: str) -> str | None:
    import json as _json

    nc = await nats.connect(url)
    try:
        try:
            kv = await nc.jetstream().key_value("SKEWD_CONTROLLER")
            e = await kv.get(f"{wire.token(cluster)}.lease.leader")
        except Exception:  # noqa: BLE001 - no bucket or no lease yet
            return None
        return _json.loads(e.value)["owner"] if e.value else None
    finally:
        await nc.close()


@pytest.mark.parametrize("fate", ["killed", "paused"])
def test_a_worker_killed_or_paused_mid_run_loses_and_duplicates_nothing(mapped_server, tmp_path, fate) -> None:
    """Two `skewd controller` worker processes; the leader is killed with SIGKILL (or frozen
    with SIGSTOP for many leases, as a VM pause or a swap storm would, then resumed) while a
    straggler's incident is held (group_wait), and a second group starts straggling after that.
    The survivor takes every partition and the leader role over (KV leases), resumes the held
    incident under its id, and each straggler gets exactly one incident and one suggestion:
    nothing lost, nothing published twice, also when the frozen leader wakes up believing it
    still leads."""
    url, cluster = mapped_server.url, f"so-{fate}"
    procs: dict[str, subprocess.Popen] = {}
    for wid in ("w0", "w1"):
        path = tmp_path / f"{wid}.yaml"
        path.write_text(config_yaml(_worker_config(url, cluster, wid)))
        log = open(tmp_path / f"{wid}.log", "wb")
        procs[wid] = subprocess.Popen([sys.executable, "-m", "skewd.cli", "controller", "--config", str(path)],
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def logs() -> str:
        return "\n".join(f"--- {w}\n" + (tmp_path / f"{w}.log").read_text()[-3000:] for w in procs)

    async def run() -> None:
        nc = await nats.connect(url)
        try:
            leader = await wait_for(lambda: _leader_of(url, cluster), 30, "a leader")
            await asyncio.sleep(2.0)  # the even share settles (2 + 2)
            groups = _groups(cluster, {"tp1": 8, "tp2": 40}, float(int(time.time())))
            # tp1's culprit fires at about interval 14 and its incident is held group_wait (8 s)
            await _play(nc, groups, 0, 18, pace=0.25)
            if fate == "killed":
                procs[leader].send_signal(signal.SIGKILL)  # ... so it is held right now
                procs[leader].wait(10)
                await _play(nc, groups, 18, 95, pace=0.25)
            else:
                procs[leader].send_signal(signal.SIGSTOP)  # ... frozen with it held, for ~7 leases
                await _play(nc, groups, 18, 60, pace=0.25)
                procs[leader].send_signal(signal.SIGCONT)  # tp2 straggles from 40: its incident is held now
                await _play(nc, groups, 60, 95, pace=0.25)
            await asyncio.sleep(3.0)
            sugs = await remaps(url, cluster)
            incs = await incidents(url, cluster)
            survivor = next(w for w in procs if w != leader)
            assert await _leader_of(url, cluster) == survivor
            if fate == "paused":  # it woke up, found its leases gone and stood down, still running
                assert procs[leader].poll() is None
                assert "lost the leader lease" in (tmp_path / f"{leader}.log").read_text(), logs()
            culprits = sorted((s.culprit.tp_group, s.culprit.node) for s in sugs if s.culprit)
            assert culprits == [("tp1", "b2"), ("tp2", "c2")] and len(sugs) == 2, [s.summary for s in sugs]
            assert len({s.key for s in sugs}) == 2
            # one incident per straggling group, each suggestion's; no incident message twice
            ids = {i.id for i in incs if i.culprit is not None}
            assert ids == {s.incident for s in sugs}, sorted((i.id, i.culprit.node, i.state) for i in incs if i.culprit)
            raw = await stored(url, "SKEWD_INCIDENTS", f"skewd.v1.incident.{cluster}")
            mids = [m.headers.get("Nats-Msg-Id") for m in raw]
            assert len(mids) == len(set(mids))
            first = {}
            for i in incs:
                first.setdefault(i.id, i)
            for s in sugs:  # first shown open, after its whole hold; planned with the culprit's data
                assert first[s.incident].state == "open" and first[s.incident].updated_at - first[s.incident].opened_at >= 8.0
                assert s.cause is not None and s.cause.layer == "pcie", (s.culprit, s.cause)
        except BaseException:
            print(logs())
            raise
        finally:
            await nc.close()

    try:
        asyncio.run(asyncio.wait_for(run(), 240))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_shipped_partition_config_is_the_codes() -> None:
    shipped = (Path(__file__).resolve().parents[2] / "deploy" / "nats" / "partitions.conf").read_text()
    body = "".join(ln + "\n" for ln in shipped.splitlines() if not ln.startswith("#"))
    assert body == wire.partition_mapping_conf(8)


def test_a_lease_is_held_by_one_and_taken_over_only_after_a_silent_lease(mapped_server) -> None:
    """Lease expiry by observation on each contender's own clock: a renewing holder keeps its
    key; one that stops renewing loses it a lease after a contender first saw its last
    revision, to exactly one of two contenders; a released key is free at once."""
    from skewd.controller.scaleout import Lease

    async def run() -> None:
        nc = await nats.connect(mapped_server.url)
        try:
            kv = await nc.jetstream().create_key_value(bucket="LEASETEST")
            now = [0.0]
            clock = lambda: now[0]  # noqa: E731
            a, b, c = (Lease("c.lease.p0", who, 3.0, clock=clock) for who in ("a", "b", "c"))
            assert await a.step(kv, True) and not await b.step(kv, True)
            for _ in range(5):  # a renews every second: b never takes it
                now[0] += 1.0
                assert await a.step(kv, True) and not await b.step(kv, True) and not await c.step(kv, True)
            now[0] += 2.9  # a stops renewing; b and c have seen its last revision for 2.9 s
            assert not await b.step(kv, True) and not await c.step(kv, True)
            now[0] += 0.2
            won = [await b.step(kv, True), await c.step(kv, True)]
            assert won == [True, False]  # one compare-and-set wins
            assert not await a.step(kv, True)  # the old holder finds out at its next renewal
            assert not a.held and b.held
            assert not await b.step(kv, False)  # released ...
            assert await c.step(kv, True)  # ... and free at once
        finally:
            await nc.close()

    asyncio.run(asyncio.wait_for(run(), 30))


def test_a_lone_worker_behind_a_summary_flood_keeps_its_leases(nats_server_factory) -> None:
    """More summaries than one worker can take in, for 12 s: every summary costs it 1 ms and
    another process publishes 3,000 a second. What the worker has not read waits in the kernel's
    socket buffers and then in the server, up to its ``max_pending`` (64 MB by default; 256 KB
    here, the same overload made smaller), where the server closes the connection as a slow
    consumer, again and again; the worker's own bounded backlog (``ingest.summary_backlog_bytes``,
64 KB here) drops what it cannot hold and each partition counts it. The worker falls behind
and loses summaries, but not its leases:
    no partition is stopped or restarted (a restarted partition forgets its alignment window and
    warm-up, so under a lasting overload it would never evaluate again), and once the flood is
    over it takes summaries in again on every partition."""
    from skewd.controller.service import Controller

    server = nats_server_factory(config_text=wire.partition_mapping_conf(PARTITIONS) + "max_payload: 65536\nmax_pending: 262144\n")
    url, cluster = server.url, "so-flood"

    async def run() -> None:
        w = Worker(config(url, cluster, controller_id="lone", topology=_topology(),
                          scaleout={"partitions": PARTITIONS, "lease": "1.5s"},
                          ingest={"summary_backlog_bytes": 1 << 16}))
        stops: list[tuple[int, str]] = []
        starts: list[int] = []
        orig_stop, orig_start = w._stop_partition, w._start_partition

        async def stop_partition(k: int, why: str, save: bool = True) -> None:
            stops.append((k, why))
            await orig_stop(k, why, save)

        async def start_partition(k: int) -> None:
            starts.append(k)
            await orig_start(k)

        w._stop_partition, w._start_partition = stop_partition, start_partition  # type: ignore[method-assign]
        orig_ingest = Controller.ingest_summary

        def slow_ingest(self, s, labels=None):  # CPU the event loop cannot serve anything else in
            time.sleep(0.001)
            orig_ingest(self, s, labels)

        def taken() -> dict[int, int]:
            return {k: c.stats.summaries for k, c in w.partitions.items()}

        await w.start()
        nc = await nats.connect(url)
        try:
            await wait_for(lambda: asyncio.sleep(0, len(w.partitions) == PARTITIONS and w.leader is not None),
                           20, "all partitions and the leader held")
            Controller.ingest_summary = slow_ingest  # type: ignore[method-assign]
            groups = _groups(cluster, {}, float(int(time.time())))
            flood = [(wire.summary_subject(cluster, n, name), g.summary(i, n))
                     for i in range(25) for name, g in groups.items() for n in g.nodes]
            script = (  # 5,000 summaries/s for 20 s, from another process (the agents)
                "import asyncio, json, sys, time, nats\n"
                "async def main():\n"
                "    nc = await nats.connect(sys.argv[1]); flood = json.loads(sys.stdin.read())\n"
                "    t0 = time.monotonic(); k = 0\n"
                "    while time.monotonic() - t0 < 20.0:\n"
                "        for _ in range(30):\n"
                "            s, d = flood[k % len(flood)]; k += 1\n"
                "            await nc.publish(s, d.encode())\n"
                "        await asyncio.sleep(max(0.0, t0 + k / 5000 - time.monotonic()))\n"
                "    await nc.flush(); await nc.close()\n"
                "asyncio.run(main())\n")
            pub = await asyncio.create_subprocess_exec(sys.executable, "-c", script, url, stdin=subprocess.PIPE)
            await pub.communicate(json.dumps([(sj, d.decode()) for sj, d in flood]).encode())
            assert pub.returncode == 0
            await asyncio.sleep(2.0)
            Controller.ingest_summary = orig_ingest  # type: ignore[method-assign]
            # what the worker's intake could not hold was dropped by its partitions' bounded
            # backlogs and counted there, not reported as a connection error
            dropped = {k: c.rejections.counts.get("summary", {}).get("backlog_full", 0) for k, c in w.partitions.items()}
            assert sum(dropped.values()) > 0, dropped
            assert not any("slow consumer, messages dropped" in e for e in w.errors), w.errors[-3:]
            before = taken()
            await _play(nc, groups, 250, 262, pace=0.1)
            busy = {wire.partition_of(g, PARTITIONS) for g in GROUPS}
            await wait_for(lambda: asyncio.sleep(0.2, all(taken().get(k, 0) > before.get(k, 0) for k in busy)),
                           20, "summaries taken in again after the flood")
            assert stops == [] and starts == list(range(PARTITIONS)), (stops, starts)
            assert sorted(w.partitions) == list(range(PARTITIONS)) and w.leader is not None
        finally:
            Controller.ingest_summary = orig_ingest  # type: ignore[method-assign]
            await nc.close()
            await w.stop()

    asyncio.run(asyncio.wait_for(run(), 120))
