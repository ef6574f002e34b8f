"""The HTML post-mortem report of a replay: one self-contained file, no external URL.

Plots are inline SVG built here (so the page shows without JavaScript, in a mail client or a
locked-down browser); a few lines of inline JS only add highlighting: clicking a finding
highlights its interval in the timelines. Sections: timelines of the key signals with the
findings' pending/firing intervals shaded, heatmaps of the main skew measures (per node and
entity, as deviation from the per-interval median of their peers), the findings table with
evidence, mitigation and (when the bundle carries them) root cause and suggestions, the rule
versions used, and the bundle's segments and damage.

Output is deterministic: the same replay result renders byte-identical HTML.
"""
from __future__ import annotations

import datetime as _dt
import html
import math
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from skewd import __version__
from skewd.model import Kind, SampleBatch

from .replay import Occurrence, ReplayResult, occurrences
from .replay.output import fmt_t as _fmt_t

#: Measures that show skew best, in order of preference, when present in the bundle.
MAIN_MEASURES = (
    "gpu_util_ratio", "gpu_power_watts", "pcie_gpu_rx_bytes_per_second", "pcie_gpu_tx_bytes_per_second",
    "rdma_port_xmit_bytes_total", "rdma_port_xmit_wait_total", "netdev_tx_bytes_total",
    "netdev_qdisc_backlog_bytes", "vllm_kv_cache_usage_ratio", "vllm_num_requests_waiting",
    "summary_gpu_util_mean_ratio", "summary_burst_start_seconds",
)
MAX_PLOTS = 6
MAX_SERIES = 10
MAX_HEATMAPS = 3
MAX_ROWS = 32
PLOT_BUCKETS = 300
HEAT_BUCKETS = 120
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22")
SEV_FILL = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}

e = html.escape


def _num(v: float | None, digits: int = 4) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}"


def _dur(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "–"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


def _clock(t: float | None) -> str:
    """Table cell: time of day with ms; the full UTC timestamp in the tooltip."""
    if t is None or not math.isfinite(t):
        return "–"
    d = _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc)
    return f"<span title='{_fmt_t(t)}'>{d.strftime('%H:%M:%S')}.{d.microsecond // 1000:03d}</span>"


def _hms(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%H:%M:%S")


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

class Series:
    def __init__(self, signal: str, node: str, entity: str, t: np.ndarray, v: np.ndarray) -> None:
        self.signal, self.node, self.entity, self.t, self.v = signal, node, entity, t, v

    @property
    def label(self) -> str:
        return f"{self.node}/{self.entity}" if self.entity else self.node


def _key_signals(result: ReplayResult, present: set[str], occ: Sequence[Occurrence]) -> list[str]:
    rules = {r.id: r for rs in result.rulesets.values() for r in rs.rules}
    out: list[str] = []
    for o in sorted(occ, key=lambda o: (o.fired_at if o.fired_at is not None else o.active_at, o.rule_id)):
        r = rules.get(o.rule_id)
        for s in (r.requires if r else []):
            if s in present and s not in out:
                out.append(s)
    out += [s for s in MAIN_MEASURES if s in present and s not in out]
    if len(out) < 2:  # nothing known to matter: show what there is
        out += sorted(s for s in present if s not in out and not s.startswith("summary_"))
    return out[:MAX_PLOTS]


def _series(result: ReplayResult, signals: list[str]) -> dict[str, list[Series]]:
    wanted = set(signals)
    nodes = set(result.nodes) if result.nodes else None
    parts: list[SampleBatch] = []
    for seg in result.segments:
        parts.append(seg.samples(wanted))
    allb = SampleBatch.concat(parts)
    sums: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for m in result.summaries:
        for name, ents in m.signals.items():
            if name in wanted:
                for ent, v in ents.items():
                    sums.setdefault((name, m.node, ent), []).append((m.t, np.nan if v is None else v))
    out: dict[str, list[Series]] = {s: [] for s in signals}
    for (name, node, ent), pts in sorted(sums.items()):
        if nodes is None or node in nodes:
            arr = np.array(sorted(pts), dtype=np.float64)
            out[name].append(Series(name, node, ent, arr[:, 0], arr[:, 1]))
    if not len(allb):
        return out
    keys = np.char.add(np.char.add(allb.signal.astype(str), "\x00"),
                       np.char.add(np.char.add(allb.node.astype(str), "\x00"), allb.entity.astype(str)))
    order = np.lexsort((allb.t, keys))
    ks = keys[order]
    cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
    for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(order)]))):
        idx = order[a:b]
        sig, node, ent = str(allb.signal[idx[0]]), str(allb.node[idx[0]]), str(allb.entity[idx[0]])
        if nodes is not None and node not in nodes:
            continue
        out[sig].append(Series(sig, node, ent, allb.t[idx], allb.value[idx]))
    return out


def _rate(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counter → per-second rate between consecutive samples; a decrease (reset) gives a gap."""
    if len(t) < 2:
        return t[:0], v[:0]
    dt = np.diff(t)
    dv = np.diff(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where((dt > 0) & (dv >= 0), dv / np.where(dt > 0, dt, 1.0), np.nan)
    return t[1:], r


def _bucket(t: np.ndarray, v: np.ndarray, t0: float, t1: float, n: int) -> np.ndarray:
    """Mean of finite values per time bucket (NaN where a bucket has none)."""
    out = np.full(n, np.nan)
    ok = np.isfinite(v)
    if not ok.any() or t1 <= t0:
        return out
    idx = np.clip(((t[ok] - t0) / (t1 - t0) * n).astype(np.int64), 0, n - 1)
    sums = np.bincount(idx, weights=v[ok], minlength=n)
    cnt = np.bincount(idx, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(cnt > 0, sums / np.maximum(cnt, 1), np.nan)
    return out


def _hold(b: np.ndarray, t: np.ndarray, width: float) -> np.ndarray:
    """Carry a value into following empty buckets while the data has no real gap (three
    sample intervals), so irregular sampling does not stripe the heatmap."""
    md = float(np.median(np.diff(t))) if len(t) > 1 else width
    run = max(1, int(math.ceil(3 * md / width))) if width > 0 else 1
    out = b.copy()
    last, age = np.nan, 0
    for i, v in enumerate(b):
        if math.isfinite(v):
            last, age = v, 0
        else:
            age += 1
            if math.isfinite(last) and age <= run:
                out[i] = last
    return out


def _nbuckets(series: Sequence[Series], t0: float, t1: float, cap: int) -> int:
    """As many buckets as there are distinct sample times (up to ``cap``), so sparse data
    does not turn into a dotted line or a striped heatmap."""
    ts = [s.t[(s.t >= t0) & (s.t <= t1)] for s in series]
    n = len(np.unique(np.concatenate(ts))) if ts else 0
    return int(min(cap, max(2, n)))


# ---------------------------------------------------------------------------------------------
# SVG
# ---------------------------------------------------------------------------------------------

W, H, ML, MR, MT, MB = 960, 210, 78, 12, 10, 30


def _time_axis(t0: float, t1: float, x: Any, y0: float) -> list[str]:
    out = [f'<line x1="{ML}" y1="{y0}" x2="{W - MR}" y2="{y0}" class="axis"/>']
    span = max(t1 - t0, 1e-9)
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
    step = next((s for s in steps if span / s <= 8), steps[-1])
    k = math.ceil(t0 / step) * step
    while k <= t1:
        px = x(k)
        out.append(f'<line x1="{px:.1f}" y1="{y0}" x2="{px:.1f}" y2="{y0 + 4}" class="axis"/>')
        out.append(f'<text x="{px:.1f}" y="{y0 + 16}" class="tick" text-anchor="middle">{_hms(k)}</text>')
        k += step
    return out


def timeline_svg(sig: str, unit: str, series: list[Series], t0: float, t1: float,
                 shades: Iterable[tuple[str, float, float, str, str]], idx: int) -> str:
    """One plot: a line per series, finding intervals shaded (pending lighter than firing)."""
    span = max(t1 - t0, 1e-9)
    x = lambda t: ML + (t - t0) / span * (W - ML - MR)  # noqa: E731
    nb = _nbuckets(series, t0, t1, PLOT_BUCKETS)
    buck = [(s, _bucket(s.t, s.v, t0, t1, nb)) for s in series]
    vals = np.concatenate([b for _, b in buck]) if buck else np.empty(0)
    vals = vals[np.isfinite(vals)]
    lo, hi = (float(vals.min()), float(vals.max())) if len(vals) else (0.0, 1.0)
    if hi == lo:
        lo, hi = lo - (abs(lo) * 0.1 or 1.0), hi + (abs(hi) * 0.1 or 1.0)
    y = lambda v: MT + (1 - (v - lo) / (hi - lo)) * (H - MT - MB)  # noqa: E731
    parts = [f'<svg class="plot timeline" id="plot-{idx}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
             f'role="img" aria-label="{e(sig)} over time">']
    for occ_id, a, b, kind, title in shades:
        xa, xb = x(max(a, t0)), x(min(b, t1))
        if xb < xa:
            continue
        parts.append(f'<rect class="shade {kind}" data-occ="{e(occ_id)}" x="{xa:.1f}" y="{MT}" '
                     f'width="{max(xb - xa, 1.5):.1f}" height="{H - MT - MB}"><title>{e(title)}</title></rect>')
    for frac in (0.0, 0.5, 1.0):
        v = lo + frac * (hi - lo)
        parts.append(f'<line x1="{ML}" y1="{y(v):.1f}" x2="{W - MR}" y2="{y(v):.1f}" class="grid"/>')
        parts.append(f'<text x="{ML - 6}" y="{y(v) + 4:.1f}" class="tick" text-anchor="end">{_num(v, 3)}</text>')
    width = span / nb
    centers = t0 + (np.arange(nb) + 0.5) * width
    for k, (s, bv) in enumerate(buck):
        # break the line only at a real gap in the data, not at an empty bucket
        md = float(np.median(np.diff(s.t))) if len(s.t) > 1 else width
        gap = max(3.0 * md, 2.5 * width)
        d = []
        last = None
        for tc, v in zip(centers, bv):
            if not math.isfinite(v):
                continue
            d.append(f'{"L" if last is not None and tc - last <= gap else "M"}{x(tc):.1f},{y(v):.1f}')
            last = tc
        if d:
            parts.append(f'<path class="line" d="{" ".join(d)}" stroke="{PALETTE[k % len(PALETTE)]}">'
                         f'<title>{e(s.label)}</title></path>')
    parts += _time_axis(t0, t1, x, H - MB)
    parts.append(f'<text x="{ML}" y="{H - 2}" class="unit">{e(unit)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _diverging(d: float) -> str:
    if not math.isfinite(d):
        return "#eeeeee"
    d = max(-1.0, min(1.0, d))
    if d >= 0:
        r, g, b = 255, int(255 - 200 * d), int(255 - 210 * d)
    else:
        r, g, b = int(255 + 210 * d), int(255 + 150 * d), 255
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap_svg(sig: str, series: list[Series], t0: float, t1: float, idx: int) -> str:
    """Rows = node/entity, columns = time; colour = relative deviation from the per-column
    median across rows (red above peers, blue below): a straggler is a coloured stripe."""
    rows = series[:MAX_ROWS]
    nb = _nbuckets(rows, t0, t1, HEAT_BUCKETS)
    M = np.vstack([_hold(_bucket(s.t, s.v, t0, t1, nb), s.t, (t1 - t0) / nb) for s in rows])
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(M, axis=0)
        scale = np.where(np.abs(med) > 1e-12, np.abs(med), np.nan)
        D = (M - med) / scale
        D = np.where(np.isfinite(D), D, np.where(np.isfinite(M), 0.0, np.nan))
    label_w = 150
    cw = (W - label_w - MR) / nb
    ch = 16
    h = MT + ch * len(rows) + MB
    span = max(t1 - t0, 1e-9)
    x = lambda t: label_w + (t - t0) / span * (W - label_w - MR)  # noqa: E731
    parts = [f'<svg class="plot heatmap" id="heat-{idx}" viewBox="0 0 {W} {h}" width="{W}" height="{h}" '
             f'role="img" aria-label="{e(sig)} deviation from peers">']
    for r, s in enumerate(rows):
        yy = MT + r * ch
        parts.append(f'<text x="{label_w - 6}" y="{yy + ch - 4}" class="tick" text-anchor="end">{e(s.label)}</text>')
        for c in range(nb):
            d = float(D[r, c])
            v = float(M[r, c])
            parts.append(f'<rect x="{label_w + c * cw:.1f}" y="{yy}" width="{cw + 0.3:.1f}" height="{ch - 1}" '
                         f'fill="{_diverging(d)}"><title>{e(s.label)} {_num(v)} '
                         f'({"+" if d >= 0 else ""}{_num(d * 100 if math.isfinite(d) else None, 3)}% vs median)'
                         f'</title></rect>')
    parts.append(f'<rect x="{label_w}" y="{MT}" width="{W - label_w - MR}" height="{ch * len(rows) - 1}" '
                 'fill="none" stroke="#d1d5db"/>')
    saved_ml = label_w
    ax = [f'<line x1="{saved_ml}" y1="{h - MB}" x2="{W - MR}" y2="{h - MB}" class="axis"/>']
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
    step = next((s for s in steps if span / s <= 8), steps[-1])
    k = math.ceil(t0 / step) * step
    while k <= t1:
        ax.append(f'<text x="{x(k):.1f}" y="{h - MB + 16}" class="tick" text-anchor="middle">{_hms(k)}</text>')
        k += step
    parts += ax
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Page
# ---------------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header .meta{color:#c8cdd8;font-size:13px}main{padding:8px 28px 40px;max-width:1280px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:14px 18px;margin:16px 0}
h2{font-size:17px;margin:0 0 10px}h3{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid #e6e9ef;padding:5px 7px;
text-align:left;vertical-align:top;overflow-wrap:break-word}th{background:#f0f2f6;position:sticky;top:0;
white-space:nowrap}td.mono,.sev{white-space:nowrap}td code{overflow-wrap:anywhere}
tr.occ{cursor:pointer}tr.occ:hover,tr.sel{background:#fff6d6}
.sev{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:12px}
.sev.critical{background:#d62728}.sev.warning{background:#e67e00}.sev.info{background:#1f77b4}
.plot{display:block;max-width:100%;height:auto}.axis{stroke:#6b7280;stroke-width:1}.grid{stroke:#e5e7eb}
.tick,.unit{font-size:11px;fill:#4b5563}.line{fill:none;stroke-width:1.4}
.shade.pending{fill:#f5c542;opacity:.22}.shade.firing{opacity:.2}.shade.critical{fill:#d62728}
.shade.warning{fill:#ff7f0e}.shade.info{fill:#1f77b4}.shade.hl{opacity:.55;stroke:#000;stroke-width:1}
.legend span{display:inline-block;margin:0 12px 2px 0;font-size:12px}.legend i{display:inline-block;width:12px;
height:3px;margin-right:4px;vertical-align:middle}.note{color:#6b7280;font-size:12px}.bad{color:#b42318}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
.ev{white-space:nowrap}.empty{color:#6b7280;font-style:italic}
"""

JS = """
(function(){
  var rows=document.querySelectorAll('tr.occ');
  rows.forEach(function(r){r.addEventListener('click',function(){
    var id=r.getAttribute('data-occ'),on=!r.classList.contains('sel');
    document.querySelectorAll('tr.sel').forEach(function(x){x.classList.remove('sel')});
    document.querySelectorAll('.shade.hl').forEach(function(x){x.classList.remove('hl')});
    if(on){r.classList.add('sel');document.querySelectorAll('.shade').forEach(function(s){
      if(s.getAttribute('data-occ')===id){s.classList.add('hl')}});}
  });});
  document.documentElement.setAttribute('data-ready','1');
})();
"""


def _fill(template: str, o: Occurrence, params: dict[str, Any]) -> str:
    """``{node}``, ``{entity}`` and ``{param}`` placeholders, as the engine fills summaries."""
    values = {"node": o.node, "entity": o.entity or o.node, **{k: str(v) for k, v in params.items()}}
    return re.sub(r"\{([a-z_][a-z0-9_]*)\}", lambda m: values.get(m.group(1), m.group(0)), template)


def _occ_id(o: Occurrence) -> str:
    return f"{o.rule_id}|{o.node}|{o.entity}|{o.active_at!r}"


def _recorded_extras(result: ReplayResult) -> dict[tuple, dict[str, Any]]:
    """Root cause / suggestions attached to recorded findings (e.g. by a controller), by occurrence."""
    out: dict[tuple, dict[str, Any]] = {}
    for seg in result.segments:
        for d in seg.findings():
            extra = {k: d[k] for k in ("root_cause", "suggestions", "suggestion") if d.get(k)}
            if extra:
                key = (d.get("rule_id"), d.get("node"), d.get("entity"), d.get("active_at"))
                out.setdefault(key, {}).update(extra)
    return out


def render(result: ReplayResult, title: str = "skewd post-mortem") -> str:
    occ = occurrences(result.findings, fired_only=False)
    present: set[str] = set()
    for seg in result.segments:
        present.update(seg.meta.get("signals") or [])
    if not present:
        for seg in result.segments:
            present.update(seg.samples().signals())
    for m in result.summaries:
        present.update(m.signals)
    if result.evaluations and result.end > result.start:
        t0, t1 = result.start, result.end  # the replayed range (--from/--to)
    else:
        t0 = min((s.start for s in result.segments if math.isfinite(s.start)), default=0.0)
        t1 = max((s.end for s in result.segments if math.isfinite(s.end)), default=t0 + 1.0)
        if t1 <= t0:
            t1 = t0 + 1.0
    keys = _key_signals(result, present, occ)
    data = _series(result, keys)
    from .summary import CATALOGUE as SUMMARY_CATALOGUE

    cat = {s.name: s for s in SUMMARY_CATALOGUE}
    for seg in result.segments:
        for s in seg.catalogue():
            cat.setdefault(s.name, s)
    rules = {r.id: r for rs in result.rulesets.values() for r in rs.rules}
    out: list[str] = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      f"<title>{e(title)}</title><style>{CSS}</style></head><body>"]
    cluster = result.segments[0].cluster if result.segments else ""
    sev_counts: dict[str, int] = {}
    for o in occ:
        if o.fired_at is not None:
            sev_counts[o.severity] = sev_counts.get(o.severity, 0) + 1
    out.append(f"<header><h1>{e(title)}</h1><div class='meta'>cluster <b>{e(cluster or '–')}</b> · "
               f"nodes {e(', '.join(result.nodes) or '–')} · {_fmt_t(t0)} → {_fmt_t(t1)} ({_dur(t1 - t0)}) · "
               f"{result.evaluations} evaluations · "
               f"{sum(sev_counts.values())} fired ({', '.join(f'{v} {k}' for k, v in sorted(sev_counts.items())) or 'none'})"
               f" · report by skewd {e(__version__)}</div></header><main>")
    if result.damage or result.stopped_early:
        out.append("<section id='damage'><h2 class='bad'>Damaged input</h2><p>Everything before the damage "
                   "was replayed.</p><ul>")
        out += [f"<li class='mono'>{e(str(d))}</li>" for d in result.damage]
        out += [f"<li class='mono'>{e(n)}</li>" for n in result.stopped_early]
        out.append("</ul></section>")
    # -- findings table
    extras = _recorded_extras(result)
    has_rc = bool(extras)
    out.append(f"<section id='findings-section'><h2>Findings</h2><p class='note'>One row per occurrence "
               f"(pending → firing → resolved). Click a row to highlight its interval in the timelines.</p>"
               f"<table id='findings'><thead><tr><th>Severity</th><th>Rule</th><th>Node</th><th>Entity</th>"
               f"<th>Pending</th><th>Fired</th><th>Resolved</th><th>Duration</th><th>Evidence</th>"
               f"<th>Summary</th><th>Mitigation</th>{'<th>Root cause</th><th>Suggestions</th>' if has_rc else ''}"
               f"</tr></thead><tbody>")
    if not occ:
        out.append(f"<tr><td colspan='{13 if has_rc else 11}' class='empty'>No rule fired or went pending "
                   "during the replay.</td></tr>")
    for o in sorted(occ, key=lambda o: (o.fired_at if o.fired_at is not None else o.active_at, o.key)):
        r = rules.get(o.rule_id)
        end = o.resolved_at if o.resolved_at is not None else t1
        dur = end - o.fired_at if o.fired_at is not None else None
        ev = "<br>".join(f"<span class='ev'><code>{e(k)}</code> = {_num(v)}</span>"
                         for k, v in sorted(o.evidence.items()))
        x = extras.get((o.rule_id, o.node, o.entity, o.active_at), {})
        sug = x.get("suggestions", x.get("suggestion", ""))
        if isinstance(sug, list):
            sug = "<br>".join(e(str(s)) for s in sug)
        else:
            sug = e(str(sug))
        path = f"<br><span class='note'>{e(r.pathology)}</span>" if r else ""
        out.append(
            f"<tr class='occ' data-occ='{e(_occ_id(o))}'><td><span class='sev {e(o.severity)}'>{e(o.severity)}</span></td>"
            f"<td><b>{e(o.rule_id)}</b>{path}</td><td>{e(o.node)}</td><td>{e(o.entity or '–')}</td>"
            f"<td class='mono'>{_clock(o.active_at)}</td><td class='mono'>{_clock(o.fired_at)}</td>"
            f"<td class='mono'>{_clock(o.resolved_at) if o.resolved_at is not None else ('ongoing' if o.fired_at is not None else 'never fired')}</td>"
            f"<td>{_dur(dur)}</td><td>{ev or '–'}</td><td>{e(o.summary)}</td>"
            f"<td>{e(_fill(r.mitigation, o, r.params)) if r and r.mitigation else '–'}</td>"
            + (f"<td>{e(str(x.get('root_cause', ''))) or '–'}</td><td>{sug or '–'}</td>" if has_rc else "")
            + "</tr>")
    out.append("</tbody></table>")
    live = sum(len(seg.findings()) for seg in result.segments)
    if live:
        node_tr = sum(1 for f in result.findings if f.scope.value not in ("tp_group", "cluster"))
        group_tr = len(result.findings) - node_tr
        out.append(f"<p class='note'>The live agent recorded {live} transitions of node rules in this bundle; "
                   f"the replay produced {node_tr}" + (f", plus {group_tr} of group rules (evaluated as the "
                   "controller does)" if group_tr else "") + ".</p>")
    out.append("</section>")
    # -- timelines
    out.append("<section id='timelines'><h2>Timelines</h2>")
    n_plots = 0
    for i, sig in enumerate(keys):
        ss = data.get(sig) or []
        if not ss:
            continue
        spec = cat.get(sig)
        counter = spec is not None and spec.kind is Kind.COUNTER
        unit = (spec.unit if spec else "") + ("/s (rate)" if counter else "")
        if counter:
            ss = [Series(s.signal, s.node, s.entity, *_rate(s.t, s.v)) for s in ss]
        note = ""
        if len(ss) > MAX_SERIES:
            note = f" — {MAX_SERIES} of {len(ss)} series shown (most variable)"
            ss = sorted(ss, key=lambda s: (-float(np.nanstd(s.v)) if np.isfinite(s.v).any() else 0.0, s.label))
            ss = sorted(ss[:MAX_SERIES], key=lambda s: s.label)
        shades = []
        for o in occ:
            r = rules.get(o.rule_id)
            if r is None or sig not in r.requires:
                continue
            oid = _occ_id(o)
            what = f"{o.rule_id} {o.node}/{o.entity or '-'}"
            stop = o.fired_at if o.fired_at is not None else (o.resolved_at if o.resolved_at is not None else t1)
            shades.append((oid, o.active_at, stop, "pending", f"{what} pending"))
            if o.fired_at is not None:
                shades.append((oid, o.fired_at, o.resolved_at if o.resolved_at is not None else t1,
                               f"firing {o.severity}", f"{what} firing"))
        desc = f"<span class='note'> — {e(spec.desc)}</span>" if spec else ""
        out.append(f"<h3><code>{e(sig)}</code>{desc}{e(note)}</h3>")
        out.append(timeline_svg(sig, unit, ss, t0, t1, shades, i))
        out.append("<div class='legend'>" + "".join(
            f"<span><i style='background:{PALETTE[k % len(PALETTE)]}'></i>{e(s.label)}</span>"
            for k, s in enumerate(ss)) + "</div>")
        n_plots += 1
    if not n_plots:
        out.append("<p class='empty'>The bundle holds no samples in the replayed range.</p>")
    out.append("</section>")
    # -- heatmaps
    heat = [s for s in keys if len(data.get(s) or []) >= 2][:MAX_HEATMAPS]
    out.append("<section id='heatmaps'><h2>Skew heatmaps</h2><p class='note'>Per node and entity, deviation "
               "from the median of its peers in each interval: red above, blue below, grey no data.</p>")
    for i, sig in enumerate(heat):
        ss = sorted(data[sig], key=lambda s: (s.node, s.entity))
        spec = cat.get(sig)
        if spec is not None and spec.kind is Kind.COUNTER:
            ss = [Series(s.signal, s.node, s.entity, *_rate(s.t, s.v)) for s in ss]
        out.append(f"<h3><code>{e(sig)}</code>{' (rate)' if spec is not None and spec.kind is Kind.COUNTER else ''}"
                   f"{' — first %d of %d rows' % (MAX_ROWS, len(ss)) if len(ss) > MAX_ROWS else ''}</h3>")
        out.append(heatmap_svg(sig, ss, t0, t1, i))
    if not heat:
        out.append("<p class='empty'>No measure has two or more entities to compare.</p>")
    out.append("</section>")
    # -- rules
    out.append("<section id='rules'><h2>Rules</h2>")
    recorded = sorted({str((seg.meta.get("rules") or {}).get("version") or "") for seg in result.segments} - {""})
    out.append(f"<p>Replayed with rule set version{'s' if len(result.rulesets) > 1 else ''} "
               f"<code>{e(', '.join(result.rulesets) or '–')}</code>; the live agent ran "
               f"<code>{e(', '.join(recorded) or 'unknown')}</code>.</p>")
    # rule files were loaded from the bundle's copies: show where the agent had them
    origin: dict[str, str] = {}
    for seg in result.segments:
        for f in (seg.meta.get("rules") or {}).get("files") or []:
            origin[str(seg.path / f["stored"])] = str(f["path"])

    def orig(src: str) -> str:
        for stored, path in origin.items():
            if src.startswith(stored):
                return path + src[len(stored):]
        return src

    fired_by_rule: dict[str, int] = {}
    for o in occ:
        if o.fired_at is not None:
            fired_by_rule[o.rule_id] = fired_by_rule.get(o.rule_id, 0) + 1
    for ver, rs in result.rulesets.items():
        out.append(f"<h3>Version <code>{e(ver)}</code> — files: {e(', '.join(orig(f) for f in rs.files))}</h3>"
                   "<table class='rules'><thead><tr><th>Rule</th><th>Scope</th><th>Pathology</th><th>Severity</th>"
                   "<th>Digest</th><th>Source</th><th>Fired</th></tr></thead><tbody>")
        for r in rs.rules:
            out.append(f"<tr><td><b>{e(r.id)}</b>{'' if r.enabled else ' (disabled)'}</td><td>{e(r.scope.value)}</td>"
                       f"<td>{e(r.pathology)}</td><td>{e(r.severity.value)}</td><td class='mono'>{e(r.digest)}</td>"
                       f"<td class='mono'>{e(orig(r.source))}</td><td>{fired_by_rule.get(r.id, 0)}</td></tr>")
        out.append("</tbody></table>")
    out.append("</section>")
    # -- bundle
    out.append("<section id='bundle'><h2>Bundle</h2><table><thead><tr><th>Segment</th><th>Nodes</th><th>From</th>"
               "<th>To</th><th>Samples</th><th>Ticks</th><th>Findings</th><th>skewd</th><th>Complete</th></tr>"
               "</thead><tbody>")
    for seg in result.segments:
        c = seg.meta.get("counts") or {}
        labels = "; ".join(f"{n}: " + ", ".join(f"{k}={v}" for k, v in sorted(lab.items()))
                           for n, lab in sorted(seg.node_labels.items()))
        out.append(f"<tr><td class='mono'>{e(seg.path.parent.name + '/' + seg.path.name)}</td><td>{e(', '.join(seg.nodes))}"
                   f"<br><span class='note'>{e(labels)}</span></td><td class='mono'>{_fmt_t(seg.start)}</td>"
                   f"<td class='mono'>{_fmt_t(seg.end)}</td><td>{c.get('samples', '–')}</td>"
                   f"<td>{c.get('ticks', '–')}</td><td>{c.get('findings', '–')}</td>"
                   f"<td>{e(str(seg.meta.get('skewd_version', '?')))}</td>"
                   f"<td>{'yes' if seg.meta.get('complete') else 'no (interrupted or still recording)'}</td></tr>")
    out.append("</tbody></table></section>")
    out.append(f"</main><script>{JS}</script></body></html>")
    return "\n".join(out) + "\n"


def write_report(result: ReplayResult, path: str | Path, title: str = "skewd post-mortem") -> Path:
    p = Path(path)
    p.write_text(render(result, title), encoding="utf-8")
    return p
