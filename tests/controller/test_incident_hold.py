"""An incident is held ``correlation.group_wait`` before it is published (Alertmanager's
group_wait for a group's first notification): a symptom whose cause fires within the hold is
taken over by the cause's incident and never shown on its own; one whose cause never comes is
shown when the hold ends; one that resolves while held is never shown; a restart during the
hold resumes it (same id, same deadline). The controller service itself, with in-memory KV and
JetStream (as the fault lab's harness runs it), no NATS."""
from __future__ import annotations

import asyncio
import dataclasses
import json

from skewd.controller import messages as M
from skewd.controller.config import load_config
from skewd.controller.service import Controller
from skewd.lab.harness import CaptureJetStream, MemoryState
from skewd.model import Finding, Layer, Scope, State

from .helpers import RULES
from .sim import finding

WAIT = 8.0


class _KV(MemoryState):
    """MemoryState that also gives back what it holds on ``load`` (a restart's view of KV)."""

    def __init__(self, cluster: str) -> None:
        super().__init__(cluster)
        self.latest: dict[str, dict] = {}

    async def put_finding(self, f: Finding) -> None:
        await super().put_finding(f)
        self.latest[f.fingerprint] = f.to_dict()

    async def load(self) -> dict:
        return {"finding": dict(self.latest), "remap": dict(self.remaps), "engine": {},
                "incident": {f"slot{i}": {"group_key": k, "id": iid, "opened_at": at, "published": iid in self.published,
                                          "held_from": self.held_from[iid]}
                             for i, (k, (iid, at)) in enumerate(self.incidents.items())}}


def _controller(kv: _KV | None = None) -> tuple[Controller, _KV]:
    cfg = load_config(None, env={}, overrides={
        "cluster": "c", "rules": [RULES], "correlation": {"group_wait": f"{WAIT:g}s"},
        "topology": {"tp_groups": {"tp0": {"nodes": ["n0", "n1", "n2", "n3"], "model": "m1"}},
                     "models": {"m1": {"max_num_seqs": 200}}}})
    ctl = Controller(cfg)
    ctl.state = kv or _KV("c")
    ctl.js = CaptureJetStream()
    return ctl, ctl.state  # type: ignore[return-value]


def _run(ctl: Controller, t0: float, t1: float, feed: dict[float, list[Finding]] | None = None) -> None:
    """Correlate and plan once a second over [t0, t1], observing ``feed``'s findings at their times."""
    loop = asyncio.new_event_loop()
    try:
        t = t0
        while t <= t1 + 1e-9:
            for f in (feed or {}).get(t, []):
                if ctl.correlator.observe(f):
                    loop.run_until_complete(ctl.state.put_finding(f))
            ctl.now = t
            loop.run_until_complete(ctl._correlate_and_plan(t))
            t += 1.0
    finally:
        loop.close()


def _shown(ctl: Controller) -> list[M.Incident]:
    return list(ctl.js.incidents)  # type: ignore[attr-defined]


def _erosion(t: float) -> Finding:
    return finding("n0", "GPU-8-x", "GPU-8", Layer.ENGINE, t, cluster="c", entity="engine0", scope=Scope.ENGINE)


def _resolved(f: Finding, t: float) -> Finding:
    return dataclasses.replace(f, state=State.RESOLVED, evaluated_at=t, resolved_at=t)


def _stall(t: float) -> Finding:
    return finding("n0", "GPU-3-x", "GPU-3", Layer.ENGINE, t, cluster="c", entity="engine0", scope=Scope.ENGINE)


def test_a_symptom_whose_cause_fires_within_group_wait_is_never_published() -> None:
    ctl, _ = _controller()
    # GPU-8 (throughput erosion) fires 5 s before the GPU-3 stall that causes it
    _run(ctl, 100.0, 130.0, {100.0: [_erosion(100.0)], 105.0: [_stall(105.0)]})
    shown = _shown(ctl)
    assert {i.pathology for i in shown} == {"GPU-3"}, [(i.pathology, i.state) for i in shown]
    stall = shown[0]
    assert stall.state == "open" and stall.inhibited == [_erosion(100.0).id]
    assert stall.updated_at == 105.0 + WAIT  # shown when its own hold ended, not before
    # internally the symptom's incident was closed as taken over by the cause, never shown
    gone = [i for i in ctl.correlator.incidents.values() if i.pathology == "GPU-8"]
    assert len(gone) == 1 and gone[0].state == "inhibited" and gone[0].inhibited_by == stall.id
    assert ctl.stats.incidents_withheld == 1 and ctl.stats.incidents_shown == 1
    # planned once the cause's incident was shown; nothing for the symptom
    sugs = [r["suggestion"] for r in ctl.remaps.values() if r.get("suggestion")]
    assert [s["incident"] for s in sugs] == [stall.id]


def test_a_symptom_whose_cause_never_fires_is_published_when_group_wait_ends() -> None:
    ctl, kv = _controller()
    _run(ctl, 100.0, 100.0 + WAIT - 1, {100.0: [_erosion(100.0)]})
    assert _shown(ctl) == [] and not ctl.remaps
    held = ctl.correlator.open_incidents()
    assert len(held) == 1 and ctl.correlator.is_held(held[0])
    # the status view lists it, marked held
    (st,) = ctl.status()["open_incidents"]
    assert st["held"] is True and st["publish_after"] == 100.0 + WAIT and st["pathology"] == "GPU-8"
    assert kv.incidents and held[0].id not in kv.published  # id stored, as held
    _run(ctl, 100.0 + WAIT, 120.0)
    (inc,) = _shown(ctl)
    assert inc.pathology == "GPU-8" and inc.state == "open" and inc.id == held[0].id
    assert inc.opened_at == 100.0 and inc.updated_at == 100.0 + WAIT
    assert inc.id in kv.published and ctl.status()["open_incidents"][0]["held"] is False
    # planned in the tick it was shown (the planner's group_wait, unchanged)
    assert [r["suggestion"]["incident"] for r in ctl.remaps.values() if r.get("suggestion")] == [inc.id]
    assert [r["suggestion"]["created_at"] for r in ctl.remaps.values() if r.get("suggestion")] == [100.0 + WAIT]
    # updates after the first publication are published as they happen
    _run(ctl, 121.0, 122.0, {121.0: [_resolved(_erosion(100.0), 121.0)]})
    assert [(i.id, i.state) for i in _shown(ctl)] == [(inc.id, "open"), (inc.id, "resolved")]


def test_an_incident_resolved_within_group_wait_is_never_published() -> None:
    ctl, kv = _controller()
    _run(ctl, 100.0, 130.0, {100.0: [_erosion(100.0)], 104.0: [_resolved(_erosion(100.0), 104.0)]})
    assert _shown(ctl) == [] and not ctl.remaps
    assert ctl.stats.incidents_withheld == 1 and not kv.incidents and not ctl.correlator.open_incidents()


def test_a_restart_during_the_hold_resumes_it_with_the_same_id_and_deadline() -> None:
    ctl, kv = _controller()
    _run(ctl, 100.0, 104.0, {100.0: [_erosion(100.0)]})
    (held,) = ctl.correlator.open_incidents()
    assert _shown(ctl) == []
    # crash; a new controller starts from the KV state
    ctl2, _ = _controller(kv)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(ctl2._restore())
    loop.close()
    assert ctl2.status()["nodes"]["not_heard_since_restart"] == ["n0"]
    assert ctl2._heard("n0")  # n0's agent is alive: its next summary (a dead one's: see test_silent_nodes)
    _run(ctl2, 105.0, 100.0 + WAIT - 1)
    assert _shown(ctl2) == []  # still held: the hold counts from the original opening
    _run(ctl2, 100.0 + WAIT, 110.0)
    (inc,) = _shown(ctl2)
    assert inc.id == held.id and inc.opened_at == 100.0 and inc.updated_at == 100.0 + WAIT

    # a restart during the hold, and the cause arrives after it: never shown on its own
    ctl3, kv3 = _controller()
    _run(ctl3, 200.0, 203.0, {200.0: [_erosion(200.0)]})
    ctl4, _ = _controller(kv3)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(ctl4._restore())
    loop.close()
    ctl4._heard("n0")
    _run(ctl4, 204.0, 230.0, {204.0: [_stall(204.0)]})
    assert [i.pathology for i in _shown(ctl4)] == ["GPU-3"]


def test_a_restart_after_publication_keeps_it_published() -> None:
    ctl, kv = _controller()
    _run(ctl, 100.0, 110.0, {100.0: [_erosion(100.0)]})
    (inc,) = _shown(ctl)
    ctl2, _ = _controller(kv)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(ctl2._restore())
    loop.close()
    assert not ctl2.correlator.is_held(M.incident_from_dict(json.loads(M.encode(inc))))
    # the restarted controller does not announce it again before it has heard from its node
    # (a dead node's trouble must not be re-announced: test_silent_nodes); then its resolution
    _run(ctl2, 111.0, 111.0)
    assert _shown(ctl2) == []
    ctl2._heard("n0")  # what taking in its next summary or finding does
    _run(ctl2, 112.0, 112.0, {112.0: [_resolved(_erosion(100.0), 112.0)]})
    assert [(i.id, i.state) for i in _shown(ctl2)] == [(inc.id, "resolved")]


def _stall_resolved(t: float) -> Finding:
    return _resolved(_stall(105.0), t)


def test_a_symptom_left_firing_after_its_cause_resolved_is_held_again() -> None:
    # the cause resolves first; the symptom, still firing, becomes an incident of its own then
    # (with its old opened_at): held group_wait from then, so its own end 5 s later is never shown
    ctl, _ = _controller()
    _run(ctl, 100.0, 170.0, {100.0: [_erosion(100.0)], 105.0: [_stall(105.0)], 150.0: [_stall_resolved(150.0)],
                             155.0: [_resolved(_erosion(100.0), 155.0)]})
    assert [(i.pathology, i.state) for i in _shown(ctl)] == [("GPU-3", "open"), ("GPU-3", "resolved")]
    # ... and when it keeps firing it is shown group_wait after it became its own incident
    ctl, _ = _controller()
    _run(ctl, 100.0, 170.0, {100.0: [_erosion(100.0)], 105.0: [_stall(105.0)], 150.0: [_stall_resolved(150.0)]})
    shown = [(i.pathology, i.state, i.opened_at, i.updated_at) for i in _shown(ctl)]
    assert shown == [("GPU-3", "open", 105.0, 105.0 + WAIT), ("GPU-3", "resolved", 105.0, 150.0),
                     ("GPU-8", "open", 100.0, 150.0 + WAIT)], shown
    (st,) = ctl.status()["open_incidents"]
    assert st["pathology"] == "GPU-8" and st["held"] is False and st["publish_after"] == 150.0 + WAIT
