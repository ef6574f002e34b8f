"""The controller service on recorded or simulated time, inside another program: what cluster
replay (``skewd.agent.replay.cluster``) and the fault lab's harness (``skewd.lab.harness``) run.

It is the deployed :class:`~skewd.controller.service.Controller` itself - its summary intake,
its findings consumer's handler, its ``tick`` (aligner, group rules, correlator, planner) and its
housekeeping of silent nodes - with only the two things it talks to replaced:

- the KV bucket by :class:`MemoryState` (same methods, same compare-and-set outcome), and
- the JetStream publish by :class:`CaptureJetStream`, which decodes what the controller
  published (its findings, incidents and remap suggestions) as a subscriber would.

Those sinks never wait, so the controller's coroutines run to completion without an event loop
(:func:`run_to_completion`): the same code works inside ``asyncio.run`` (replay's CLI) and in
a plain loop (the benchmark's worker processes), and nothing depends on task scheduling.

Time is the caller's: the controller's wall clock is the latest time handed in (a summary's
``t``, a finding's evaluation time, a tick), and its clock check against agents
(``ingest.max_clock_skew``) is off, as in ``run_embedded(recorded_time=True)``: replay cannot
know the live controller's clock, and a recording must not be rejected for being old.

Nothing here is imported by the deployed controller; the import goes one way (replay, lab →
controller).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from skewd import wire
from skewd.model import Catalogue, Finding
from skewd.rules.engine import RuleSet

from . import messages
from .config import load_config
from .configtypes import ControllerConfig
from .service import Controller

T = TypeVar("T")


def run_to_completion(aw: Awaitable[T]) -> T:
    """Run a coroutine whose awaits never wait: the controller's with in-memory sinks. Its only
    suspension is the cooperative ``asyncio.sleep(0)`` (a bare yield), which is resumed at
    once; anything else it awaited would be real I/O, which an offline controller must not do."""
    coro = aw.__await__()
    try:
        while True:
            got = coro.send(None)
            if got is not None:
                coro.close()
                raise RuntimeError(f"the offline controller awaited {got!r}: a sink is doing real I/O")
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def offline_config(cluster: str, path: str | None = None, overrides: Mapping[str, Any] | None = None
                   ) -> ControllerConfig:
    """The controller config for a run on recorded time: the operator's file (``path``, the
    one the live controller ran with) or the defaults, the bundle's cluster, the clock check off."""
    over: dict[str, Any] = {"cluster": cluster, **dict(overrides or {})}
    ing = dict(over.get("ingest") or {})
    ing["max_clock_skew"] = "0s"
    over["ingest"] = ing
    return load_config(path, env={}, overrides=over)


@dataclass
class Published:
    """What the controller published during one call: its own finding transitions, incident
    messages (first publications and updates, as the incidents stream holds them) and remap
    suggestions, each in publication order, decoded from the bytes a subscriber received."""

    findings: list[Finding] = field(default_factory=list)
    incidents: list[messages.Incident] = field(default_factory=list)
    suggestions: list[messages.RemapSuggestion] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.findings or self.incidents or self.suggestions)

    def extend(self, other: "Published") -> None:
        self.findings += other.findings
        self.incidents += other.incidents
        self.suggestions += other.suggestions


class OfflineController:
    """One controller service run in-process on the caller's time; owns the service and its
    in-memory sinks. Callers (cluster replay, the lab harness) hand it what agents sent -
    :meth:`summary`, :meth:`finding` - and move it on with :meth:`advance` (the grid times the
    summaries' clock has passed, as the live evaluation loop does) or :meth:`tick` (one given
    time); each returns what the controller published meanwhile."""

    def __init__(self, cfg: ControllerConfig, *, catalogue: Catalogue | None = None,
                 ruleset: RuleSet | None = None) -> None:
        self.cfg = cfg
        self.now = -math.inf  # the controller's wall clock: the latest time handed in
        self.ctl = Controller(cfg, catalogue=catalogue, ruleset=ruleset, wall_clock=self._wall)
        self.state = MemoryState(cfg.cluster)
        self.js = CaptureJetStream()
        self.ctl.state = self.state  # type: ignore[assignment]
        self.ctl.js = self.js
        self._next_housekeeping: float | None = None
        self.refused: list[tuple[str, str]] = []  # (finding event id, why) the intake refused

    def _wall(self) -> float:
        return self.now if self.now > -math.inf else 0.0

    def _at(self, t: float) -> None:
        if t > self.now:
            self.now = t

    # -- what agents send --------------------------------------------------------------------------
    def summary(self, s: wire.Summary, labels: Mapping[str, str] | None = None) -> None:
        """A node summary, as the summary subscription takes it after its checks: the node is
        heard (silent-node bookkeeping), the summary ingested. ``labels`` stand in for a
        summary that carries none (a recording made before summaries carried labels)."""
        self._at(s.t)
        if not self.ctl._heard(s.node, s.interval):
            self.ctl._reject("summary", "too_many_nodes", wire.summary_subject(s.cluster, s.node),
                             f"node {s.node!r} is new and {self.cfg.max_nodes} nodes are live")
            return
        self.ctl.ingest_summary(s, s.labels or dict(labels or {}))

    def finding(self, f: Finding) -> None:
        """A node's finding transition, through the findings consumer's own handler: encoded as
        the agent publishes it, decoded, checked (subject, clock) and correlated."""
        self._at(f.evaluated_at)
        msg = _Msg(wire.subject_for(f, self.cfg.cluster), wire.encode(f))
        run_to_completion(self.ctl._take_finding_msg(msg))
        if msg.outcome != "ack":
            self.refused.append((f.event_id, msg.outcome))

    # -- time ------------------------------------------------------------------------------------
    def advance(self) -> Published:
        """Evaluate every grid time the summaries' clock has passed (``evaluate_due``, without
        its per-wake-up limit: nothing else waits here), then housekeeping as the live loop runs
        it once per evaluation interval: silent nodes, store gc, closed incidents forgotten."""
        mark = self.js.mark()
        ctl = self.ctl
        while ctl.next_eval is not None and ctl.watermark >= ctl.next_eval:
            run_to_completion(ctl.evaluate_due())
            self._housekeeping(ctl.now)
        return self.js.since(mark)

    def tick(self, t: float) -> Published:
        """One evaluation at ``t`` (a caller with its own schedule: the lab's group interval)."""
        mark = self.js.mark()
        self._at(t)
        run_to_completion(self.ctl.tick(t))
        self._housekeeping(t)
        return self.js.since(mark)

    def _housekeeping(self, t: float) -> None:
        ival = self.cfg.evaluation_interval
        if self._next_housekeeping is not None and t < self._next_housekeeping:
            return
        self._next_housekeeping = t + ival
        ctl = self.ctl
        run_to_completion(ctl.expire_silent_nodes(self._wall()))
        if ctl.now > -math.inf:
            ctl.gc_store(ctl.now)
            ctl.correlator.forget_closed(ctl.now - self.cfg.horizon)

    # -- state -----------------------------------------------------------------------------------
    def open_incidents(self) -> list[messages.Incident]:
        """Incidents open now (shown or still held)."""
        return sorted(self.ctl.correlator.open_incidents(), key=lambda i: (i.opened_at, i.id))

    def status(self) -> dict[str, Any]:
        return self.ctl.status()


@dataclass
class _Msg:
    """A JetStream message as the findings consumer's handler sees it; records its outcome."""

    subject: str
    data: bytes
    outcome: str = ""

    async def ack(self) -> None:
        self.outcome = "ack"

    async def term(self) -> None:
        self.outcome = "refused"

    async def nak(self, delay: float | None = None) -> None:
        self.outcome = "too many nodes"


class MemoryState:
    """The controller's KV state (``controller/state.py``) kept in dicts: same methods, same
    compare-and-set semantics, no NATS. It also records what was stored, in order."""

    def __init__(self, cluster: str) -> None:
        self.prefix = f"skewd.{cluster}"
        self.findings: list[Finding] = []
        self.remaps: dict[str, dict] = {}
        self.remaps_created: list[dict] = []
        self.incidents: dict[str, tuple[str, float]] = {}
        self.published: set[str] = set()  # incident ids stored as published (no longer held)
        self.held_from: dict[str, float] = {}  # incident id → hold start stored with it
        self.writes = 0
        self.engine_saved: dict[str, float] = {}  # snapshot name → time of its latest put_engine

    async def load(self) -> dict:
        return {}

    async def put_finding(self, f: Finding) -> None:
        self.findings.append(f)

    async def delete_finding(self, fingerprint: str) -> None:
        pass

    async def put_incident_id(self, group_key: str, incident_id: str, opened_at: float, published: bool = True,
                              held_from: float | None = None) -> None:
        self.incidents[group_key] = (incident_id, opened_at)
        self.held_from[incident_id] = opened_at if held_from is None else held_from
        if published:
            self.published.add(incident_id)

    async def delete_incident_id(self, group_key: str) -> None:
        self.incidents.pop(group_key, None)

    async def put_engine(self, engine: Any, t: float, name: str | None = None) -> None:
        """As StateStore.put_engine (a scaled-out partition names its snapshot): the time of
        the latest snapshot under each name ("" for the controller's own) is kept."""
        self.engine_saved[name or ""] = t

    async def create_remap(self, key: str, record: dict) -> bool:
        if key in self.remaps:
            return False
        self.remaps[key] = json.loads(json.dumps(record))
        self.remaps_created.append(self.remaps[key])
        return True

    async def update_remap(self, key: str, fn: Callable[[dict], dict | None], attempts: int = 20) -> dict | None:
        cur = self.remaps.get(key)
        if cur is None:
            return None
        new = fn(json.loads(json.dumps(cur)))
        if new is None:
            return cur
        self.remaps[key] = new
        return new

    async def get_remap(self, key: str) -> dict | None:
        return self.remaps.get(key)


class CaptureJetStream:
    """Stands in for the controller's JetStream publish: every publication is acknowledged and
    kept decoded, by kind - its finding transitions, incident messages and remap suggestions -
    in publication order (held incidents never reach it: the controller does not publish them)."""

    def __init__(self) -> None:
        self.published: list[str] = []  # subjects, in order
        self.findings: list[Finding] = []
        self.incidents: list[messages.Incident] = []
        self.suggestions: list[messages.RemapSuggestion] = []

    async def publish(self, subject: str, payload: bytes = b"", headers: dict | None = None, timeout: float = 0.0,
                      **kw: Any) -> "_Ack":
        headers = headers or {}
        self.published.append(subject)
        kind = headers.get(wire.HDR_KIND)
        if kind == wire.MessageKind.FINDING.value:
            self.findings.append(wire.decode_finding(payload))
        elif kind == messages.Kind.INCIDENT.value:
            self.incidents.append(messages.decode(payload, messages.Kind.INCIDENT))  # type: ignore[arg-type]
        elif kind == messages.Kind.REMAP.value:
            self.suggestions.append(messages.decode(payload, messages.Kind.REMAP))  # type: ignore[arg-type]
        return _Ack(len(self.published))

    def mark(self) -> tuple[int, int, int]:
        return len(self.findings), len(self.incidents), len(self.suggestions)

    def since(self, mark: tuple[int, int, int]) -> Published:
        a, b, c = mark
        return Published(self.findings[a:], self.incidents[b:], self.suggestions[c:])


@dataclass
class _Ack:
    seq: int
    duplicate: bool = False
    stream: str = "memory"
