"""The culprit-evidence contract: a cross-node finding names a culprit node only when its own
measurement singles that node out.

A group rule (scope ``tp_group`` / ``cluster``) of a culprit pathology fires *for* a node: the
finding's ``node`` is the node it names. Whether the controller may call that node the
culprit - open a culprit incident, inhibit its peers' findings as victims, plan a remap moving
its rank - is decided here, from values the finding carries in its ``evidence`` under these
reserved keys:

``culprit_measure``
    the named node's own value of the measurement that names it (e.g. EW-1: its median arrival
    lag beyond the clocks' error, seconds; EW-9: the share of its group's steps it sat out);
``culprit_bar``
    the value that measurement must exceed (the rule's threshold, same unit). A measure where
    lower is worse is given negated (a deficit), so the test is always ``measure > bar``;
``culprit_steps`` / ``culprit_min_steps`` (optional, together)
    how many steps (samples) the measure rests on, and the rule's minimum;
``culprit_peer_max`` (optional)
    the largest value of the same measure among the other nodes the rule compared it with.

The node is *singled out* when its measure clears the bar (over enough steps), no peer's does
(``culprit_peer_max`` when given) and no other node of the same peer group has the same rule
pending or firing. Anything else - a missing key, a measure under its bar, two nodes over it -
is refused: the finding stays a finding and the correlator counts the refusal
(``Controller.status()["correlation"]``).

A rule may put the keys into its evidence itself. For rules that do not (the shipped packs
compute evidence from their expressions, whose labels are the expression's text), the
controller's ``correlation.culprit_evidence`` says, per rule id, which evidence label is the
measure and which param is the bar; :func:`contract_evidence` fills the keys from it. The
controller does that for its own findings before it publishes them, so subscribers see the
same numbers the correlator judged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from skewd.model import Finding, State

MEASURE, BAR, STEPS, MIN_STEPS, PEER_MAX = ("culprit_measure", "culprit_bar", "culprit_steps",
                                            "culprit_min_steps", "culprit_peer_max")
KEYS = (MEASURE, BAR, STEPS, MIN_STEPS, PEER_MAX)


@dataclass(frozen=True)
class CulpritEvidence:
    """``correlation.culprit_evidence.<rule id>``: where a rule's finding holds its culprit
    measurement. ``measure`` / ``steps`` are evidence labels (the expression's own text, as
    ``skewd rules explain`` and the finding show them); ``above`` / ``min_steps`` are a param
    name of the rule or a number. ``abs``: either direction counts (a load skew may be too
    much or too little); ``negate``: lower is worse (a deficit against the peers)."""

    measure: str
    above: str | float
    steps: str = ""
    min_steps: str | float | None = None
    abs: bool = False
    negate: bool = False
    #: an evidence label subtracted from ``measure``: the node's value over what it is compared
    #: with (EW-1: its compute gap minus the other members' median)
    minus: str = ""
    #: an evidence label the measure is divided by, for a rule whose bar is a share of it
    #: (EW-2-pp-stage-straggler: the neighbours' extra wait as a share of the step period)
    per: str = ""


@dataclass(frozen=True)
class Verdict:
    """Whether a finding names its node, why not, and the measurement in words."""

    names: bool
    reason: str  # "" when it names the node
    measurement: str  # e.g. "avg(ctl_arrival_lag_excess_seconds, window) 0.0086 > lag 0.002 over 308 steps (>= 20)"


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _param(f: Finding, ref: str | float | None) -> float | None:
    """A bar given as a number, or the value of the rule's param of that name (durations are
    stored as seconds in ``params``)."""
    if ref is None:
        return None
    if isinstance(ref, (int, float)) and not isinstance(ref, bool):
        return float(ref)
    v = f.params.get(str(ref))
    if isinstance(v, str):
        from skewd.model import parse_duration

        try:
            return parse_duration(v)
        except ValueError:
            return None
    return _num(v)


def contract_evidence(f: Finding, spec: CulpritEvidence | None) -> dict[str, float]:
    """The contract keys of ``f``: those its evidence carries, else derived with ``spec``
    (an empty dict when neither gives a measure and a bar)."""
    have = {k: _num(f.evidence.get(k)) for k in KEYS if k in f.evidence}
    out = {k: v for k, v in have.items() if v is not None}
    if MEASURE in out and BAR in out:
        return out
    if spec is None:
        return {}
    m = _num(f.evidence.get(spec.measure))
    bar = _param(f, spec.above)
    if m is not None and spec.minus:
        sub = _num(f.evidence.get(spec.minus))
        m = None if sub is None else m - sub
    if m is not None and spec.per:
        d = _num(f.evidence.get(spec.per))
        m = m / d if d is not None and d > 0 else None  # no positive divisor: no measurement
    if m is None or bar is None:
        return {}
    if spec.abs:
        m = abs(m)
    if spec.negate:
        m = -m
    out = {MEASURE: m, BAR: bar}
    if spec.steps:
        s, lo = _num(f.evidence.get(spec.steps)), _param(f, spec.min_steps)
        if s is not None:
            out[STEPS] = s
        if lo is not None:
            out[MIN_STEPS] = lo
    return out


def _shown(spec: CulpritEvidence) -> str:
    """The measure as the test reads it: ``|x|`` either way, ``-x`` a deficit."""
    m = f"{spec.measure} - {spec.minus}" if spec.minus else spec.measure
    if spec.per:
        m = f"({m}) / {spec.per}" if spec.minus else f"{m} / {spec.per}"
    return f"|{m}|" if spec.abs else f"-({m})" if spec.negate and spec.minus else f"-{m}" if spec.negate else m


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def describe(f: Finding, ev: Mapping[str, float], spec: CulpritEvidence | None) -> str:
    """The measurement in words, as the finding's evidence states it."""
    if MEASURE not in ev or BAR not in ev:
        return "no culprit measurement in its evidence"
    # the rule's own label when its entry reads one (the controller also copies the keys in)
    mapped = spec is not None and (spec.measure in f.evidence or not {MEASURE, BAR} <= set(f.evidence))
    what, bar_name = "culprit_measure", ""
    if mapped:
        what = _shown(spec)
        bar_name = f" {spec.above}" if isinstance(spec.above, str) else ""
    m, bar = ev[MEASURE], ev[BAR]
    text = f"{what} {_fmt(m)} {'>' if m > bar else '<='}{bar_name} {_fmt(bar)}"
    if STEPS in ev:
        text += f" over {ev[STEPS]:.0f} steps"
        if MIN_STEPS in ev:
            text += f" (min {ev[MIN_STEPS]:.0f})"
    if PEER_MAX in ev:
        text += f"; highest peer {_fmt(ev[PEER_MAX])}"
    return text


def judge(f: Finding, spec: CulpritEvidence | None, peers: Iterable[Finding] = ()) -> Verdict:
    """Does ``f``'s own evidence single out ``f.node``? ``peers``: the other findings the
    correlator holds (pending or firing findings of the same rule on other nodes of the same
    peer group mean the node is not the only one over the bar)."""
    ev = contract_evidence(f, spec)
    text = describe(f, ev, spec)
    if MEASURE not in ev or BAR not in ev:
        return Verdict(False, f"{f.rule_id} gives no culprit measurement (evidence keys {MEASURE}/{BAR}, "
                              "or a correlation.culprit_evidence entry whose labels its evidence has)", text)
    if not ev[MEASURE] > ev[BAR]:
        return Verdict(False, f"its own measurement does not clear the rule's bar: {text}", text)
    if STEPS in ev and MIN_STEPS in ev and ev[STEPS] < ev[MIN_STEPS]:
        return Verdict(False, f"too few steps behind the measurement: {text}", text)
    if PEER_MAX in ev and ev[PEER_MAX] > ev[BAR]:
        return Verdict(False, f"a peer is over the bar too: {text}", text)
    others = sorted({p.node for p in peers if p.rule_id == f.rule_id and p.node != f.node and p.labels == f.labels
                     and p.state in (State.PENDING, State.FIRING)})
    if others:
        return Verdict(False, f"{f.rule_id} holds for {', '.join([f.node, *others])} at once: it does not single "
                              f"out {f.node}", text)
    return Verdict(True, "", text)


def coverage(rules: Iterable, culprit_pathologies: Iterable[str],
             entries: Mapping[str, CulpritEvidence]) -> dict[str, str]:
    """For every loaded group rule of a culprit pathology: how its findings state their culprit
    measurement, or why they cannot (then every claim of that rule is refused). ``rules`` are
    compiled rules (``id``, ``pathology``, ``scope``, ``params``, ``compiled.evidence_labels``).
    Shown by ``skewd controller --check`` and logged at start: a rule whose expression changed
    without its ``correlation.culprit_evidence`` entry shows up here, not as silence."""
    from skewd.model import GROUP_SCOPES

    culprits = set(culprit_pathologies)
    out: dict[str, str] = {}
    for r in rules:
        if r.scope not in GROUP_SCOPES or r.pathology not in culprits:
            continue
        spec = entries.get(r.id)
        labels = set(r.compiled.evidence_labels)
        if spec is None:
            out[r.id] = (f"PROBLEM: no correlation.culprit_evidence entry: its findings name a culprit only if they "
                         f"carry {MEASURE}/{BAR} in their evidence")
            continue
        missing = [x for x in (spec.measure, spec.minus, spec.per, spec.steps) if x and x not in labels]
        params = [p for p in (spec.above, spec.min_steps) if isinstance(p, str) and p not in r.params]
        if missing or params:
            what = [f"evidence label(s) {', '.join(repr(m) for m in missing)}" if missing else "",
                    f"param(s) {', '.join(params)}" if params else ""]
            out[r.id] = (f"PROBLEM: the rule has no {' and no '.join(w for w in what if w)}: every claim is "
                         f"refused (its labels: {', '.join(sorted(labels))})")
            continue
        out[r.id] = f"names its node when {_shown(spec)} > {spec.above}" + (
            f" over {spec.steps} >= {spec.min_steps}" if spec.steps else "")
    return out
