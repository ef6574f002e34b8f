"""The lexical pre-pass of rule expressions: duration literals become placeholder names.

Python's parser does not accept ``30s`` or ``1h30m``; rewriting them as ``_d0_``-style names
(outside string literals) lets ``ast`` parse the rest, and the recorded spans map an error's
column in the rewritten text back to the original, so messages point at what the author wrote.
"""
from __future__ import annotations

import re
from typing import Sequence

from skewd.model import parse_duration

from .codes import Code, ExprError
from .limits import RuleLimits

#: a duration literal outside a name or number: 30s, 250ms, 1h30m, 1.5m
_DUR_LIT = re.compile(r"(?<![\w.])((?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+)(?![\w.])")
#: placeholder names: the compiler reads ``_d<i>_`` as the i-th duration
PLACEHOLDER = "_d{}_"


def split_strings(text: str) -> list[tuple[int, int, bool]]:
    """Segments (start, end, is_string_literal) so duration rewriting skips quoted text."""
    segs = []
    i = 0
    start = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            if i > start:
                segs.append((start, i, False))
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            segs.append((i, j, True))
            i = start = j
        else:
            i += 1
    if start < n:
        segs.append((start, n, False))
    return segs


def rewrite_durations(text: str, limits: RuleLimits | None = None
                      ) -> tuple[str, list[float], list[tuple[int, int, int]]]:
    """Replace duration literals by placeholder names.

    Returns (new text, durations by placeholder index, spans (new_start, new_len, orig_len)).
    With ``limits``, a literal outside them raises an :class:`ExprError` at its offset."""
    out: list[str] = []
    durs: list[float] = []
    spans: list[tuple[int, int, int]] = []
    pos = 0
    for a, b, is_str in split_strings(text):
        seg = text[a:b]
        if is_str:
            out.append(seg)
            pos += len(seg)
            continue
        last = 0
        for m in _DUR_LIT.finditer(seg):
            out.append(seg[last: m.start()])
            pos += m.start() - last
            name = PLACEHOLDER.format(len(durs))
            d = parse_duration(m.group(1))
            why = limits.duration_problem(d) if limits is not None else None
            if why:
                raise ExprError(Code.OUT_OF_RANGE, f"{m.group(1)}: {why}", a + m.start(1))
            durs.append(d)
            spans.append((pos, len(name), len(m.group(1))))
            out.append(name)
            pos += len(name)
            last = m.end()
        out.append(seg[last:])
        pos += len(seg) - last
    return "".join(out), durs, spans


def map_offset(new_off: int, spans: Sequence[tuple[int, int, int]]) -> int:
    """An offset into the rewritten text → the offset into the original (a placeholder maps to
    the start of its literal)."""
    shift = 0
    for start, new_len, orig_len in spans:
        if new_off >= start + new_len:
            shift += new_len - orig_len
        elif new_off >= start:
            return start - shift
    return new_off - shift
