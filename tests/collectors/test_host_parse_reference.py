"""host's /proc/stat and /proc/net/snmp parsers skip the lines they read nothing from before
splitting them; they must give what the straightforward parsers (kept here as the reference)
give on any text: real files, generated ones, odd whitespace, garbage, and the same errors."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewd.collectors.host import parse
from skewd.collectors.host.parse import MODES, SNMP, STAT_COLUMNS, Sample, cpu_signal, node_cpu_signal


def ref_parse_stat(text: str, user_hz: int = parse.USER_HZ) -> list[Sample]:
    out: list[Sample] = []
    online = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        key = parts[0]
        if key.startswith("cpu"):
            ticks = dict(zip(STAT_COLUMNS, (int(x) for x in parts[1:])))
            if key == "cpu":
                entity, name = "", node_cpu_signal
            elif key[3:].isdigit():
                entity, name = key, cpu_signal
                online += 1
            else:
                continue
            for mode, cols in MODES.items():
                if any(c in ticks for c in cols):
                    out.append(Sample(entity, name(mode), sum(ticks.get(c, 0) for c in cols) / user_hz))
        elif key in ("procs_running", "procs_blocked") and len(parts) > 1:
            out.append(Sample("", f"host_{key}", float(parts[1])))
    if online:
        out.append(Sample("", "host_cpus_online", float(online)))
    return out


def ref_parse_snmp(text: str) -> list[Sample]:
    out: list[Sample] = []
    lines = text.splitlines()
    for head, vals in zip(lines[::2], lines[1::2]):
        proto, _, names = head.partition(":")
        vproto, _, values = vals.partition(":")
        if proto != vproto:
            continue
        for field, v in zip(names.split(), values.split()):
            sig = SNMP.get((proto, field))
            if sig is not None:
                out.append(Sample("", sig, float(v)))
    return out


def outcome(fn, text: str) -> str:
    """The result as text (so NaN equals NaN), or the error's type: the same error, too."""
    try:
        return repr(fn(text))
    except Exception as e:
        return repr(type(e))


FIXTURES = [p for p in (Path(__file__).resolve().parents[1] / "fixtures").rglob("*")
            if p.is_file() and p.name in ("stat", "snmp")]


@pytest.mark.parametrize("path", ["/proc/stat", "/proc/net/snmp"] + [str(p) for p in FIXTURES])
def test_real_files(path: str) -> None:
    try:
        text = Path(path).read_text()
    except OSError:
        pytest.skip(f"{path} not readable")
    assert outcome(parse.parse_stat, text) == outcome(ref_parse_stat, text)
    assert outcome(parse.parse_snmp, text) == outcome(ref_parse_snmp, text)


_ws = st.sampled_from([" ", "  ", "\t", "\x0b", "\u00a0", "\u2003", ""])
_word = st.sampled_from(["cpu", "cpu0", "cpu17", "cpux", "cpu1a", "intr", "ctxt", "procs_running", "procs_blocked",
                         "procs_x", "btime", "softirq", "Tcp:", "Udp:", "Ip:", "UdpLite:", "Tcp", "InSegs",
                         "RetransSegs", "InErrors", "RcvbufErrors", "Forwarding", "x:", ""])
_num = st.one_of(st.integers(0, 10**12).map(str), st.sampled_from(["-1", "1.5", "nan", "x", "0x10", ""]))
_line = st.builds(lambda lead, toks, seps: lead + "".join(t + s for t, s in zip(toks, seps)),
                  _ws, st.lists(st.one_of(_word, _num), max_size=14), st.lists(st.sampled_from([" ", "  ", "\t", ""]),
                                                                                min_size=14, max_size=14))


@settings(max_examples=600, derandomize=True, deadline=None)
@given(st.lists(_line, max_size=12), st.sampled_from(["\n", "\r\n", "\r", "\x1c"]))
def test_generated_text(lines: list[str], nl: str) -> None:
    text = nl.join(lines)
    assert outcome(parse.parse_stat, text) == outcome(ref_parse_stat, text)
    assert outcome(parse.parse_snmp, text) == outcome(ref_parse_snmp, text)
