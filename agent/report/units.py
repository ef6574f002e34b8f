"""Numbers as an on-call engineer reads them: ``85.2 MB/s``, ``12 ms``, ``93 %``, ``on``.

Catalogue units are base units (bytes, seconds, ratio 0..1, watts; counters cumulative), which
is right for rules and wrong for a page: ``8.52e+07`` is not a byte rate anyone reads. Counters
are plotted as rates, so their unit gains ``/s``.
"""
from __future__ import annotations

import math

#: units whose values are states, drawn as bands rather than lines
STATE_UNITS = frozenset({"bool", "state", "enum", "code", "bitmask"})
_BYTE_UNITS = {"bytes": "B", "bytes/s": "B/s", "bytes_per_second": "B/s"}
_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def rate_unit(unit: str, counter: bool) -> str:
    """The unit a plotted series is in: a counter's becomes a per-second rate."""
    if not counter:
        return unit
    if unit in ("bytes", "B"):
        return "bytes/s"
    if unit == "seconds":
        return "seconds/s"  # busy time per second: a share of one core or device
    return f"{unit}/s"


def _trim(x: float, digits: int = 3) -> str:
    s = f"{x:.{digits}g}"
    if "e" in s:
        s = f"{x:.{max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))}f}" if x else "0"
    return s


def human(v: float | None, unit: str) -> str:
    """One value with its unit, scaled to read: bytes in kB/MB/GB (decimal), seconds in
    µs/ms/s/min, ratios in percent, states as on/off, other units with k/M/G prefixes."""
    if v is None or not math.isfinite(v):
        return "–"
    a = abs(v)
    if unit in _BYTE_UNITS:
        sym = _BYTE_UNITS[unit]
        for scale, p in _SI:
            if a >= scale:
                return f"{_trim(v / scale)} {p}{sym}"
        return f"{_trim(v)} {sym}"
    if unit == "ratio":
        return f"{_trim(v * 100)} %"
    if unit in ("seconds", "s"):
        if a == 0:
            return "0 s"
        if a < 1e-3:
            return f"{_trim(v * 1e6)} µs"
        if a < 1:
            return f"{_trim(v * 1e3)} ms"
        if a < 120:
            return f"{_trim(v)} s"
        return f"{_trim(v / 60)} min"
    if unit == "seconds/s":
        return f"{_trim(v * 100)} % busy"
    if unit in ("bool", "state"):
        return "on" if v >= 0.5 else "off"
    if unit == "celsius":
        return f"{_trim(v)} °C"
    if unit == "watts":
        return f"{_trim(v)} W"
    if unit == "hz":
        for scale, p in _SI:
            if a >= scale:
                return f"{_trim(v / scale)} {p}Hz"
        return f"{_trim(v)} Hz"
    suffix = unit.replace("_per_second", "/s").replace("_", " ")
    for scale, p in _SI:
        if a >= scale:
            return f"{_trim(v / scale)}{p} {suffix}".rstrip()
    return f"{_trim(v)} {suffix}".rstrip()


def is_state(unit: str) -> bool:
    """A boolean or state signal: drawn as a band of states over time, not as a line."""
    return unit in STATE_UNITS


def duration(s: float | None) -> str:
    """``45 s``, ``3 min 20 s``, ``1 h 05 min``."""
    if s is None or not math.isfinite(s):
        return "–"
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About ``n`` round axis values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out = []
    k = start
    while k <= hi + step * 1e-9 and len(out) < 12:
        out.append(0.0 if abs(k) < step * 1e-9 else k)
        k += step
    return out
