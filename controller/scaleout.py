"""Scale-out: controller workers that share a cluster's summaries by partition, on NATS alone.

The server's subject mapping (``skewd nats-auth --partitions N``; :func:`skewd.wire.partition_mappings`)
puts every summary in one of N partitions by its *placement* token (the node's pipeline, else its
TP group, else the node), so a TP group's or pipeline's members always share a partition. Every
``skewd controller`` process with ``scaleout.partitions`` > 1 is a :class:`Worker`:

* it holds partitions through KV leases (``<cluster>.lease.p<k>`` in the controller's bucket):
  for each one a :class:`~skewd.controller.service.Controller` in the *partition* role takes that
  partition's summaries in (core NATS, its ``skewd.v1.psummary.<cluster>.<k>.*.*`` subject
  only), aligns its groups' bursts, evaluates the TP-group rules, publishes their findings
  (JetStream, as always) and, after each evaluation, a *digest* for the leader;
* one worker also holds the ``leader`` lease: its *leader* Controller takes the digests in
  (every node's latest summary values, the ctl_* values, the groups' alignment reports),
  evaluates the cluster-wide rules, takes every finding from the shared durable consumer and
  correlates, holds, publishes incidents and plans suggestions - in one place, with the
  exactly-once machinery unchanged (KV create of ``remap.<key>``, ``Nats-Msg-Id``).

Leases expire by observation, not by clocks: a holder renews its key every third of
``scaleout.lease`` (the key's revision moves); a contender that has seen the same revision for a
whole lease on its own monotonic clock presumes the holder dead and takes the key over with a
compare-and-set on that revision (one contender wins). A holder that could not renew for a whole
lease stops that partition itself. Workers also keep a heartbeat key (``<cluster>.worker.<id>``);
each holds at most an even share of the partitions (``ceil(N / live workers)``, or
``scaleout.max_partitions``) and hands back the rest, so a new worker gets partitions and a dead
one's are taken over within about one lease.

Why this shape: the summary stream is the load (every node, every interval); findings are rare,
and correlation needs them all in one place (a cluster-wide incident inhibits node findings
anywhere; one incident id per group key). So summaries are partitioned and findings are not.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Iterable, Mapping

import msgspec
from nats import errors as nats_errors

from skewd import wire
from skewd.natsutil import connect, connect_intake, ensure_streams, hold_reads

from . import messages as M
from .configtypes import ControllerConfig
from .evaluation import TickGate
from .roles import ROLE_LEADER, ROLE_PARTITION
from .service import Controller
from .state import StateStore

LEADER = "leader"

log = logging.getLogger("skewd.controller.scaleout")

# ---------------------------------------------------------------------------------------------
# leases
# ---------------------------------------------------------------------------------------------

class Lease:
    """One KV key held by at most one worker (see module doc: expiry by observation)."""

    def __init__(self, key: str, owner: str, ttl: float, clock=time.monotonic) -> None:
        self.key, self.owner, self.ttl, self.clock = key, owner, ttl, clock
        self.held = False
        self.revision = 0
        self.renewed_at = -math.inf  # our last successful write (holder)
        self._seen: tuple[int, float] | None = None  # (revision, when first seen) of another's key
        self._n = 0

    def _value(self) -> bytes:
        self._n += 1
        return msgspec.json.encode({"owner": self.owner, "n": self._n})

    async def step(self, kv: Any, want: bool) -> bool:
        """Renew, acquire, take over or release the key as ``want`` says; returns whether it is
        held afterwards. Never raises for a lost race or an unreachable server (not held, then)."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError

        now = self.clock()
        try:
            if self.held:
                if not want:
                    await kv.delete(self.key, last=self.revision)
                    self.held = False
                    return False
                self.revision = await kv.update(self.key, self._value(), last=self.revision)
                self.renewed_at = now
                return True
            if not want:
                return False
            try:
                e = await kv.get(self.key)
            except (KeyNotFoundError, KeyDeletedError):  # never written, or deleted (released)
                e = None
            if e is None or not e.value:
                self.revision = await kv.create(self.key, self._value())
            else:
                if msgspec.json.decode(e.value).get("owner") == self.owner:  # ours, from before a restart
                    self._seen = None
                elif self._seen is None or self._seen[0] != e.revision:
                    self._seen = (e.revision, now)
                    return False
                elif now - self._seen[1] < self.ttl:
                    return False
                self.revision = await kv.update(self.key, self._value(), last=e.revision)
            self.held, self.renewed_at, self._seen = True, now, None
            return True
        except KeyWrongLastSequenceError:  # another worker wrote the key first: it is theirs
            self.held, self._seen = False, None
            return False
        except Exception as e:  # noqa: BLE001 - NATS is away or slow
            log.debug("lease %s: %s: %s", self.key, type(e).__name__, e)
            if self.held and now - self.renewed_at < self.ttl:
                return True  # not renewed this time; still ours until a whole lease passed
            self.held = False
            return False


class Heartbeats:
    """Which workers are alive: each renews ``worker.<id>``; a key whose revision stood still for
    a lease is a dead worker's (the same observation as :class:`Lease`)."""

    def __init__(self, ttl: float, clock=time.monotonic) -> None:
        self.ttl, self.clock = ttl, clock
        self._seen: dict[str, tuple[int, float]] = {}

    def live(self, entries: Mapping[str, int]) -> set[str]:
        now = self.clock()
        out = set()
        for key, rev in entries.items():
            seen = self._seen.get(key)
            if seen is None or seen[0] != rev:
                self._seen[key] = (rev, now)
                out.add(key)
            elif now - seen[1] < self.ttl:
                out.add(key)
        for key in set(self._seen) - set(entries):
            del self._seen[key]
        return out

    def long_dead(self, factor: float = 10.0) -> dict[str, int]:
        """Keys unchanged for ``factor`` leases (a killed worker's), with their revision."""
        now = self.clock()
        return {k: rev for k, (rev, at) in self._seen.items() if now - at > factor * self.ttl}


# ---------------------------------------------------------------------------------------------
# the worker
# ---------------------------------------------------------------------------------------------

class Worker:
    """One ``skewd controller`` process of a scaled-out controller: two NATS connections (control,
    and the summaries' own: :func:`skewd.natsutil.connect_intake`), the
    leases it holds, a partition Controller per partition held and the leader Controller while
    it holds that lease. Started and stopped like a Controller (``start``/``stop``)."""

    def __init__(self, cfg: ControllerConfig, *, catalogue: Any = None, ruleset: Any = None,
                 wall_clock=time.time) -> None:
        self.cfg = cfg
        self.catalogue, self.ruleset, self.wall = catalogue, ruleset, wall_clock
        self.id = wire.token(cfg.controller_id)
        self.nc: Any = None  # control: leases, KV state, JetStream, digests
        self.intake_nc: Any = None  # the partitions' summaries (natsutil.connect_intake)
        self.js: Any = None
        self.state: StateStore | None = None
        self.partitions: dict[int, Controller] = {}
        self.leader: Controller | None = None
        #: the intake's gate, shared by this worker's controllers: none takes summaries in while
        #: one of them has a job on the (process's one) tick thread (controller/evaluation.py)
        self.tick_gate = TickGate()
        self.leases = {k: Lease("", self.id, cfg.lease) for k in [*range(cfg.partitions), LEADER]}
        self.beats = Heartbeats(cfg.lease)
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.rounds = 0
        self.takeovers = 0  # partitions (and the leader role) started here after another worker held them
        self.errors: list[str] = []  # the connection's latest asynchronous errors (permissions, ...)

    async def start(self) -> None:
        cfg = self.cfg
        self.nc = await connect(cfg.nats, initial_timeout=30.0, error_cb=self._on_error)
        self.js = self.nc.jetstream()
        await ensure_streams(self.js, [wire.FINDINGS_STREAM], update=False)
        await ensure_streams(self.js, [wire.REMAPS_STREAM, M.INCIDENTS_STREAM], update=True)
        self.state = await StateStore.open(self.js, cfg.bucket, cfg.cluster, cfg.state_max_age, nc=self.nc)
        self.intake_nc = await connect_intake(cfg.nats, error_cb=self._on_intake_error)
        hold_reads(self.intake_nc, self.tick_gate)  # none read while one of its controllers' ticks computes
        for k, lease in self.leases.items():
            lease.key = self.state.key("lease", f"p{k}" if k != LEADER else LEADER)
        await self._beat()
        self._task = asyncio.create_task(self._run(), name="skewd-ctl-leases")

    def _note_error(self, e: Exception, which: str = "") -> None:
        if self._stopping:
            return  # reconnect attempts racing the close: not news
        self.errors.append(f"{which}{': ' if which else ''}{e}"[:300])
        del self.errors[:-20]
        log.warning("nats%s: %s", f" ({which})" if which else "", e)

    async def _on_error(self, e: Exception) -> None:
        self._note_error(e)

    async def _on_intake_error(self, e: Exception) -> None:
        if isinstance(e, nats_errors.SlowConsumerError):  # a summary dropped unread: its partition counts it
            ctl = next((c for c in self.controllers() if c.subscribes(e.sub)), None)
            if ctl is not None:
                ctl.summary_dropped(e.subject)
                return
        self._note_error(e, "summary intake")

    async def _beat(self) -> None:
        assert self.state is not None
        await self.state.kv.put(self.state.key("worker", self.id), msgspec.json.encode({"t": self.wall()}))

    async def _run(self) -> None:
        period = self.cfg.lease / 3
        await asyncio.sleep(period)  # workers started together see each other's heartbeat first
        while not self._stopping:
            try:
                await self.rebalance()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - next round; a lease we could not renew runs out
                log.exception("lease round failed")
            await asyncio.sleep(period)

    async def live_workers(self) -> set[str]:
        assert self.state is not None
        prefix = self.state.key("worker") + "."
        revs: dict[str, int] = {}
        for key in await self.state.keys("worker"):
            try:
                revs[key] = (await self.state.kv.get(key)).revision
            except Exception:  # noqa: BLE001 - deleted meanwhile
                continue
        live = self.beats.live(revs) | {prefix + self.id}
        for key, rev in self.beats.long_dead().items():  # killed workers' heartbeats: tidy up
            try:
                await self.state.kv.delete(key, last=rev)
            except Exception:  # noqa: BLE001 - it moved (alive after all) or another worker deleted it
                pass
        return live

    def share(self, live: int) -> int:
        fair = math.ceil(self.cfg.partitions / max(1, live))
        return min(fair, self.cfg.max_partitions) if self.cfg.max_partitions else fair

    async def rebalance(self) -> None:
        """One lease round: heartbeat, renew what is held, hand back more than the share, take
        free or expired partitions up to it, and hold or contend for the leader role."""
        assert self.state is not None
        kv = self.state.kv
        self.rounds += 1
        await self._beat()
        share = self.share(len(await self.live_workers()))
        held = sorted(k for k in self.partitions)
        for k in held:  # renew; drop what we lost (its snapshot is the new holder's to write now)
            if not await self.leases[k].step(kv, True):
                await self._stop_partition(k, "lease lost", save=False)
        for k in sorted(self.partitions)[share:]:  # above the share: hand back the highest
            await self._stop_partition(k, f"share is {share}")
            await self.leases[k].step(kv, False)
        for k in range(self.cfg.partitions):
            if len(self.partitions) >= share:
                break
            if k in self.partitions:
                continue
            lease = self.leases[k]
            seen = lease._seen is not None
            if await lease.step(kv, True):
                if seen:
                    self.takeovers += 1
                await self._start_partition(k)
        lead = self.leases[LEADER]
        seen = lead._seen is not None
        if await lead.step(kv, True):
            if self.leader is None:
                if seen:
                    self.takeovers += 1
                self.leader = Controller(self.cfg, catalogue=self.catalogue, ruleset=self.ruleset, wall_clock=self.wall,
                                         role=ROLE_LEADER)
                self.leader.tick_gate = self.tick_gate
                await self.leader.start(shared=(self.nc, self.intake_nc, self.js, self.state))
                log.info("worker %s leads cluster %s", self.id, self.cfg.cluster)
        elif self.leader is not None:
            ctl, self.leader = self.leader, None
            ctl.save_on_stop = False
            await ctl.stop()
            log.warning("worker %s lost the leader lease", self.id)

    async def _start_partition(self, k: int) -> None:
        ctl = Controller(self.cfg, catalogue=self.catalogue, ruleset=self.ruleset, wall_clock=self.wall,
                         role=ROLE_PARTITION, partition=k)
        ctl.tick_gate = self.tick_gate
        await ctl.start(shared=(self.nc, self.intake_nc, self.js, self.state))
        self.partitions[k] = ctl
        log.info("worker %s holds partition %d", self.id, k)

    async def _stop_partition(self, k: int, why: str, save: bool = True) -> None:
        ctl = self.partitions.pop(k, None)
        if ctl is not None:
            ctl.save_on_stop = save
            await ctl.stop()
            log.info("worker %s released partition %d (%s)", self.id, k, why)

    def controllers(self) -> Iterable[Controller]:
        yield from self.partitions.values()
        if self.leader is not None:
            yield self.leader

    def status(self) -> dict[str, Any]:
        return {"worker": self.id, "partitions": sorted(self.partitions), "leader": self.leader is not None,
                "rounds": self.rounds, "takeovers": self.takeovers,
                "controllers": {c.role + ("" if c.partition is None else str(c.partition)): c.status()
                                for c in self.controllers()}}

    async def stop(self) -> None:
        """Stop every controller and hand the leases back at once (a successor need not wait a
        lease); within about two seconds, as a Controller."""
        if self._stopping:
            return
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=0.5)
        ctls = list(self.controllers())
        if ctls:
            await asyncio.wait([asyncio.create_task(c.stop()) for c in ctls], timeout=1.0)
        if self.nc is not None and self.nc.is_connected and self.state is not None:
            try:
                async def release() -> None:
                    for lease in self.leases.values():
                        await lease.step(self.state.kv, False)  # type: ignore[union-attr]
                    await self.state.kv.delete(self.state.key("worker", self.id))  # type: ignore[union-attr]
                await asyncio.wait_for(release(), 0.5)
            except Exception:  # noqa: BLE001 - they run out after a lease anyway
                pass
        for nc in (self.intake_nc, self.nc):
            if nc is None:
                continue
            try:
                await asyncio.wait_for(nc.close(), 0.5)
            except Exception:  # noqa: BLE001
                pass
        self.partitions.clear()
        self.leader = None
