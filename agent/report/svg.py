"""The report's plots as inline SVG (no script, no network): the culprit's lines against its
peers' band, state bands for booleans, and heatmaps of like-for-like entities.

Every plot is drawn in a fixed ``viewBox`` and scales to its container's width (CSS
``width:100%``), so it fits any window from 1280 to 1920 px without a scroll bar. Values on
axes and in tooltips are in human units (:mod:`.units`).
"""
from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np

from ..replay.output import utc
from .data import Comparison, Series
from .units import human, nice_ticks

e = html.escape
W, H = 900, 190
ML, MR, MT, MB = 84, 12, 12, 28
CULPRIT = ("#c62828", "#ef6c00", "#6a1b9a", "#ad1457")
PEER_BAND = "#90a4ae"
PEER_LINE = "#455a64"
BUCKETS = 240


def _hms(t: float) -> str:
    d = utc(t)
    return d.strftime("%H:%M:%S") if d is not None else f"{t:g}"


def short(label: str, n: int = 28) -> str:
    """A row label that fits its column: the node, an ellipsis and the entity's end."""
    if len(label) <= n:
        return label
    node, _, ent = label.partition("/")
    keep = max(6, n - len(node) - 2)
    return f"{node}/…{ent[-keep:]}" if ent else label[: n - 1] + "…"


def _buckets(s: Series, t0: float, t1: float, n: int) -> np.ndarray:
    """Mean of the finite values per time bucket (NaN where a bucket has none)."""
    out = np.full(n, np.nan)
    ok = np.isfinite(s.v) & (s.t >= t0) & (s.t <= t1)
    if not ok.any() or t1 <= t0:
        return out
    idx = np.clip(((s.t[ok] - t0) / (t1 - t0) * n).astype(np.int64), 0, n - 1)
    sums = np.bincount(idx, weights=s.v[ok], minlength=n)
    cnt = np.bincount(idx, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, sums / np.maximum(cnt, 1), np.nan)


def _nb(series: Sequence[Series], t0: float, t1: float) -> int:
    ts = [s.t[(s.t >= t0) & (s.t <= t1)] for s in series]
    n = len(np.unique(np.concatenate(ts))) if ts else 0
    return int(min(BUCKETS, max(2, n)))


def _hold(b: np.ndarray, run: int = 3) -> np.ndarray:
    """Carry a value over a few empty buckets (irregular sampling), not over a real gap."""
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


def _time_axis(t0: float, t1: float, x, y0: float, left: float) -> list[str]:
    out = [f'<line x1="{left}" y1="{y0}" x2="{W - MR}" y2="{y0}" class="axis"/>']
    span = max(t1 - t0, 1e-9)
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
    step = next((s for s in steps if span / s <= 8), steps[-1])
    k = math.ceil(t0 / step) * step
    while k <= t1:
        px = x(k)
        anchor = "end" if px > W - MR - 26 else "start" if px < left + 26 else "middle"
        out.append(f'<line x1="{px:.1f}" y1="{y0}" x2="{px:.1f}" y2="{y0 + 4}" class="axis"/>'
                   f'<text x="{px:.1f}" y="{y0 + 16}" class="tick" text-anchor="{anchor}">{_hms(k)}</text>')
        k += step
    return out


def _marks(marks: Sequence[tuple[float, str, str]], x, t0: float, t1: float, top: float, bottom: float) -> list[str]:
    """Vertical markers (onset, detection, resolution) and shaded spans."""
    out = []
    for t, cls, title in marks:
        if t0 <= t <= t1:
            out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{bottom}" class="mark {cls}">'
                       f'<title>{e(title)}</title></line>')
    return out


def band_plot(cmp: Comparison, t0: float, t1: float, marks: Sequence[tuple[float, str, str]],
              span: tuple[float, float] | None, idx: str) -> str:
    """The culprit's series as lines over its peers' band (min..max, median dashed)."""
    span_t = max(t1 - t0, 1e-9)
    x = lambda t: ML + (t - t0) / span_t * (W - ML - MR)  # noqa: E731
    nb = _nb([*cmp.culprit, *cmp.peers], t0, t1)
    mine = [(s, _hold(_buckets(s, t0, t1, nb))) for s in cmp.culprit]
    band = None
    if cmp.peers:
        P = np.vstack([_hold(_buckets(s, t0, t1, nb)) for s in cmp.peers])
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                band = (np.nanmin(P, axis=0), np.nanmedian(P, axis=0), np.nanmax(P, axis=0))
    vals = [b for _, b in mine] + (list(band) if band is not None else [])
    allv = np.concatenate(vals) if vals else np.empty(0)
    allv = allv[np.isfinite(allv)]
    lo, hi = (float(allv.min()), float(allv.max())) if len(allv) else (0.0, 1.0)
    lo = min(lo, 0.0) if lo >= 0 else lo
    if hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    hi += (hi - lo) * 0.05
    y = lambda v: MT + (1 - (v - lo) / (hi - lo)) * (H - MT - MB)  # noqa: E731
    centers = t0 + (np.arange(nb) + 0.5) * (span_t / nb)
    parts = [f'<svg class="plot band" id="plot-{e(idx)}" viewBox="0 0 {W} {H}" preserveAspectRatio="xMinYMin meet" '
             f'role="img" aria-label="{e(cmp.signal)}: culprit against peers">']
    if span is not None:
        a, b = max(span[0], t0), min(span[1], t1)
        if b > a:
            parts.append(f'<rect class="incident-span" x="{x(a):.1f}" y="{MT}" width="{x(b) - x(a):.1f}" '
                         f'height="{H - MT - MB}"><title>incident open</title></rect>')
    for v in nice_ticks(lo, hi, 3):
        parts.append(f'<line x1="{ML}" y1="{y(v):.1f}" x2="{W - MR}" y2="{y(v):.1f}" class="grid"/>'
                     f'<text x="{ML - 6}" y="{y(v) + 4:.1f}" class="tick" text-anchor="end">{e(human(v, cmp.unit))}</text>')
    if band is not None:
        bmin, bmed, bmax = band
        ok = np.isfinite(bmin) & np.isfinite(bmax)
        for seg in _runs(ok):
            up = " ".join(f"{x(centers[i]):.1f},{y(bmax[i]):.1f}" for i in seg)
            down = " ".join(f"{x(centers[i]):.1f},{y(bmin[i]):.1f}" for i in reversed(seg))
            parts.append(f'<polygon class="peer-band" points="{up} {down}"><title>peers ({len(cmp.peers)} '
                         f'{e(cmp.family or "node")} series): min..max</title></polygon>')
        parts.append(_path(centers, bmed, x, y, "peer-median", f"peers' median ({len(cmp.peers)} series)", PEER_LINE))
    for k, (s, b) in enumerate(mine):
        parts.append(_path(centers, b, x, y, "culprit-line", s.label, CULPRIT[k % len(CULPRIT)]))
    parts += _marks(marks, x, t0, t1, MT, H - MB)
    parts += _time_axis(t0, t1, x, H - MB, ML)
    parts.append("</svg>")
    return "".join(parts)


def _runs(ok: np.ndarray) -> list[list[int]]:
    out: list[list[int]] = []
    cur: list[int] = []
    for i, v in enumerate(ok.tolist()):
        if v:
            cur.append(i)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def _path(centers: np.ndarray, b: np.ndarray, x, y, cls: str, title: str, colour: str) -> str:
    d = []
    prev = False
    for tc, v in zip(centers, b):
        if not math.isfinite(v):
            prev = False
            continue
        d.append(f'{"L" if prev else "M"}{x(tc):.1f},{y(v):.1f}')
        prev = True
    if not d:
        return ""
    return f'<path class="{cls}" d="{" ".join(d)}" stroke="{colour}"><title>{e(title)}</title></path>'


def state_bands(rows: Sequence[tuple[str, Series, bool]], t0: float, t1: float,
                marks: Sequence[tuple[float, str, str]], idx: str) -> str:
    """A boolean signal as bands: one row per entity (culprit rows first), filled where on."""
    label_w = 170
    rh = 18
    h = MT + rh * len(rows) + MB
    span = max(t1 - t0, 1e-9)
    x = lambda t: label_w + (t - t0) / span * (W - label_w - MR)  # noqa: E731
    nb = _nb([s for _, s, _ in rows], t0, t1)
    width = (W - label_w - MR) / nb
    parts = [f'<svg class="plot states" id="plot-{e(idx)}" viewBox="0 0 {W} {h}" preserveAspectRatio="xMinYMin meet" '
             f'role="img" aria-label="states over time">']
    for r, (label, s, mine) in enumerate(rows):
        yy = MT + r * rh
        parts.append(f'<text x="{label_w - 6}" y="{yy + rh - 5}" class="tick{" culprit-label" if mine else ""}" '
                     f'text-anchor="end">{e(short(label))}<title>{e(label)}</title></text>'
                     f'<rect x="{label_w}" y="{yy + 2}" width="{W - label_w - MR}" height="{rh - 4}" class="state-off"/>')
        b = _hold(_buckets(s, t0, t1, nb))
        on = np.isfinite(b) & (b >= 0.5)
        for seg in _runs(on):
            a = label_w + seg[0] * width
            parts.append(f'<rect x="{a:.1f}" y="{yy + 2}" width="{len(seg) * width:.1f}" height="{rh - 4}" '
                         f'class="state-on{" mine" if mine else ""}"><title>{e(label)}: on</title></rect>')
    parts += _marks(marks, x, t0, t1, MT, h - MB)
    parts += _time_axis(t0, t1, x, h - MB, label_w)
    parts.append("</svg>")
    return "".join(parts)


def _diverging(d: float) -> str:
    if not math.isfinite(d):
        return "#eceff1"
    d = max(-1.0, min(1.0, d))
    if d >= 0:
        r, g, b = 255, int(255 - 200 * d), int(255 - 210 * d)
    else:
        r, g, b = int(255 + 210 * d), int(255 + 150 * d), 255
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(series: Sequence[Series], unit: str, t0: float, t1: float, idx: str) -> str:
    """Rows = node/entity (one entity family), columns = time; colour = deviation from the
    per-column median of the rows: red above, blue below, grey no data."""
    label_w = 190
    rh = 15
    nb = min(_nb(series, t0, t1), 120)
    M = np.vstack([_hold(_buckets(s, t0, t1, nb)) for s in series])
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(M, axis=0)
        scale = np.where(np.abs(med) > 1e-12, np.abs(med), np.nan)
        D = (M - med) / scale
        D = np.where(np.isfinite(D), D, np.where(np.isfinite(M), 0.0, np.nan))
    h = MT + rh * len(series) + MB
    span = max(t1 - t0, 1e-9)
    x = lambda t: label_w + (t - t0) / span * (W - label_w - MR)  # noqa: E731
    cw = (W - label_w - MR) / nb
    parts = [f'<svg class="plot heatmap" id="heat-{e(idx)}" viewBox="0 0 {W} {h}" preserveAspectRatio="xMinYMin meet" '
             f'role="img" aria-label="deviation from the median of like entities">']
    for r, s in enumerate(series):
        yy = MT + r * rh
        parts.append(f'<text x="{label_w - 6}" y="{yy + rh - 4}" class="tick" text-anchor="end">{e(short(s.label))}'
                     f'<title>{e(s.label)}</title></text>')
        for c in range(nb):
            d, v = float(D[r, c]), float(M[r, c])
            if not math.isfinite(v):
                continue
            pct = f"{'+' if d >= 0 else ''}{d * 100:.0f} %" if math.isfinite(d) else "–"
            parts.append(f'<rect x="{label_w + c * cw:.1f}" y="{yy}" width="{cw + 0.3:.1f}" height="{rh - 1}" '
                         f'fill="{_diverging(d)}"><title>{e(s.label)} {e(human(v, unit))} ({pct} vs median)</title></rect>')
    parts += _time_axis(t0, t1, x, h - MB, label_w)
    parts.append("</svg>")
    return "".join(parts)
