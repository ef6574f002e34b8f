"""The one rule engine: windows + a time in, state transitions (Findings) out.

Used unchanged by the agent (node rules), the controller (group rules over node summaries) and
replay. ``evaluate(now)`` never reads the clock, so the same samples and times always give
the same findings.

Alert state follows Prometheus: inactive → pending (expression true, waiting out ``for``) →
firing → resolved (expression false for longer than ``keep_firing_for``), keyed by a
fingerprint of the rule and the entity's labels. ``replace_rules`` carries state over for
rules whose definition is unchanged, so a hot reload never re-fires or forgets an alert.

No data is not healthy data. A firing alert resolves only on evidence that its condition
ended, which a gap in the data is not (a 45 s process freeze once resolved two GPU-3 findings
whose engine was still stalled - the window held one sample, so ``increase()`` could not say -
and fired them again 31 s later). So a firing alert that is not true is *held* (neither
resolved nor refreshed: ``last_true_at`` stays) at a time when

* the rule was not evaluated for longer than its window (``max_window``, else ``lookback``) -
  the process was paused, or the rule inactive - and that long has not passed since: until its
  windows hold data from after the gap again, neither an unknown nor a *false* verdict is
  trusted (a ``count()`` over a half-empty window is low because of the gap); a condition that
  ended during the gap resolves one window after the data came back; or
* the entity has no sample of any of the rule's signals within the rule's window while the
  store still has a row of it (its collector stalled, its exporter died): held until the store
  forgets the entity (no sample for the whole ``horizon``), then resolved.

An entity with fresh data is judged as always (a rule ``a or b`` whose ``b`` this host never
has resolves when ``a`` ends). Pending alerts are unchanged: one that is not true is dropped (no
alert fires on missing data). This is Prometheus's staleness handling applied to windows (an
instant query still sees a series' last sample for the 5-minute lookback after its scrapes
stop, so an alert does not resolve on a missed scrape) and its ``for_grace_period`` idea for
restarts (:meth:`Engine.resume_from`). It depends only on the evaluation times given and the
samples, so replay reproduces it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

import numpy as np

from skewd.model import Finding, Layer, Scope, Severity, State, fingerprint

from . import functions
from .expr import Compiled
from .slabwindows import SlabWindows
from .store import WindowStore
from .windows import EvalContext, batch_plan

ENGINE_VERSION = 1


@dataclass
class Rule:
    """A compiled rule. ``digest`` identifies its effective definition (for hot reload)."""

    id: str
    pathology: str
    desc: str
    scope: Scope
    requires: list[str]
    params: dict[str, Any]
    expr: str
    for_s: float
    keep_firing_for_s: float
    severity: Severity
    layer: Layer
    mitigation: str
    labels: dict[str, str]
    tags: list[str]
    enabled: bool
    summary: str
    compiled: Compiled
    digest: str
    source: str = ""  # file:line
    #: group scopes: node labels that split the group into peer groups (nodes lacking a label
    #: share its empty value)
    peers_by: tuple[str, ...] = ()

    @property
    def maturity(self) -> str:
        for t in self.tags:
            if t in ("stable", "incubating", "sandbox"):
                return t
        return "sandbox"


@dataclass
class RuleSet:
    rules: list[Rule]
    files: list[str] = field(default_factory=list)
    version: str = ""  # digest of all rule digests, shown in reports and health

    def by_id(self) -> dict[str, Rule]:
        return {r.id: r for r in self.rules}


@dataclass
class Alert:
    """One alert instance: a rule for one entity (and its labels), in the state it is in
    (:class:`~skewd.model.State`: pending or firing) since ``active_at`` (Prometheus' ``Alert``)."""

    rule_id: str
    node: str
    entity: str
    state: State
    active_at: float
    last_true_at: float
    fired_at: float | None = None
    evidence: dict[str, float | None] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class _Frame:
    eids: np.ndarray
    node_eids: np.ndarray
    groups: np.ndarray
    names: np.ndarray
    nodes: np.ndarray
    group_labels: list[dict[str, str]]
    align: dict = field(default_factory=dict)  # see EvalContext.align; lives as long as the frame
    keys: dict = field(default_factory=dict)  # rule id → per entity (node, entity, labels, fingerprint)


class Engine:
    """Owns the alert state of every rule × entity and evaluates the rules over a window store at
    a time it is given; the agent's Pipeline, the controller (group scopes), ``skewd check`` and
    ``skewd rules test`` call :meth:`evaluate`."""

    def __init__(self, rules: RuleSet, store: WindowStore, lookback: float = 60.0, cluster: str = "",
                 scopes: Iterable[Scope] | None = None) -> None:
        """``scopes`` limits evaluation to rules of those scopes: agents evaluate node-local
        scopes, the controller the group scopes (tp_group, cluster) over node summaries."""
        self.scopes = None if scopes is None else set(scopes)
        self.store = store
        self.lookback = float(lookback)
        self.cluster = cluster
        self.rules = rules
        self.states: dict[str, dict[str, Alert]] = {r.id: {} for r in rules.rules}
        self.available: set[str] | None = None
        self.inactive: dict[str, str] = {}
        self._frames: dict[tuple, tuple[int, int, _Frame]] = {}
        self._frame_keys: dict[str, tuple[Rule, tuple]] = {}  # rule id → (rule, its frame key)
        self._fp_cache: dict[tuple, tuple[tuple[str, str], str]] = {}
        self.evaluations = 0
        self.last_eval_errors: dict[str, str] = {}
        self._last_eval: dict[str, float] = {}  # rule id → its previous evaluation time
        self._refill_until: dict[str, float] = {}  # rule id → end of the hold after an evaluation gap
        #: firing alerts held at the latest evaluation (rule id → fingerprints): no data is not healthy data
        self.held: dict[str, set[str]] = {}
        self._slab_windows = SlabWindows()
        #: read window columns once per slab (slabwindows.py) when the store writes slabs
        #: (``store.node_slabs``); only speed depends on it (the tests compare both ways)
        self.read_slabs = True
        self._refresh_inactive()

    # -- configuration -----------------------------------------------------------------------
    def set_available_signals(self, signals: Iterable[str] | None, reasons: Mapping[str, str] | None = None) -> None:
        """Declare which signals this host can supply (None = assume all). Rules whose
        ``requires`` are not all available are reported inactive instead of evaluated."""
        self.available = None if signals is None else set(signals)
        self._signal_reasons = dict(reasons or {})
        self._refresh_inactive()

    def _refresh_inactive(self) -> None:
        self._plan = None
        self.inactive = {}
        reasons = getattr(self, "_signal_reasons", {})
        for r in self.rules.rules:
            if not r.enabled:
                self.inactive[r.id] = "disabled"
                continue
            if self.available is None:
                continue
            missing = [s for s in r.requires if s not in self.available]
            if missing:
                why = sorted({reasons.get(s, "no collector on this host supplies it") for s in missing})
                self.inactive[r.id] = f"needs {', '.join(missing)}: {'; '.join(why)}"

    def resume_from(self, t: float) -> None:
        """Treat every rule as last evaluated at ``t`` (restored alert states of a restarted
        process): a first evaluation later than a rule's window after ``t`` is a gap, during
        which a firing alert is not resolved on the partial windows (module doc)."""
        for r in self.rules.rules:
            if self._last_eval.get(r.id, -np.inf) < t:
                self._last_eval[r.id] = t

    def _note_evaluation(self, rule: Rule, now: float) -> None:
        prev = self._last_eval.get(rule.id)
        self._last_eval[rule.id] = now
        window = rule.compiled.max_window or self.lookback
        if prev is not None and now - prev > window:
            self._refill_until[rule.id] = now + window

    def replace_rules(self, rules: RuleSet) -> list[str]:
        """Swap in a new (already validated) rule set; returns ids whose state carried over."""
        old = self.rules.by_id()
        carried = []
        states: dict[str, dict[str, Alert]] = {}
        for r in rules.rules:
            prev = old.get(r.id)
            if prev is not None and prev.digest == r.digest:
                states[r.id] = self.states.get(r.id, {})
                carried.append(r.id)
            else:
                states[r.id] = {}
        self.rules = rules
        self.states = states
        self._frames.clear()
        self._frame_keys.clear()
        self._refresh_inactive()
        return carried

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, now: float) -> list[Finding]:
        """Evaluate every active rule at time ``now``; return the transitions, in rule order."""
        with functions.quiet():
            functions._ACTIVE[0] = True
            try:
                return self._evaluate(now)
            finally:
                functions._ACTIVE[0] = False

    def _evaluate(self, now: float) -> list[Finding]:
        memo: dict = {}
        out: list[Finding] = []
        self.last_eval_errors = {}
        batches = self._batch_plan()
        for rule in self.rules.rules:
            if rule.id in self.inactive or (self.scopes is not None and rule.scope not in self.scopes):
                continue
            frame = self._frame(rule)
            try:
                ctx, true_idx = self._tick_context(rule, frame, now, memo, batches)
            except _EVAL_ERRORS as e:  # defensive: never kill the loop
                self.last_eval_errors[rule.id] = f"{type(e).__name__}: {e}"
                continue
            try:
                out.extend(self._transition(rule, frame, ctx, true_idx, now))
            except _EvidenceError as e:
                self.last_eval_errors[rule.id] = str(e)
        self.evaluations += 1
        return out

    def _tick_context(self, rule: Rule, frame: _Frame | None, now: float, memo: dict,
                      batches: dict | None = None) -> tuple[EvalContext | None, np.ndarray]:
        """(context, indices of the entities where the rule is true) of one rule over its
        frame at ``now``; the errors of ``fires`` propagate (the caller skips the rule at this
        tick). ``batches``: this evaluation's ``_batch_plan()`` (found here when not given)."""
        if frame is None or len(frame.eids) == 0:
            return None, np.empty(0, dtype=np.int64)
        ctx = EvalContext(self.store, now, frame.eids, frame.node_eids, frame.groups, frame.names,
                          frame.nodes, self.lookback, memo, [], frame.align,
                          batches=self._batch_plan() if batches is None else batches,
                          slabs=self._slab_windows if self.read_slabs and self.store.node_slabs else None)
        fires = rule.compiled.fires(ctx)
        if isinstance(fires, np.ndarray) and fires.ndim:
            return ctx, fires.nonzero()[0]
        # one verdict for every entity (a condition on node-wide constants)
        return ctx, (np.arange(len(frame.eids)) if fires else np.empty(0, dtype=np.int64))

    def _batch_plan(self) -> dict:
        """Which window functions of the evaluated rules are computed together per tick
        (``windows.batch_plan``), for the current rules and scopes."""
        plan = self._plan
        if plan is None or plan[0] is not self.rules or plan[1] != self.scopes:
            windows = [w for r in self.rules.rules if r.id not in self.inactive and self.evaluates(r)
                       for w in r.compiled.windows]
            scopes = None if self.scopes is None else set(self.scopes)
            plan = self._plan = (self.rules, scopes, batch_plan(windows))
        return plan[2]

    # -- range evaluation --------------------------------------------------------------------------
    def lookback_needed(self) -> float:
        """How far before a tick any evaluated rule reads: a range's samples may be ingested
        ahead only while the store's compaction cannot reach this far behind its first tick."""
        d = self.lookback
        for r in self.rules.rules:
            if r.id in self.inactive or not self.evaluates(r):
                continue
            if r.compiled.uses_horizon:
                return self.store.horizon
            d = max(d, r.compiled.max_window)
        return d

    def range_plan(self) -> list[tuple[str, str]]:
        """(rule id, how evaluate_range evaluates it) for every active rule: 'range' with the
        window functions computed per tick inside it, or 'per tick' and why."""
        out = []
        for r in self.rules.rules:
            if r.id in self.inactive or not self.evaluates(r):
                continue
            if r.scope in (Scope.TP_GROUP, Scope.CLUSTER):
                out.append((r.id, "per tick (group scope: peer groups follow node labels)"))
                continue
            out.append((r.id, "range"))
        return out

    def evaluate_range(self, ticks: Any, births: Mapping[int, np.ndarray] | None = None,
                       seen: Any = None) -> list[list[Finding]]:
        """Evaluate every active rule at each of ``ticks`` (increasing) in one pass; return each
        tick's transitions, exactly those of ``evaluate(t)`` called at each tick in turn.

        The store must already hold every tick's samples, and nothing else a tick's windows
        could see: ``seen`` gives the store's latest sample time at each tick (default: the
        tick), every sample ingested after a tick is newer than that (a new column after the
        ones the tick saw), and no column was dropped since the first tick (no block made
        room: ``WindowStore.min_free_columns``). ``births``
        (``WindowStore.take_births``) says which rows the store created after the first tick:
        they are left out of the ticks before, as they were not there yet.

        Every rule's expression is computed over a [ticks x entities] grid: window functions
        from each block's columns with the window bounds of all ticks found at once (count,
        present, absent, last and delta by range kernels, the others by their per-tick kernel at
        each tick: a running sum would add in another order), comparisons, logic and arithmetic
        elementwise on the grid, peer functions per tick over the entities present. The alert
        state machine then runs along the tick axis; evidence, when a transition needs it, is
        the full expression over the grid. Group scopes (and a rule whose range evaluation
        fails) are evaluated per tick."""
        ticks = np.asarray(ticks, dtype=float)
        ends = ticks if seen is None else np.minimum(ticks, np.asarray(seen, dtype=float))
        with functions.quiet():
            functions._ACTIVE[0] = True
            try:
                return self._evaluate_range(ticks, ends, dict(births or {}))
            finally:
                functions._ACTIVE[0] = False

    def _evaluate_range(self, ticks: np.ndarray, ends: np.ndarray, births: dict) -> list[list[Finding]]:
        T = len(ticks)
        out: list[list[Finding]] = [[] for _ in range(T)]
        memo: dict = {}
        errors: dict[str, str] = {}
        self.range_fallbacks: dict[str, str] = {}
        for rule in self.rules.rules:
            if rule.id in self.inactive or (self.scopes is not None and rule.scope not in self.scopes):
                continue
            if rule.scope in (Scope.TP_GROUP, Scope.CLUSTER):
                if births or len(ticks) > 1 and bool((ends[:-1] < ticks[:-1]).any()):
                    raise ValueError("evaluate_range: group-scope rules need the store as at each tick")
                self._group_per_tick(rule, ticks, out, errors)
                continue
            frame = self._frame(rule)
            states = self.states.setdefault(rule.id, {})
            saved = {fp: replace(st, evidence=dict(st.evidence), labels=dict(st.labels)) for fp, st in states.items()}
            saved_gap = (self._last_eval.get(rule.id), self._refill_until.get(rule.id))
            try:
                found = self._rule_range(rule, frame, ticks, ends, births, memo)
            except (_EvidenceError,) + _EVAL_ERRORS as e:
                self.states[rule.id] = saved
                for d, v in zip((self._last_eval, self._refill_until), saved_gap):
                    if v is None:
                        d.pop(rule.id, None)
                    else:
                        d[rule.id] = v
                self.range_fallbacks[rule.id] = f"{type(e).__name__}: {e}"
                self._rule_per_tick(rule, ticks, ends, births, out, errors)
                continue
            for j, fs in enumerate(found):
                out[j].extend(fs)
        self.last_eval_errors = errors
        self.evaluations += T
        return out

    def _rule_range(self, rule: Rule, frame: _Frame | None, ticks: np.ndarray, ends: np.ndarray, births: dict,
                    memo: dict) -> list[list[Finding]]:
        T = len(ticks)
        if frame is None or len(frame.eids) == 0:
            return [self._transition(rule, frame, None, np.empty(0, dtype=np.int64), float(t)) for t in ticks]
        exist = self._existence(rule, frame, T, births) if births else None
        ctx = EvalContext(self.store, float(ticks[-1]), frame.eids, frame.node_eids, frame.groups, frame.names,
                          frame.nodes, self.lookback, memo, [], frame.align, ticks, exist, births, ends)
        fires = rule.compiled.fires(ctx)
        E = len(frame.eids)
        if isinstance(fires, np.ndarray) and fires.ndim:
            fires = np.broadcast_to(fires, (T, E))
        else:
            fires = np.full((T, E), bool(fires))
        if exist is not None:
            fires = fires & exist
        full_ctx: list = []

        def full_at(j: int):
            if not full_ctx:
                fc = replace(ctx, evidence=[])
                rule.compiled.fn(fc)
                full_ctx.append(fc)
            return _TickEvidence(full_ctx[0].evidence, j)

        res = []
        any_true = np.count_nonzero(fires, axis=1).tolist()
        for j in range(T):
            true_idx = fires[j].nonzero()[0] if any_true[j] else np.empty(0, dtype=np.int64)
            res.append(self._transition(rule, frame, ctx, true_idx, float(ticks[j]),
                                        full=lambda j=j: full_at(j), end=float(ends[j])))
        return res

    def _existence(self, rule: Rule, frame: _Frame, T: int, births: dict) -> np.ndarray | None:
        """[ticks x entities]: which of the frame's entities had a row, in a signal that makes the
        rule's frame, at each tick (the frame is built from the store as it is at the end)."""
        want = Scope.NODE if rule.scope in (Scope.TP_GROUP, Scope.CLUSTER) else rule.scope
        first = np.full(len(frame.eids), T, dtype=np.int64)
        for s in sorted(rule.compiled.signals):
            if self.store.catalogue[s].scope != want:
                continue
            for blk in self.store.signal_blocks(s):
                nr = blk.nrows
                b = births.get(id(blk))
                b = np.zeros(nr, dtype=np.int64) if b is None else b[:nr]
                pos = np.searchsorted(frame.eids, blk.eids[:nr])
                pos = np.minimum(pos, len(frame.eids) - 1)
                hit = frame.eids[pos] == blk.eids[:nr]
                np.minimum.at(first, pos[hit], b[hit])
        if not first.any():
            return None
        return np.arange(T)[:, None] >= first[None, :]

    def _rule_per_tick(self, rule: Rule, ticks: np.ndarray, ends: np.ndarray, births: dict,
                       out: list[list[Finding]], errors: dict) -> None:
        """One rule tick by tick, as ``evaluate`` does it: an error skips the rule at that tick
        only. Each tick is a range of one (its own store bounds and rows, a fresh memo)."""
        frame = self._frame(rule)
        for j, t in enumerate(ticks):
            b = {k: (v > j).astype(np.int64) for k, v in births.items()}
            try:
                found = self._rule_range(rule, frame, ticks[j: j + 1], ends[j: j + 1], b, {})
            except _EVAL_ERRORS as e:
                errors[rule.id] = f"{type(e).__name__}: {e}"
                continue
            except _EvidenceError as e:
                errors[rule.id] = str(e)
                continue
            out[j].extend(found[0])

    def _group_per_tick(self, rule: Rule, ticks: np.ndarray, out: list[list[Finding]], errors: dict) -> None:
        """A group-scope rule at each tick through the per-tick path (the store must be as at
        every tick: no rows born and no samples after the first tick)."""
        for j, t in enumerate(ticks):
            now = float(t)
            frame = self._frame(rule)
            try:
                ctx, true_idx = self._tick_context(rule, frame, now, {})
            except _EVAL_ERRORS as e:
                errors[rule.id] = f"{type(e).__name__}: {e}"
                continue
            try:
                out[j].extend(self._transition(rule, frame, ctx, true_idx, now))
            except _EvidenceError as e:
                errors[rule.id] = str(e)

    def _frame(self, rule: Rule) -> _Frame | None:
        sigs = rule.compiled.signals
        key = self._frame_keys.get(rule.id)
        if key is None or key[0] is not rule:
            key = self._frame_keys[rule.id] = (rule, (rule.scope, frozenset(sigs), rule.peers_by))
        key = key[1]
        reg = self.store.registry
        cached = self._frames.get(key)
        if cached and cached[0] == self.store.version and cached[1] == reg.version:
            return cached[2]
        frame = self._build_frame(rule.scope, sigs, rule.peers_by)
        self._frames[key] = (self.store.version, reg.version, frame)
        return frame

    def _build_frame(self, scope: Scope, sigs: set[str], peers_by: tuple[str, ...] = ()) -> _Frame:
        store = self.store
        reg = store.registry
        group_scope = scope in (Scope.TP_GROUP, Scope.CLUSTER)
        want = Scope.NODE if group_scope else scope
        parts = [store.entities(s) for s in sorted(sigs) if store.catalogue[s].scope == want]
        eids = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
        keys = [reg.keys[e] for e in eids]
        nodes = np.array([k[1] for k in keys], dtype=object)
        names = np.array([k[2] for k in keys], dtype=object)
        node_eids = np.array([reg.node_id(n) for n in nodes], dtype=np.int64)
        group_labels: list[dict[str, str]] = [{} for _ in keys]
        if group_scope:
            label = "tp_group" if scope == Scope.TP_GROUP else "cluster"
            vals = [reg.node_labels.get(n, {}).get(label, "" if label == "cluster" else None) for n in nodes]
            keep = np.array([v is not None for v in vals], dtype=bool)
            eids, nodes, names, node_eids = eids[keep], nodes[keep], names[keep], node_eids[keep]
            vals = [v for v in vals if v is not None]
            group_labels = [{label: v} if v else {} for v in vals]
            if peers_by:  # peers share the group label and every peers_by label (missing: "")
                by = [tuple(reg.node_labels.get(n, {}).get(b, "") for b in peers_by) for n in nodes]
                vals = [(v, *b) for v, b in zip(vals, by)]
                group_labels = [{**g, **{k: x for k, x in zip(peers_by, b) if x}} for g, b in zip(group_labels, by)]
            codes = {v: i for i, v in enumerate(sorted(set(vals)))}
            groups = np.array([codes[v] for v in vals], dtype=np.int64)
        elif scope == Scope.NODE:
            groups = np.zeros(len(eids), dtype=np.int64)
        elif scope == Scope.RANK:
            # a rank's peers are its communicator's other ranks on the node (``<comm>/r<rank>``):
            # the ranks of another communicator run other collectives, sizes and timings
            comms = [(int(ne), str(nm).rpartition("/")[0]) for ne, nm in zip(node_eids, names)]
            codes = {c: i for i, c in enumerate(sorted(set(comms)))}
            groups = np.array([codes[c] for c in comms], dtype=np.int64)
        else:
            groups = node_eids.copy()
        # the node eids may have been created just now: a later frame build sees them cached
        return _Frame(eids, node_eids, groups, names, nodes, group_labels)

    def _transition(self, rule: Rule, frame: _Frame | None, ctx: EvalContext | None, true_idx: np.ndarray,
                    now: float, full: Any = None, end: float | None = None) -> list[Finding]:
        """The alert state changes of one rule at ``now``. Range evaluation passes ``full``,
        this tick's evidence (per tick it comes from re-running the full expression), and
        ``end``, the store's latest sample time at this tick (samples after it are later ticks')."""
        self._note_evaluation(rule, now)
        states = self.states.setdefault(rule.id, {})
        if not states and not len(true_idx):  # the common case: nothing true, nothing pending
            self.held.pop(rule.id, None)
            return []
        out: list[Finding] = []
        seen: set[str] = set()
        hits = []
        need_evidence = False
        keys = frame.keys.get(rule.id) if len(true_idx) else None
        if keys is None and len(true_idx):
            keys = frame.keys[rule.id] = [None] * len(frame.eids)
        for i in true_idx.tolist():
            key = keys[i]
            if key is None:
                key = keys[i] = self._alert_key(rule, frame, i)
            node, entity, labels, fp = key
            st = states.get(fp)
            hits.append((i, node, entity, labels, fp, st))
            if st is None or (st.state is State.PENDING and now - st.active_at >= rule.for_s):
                need_evidence = True
        if need_evidence and full is not None:  # range evaluation: this tick's slice of its values
            ctx = full()
        elif need_evidence:
            # ``fires`` may have skipped functions whose values the evidence reports: evaluate
            # the full expression once (window results come from this tick's memo). Done
            # before any state changes, so a failure leaves the rule as if not evaluated.
            full = replace(ctx, evidence=[])
            try:
                rule.compiled.fn(full)
            except _EVAL_ERRORS as e:
                raise _EvidenceError(f"{type(e).__name__}: {e}") from None
            ctx = full
        for i, node, entity, labels, fp, st in hits:
            seen.add(fp)
            if st is None:
                st = Alert(rule.id, node, entity, State.PENDING, now, now, None, _evidence(ctx, i), dict(labels))
                states[fp] = st
                if rule.for_s <= 0:
                    st.state, st.fired_at = State.FIRING, now
                out.append(self._finding(rule, st, now))
                continue
            st.last_true_at = now
            if st.state is State.PENDING and now - st.active_at >= rule.for_s:
                st.state, st.fired_at = State.FIRING, now
                # evidence is gathered when a transition is published, not on every tick
                st.evidence = _evidence(ctx, i)
                out.append(self._finding(rule, st, now))
        held: set[str] = set()
        for fp in list(states):
            if fp in seen:
                continue
            st = states[fp]
            if st.state is State.PENDING:
                del states[fp]
            elif st.state is State.FIRING:
                if rule.keep_firing_for_s > 0 and now - st.last_true_at < rule.keep_firing_for_s:
                    continue
                if self._no_evidence_of_end(rule, st, now, now if end is None else end):
                    held.add(fp)
                    continue
                st.state = State.RESOLVED
                out.append(self._finding(rule, st, now, resolved_at=now))
                del states[fp]
        if held:
            self.held[rule.id] = held
        else:
            self.held.pop(rule.id, None)
        return out

    def _no_evidence_of_end(self, rule: Rule, st: Alert, now: float, until: float) -> bool:
        """Whether a firing alert that is not true at ``now`` must be held rather than resolved
        (module doc): the rule's windows are still refilling after an evaluation gap, or the
        entity has no sample of the rule's signals within the rule's window (up to ``until``,
        the store's latest sample time at this tick) while the store still has a row of it -
        its data stopped: unknown, not healthy. Without a row the entity is gone: resolve."""
        if now < self._refill_until.get(rule.id, -np.inf):
            return True
        window = rule.compiled.max_window or self.lookback
        group = rule.scope in (Scope.TP_GROUP, Scope.CLUSTER)
        known = False
        for sig in rule.compiled.signals:
            blk = self.store.blocks.get(sig, {}).get(st.node)
            if blk is None:
                continue
            row = blk.rows.get("" if group or blk.scope is Scope.NODE else st.entity)
            if row is None:
                continue
            known = True
            _, vals = blk.window(now - window, min(now, until))
            if vals.shape[1] and not np.isnan(vals[row]).all():
                return False  # data within the window: its verdict stands
        return known

    def _alert_key(self, rule: Rule, frame: _Frame, i: int) -> tuple[str, str, dict[str, str], str]:
        node, entity = str(frame.nodes[i]), str(frame.names[i])
        labels = {**rule.labels, **frame.group_labels[i]}
        fkey = (rule.id, int(frame.eids[i]), tuple(sorted(labels.items())))
        fp = self._fp_cache.get(fkey)
        if fp is None or fp[0] != (node, entity):
            fp = ((node, entity), fingerprint(rule.id, node, entity, labels))
            self._fp_cache[fkey] = fp
        return node, entity, labels, fp[1]

    def _finding(self, rule: Rule, st: Alert, now: float, resolved_at: float | None = None) -> Finding:
        summary = _render(rule.summary or rule.desc, st, rule.params)
        return Finding(
            rule_id=rule.id, pathology=rule.pathology, severity=rule.severity, layer=rule.layer,
            scope=rule.scope, node=st.node, entity=st.entity, state=st.state, active_at=st.active_at,
            evaluated_at=now, fired_at=st.fired_at, resolved_at=resolved_at, labels=dict(st.labels),
            evidence=dict(st.evidence), params=_plain_params(rule.params), mitigation=rule.mitigation,
            summary=summary, cluster=self.cluster, maturity=rule.maturity,
        )

    def evaluates(self, rule: Rule) -> bool:
        return self.scopes is None or rule.scope in self.scopes

    # -- introspection ------------------------------------------------------------------------
    def alerts(self) -> list[Alert]:
        """Current pending and firing alerts, in a stable order."""
        out = [st for r in self.rules.rules for st in self.states.get(r.id, {}).values()]
        return sorted(out, key=lambda s: (s.rule_id, s.node, s.entity))

    def open_findings(self, now: float) -> list[Finding]:
        """Every pending and firing alert as a finding evaluated at ``now``: same state,
        activation (so the same ``id``), firing time and evidence as its last transition.
        Transitions are sent once; this is what a consumer that lost track of alerts still
        open (a controller that resolved them while their node was cut off) is told again."""
        rules = self.rules.by_id()
        return [self._finding(rules[st.rule_id], st, now) for st in self.alerts() if st.rule_id in rules]


_EVAL_ERRORS = (FloatingPointError, ValueError, IndexError, TypeError)


class _EvidenceError(Exception):
    """The full evaluation for evidence failed: the rule is skipped this tick."""


class _TickEvidence:
    """One tick's row of a range evaluation's evidence, read as a per-tick context's."""

    __slots__ = ("evidence",)

    def __init__(self, evidence: list, j: int) -> None:
        self.evidence = [(label, arr[j] if isinstance(arr, np.ndarray) and arr.ndim == 2 else arr)
                         for label, arr in evidence]


def _evidence(ctx: Any, i: int) -> dict[str, float | None]:
    if ctx is None:
        return {}
    ev: dict[str, float | None] = {}
    for label, arr in ctx.evidence:
        v = arr[i] if isinstance(arr, np.ndarray) and arr.ndim else arr
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        ev[label] = None if f != f else round(f, 9)
    return ev


def _plain_params(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if isinstance(v, (int, float, str))}


def _render(template: str, st: Alert, params: Mapping[str, Any]) -> str:
    """``{node}``, ``{entity}`` and ``{param}`` placeholders only: no format-spec, no attributes."""
    import re

    values = {"node": st.node, "entity": st.entity or st.node, **{k: str(v) for k, v in params.items()}}
    return re.sub(r"\{([a-z_][a-z0-9_]*)\}", lambda m: values.get(m.group(1), m.group(0)), template)
