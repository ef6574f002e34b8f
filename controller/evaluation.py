"""The controller's tick: when to evaluate, and what one evaluation does.

Time is the summaries' time (see :mod:`skewd.controller.service`): the evaluation loop wakes when
a summary moves the watermark and evaluates every grid time it passed (at most
:data:`MAX_TICKS_PER_WAKE` per wake-up). One tick derives the ``ctl_*`` signals (alignment),
evaluates the group rules, enriches and publishes the controller's own findings, then
correlates: incidents are held ``group_wait`` (Alertmanager's first-notification delay) and
published once shown, and suggestions are planned for the shown ones
(:mod:`skewd.controller.suggestions`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
from typing import Any, Callable

from skewd import wire
from skewd.model import GROUP_SCOPES, Finding, State

from . import messages as M
from .roles import ROLE_LEADER, ROLE_PARTITION

log = logging.getLogger("skewd.controller")

#: grid times evaluated per wake-up of the evaluation loop; more due ones wait for the next
#: turn of the event loop, so no summary time can keep the loop busy (a catch-up is at most
#: 10 ticks anyway: further behind, only the latest is evaluated)
MAX_TICKS_PER_WAKE = 10

#: the thread that computes ticks (alignment, store flush, group rules) for every controller of
#: the process, one tick at a time (they share compiled rules). The event loop stays free
#: meanwhile: a scaled-out worker renews its leases there, and a tick of 1 s at 1,000 nodes under
#: load once held them long enough for another worker to take partitions over (then summaries
#: were handled twice). Messages for the ticking controller wait (:meth:`Evaluation._tick_idle`).
_TICK_THREAD = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="skewd-tick")


class TickGate:
    """The intake's gate: closed while a job of any controller sharing it is on the tick thread.
    A controller has its own; a scaled-out worker's controllers (its partitions and the leader)
    share one (controller/scaleout.py), so none of them takes summaries in while one ticks. The
    tick thread then has the interpreter nearly to itself instead of one turn in two: with the
    event loop taking the other partitions' summaries in meanwhile, partition ticks of 62-78 ms
    of CPU took 306-334 ms wall at saturation (bench/controller_ingest.py, 2 workers)."""

    def __init__(self) -> None:
        self.busy = 0  # jobs on the tick thread
        self.idle = asyncio.Event()  # set while none is
        self.idle.set()

    def close(self) -> None:
        self.busy += 1
        self.idle.clear()

    def open(self) -> None:
        self.busy -= 1
        if not self.busy:
            self.idle.set()


class Evaluation:
    """Tick scheduling (:meth:`evaluate_due`), the tick itself (:meth:`tick`, which the lab
    harness and replay call directly) and incident publication.

    A part of :class:`~skewd.controller.service.Controller`, which declares every field in
    its ``__init__``; this class adds behaviour only."""

    async def _eval_loop(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # a deferred catch-up lets summaries and findings in first
            try:
                await self.evaluate_due()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - never let one bad tick stop the controller
                self.stats.errors += 1
                log.exception("evaluation failed")

    async def evaluate_due(self) -> None:
        """Evaluate the grid times the summaries' clock has passed: at most
        :data:`MAX_TICKS_PER_WAKE` per call (the rest are left for the next wake-up, which is
        requested), and the next grid time is always later than the one evaluated, however
        large the times are (t + interval == t for t = 1e17 once looped here for ever)."""
        ival = self.cfg.evaluation_interval
        done = 0
        while self.next_eval is not None and self.watermark >= self.next_eval:
            if done >= MAX_TICKS_PER_WAKE:
                self.stats.evaluations_deferred += 1
                self._wake.set()
                return
            if self.watermark - self.next_eval > 10 * ival:  # far behind (outage, replay jump): latest only
                self.next_eval = math.floor(self.watermark / ival) * ival
            t = self.next_eval
            self.next_eval = max(t + ival, math.nextafter(t, math.inf))
            done += 1
            async with self._lock:
                await self.tick(t)

    async def tick(self, t: float) -> None:
        """One evaluation at time ``t``: derived signals, group rules, correlation, planning.
        A partition stops after its TP-group rules and hands the leader a digest; the leader
        takes the digests in instead of deriving, and evaluates the cluster-wide rules. The
        computation runs on the tick thread when the controller was started (live), inline
        otherwise; publishing and correlation run here, on the event loop."""
        self.now, self._wall_at_now = t, self.wall()
        warm = self.first_t is not None and t - self.first_t >= self.cfg.warmup
        if self.tick_in_thread:
            derived, transitions = await self._off_loop(self._compute, t, warm)
        else:
            derived, transitions = self._compute(t, warm)
        self.gc_policy.after_tick(warm, len(self.nodes))
        self.correlator.reports = self._reports if self.role == ROLE_LEADER else self.aligner.reports
        if warm:
            self.stats.evaluations += 1
            for f in transitions:
                self._enrich(f, t)
                await self._emit_finding(f)
            if transitions or self.stats.evaluations % 10 == 1:
                await self._save_engine(t)
            await self._drop_lapsed_pending()
        if self.role == ROLE_PARTITION:
            await self._publish_digest(t, derived)
            return
        await self._correlate_and_plan(t)

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the tick thread; the controller's intake waits until it is done,
        even when the awaiting task is cancelled (stop), since ``fn`` reads and writes the state
        the intake writes."""
        loop = asyncio.get_running_loop()
        self._on_thread += 1
        self._idle.clear()
        self.tick_gate.close()

        def reopen(_: Any) -> None:
            try:
                loop.call_soon_threadsafe(self._reopen)
            except RuntimeError:  # the loop is closed: nobody waits
                self._on_thread -= 1
                self.tick_gate.busy -= 1

        try:
            job = _TICK_THREAD.submit(fn, *args)
        except RuntimeError:  # the interpreter is shutting down
            self._reopen()
            raise
        job.add_done_callback(reopen)
        return await asyncio.wrap_future(job)

    def _reopen(self) -> None:
        self._on_thread -= 1
        if not self._on_thread:
            self._idle.set()
        self.tick_gate.open()

    @property
    def _ticking(self) -> bool:
        """A job of this controller (a tick, a flush), or of one sharing its :class:`TickGate`,
        is on the tick thread."""
        return self.tick_gate.busy > 0

    async def _tick_idle(self) -> None:
        """Wait while a job of this controller, or of one sharing its gate, is on the tick
        thread (intake calls this before touching the store, aligner, timelines, topology or
        node book; code that runs without awaiting after it cannot overlap a tick, which starts
        only from the event loop)."""
        gate = self.tick_gate
        while gate.busy:
            await gate.idle.wait()

    def _compute(self, t: float, warm: bool) -> tuple[dict[str, dict[str, float]], list[Finding]]:
        """The tick's computation, touching no connection: digests (leader) and pending
        summaries into the store, node labels, the ctl_* signals (partition or single
        controller), the group rules. Returns the derived values and the transitions."""
        if self.role == ROLE_LEADER:
            self._take_digests()
        self.feed.flush()
        if self.topology.version != self._labels_version or len(self.store.registry.node_labels) < len(self.aligner.clocks) \
                or (self.role == ROLE_LEADER and len(self.store.registry.node_labels) < len(self.nodes)):
            known = set(self.aligner.clocks) if self.role != ROLE_LEADER else set(self.nodes.heard)
            for node in known | {n for g in self.topology.tp_groups().values() for n in g.nodes}:
                self.store.registry.set_node_labels(node, self.topology.node_labels(node))
            self._labels_version = self.topology.version
        derived: dict[str, dict[str, float]] = {}
        if self.role != ROLE_LEADER:
            tp = {name: g.nodes for name, g in self.topology.tp_groups().items()}
            pp = {name: [self.topology.stage_members(s) for s in p.stages]
                  for name, p in self.topology.pp_groups().items()}
            derived = self.aligner.derive(t, tp, pp)
            self.feed.ingest_derived(t, derived)
        return derived, (self.engine.evaluate(t) if warm else [])

    async def _drop_lapsed_pending(self) -> None:
        """The engine forgets a pending alert whose expression turned false without emitting a
        transition (Prometheus semantics); forget its pending finding too, or it would hold
        the victims of its group (``Correlator.culprit_pending``) for ever."""
        scopes = self.engine.scopes if self.engine.scopes is not None else GROUP_SCOPES.keys()
        ours = {r.id for r in self.engine.rules.rules if r.scope in GROUP_SCOPES and r.scope in scopes}
        # matched by identity, not by key: the engine's state keys and Finding.fingerprint
        # need not be computed alike
        alive = {(st.rule_id, st.node, st.entity, tuple(sorted(st.labels.items())))
                 for states in self.engine.states.values() for st in states.values()}
        for fp, f in list(self.correlator.findings.items()):
            if f.state is State.PENDING and f.rule_id in ours and \
                    (f.rule_id, f.node, f.entity, tuple(sorted(f.labels.items()))) not in alive:
                del self.correlator.findings[fp]
                try:
                    await self.state.delete_finding(fp)  # type: ignore[union-attr]
                except Exception as e:  # noqa: BLE001 - expires with the bucket's max_age otherwise
                    log.debug("pending finding %s not deleted from KV: %s", fp, e)

    def _enrich(self, f: Finding, now: float) -> None:
        """State the culprit measurement (controller/culprit.py), the engine phase and the
        observed effect on a controller finding."""
        if f.pathology in self.cfg.culprit_pathologies:
            f.evidence.update(self.correlator.contract(f))
        phase, effect = self.correlator.phase_and_effect(f.node, self.topology.engine_of(f.node), f.active_at, now)
        if phase is not None:
            code = M.Phase(phase.phase).code if phase.phase in {p.value for p in M.Phase} else None
            f.evidence.update({"phase_code": code, "kv_usage_ratio": phase.kv_usage_ratio,
                               "requests_waiting": phase.waiting})
        if effect is not None:
            f.evidence.update({"ttft_seconds": effect.ttft_s, "ttft_baseline_seconds": effect.ttft_baseline_s,
                               "itl_seconds": effect.itl_s, "itl_baseline_seconds": effect.itl_baseline_s,
                               "queue_growth_per_second": effect.queue_growth_per_s})
        f.summary = (f"{f.summary} [phase: {phase.phase if phase else 'unknown'}; "
                     f"effect: {effect.description if effect else 'not observed'}]")

    async def _emit_finding(self, f: Finding) -> None:
        self.stats.controller_findings += 1
        self.correlator.observe(f)
        await self.state.put_finding(f)  # type: ignore[union-attr]
        try:
            await self.js.publish(wire.subject_for(f, self.cfg.cluster), wire.encode(f), headers=wire.headers_for(f),
                                  timeout=5.0)
        except Exception as e:  # noqa: BLE001 - stored in KV already; the next transition is published again
            self.stats.errors += 1
            log.warning("controller finding %s not published: %s", f.event_id, e)

    async def _correlate_and_plan(self, t: float) -> None:
        assert self.state is not None
        corr = self.correlator
        changed = corr.correlate(t)
        key_of = {iid: k for k, (iid, _) in corr.ids.items()}
        for inc in changed:
            self._note_silence(inc)
            key = key_of.get(inc.id)
            shown = not corr.is_held(inc)
            if inc.state == "open" and key is not None and (shown or not corr.due(inc, t, self.cfg.group_wait)):
                await self.state.put_incident_id(key, inc.id, inc.opened_at, published=shown,
                                                 held_from=corr.hold_start(inc))
            if shown and inc.state == "open" and self._awaits_node(inc):
                self._deferred.add(inc.id)  # restored, its node not heard since the restart: not re-announced
                continue
            if shown:
                self._deferred.discard(inc.id)
                await self._publish_incident(inc)
            elif inc.state != "open":  # resolved or taken over while held: nobody is shown it
                self.stats.incidents_withheld += 1
                log.info("incident %s (%s) %s while held: never published", inc.id, inc.pathology, inc.state)
        # Alertmanager's group_wait for the first notification: an incident is shown once it has
        # been open group_wait (and no culprit rule is pending in its TP group), so a cause that
        # fires a few seconds after its symptom takes the symptom over before anyone saw it
        for iid in [i for i in self._deferred if not self._awaits_node(corr.incidents.get(i))]:
            self._deferred.discard(iid)  # its node spoke again: its latest state, if it changed meanwhile
            inc = corr.incidents.get(iid)
            if inc is not None and inc.state == "open" and not corr.is_held(inc):
                await self._publish_incident(inc)
        for inc in sorted(corr.open_incidents(), key=lambda i: (i.opened_at, i.id)):
            if corr.is_held(inc) and corr.due(inc, t, self.cfg.group_wait) and not self._awaits_node(inc):
                key = key_of.get(inc.id)
                if key is not None:
                    await self.state.put_incident_id(key, inc.id, inc.opened_at, published=True,
                                                     held_from=corr.hold_start(inc))
                corr.mark_published(inc.id)
                self.stats.incidents_shown += 1
                await self._publish_incident(inc)
        for key in list(self._open_keys - set(corr.ids)):
            await self.state.delete_incident_id(key)
        self._open_keys = set(corr.ids)
        await self._plan_and_expire(t)

    async def _publish_incident(self, inc: M.Incident) -> None:
        try:
            await self.js.publish(M.incident_subject(self.cfg.cluster), M.encode(inc),
                                  headers=M.headers(inc, f"{inc.id}-{inc.digest()}"), timeout=5.0)
            self.stats.incidents_published += 1
        except Exception as e:  # noqa: BLE001 - the next change publishes the incident again
            self.stats.errors += 1
            log.warning("incident %s not published: %s", inc.id, e)
