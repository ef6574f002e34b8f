"""The progress line of a long replay, on stderr when it is a terminal: how far (percentage of
the recorded time span), how much recorded time is covered, and how fast (recorded seconds per
wall second). Piped or redirected, it prints nothing, so logs and CI output stay clean.

The only wall-clock reads of a replay outside ``--speed`` pacing are here, and they never
reach stdout.
"""
from __future__ import annotations

import time
from typing import Callable, TextIO

#: a replay spanning less recorded time than this finishes before a bar would help
MIN_SPAN_S = 60.0
#: redraws at most this often (a terminal write per event would slow a fast replay down)
REDRAW_S = 0.1


def human_span(s: float) -> str:
    """``42s``, ``5m12s``, ``2h03m``."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


class Progress:
    """One line, redrawn in place: ``[#####     ] 37.2%  5m12s of 14m00s recorded  48x  123
    transitions``. Enabled only when ``stream`` is a terminal and the span is long."""

    def __init__(self, span: float, stream: TextIO, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.span = max(span, 1e-9)
        self.stream = stream
        self.clock = clock
        isatty = getattr(stream, "isatty", None)
        self.enabled = enabled and span > MIN_SPAN_S and bool(isatty and isatty())
        self._wall0 = clock()
        self._last = -1.0
        self._width = 0

    def update(self, done: float, transitions: int) -> None:
        """``done``: recorded seconds replayed so far."""
        if not self.enabled:
            return
        now = self.clock()
        if now - self._last < REDRAW_S:
            return
        self._last = now
        frac = min(1.0, max(0.0, done / self.span))
        wall = now - self._wall0
        rate = f"{done / wall:.0f}x" if wall > 0.2 and done > 0 else "…"
        bar = "#" * int(frac * 24)
        line = (f"[{bar:24}] {frac * 100:5.1f}%  {human_span(done)} of {human_span(self.span)} recorded  "
                f"{rate} real time  {transitions} transitions")
        pad = max(0, self._width - len(line))
        self._width = len(line)
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
