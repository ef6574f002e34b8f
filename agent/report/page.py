"""The post-mortem page, incident first: for each incident the controller published, a headline
card (what, where, cause, when, impact, suggested actions) with its evidence below it; then the
findings grouped by rule and node; the rules and the bundle folded away at the end. A run in
which nothing fired says so in one line.
"""
from __future__ import annotations

import html
import math
import re
from typing import Any

import numpy as np

from skewd import __version__
from skewd.model import SignalSpec

from ..replay.core import ReplayResult
from ..replay.diff import Occurrence
from ..replay.output import fmt_t, utc
from . import data as report_data
from . import svg
from .units import duration, human, is_state

e = html.escape
MAX_HEAT_ROWS = 24


def _clock(t: float | None) -> str:
    """Time of day with the full UTC time in the tooltip."""
    if t is None or not math.isfinite(t):
        return "–"
    d = utc(t)
    if d is None:
        return e(fmt_t(t))
    return f"<time title='{fmt_t(t)}'>{d.strftime('%H:%M:%S')}</time>"


def _pathology_title(pid: str) -> str:
    from skewd.rules.pathologies import PATHOLOGIES

    p = PATHOLOGIES.get(pid)
    return p.title if p is not None else ""


def _fill(template: str, o: Occurrence, params: dict[str, Any]) -> str:
    """``{node}``, ``{entity}`` and ``{param}`` placeholders, as the engine fills summaries."""
    values = {"node": o.node, "entity": o.entity or o.node, **{k: str(v) for k, v in params.items()}}
    return re.sub(r"\{([a-z_][a-z0-9_]*)\}", lambda m: values.get(m.group(1), m.group(0)), template)


def _evidence_unit(label: str, catalogue: dict[str, SignalSpec]) -> str:
    """The unit of an evidence value, from the signal its expression reads."""
    for name in re.findall(r"[a-z][a-z0-9_]+", label):
        if name in catalogue:
            spec = catalogue[name]
            if label.startswith(("rate(", "increase(")) or spec.kind.value == "counter" and label.startswith("rate"):
                return report_data.plotted_unit(name, catalogue)
            if label.startswith(("count(", "changes(", "resets(")):
                return ""
            return spec.unit
    return ""


def _constant(series: list[report_data.Series]) -> bool:
    vals = [s.v[~np.isnan(s.v)] for s in series]
    allv = np.concatenate(vals) if vals else np.empty(0)
    return len(allv) == 0 or bool((allv == allv[0]).all())


def _on_share(series: list[report_data.Series], a: float, b: float) -> float:
    vals = [s.v[(s.t >= a) & (s.t <= b) & ~np.isnan(s.v)] for s in series]
    allv = np.concatenate(vals) if vals else np.empty(0)
    return float((allv >= 0.5).mean()) if len(allv) else 0.0


def _state_tells(cmp: report_data.Comparison, onset: float, end: float) -> bool:
    """A state belongs in the evidence when the culprit's is on during the incident clearly more
    than before it and than its peers' (a flag that is always on, everywhere, explains nothing)."""
    during = _on_share(cmp.culprit, onset, end)
    before = _on_share(cmp.culprit, -np.inf, onset)
    peers = _on_share(cmp.peers, onset, end) if cmp.peers else 0.0
    return during - before >= 0.25 and during - peers >= 0.25


def _evidence(o: Occurrence, catalogue: dict[str, SignalSpec]) -> str:
    return "<br>".join(f"<span class='ev'><code>{e(k)}</code> = {e(human(v, _evidence_unit(k, catalogue)))}</span>"
                       for k, v in sorted(o.evidence.items())) or "–"


class Page:
    """Builds one report from a replay result (deterministic: same result, same bytes)."""

    def __init__(self, result: ReplayResult, title: str) -> None:
        self.r = result
        self.title = title
        self.rules = {r.id: r for rs in result.rulesets.values() for r in rs.rules}
        self.catalogue: dict[str, SignalSpec] = {}
        from ..summary import CATALOGUE as SUMMARY_CATALOGUE

        for s in SUMMARY_CATALOGUE:
            self.catalogue[s.name] = s
        try:
            from skewd.catalogue import full_catalogue

            for s in full_catalogue().values():
                self.catalogue.setdefault(s.name, s)
        except Exception:  # noqa: BLE001 - a broken collector package: the bundle's snapshot still describes it
            pass
        for seg in result.segments:
            for s in seg.catalogue():
                self.catalogue.setdefault(s.name, s)
        self.present: set[str] = set()
        for seg in result.segments:
            self.present.update(seg.meta.get("signals") or [])
        for m in result.summaries:
            self.present.update(m.signals)
        if not self.present:
            for seg in result.segments:
                self.present.update(seg.samples().signals())
        if result.evaluations and result.end > result.start:
            self.t0, self.t1 = result.start, result.end
        else:
            self.t0 = min((s.start for s in result.segments if math.isfinite(s.start)), default=0.0)
            self.t1 = max((s.end for s in result.segments if math.isfinite(s.end)), default=self.t0 + 1.0)
            self.t1 = max(self.t1, self.t0 + 1.0)
        self.occ = report_data.all_occurrences(result)
        self.cards = report_data.cards(result, self.occ, self.t1)
        self.groups = report_data.finding_groups(result, self.occ, self.cards, self.rules)

    # -- page ------------------------------------------------------------------------------------
    def render(self) -> str:
        r = self.r
        out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
               '<meta name="viewport" content="width=device-width, initial-scale=1">',
               f"<title>{e(self.title)}</title><style>{CSS}</style></head><body>"]
        cluster = r.segments[0].cluster if r.segments else ""
        shown = [c for c in self.cards if not c.held]
        fired = sum(1 for o in self.occ if o.fired_at is not None)
        out.append(f"<header><h1>{e(self.title)}</h1><div class='meta'>cluster <b>{e(cluster or '–')}</b> · "
                   f"{len(r.nodes)} node{'s' if len(r.nodes) != 1 else ''} ({e(', '.join(r.nodes[:8]) or '–')}"
                   f"{'…' if len(r.nodes) > 8 else ''}) · {fmt_t(self.t0)} → {fmt_t(self.t1)} "
                   f"({duration(self.t1 - self.t0)}) · {len(shown)} incident{'s' if len(shown) != 1 else ''} · "
                   f"{fired} fired finding{'s' if fired != 1 else ''} · skewd {e(__version__)}</div></header><main>")
        if r.damage or r.stopped_early:
            out.append("<section id='damage' class='panel'><h2 class='bad'>Damaged input</h2><p>Everything before the "
                       "damage was replayed.</p><ul>")
            out += [f"<li class='mono'>{e(str(d))}</li>" for d in r.damage]
            out += [f"<li class='mono'>{e(n)}</li>" for n in r.stopped_early]
            out.append("</ul></section>")
        if not self.cards and not fired:
            what = "the controller opened no incident" if r.controller else "the controller did not run"
            out.append(f"<p class='quiet' id='quiet'>Quiet: no rule fired and {what} on {len(r.nodes)} "
                       f"node{'s' if len(r.nodes) != 1 else ''} between {fmt_t(self.t0)} and {fmt_t(self.t1)} "
                       f"({r.evaluations} evaluations).</p>")
        elif not self.cards:
            why = ("no finding lasted into a published incident" if r.controller
                   else "replayed without the controller (--no-controller)")
            out.append(f"<p class='quiet' id='no-incidents'>No incident: {e(why)}; the findings are below.</p>")
        for k, c in enumerate(self.cards):
            out.append(self.card(c, k))
        out.append(self.findings())
        out.append(self.heatmaps())
        out.append(self.rules_section())
        out.append(self.bundle_section())
        out.append(f"</main><script>{JS}</script></body></html>")
        return "\n".join(out) + "\n"

    # -- incident card ---------------------------------------------------------------------------
    def card(self, c: report_data.Card, k: int) -> str:
        inc, st = c.incident, c.story
        title = _pathology_title(inc.pathology)
        culprit = inc.culprit
        where_node = culprit.node if culprit is not None and culprit.node else ""
        where = (f"<b class='culprit'>{e(where_node)}</b>" + (f" <span class='entity'>{e(culprit.entity)}</span>"
                                                               if culprit is not None and culprit.entity else "")
                 if where_node else f"<b class='culprit'>{e(', '.join(inc.victims) or 'cluster')}</b>")
        head_where = (f"on {e(where_node)}" + (f"/{e(culprit.entity)}" if culprit is not None and culprit.entity else "")
                      if where_node else f"across {e(', '.join(inc.victims[:4]) or 'the cluster')}")
        status = ("held, never published" if c.held else
                  "resolved" if st.closed_as == "resolved" else
                  f"taken over by {st.last.inhibited_by}" if st.closed_as == "inhibited" and st.last else
                  "open at the end of the recording")
        rows = []
        rows.append(("What", f"<b>{e(inc.pathology)}</b> {e(title)} <span class='note'>rule {e(inc.rule_id)} · "
                             f"incident <span class='mono'>{e(inc.id)}</span> · {e(status)}</span>"))
        grp = culprit.tp_group if culprit is not None and culprit.tp_group else inc.group.get("tp_group", "")
        victims = [v for v in inc.victims if v != where_node]
        rows.append(("Where", where + (f" <span class='note'>in TP group {e(grp)}</span>" if grp else "")
                     + (f"<br><span class='note'>waiting on it: {e(', '.join(victims))}</span>"
                        if victims and where_node else "")))
        if inc.cause is not None:
            rows.append(("Cause", f"<span class='layer {e(inc.cause.layer)}'>{e(inc.cause.layer)}</span> "
                                  f"{e(inc.cause.reason)} <span class='note'>({inc.cause.confidence:.0%} confident)</span>"))
        end = (f"resolved {_clock(st.closed_at)} (after {duration(st.closed_at - c.onset)})"
               if st.closed_at is not None else "still open when the recording ends")
        rows.append(("When", f"onset {_clock(c.onset)} · detected {_clock(inc.opened_at)} "
                             f"(+{duration(inc.opened_at - c.onset)}) · "
                             + (f"published {_clock(st.published_at)} · " if not c.held else "")
                             + end))
        rows.append(("Impact", self._impact(inc)))
        dl = "".join(f"<dt>{e(a)}</dt><dd>{b}</dd>" for a, b in rows)
        out = [f"<section class='incident panel' id='incident-{k}' data-incident='{e(inc.id)}'>",
               "<div class='head'><div class='facts'>",
               f"<h2 class='headline'><span class='pid'>{e(inc.pathology)}</span> {e(title or inc.rule_id)} "
               f"{head_where}</h2><dl>{dl}</dl></div>",
               self._actions(c), "</div>"]
        out.append(self._evidence(c, k))
        if c.symptoms:
            out.append(self._symptoms(c))
        out.append("</section>")
        return "".join(out)

    def _impact(self, inc: Any) -> str:
        parts = []
        ph = inc.phase
        if ph is not None and ph.phase and ph.phase != "unknown":
            kv = f", KV {ph.kv_usage_ratio:.0%}" if ph.kv_usage_ratio is not None else ""
            wait = f", {ph.waiting:.0f} waiting" if ph.waiting is not None else ""
            parts.append(f"engine {e(ph.engine)} in <b>{e(ph.phase)}</b>{kv}{wait}")
        ef = inc.effect
        if ef is not None and (ef.ttft_s is not None or ef.itl_s is not None):
            if ef.ttft_s is not None:
                base = f" (before: {human(ef.ttft_baseline_s, 'seconds')})" if ef.ttft_baseline_s is not None else ""
                parts.append(f"TTFT <b>{human(ef.ttft_s, 'seconds')}</b>{base}")
            if ef.itl_s is not None:
                base = f" (before: {human(ef.itl_baseline_s, 'seconds')})" if ef.itl_baseline_s is not None else ""
                parts.append(f"ITL <b>{human(ef.itl_s, 'seconds')}</b>{base}")
            if ef.queue_growth_per_s:
                parts.append(f"queue +{ef.queue_growth_per_s:.2g}/s")
        else:
            parts.append("<span class='note'>TTFT/ITL effect not observed (no engine timing data)</span>")
        return " · ".join(parts)

    def _actions(self, c: report_data.Card) -> str:
        s = c.suggestion
        if s is None:
            why = ("the incident was still held when the recording ended" if c.held else
                   "the controller's planner has no remap for this pathology and cause")
            mits: dict[str, str] = {}
            for o in c.members:
                r = self.rules.get(o.rule_id)
                if r is not None and r.mitigation:
                    mits.setdefault(_fill(r.mitigation, o, r.params), o.rule_id)
            items = "".join(f"<li class='action mitigation'><div class='act'><b>{e(m)}</b></div>"
                            f"<div class='why'>from rule {e(rid)}</div></li>" for m, rid in mits.items())
            return (f"<div class='actions'><h3>Suggested actions</h3><p class='note none'>No remap suggestion: "
                    f"{e(why)}." + (" What the rules advise:" if mits else "") + "</p>"
                    + (f"<ol>{items}</ol>" if items else "") + "</div>")
        items = []
        for a in s.actions:
            tgt = a.target.node or a.target.tp_group or "-"
            if a.target.entity:
                tgt += f"/{a.target.entity}"
            cmd = f"<code class='cmd'>{e(a.command)}</code>" if a.command else ""
            items.append(f"<li class='action'><div class='act'><b>{e(a.type.value.replace('_', ' '))}</b> → "
                         f"<span class='mono'>{e(tgt)}</span><span class='conf' title='confidence'><span class='bar'>"
                         f"<i style='width:{a.confidence * 100:.0f}%'></i></span>{a.confidence:.0%}</span></div>"
                         f"<div class='why'>{e(a.rationale)}</div>{cmd}</li>")
        return (f"<div class='actions' id='suggestion-{e(s.key)}'><h3>Suggested actions "
                f"<span class='note'>{_clock(s.created_at)}, least disruptive first</span></h3>"
                f"<ol>{''.join(items)}</ol></div>")

    def _evidence(self, c: report_data.Card, k: int) -> str:
        sigs = report_data.evidence_signals(c, self.rules, self.catalogue, self.present)
        t0, t1 = max(c.t0, self.t0 - 1.0), min(c.t1, self.t1 + 1.0)
        if t1 <= t0:
            t0, t1 = self.t0, self.t1
        series = report_data.load_series(self.r, sigs, self.catalogue, t0, t1)
        inc = c.incident
        marks = [(c.onset, "onset", "onset"), (inc.opened_at, "detected", "detected (incident opened)")]
        if not c.held:
            marks.append((c.story.published_at, "published", "published (after group_wait)"))
        span = (inc.opened_at, c.story.closed_at if c.story.closed_at is not None else t1)
        plots = []
        for j, sig in enumerate(sigs):
            if len(plots) >= report_data.MAX_EVIDENCE:
                break
            unit = report_data.plotted_unit(sig, self.catalogue)
            cmp = report_data.compare(c, sig, series.get(sig) or [], unit)
            if cmp is None or _constant([*cmp.culprit, *cmp.peers]):
                continue  # nothing of the culprit's, or nothing that moved: no story in it
            if is_state(unit) and not _state_tells(cmp, c.onset, span[1]):
                continue  # a state that was as it is before the onset, or on the peers too
            spec = self.catalogue.get(sig)
            desc = f"<span class='note'>{e(spec.desc)}</span>" if spec is not None and spec.desc else ""
            pid = f"{k}-{j}"
            if is_state(unit):
                rows = [(s.label, s, True) for s in cmp.culprit] + [(s.label, s, False) for s in cmp.peers[:8]]
                body = svg.state_bands(rows, t0, t1, marks, pid)
                legend = "<span><i class='sw on'></i>culprit on</span><span><i class='sw peer'></i>peer on</span>"
            else:
                body = svg.band_plot(cmp, t0, t1, marks, span, pid)
                legend = "".join(f"<span><i style='background:{svg.CULPRIT[n % len(svg.CULPRIT)]}'></i>{e(s.label)}</span>"
                                 for n, s in enumerate(cmp.culprit))
                if cmp.peers:
                    legend += (f"<span><i class='sw band'></i>peers ({len(cmp.peers)} {e(cmp.family or 'node')} "
                               f"series on {e(', '.join(sorted({s.node for s in cmp.peers}))[:60])}): "
                               f"min–max, median dashed</span>")
                else:
                    legend += "<span class='note'>no like-for-like peer to compare with</span>"
            note = f" <span class='note'>({e(cmp.note)})</span>" if cmp.note else ""
            plots.append(f"<figure class='evplot'><figcaption><code>{e(sig)}</code> in {e(unit or 'units')}{note} "
                         f"{desc}</figcaption>{body}<div class='legend'>{legend}</div></figure>")
        if not plots:
            return ("<div class='evidence'><p class='note'>No recorded signal of the incident's rules in its window "
                    "(the bundle holds none of them).</p></div>")
        return f"<div class='evidence'><h3>Evidence: the culprit against its peers</h3><div class='evgrid'>" \
               f"{''.join(plots)}</div></div>"

    def _symptoms(self, c: report_data.Card) -> str:
        by: dict[tuple[str, str], list[Occurrence]] = {}
        for o in c.symptoms:
            by.setdefault((o.rule_id, o.node), []).append(o)
        what = ", ".join(f"{rid} on {node}" + (f" ({len(os)} entities)" if len({o.entity for o in os}) > 1 else "")
                         for (rid, node), os in sorted(by.items()))
        rows = "".join(
            f"<tr><td>{e(o.rule_id)}</td><td>{e(o.node)}</td><td>{e(o.entity or '–')}</td>"
            f"<td>{_clock(o.fired_at)}</td><td>{_clock(o.resolved_at)}</td><td>{e(o.summary)}</td></tr>"
            for o in sorted(c.symptoms, key=lambda o: (o.fired_at or o.active_at, o.rule_id, o.node, o.entity)))
        return (f"<details class='symptoms'><summary>Explains {len(c.symptoms)} symptom"
                f"{'s' if len(c.symptoms) != 1 else ''} (inhibited findings): {e(what)}</summary>"
                f"<table><thead><tr><th>Rule</th><th>Node</th><th>Entity</th><th>Fired</th><th>Resolved</th>"
                f"<th>Summary</th></tr></thead><tbody>{rows}</tbody></table></details>")

    # -- findings --------------------------------------------------------------------------------
    def findings(self) -> str:
        if not self.groups:
            return ""
        fired = [g for g in self.groups if g.fired]
        pending = [g for g in self.groups if not g.fired]
        out = ["<section id='findings' class='panel'><h2>Findings by rule and node</h2>"
               "<p class='note'>Each row is one rule on one node; open it for its entities.</p>"]
        for g in fired:
            out.append(self._group(g))
        if pending:
            out.append(f"<details class='pending'><summary>{len(pending)} rule×node pair"
                       f"{'s' if len(pending) != 1 else ''} went pending without firing</summary>")
            out += [self._group(g) for g in pending]
            out.append("</details>")
        out.append("</section>")
        return "".join(out)

    def _group(self, g: report_data.FindingGroup) -> str:
        r = self.rules.get(g.rule_id)
        fired = g.fired
        first = min((o.fired_at for o in fired if o.fired_at is not None), default=None)
        ends = [o.resolved_at for o in fired]
        last = None if any(x is None for x in ends) or not ends else max(x for x in ends if x is not None)
        member_of = next((c.story.id for c in self.cards if any(o in c.members for o in fired)), "")
        status = (f"symptom of incident {g.inhibited_by}" if g.inhibited_by else
                  f"in incident {member_of}" if member_of else
                  ("ongoing at the end" if fired and last is None else "") if fired else "pending only")
        ent = f"{g.entities} entit{'y' if g.entities == 1 else 'ies'}"
        rows = []
        for o in g.occurrences[:200]:
            end = o.resolved_at if o.resolved_at is not None else self.t1
            dur = duration(end - o.fired_at) if o.fired_at is not None else "–"
            rows.append(f"<tr><td class='mono'>{e(o.entity or '–')}</td><td>{_clock(o.active_at)}</td>"
                        f"<td>{_clock(o.fired_at)}</td><td>{_clock(o.resolved_at) if o.resolved_at is not None else ('ongoing' if o.fired_at is not None else 'never fired')}</td>"
                        f"<td>{dur}</td><td>{_evidence(o, self.catalogue)}</td></tr>")
        more = (f"<p class='note'>{len(g.occurrences) - 200} more occurrences not listed.</p>"
                if len(g.occurrences) > 200 else "")
        mit = (f"<p class='mitigation'><b>Mitigation:</b> {e(_fill(r.mitigation, g.occurrences[0], r.params))}</p>"
               if r is not None and r.mitigation else "")
        summ = e(g.occurrences[0].summary) if g.occurrences and g.occurrences[0].summary else ""
        return (f"<details class='fgroup' data-rule='{e(g.rule_id)}' data-node='{e(g.node)}'><summary>"
                f"<span class='sev {e(g.severity)}'>{e(g.severity)}</span><b>{e(g.rule_id)}</b>"
                f"<span class='note'>{e(g.pathology)} {e(_pathology_title(g.pathology))}</span>"
                f"<span class='node'>{e(g.node)}</span><span class='count'>{e(ent)}</span>"
                f"<span class='when'>{_clock(first) if first is not None else '–'}</span>"
                f"<span class='note status'>{e(status)}</span></summary>"
                f"<div class='gbody'><p class='summary'>{summ}</p>{mit}<table class='occ'><thead><tr><th>Entity</th>"
                f"<th>Pending</th><th>Fired</th><th>Resolved</th><th>Duration</th><th>Evidence</th></tr></thead>"
                f"<tbody>{''.join(rows)}</tbody></table>{more}</div></details>")

    # -- heatmaps --------------------------------------------------------------------------------
    def heatmaps(self) -> str:
        """Skew across like-for-like entities of the first incident's main non-state signal."""
        if not self.cards:
            return ""
        c = self.cards[0]
        out = []
        for sig in report_data.evidence_signals(c, self.rules, self.catalogue, self.present):
            unit = report_data.plotted_unit(sig, self.catalogue)
            if is_state(unit):
                continue
            series = report_data.load_series(self.r, [sig], self.catalogue, self.t0, self.t1).get(sig) or []
            fams: dict[str, list[report_data.Series]] = {}
            for s in series:
                if len(s.t):
                    fams.setdefault(report_data.family(s.entity), []).append(s)
            for fam, ss in sorted(fams.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                if len(ss) < 3:
                    continue
                if len(ss) > MAX_HEAT_ROWS:
                    ss = sorted(sorted(ss, key=lambda s: -abs(report_data._mean(s)))[:MAX_HEAT_ROWS],
                                key=lambda s: (s.node, s.entity))
                    extra = f" — {MAX_HEAT_ROWS} largest of {len(fams[fam])}"
                else:
                    extra = ""
                out.append(f"<h3><code>{e(sig)}</code> · {e(fam or 'node')} entities{e(extra)}</h3>"
                           + svg.heatmap(ss, unit, self.t0, self.t1, f"{len(out)}"))
                break
            if out:
                break
        if not out:
            return ""
        return ("<section id='heatmaps' class='panel'><h2>Skew across like entities</h2><p class='note'>Each row one "
                "node/entity of one kind; colour is its deviation from the rows' median in each interval (red above, "
                "blue below).</p>" + "".join(out) + "</section>")

    # -- rules and bundle (folded) ---------------------------------------------------------------
    def rules_section(self) -> str:
        r = self.r
        recorded = sorted({str((seg.meta.get("rules") or {}).get("version") or "") for seg in r.segments} - {""})
        n = sum(len(rs.rules) for rs in r.rulesets.values())
        origin: dict[str, str] = {}
        for seg in r.segments:
            for f in (seg.meta.get("rules") or {}).get("files") or []:
                origin[str(seg.path / f["stored"])] = str(f["path"])

        def orig(src: str) -> str:
            for stored, path in origin.items():
                if src.startswith(stored):
                    return path + src[len(stored):]
            return src

        fired_by: dict[str, int] = {}
        for o in self.occ:
            if o.fired_at is not None:
                fired_by[o.rule_id] = fired_by.get(o.rule_id, 0) + 1
        out = [f"<details id='rules' class='panel'><summary><h2>Rules</h2> <span class='note'>Replayed with rule set "
               f"version{'s' if len(r.rulesets) > 1 else ''} <code>{e(', '.join(r.rulesets) or '–')}</code> ({n} rules); "
               f"the live agents ran <code>{e(', '.join(recorded) or 'unknown')}</code></span></summary>"]
        for ver, rs in r.rulesets.items():
            out.append(f"<h3>Version <code>{e(ver)}</code> — files: {e(', '.join(orig(f) for f in rs.files))}</h3>"
                       "<table class='rules'><thead><tr><th>Rule</th><th>Scope</th><th>Pathology</th><th>Severity</th>"
                       "<th>Digest</th><th>Source</th><th>Fired</th></tr></thead><tbody>")
            for rule in rs.rules:
                out.append(f"<tr><td><b>{e(rule.id)}</b>{'' if rule.enabled else ' (disabled)'}</td>"
                           f"<td>{e(rule.scope.value)}</td><td>{e(rule.pathology)}</td><td>{e(rule.severity.value)}</td>"
                           f"<td class='mono'>{e(rule.digest)}</td><td class='mono'>{e(orig(rule.source))}</td>"
                           f"<td>{fired_by.get(rule.id, 0)}</td></tr>")
            out.append("</tbody></table>")
        out.append("</details>")
        return "".join(out)

    def bundle_section(self) -> str:
        r = self.r
        rows = []
        for seg in r.segments:
            c = seg.meta.get("counts") or {}
            labels = "; ".join(f"{n}: " + ", ".join(f"{k}={v}" for k, v in sorted(lab.items()))
                               for n, lab in sorted(seg.node_labels.items()))
            rows.append(f"<tr><td class='mono'>{e(seg.path.parent.name + '/' + seg.path.name)}</td>"
                        f"<td>{e(', '.join(seg.nodes))}<br><span class='note'>{e(labels)}</span></td>"
                        f"<td class='mono'>{fmt_t(seg.start)}</td><td class='mono'>{fmt_t(seg.end)}</td>"
                        f"<td>{c.get('samples', '–')}</td><td>{c.get('ticks', '–')}</td><td>{c.get('findings', '–')}</td>"
                        f"<td>{e(str(seg.meta.get('skewd_version', '?')))}</td>"
                        f"<td>{'yes' if seg.meta.get('complete') else 'no (interrupted or still recording)'}</td></tr>")
        live = sum(len(seg.findings()) for seg in r.segments)
        node_tr = sum(1 for f in r.findings if not report_data.is_group(f))
        note = (f"<p class='note'>The live agents recorded {live} transitions of node rules; the replay produced "
                f"{node_tr}, and the controller {len(r.findings) - node_tr} of group rules.</p>")
        return (f"<details id='bundle' class='panel'><summary><h2>Bundle</h2> <span class='note'>{len(r.segments)} "
                f"segment{'s' if len(r.segments) != 1 else ''}</span></summary>{note}<table><thead><tr><th>Segment</th>"
                f"<th>Nodes</th><th>From</th><th>To</th><th>Samples</th><th>Ticks</th><th>Findings</th><th>skewd</th>"
                f"<th>Complete</th></tr></thead><tbody>{''.join(rows)}</tbody></table></details>")


CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f4f5f7}
header{background:#1d2330;color:#fff;padding:10px 24px}header h1{margin:0;font-size:18px;display:inline}
header .meta{color:#c8cdd8;font-size:13px;display:inline;margin-left:14px}
main{padding:4px 24px 40px;max-width:1840px;margin:0 auto}
.panel{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:12px 16px;margin:12px 0}
h2{font-size:17px;margin:0 0 8px}h3{font-size:14px;margin:10px 0 6px}
.quiet{font-size:15px;background:#fff;border:1px solid #dde1e8;border-left:4px solid #2e7d32;border-radius:6px;
padding:10px 14px;margin:12px 0}
.incident{border-left:5px solid #c62828}
.head{display:grid;grid-template-columns:minmax(0,1.05fr) minmax(0,1fr);gap:8px 28px;align-items:start}
@media (max-width:1100px){.head{grid-template-columns:minmax(0,1fr)}}
.headline{font-size:20px;margin:2px 0 8px;overflow-wrap:anywhere}.pid{background:#c62828;color:#fff;border-radius:4px;
padding:1px 7px;font-size:16px;margin-right:4px}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:4px 14px;margin:0}
dt{font-weight:600;color:#4b5563}dd{margin:0;overflow-wrap:anywhere}
.culprit{font-size:16px;color:#b71c1c}.entity{font-family:ui-monospace,Menlo,monospace;font-size:13px}
.layer{display:inline-block;border-radius:9px;padding:0 8px;background:#37474f;color:#fff;font-size:12px}
.actions ol{margin:0;padding-left:20px}.action{margin:0 0 8px}.act{display:flex;flex-wrap:wrap;gap:4px 10px;
align-items:center}.why{color:#374151;font-size:13px}
.conf{display:inline-flex;align-items:center;gap:6px;font-size:12px;color:#374151}
.conf .bar{display:inline-block;width:80px;height:6px;background:#e5e7eb;border-radius:3px;overflow:hidden}
.conf .bar i{display:block;height:6px;background:#2e7d32}
.cmd{display:block;white-space:pre-wrap;overflow-wrap:anywhere;background:#f3f4f6;border-radius:4px;padding:3px 6px;
margin-top:3px}
.evidence{margin-top:10px;border-top:1px solid #eef0f4}
.evgrid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:6px 20px}
.evplot{margin:0;min-width:0}figcaption{font-size:13px;margin:4px 0}
.plot{display:block;width:100%;height:auto}.axis{stroke:#6b7280;stroke-width:1}.grid{stroke:#e5e7eb}
.tick{font-size:11px;fill:#4b5563}.culprit-label{fill:#b71c1c;font-weight:600}
.culprit-line{fill:none;stroke-width:2}.peer-median{fill:none;stroke-width:1.2;stroke-dasharray:4 3}
.peer-band{fill:#90a4ae;opacity:.35;stroke:none}.incident-span{fill:#c62828;opacity:.06}
.mark{stroke-width:1.2}.mark.onset{stroke:#f9a825}.mark.detected{stroke:#c62828}.mark.published{stroke:#1565c0;
stroke-dasharray:3 2}
.state-off{fill:#eceff1}.state-on{fill:#78909c}.state-on.mine{fill:#c62828}
.legend{font-size:12px}.legend span{display:inline-block;margin:0 12px 2px 0}.legend i{display:inline-block;
width:14px;height:4px;margin-right:4px;vertical-align:middle}.sw.band{background:#90a4ae;height:8px}
.sw.on{background:#c62828;height:8px}.sw.peer{background:#78909c;height:8px}
details summary{cursor:pointer}details.panel>summary h2{display:inline;margin:0}
.symptoms{margin-top:8px;font-size:13px}
table{border-collapse:collapse;width:100%;font-size:13px;table-layout:auto}th,td{border-bottom:1px solid #e6e9ef;
padding:4px 7px;text-align:left;vertical-align:top;overflow-wrap:anywhere}th{background:#f0f2f6}
.fgroup{border-bottom:1px solid #eef0f4}.fgroup>summary{display:grid;grid-template-columns:80px minmax(0,1.4fr)
minmax(0,1.6fr) minmax(0,.8fr) 100px 80px minmax(0,1.2fr);gap:8px;align-items:center;padding:5px 2px}
.gbody{padding:4px 8px 10px 24px}.fgroup .summary{margin:2px 0}
.sev{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:12px;text-align:center}
.sev.critical{background:#d62728}.sev.warning{background:#e67e00}.sev.info{background:#1f77b4}
.note{color:#6b7280;font-size:12px}.bad{color:#b42318}.ev{white-space:normal}
code,.mono,time{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
"""

JS = "document.documentElement.setAttribute('data-ready','1');"
