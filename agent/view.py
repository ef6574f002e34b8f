"""The live terminal view of ``skewd up`` (and ``skewd demo``).

On a terminal the screen is redrawn in place once a second; when stdout is not a terminal
(CI, a pipe) each new finding and suggestion is printed once as a line instead, so logs stay
readable.
"""
from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from skewd.model import Finding, State
from skewd.rules.counts import RuleCounts

CLEAR = "\x1b[H\x1b[2J"
BOLD, DIM, RED, YELLOW, GREEN, RESET = "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[33m", "\x1b[32m", "\x1b[0m"


def _rate(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    for div, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.1f} {prefix}{unit}"
    return f"{v:.1f} {unit}"


#: summary signal → (label, formatter) shown under "key signals"
KEY_SIGNALS: list[tuple[str, str, Callable[[float], str]]] = [
    ("summary_net_rx_bytes_per_second", "net rx", lambda v: _rate(v, "B/s")),
    ("summary_net_tx_bytes_per_second", "net tx", lambda v: _rate(v, "B/s")),
    ("summary_gpu_util_mean_ratio", "GPU util", lambda v: f"{v * 100:.0f} %"),
    ("summary_pcie_rx_bytes_per_second", "PCIe H2D", lambda v: _rate(v, "B/s")),
    ("summary_rdma_xmit_bytes_per_second", "RDMA tx", lambda v: _rate(v, "B/s")),
    ("summary_kv_cache_usage_ratio", "KV cache", lambda v: f"{v * 100:.0f} %"),
    ("summary_requests_waiting", "waiting", lambda v: f"{v:.0f}"),
    ("summary_engine_phase", "phase", lambda v: {0: "idle", 1: "decode", 2: "prefill"}.get(int(v), "?")),
]


@dataclass
class ViewState:
    title: str
    collectors: list[tuple[str, bool, str, float]] = field(default_factory=list)  # name, active, reason, interval
    rules: RuleCounts | None = None  # skewd.rules.counts: the same numbers as agent --check
    signals: dict[str, float] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    suggestions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class LiveView:
    def __init__(self, out: TextIO | None = None, interactive: bool | None = None, keep: int = 12) -> None:
        self.out = out or sys.stdout
        self.interactive = self.out.isatty() if interactive is None else interactive
        self.keep = keep
        self._printed_suggestions = 0
        self._header_done = False

    def render(self, st: ViewState) -> str:
        width = shutil.get_terminal_size((100, 30)).columns
        lines = [f"{BOLD}{st.title}{RESET}  {DIM}{time.strftime('%H:%M:%S')} · Ctrl-C to stop{RESET}", ""]
        act = [f"{GREEN}{n}{RESET}({i:g}s)" for n, a, _, i in st.collectors if a]
        lines.append(f"{BOLD}collectors{RESET}  active: " + (" ".join(act) or "none"))
        for n, a, why, _ in st.collectors:
            if not a:
                lines.append(f"  {DIM}inactive {n}: {why}{RESET}"[: width + 10])
        lines.append(f"{BOLD}rules{RESET}  {_rules(st)} {DIM}(skewd agent --check says why){RESET}")
        sig = [f"{label} {fmt(st.signals[k])}" for k, label, fmt in KEY_SIGNALS if k in st.signals]
        lines.append(f"{BOLD}key signals{RESET}  " + ("  ·  ".join(sig) if sig else f"{DIM}waiting for data{RESET}"))
        lines += ["", f"{BOLD}findings{RESET} (latest first)"]
        shown = [f for f in reversed(st.findings)][: self.keep]
        if not shown:
            lines.append(f"  {DIM}none yet{RESET}")
        for f in shown:
            lines.append("  " + self.finding_line(f)[: width + 20])
        lines += ["", f"{BOLD}suggestions{RESET}"]
        if not st.suggestions:
            lines.append(f"  {DIM}none{RESET}")
        for s in st.suggestions[-self.keep:][::-1]:
            lines.append("  " + self.suggestion_line(s)[: width + 20])
        for n in st.notes:
            lines.append(f"{DIM}{n}{RESET}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def finding_line(f: Finding) -> str:
        color = {State.FIRING: RED, State.PENDING: YELLOW, State.RESOLVED: GREEN}.get(f.state, "")
        ts = time.strftime("%H:%M:%S", time.localtime(f.evaluated_at))
        where = f.node + (f"/{f.entity}" if f.entity else "")
        ev = ", ".join(f"{k}={v:.4g}" for k, v in list(f.evidence.items())[:2] if isinstance(v, (int, float)))
        return f"{ts} {color}{f.state.value:8}{RESET} {f.pathology:7} {f.rule_id:34} {where:22} {DIM}{ev}{RESET}"

    @staticmethod
    def suggestion_line(s: dict[str, Any]) -> str:
        action = s.get("action") or s.get("kind") or "?"
        target = s.get("target", "")
        why = s.get("rationale", "")
        conf = s.get("confidence")
        c = f" ({conf:.0%})" if isinstance(conf, (int, float)) else ""
        return f"{BOLD}{action}{RESET} {target}{c}: {why}"

    def on_finding(self, f: Finding) -> None:
        """Line mode: print each transition as it happens (the screen mode redraws instead)."""
        if not self.interactive:
            self.out.write("finding " + _plain(self.finding_line(f)) + "\n")
            self.out.flush()

    def update(self, st: ViewState) -> None:
        if self.interactive:
            self.out.write(CLEAR + self.render(st))
            self.out.flush()
            return
        if not self._header_done:
            self._header_done = True
            self.out.write(st.title + "\n")
            for n, a, why, i in st.collectors:
                self.out.write(f"collector {n}: {'active every %gs' % i if a else 'inactive: ' + why}\n")
            self.out.write(f"rules: {_rules(st)}\n")
        new_s = st.suggestions[self._printed_suggestions:]
        for s in new_s:
            self.out.write("suggestion " + _plain(self.suggestion_line(s)) + "\n")
        self._printed_suggestions = len(st.suggestions)
        self.out.flush()


def _rules(st: ViewState) -> str:
    return st.rules.describe() if st.rules is not None else "not loaded"


def _plain(s: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", s)
