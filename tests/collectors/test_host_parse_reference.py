"""host's /proc/stat, /proc/net/snmp and /proc/net/netstat parsers drop the lines they read nothing from before
splitting them (``intr`` alone is thousands of numbers on a large node). The drop must lose
nothing: on any text - real files, generated ones, odd whitespace, garbage - the parsers give
what their line parsers give on every line, the same errors included."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewd.collectors.host import parse


def every_stat_line(text: str):
    return parse._stat_samples(text.splitlines(), parse.USER_HZ)


def every_snmp_pair(text: str):
    lines = text.splitlines()
    return parse._snmp_samples(zip(lines[::2], lines[1::2]))


def every_netstat_pair(text: str):
    lines = text.splitlines()
    return parse._snmp_samples(zip(lines[::2], lines[1::2]), parse.NETSTAT)


def outcome(fn, text: str) -> str:
    """The result as text (so NaN equals NaN), or the error's type: the same error, too."""
    try:
        return repr(fn(text))
    except Exception as e:
        return repr(type(e))


FIXTURES = [p for p in (Path(__file__).resolve().parents[1] / "fixtures").rglob("*")
            if p.is_file() and p.name in ("stat", "snmp", "netstat")]


@pytest.mark.parametrize("path", ["/proc/stat", "/proc/net/snmp", "/proc/net/netstat"] + [str(p) for p in FIXTURES])
def test_real_files(path: str) -> None:
    try:
        text = Path(path).read_text()
    except OSError:
        pytest.skip(f"{path} not readable")
    assert outcome(parse.parse_stat, text) == outcome(every_stat_line, text)
    assert outcome(parse.parse_snmp, text) == outcome(every_snmp_pair, text)
    assert outcome(parse.parse_netstat, text) == outcome(every_netstat_pair, text)


_ws = st.sampled_from([" ", "  ", "\t", "\x0b", "\u00a0", "\u2003", ""])
_word = st.sampled_from(["cpu", "cpu0", "cpu17", "cpux", "cpu1a", "intr", "ctxt", "procs_running", "procs_blocked",
                         "procs_x", "btime", "softirq", "Tcp:", "Udp:", "Ip:", "UdpLite:", "Tcp", "InSegs",
                         "RetransSegs", "InErrors", "RcvbufErrors", "Forwarding", "x:", "TcpExt:", "IpExt:",
                         "TcpExt", "TCPLossProbes", "TCPTimeouts", "InCEPkts", ""])
_num = st.one_of(st.integers(0, 10**12).map(str), st.sampled_from(["-1", "1.5", "nan", "x", "0x10", ""]))
_line = st.builds(lambda lead, toks, seps: lead + "".join(t + s for t, s in zip(toks, seps)),
                  _ws, st.lists(st.one_of(_word, _num), max_size=14), st.lists(st.sampled_from([" ", "  ", "\t", ""]),
                                                                                min_size=14, max_size=14))


@settings(max_examples=600, derandomize=True, deadline=None)
@given(st.lists(_line, max_size=12), st.sampled_from(["\n", "\r\n", "\r", "\x1c"]))
def test_generated_text(lines: list[str], nl: str) -> None:
    text = nl.join(lines)
    assert outcome(parse.parse_stat, text) == outcome(every_stat_line, text)
    assert outcome(parse.parse_snmp, text) == outcome(every_snmp_pair, text)
    assert outcome(parse.parse_netstat, text) == outcome(every_netstat_pair, text)
