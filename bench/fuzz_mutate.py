"""The fuzzer's mutation engine: text, byte and JSON-value mutations of real samples.

Format-agnostic on purpose: a :class:`Mutator` knows byte flips and splices, interesting
numbers (2**64, 1e309, NaN, 400-digit integers), special characters, a dictionary of tokens it
is handed, and edits of parsed JSON values (wrong types, nesting thousands deep). What is
mutated, and which parser gets it, is the targets' business (:mod:`fuzz_targets`); running and
counting is the harness's (:mod:`fuzz`). Everything is driven by one ``random.Random``, so an
input is a function of its seed alone.
"""
from __future__ import annotations

import bisect
import json
import random
import re
from typing import Any


#: numbers that break parsers: type limits, float edges, non-finite spellings, huge integers
NUMBERS = ["0", "-0", "1", "-1", "7", "255", "256", "-129", "65535", "65536", "2147483647", "2147483648",
           "-2147483649", "4294967295", "4294967296", "9007199254740993", "9223372036854775807",
           "9223372036854775808", "18446744073709551615", "18446744073709551616", "1e308", "1e309", "-1e309",
           "4.9e-324", "1e-400", "NaN", "nan", "-nan", "+Inf", "-Inf", "inf", "Infinity", ".inf", "-.inf", ".nan",
           "0x7fffffff", "0xffffffffffffffff", "1_000", "0o777", "0b101", "1.", ".5", "1e", "--1", "+-1",
           "9" * 400, "-" + "9" * 60, "1" + "0" * 30 + "h", "99999999999999999999999h", "0.000000001ms",
           "\u0663", "\u00b2", "\uff11", "1\u00a0", "NaN\u00a0"]
#: characters that change meaning in one format or another
SPECIAL = ["\0", "\n", "\r", "\t", " ", "\\", "\"", "'", "{", "}", "[", "]", "(", ")", ":", ",", "#", "&", "*",
           "!", "|", ">", "<", "=", "%", "@", "`", "\u2028", "\ufeff", "\udcff", "\U0001f600", "\x85"]


class Mutator:
    """Text, byte and JSON-value mutations driven by one ``random.Random``."""

    def __init__(self, rng: random.Random, seeds: list, tokens: list[str] | None = None,
                 max_len: int = 1 << 16, deep: int = 3000) -> None:
        self.rng = rng
        self.seeds = seeds
        self.tokens = tokens or []
        self.max_len = max_len
        self.deep = deep  # deepest nesting value() makes (JSON parsers recurse: 3000 finds that)

    # -- text ----------------------------------------------------------------------------------
    def text(self, s: str, rounds: int | None = None) -> str:
        r = self.rng
        for _ in range(rounds or r.choice((1, 1, 2, 3, 5, 8))):
            s = r.choice(self._TEXT_OPS)(self, s)
            if len(s) > self.max_len:
                s = s[: self.max_len]
        return s

    def _pos(self, s: str) -> int:
        return self.rng.randint(0, len(s)) if s else 0

    def _t_insert_token(self, s: str) -> str:
        tok = self.rng.choice(self.tokens or SPECIAL)
        i = self._pos(s)
        return s[:i] + tok + s[i:]

    def _t_insert_special(self, s: str) -> str:
        i = self._pos(s)
        return s[:i] + self.rng.choice(SPECIAL) * self.rng.choice((1, 1, 2, 3, 50)) + s[i:]

    def _t_number(self, s: str) -> str:
        nums = list(re.finditer(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", s))
        new = self.rng.choice(NUMBERS)
        if not nums:
            i = self._pos(s)
            return s[:i] + new + s[i:]
        m = self.rng.choice(nums)
        return s[: m.start()] + new + s[m.end():]

    def _t_delete(self, s: str) -> str:
        if not s:
            return s
        a = self._pos(s)
        b = min(len(s), a + self.rng.choice((1, 1, 2, 4, 16, 128)))
        return s[:a] + s[b:]

    def _t_duplicate(self, s: str) -> str:
        if not s:
            return s
        a = self._pos(s)
        b = min(len(s), a + self.rng.choice((1, 4, 16, 64, 512)))
        return s[:b] + s[a:b] * self.rng.choice((1, 2, 8, 100)) + s[b:]

    def _t_line(self, s: str) -> str:
        lines = s.split("\n")
        if not lines:
            return s
        r = self.rng
        i = r.randrange(len(lines))
        op = r.randrange(5)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(r.randrange(len(lines) + 1), lines[i])
        elif op == 2:
            j = r.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3:
            lines[i] = " " * r.choice((1, 2, 4)) + lines[i]
        else:
            lines[i] = lines[i].lstrip(" ")
        return "\n".join(lines)

    def _t_splice(self, s: str) -> str:
        other = self.rng.choice(self.seeds)
        if isinstance(other, bytes):
            other = other.decode("utf-8", "replace")
        if not isinstance(other, str) or not other:
            return s
        a = self.rng.randrange(len(other))
        piece = other[a: a + self.rng.choice((8, 64, 512))]
        i = self._pos(s)
        return s[:i] + piece + s[i:]

    def _t_char(self, s: str) -> str:
        if not s:
            return s
        i = self.rng.randrange(len(s))
        return s[:i] + chr(self.rng.choice((self.rng.randrange(32, 127), self.rng.randrange(0, 0x2000),
                                            ord(s[i]) ^ (1 << self.rng.randrange(7))))) + s[i + 1:]

    def _t_nest(self, s: str) -> str:
        i = self._pos(s)
        o, c = self.rng.choice((("[", "]"), ("{", "}"), ("(", ")")))
        n = self.rng.choice((10, 100, 1000, 5000))
        return s[:i] + o * n + s[i:i + 5] + c * n + s[i + 5:]

    def _t_truncate(self, s: str) -> str:
        return s[: self._pos(s)]

    _TEXT_OPS = [_t_insert_token, _t_insert_token, _t_insert_special, _t_number, _t_number, _t_delete,
                 _t_duplicate, _t_line, _t_line, _t_splice, _t_char, _t_nest, _t_truncate]

    # -- bytes ---------------------------------------------------------------------------------
    def bytes_(self, b: bytes, rounds: int | None = None, ints: list[int] | None = None) -> bytes:
        r = self.rng
        a = bytearray(b)
        for _ in range(rounds or r.choice((1, 1, 2, 3, 6))):
            op = r.randrange(9)
            n = len(a)
            if op == 0 and n:  # bit flip
                i = r.randrange(n)
                a[i] ^= 1 << r.randrange(8)
            elif op == 1 and n:  # random byte
                a[r.randrange(n)] = r.randrange(256)
            elif op in (2, 3) and n >= 4:  # an interesting integer over 1/2/4/8 aligned bytes
                width = r.choice((1, 2, 4, 4, 8))
                i = r.randrange(0, max(1, n - width + 1))
                if r.random() < 0.7:
                    i -= i % 4
                v = r.choice(ints or [0]) if ints and r.random() < 0.6 else r.choice(
                    (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, (1 << 63) - 1,
                     1 << 63, (1 << 64) - 1, r.getrandbits(32)))
                v &= (1 << (8 * width)) - 1
                a[i:i + width] = v.to_bytes(width, r.choice(("little", "big")))
            elif op == 4 and n:  # delete a range
                i = r.randrange(n)
                del a[i:i + r.choice((1, 4, 16, 64, 1024))]
            elif op == 5 and n:  # duplicate a range
                i = r.randrange(n)
                j = min(n, i + r.choice((4, 16, 64, 256, 4096)))
                a[j:j] = a[i:j] * r.choice((1, 2, 4))
            elif op == 6 and n:  # truncate
                del a[r.randrange(n):]
            elif op == 7:  # splice from another seed
                other = r.choice(self.seeds)
                if isinstance(other, (bytes, bytearray)) and other:
                    i = r.randrange(len(other))
                    piece = other[i:i + r.choice((16, 64, 1024))]
                    k = r.randrange(n + 1)
                    a[k:k] = piece
            elif op == 8 and n:  # insert random bytes
                k = r.randrange(n + 1)
                a[k:k] = bytes(r.randrange(256) for _ in range(r.choice((1, 3, 8))))
            if len(a) > self.max_len:
                del a[self.max_len:]
        return bytes(a)

    # -- JSON values ---------------------------------------------------------------------------
    def value(self) -> Any:
        r = self.rng
        k = r.randrange(16)
        if k == 0:
            return None
        if k == 1:
            return r.choice((True, False))
        if k == 2:
            return r.choice((0, -1, 1, 2 ** 31, 2 ** 53 + 1, 2 ** 64, -(2 ** 63) - 1, 10 ** 400))
        if k == 3:
            return r.choice((1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"), 0.5))
        if k == 4:
            return r.choice(("", "x", "\0", "\udcff", "a" * 10_000, "1e400", "NaN", "seg-000001", "../../etc/passwd",
                             "/etc/passwd", "rules/../../x"))
        if k == 5:
            return []
        if k == 6:
            return {}
        if k == 7:  # deep nesting
            v: Any = 1
            for _ in range(r.choice((50, min(500, self.deep), self.deep))):
                v = [v] if r.random() < 0.5 else {"a": v}
            return v
        if k == 8:  # a large flat list
            return list(range(r.choice((1000, 100_000))))
        if k == 9:
            return {str(i): i for i in range(r.choice((10, 10_000)))}
        if k == 10:
            return [r.choice(("x", 1, None, [], {}))] * r.randrange(1, 5)
        return r.choice(NUMBERS)

    def json(self, doc: Any) -> Any:
        """Replace, delete or add one node of a JSON document (a copy is not made: pass one)."""
        r = self.rng
        paths = _Paths(doc, 5000)
        if not paths:
            return self.value() if r.random() < 0.5 else doc
        parent, key = r.choice(paths)
        op = r.randrange(6)
        if op <= 2:
            parent[key] = self.value()
        elif op == 3 and isinstance(parent, dict):
            del parent[key]
        elif op == 3:
            del parent[key]
        elif op == 4 and isinstance(parent, dict):
            parent[r.choice(("x", "", "nodes", "t", "kind", "schema", "format_version"))] = self.value()
        elif op == 4:
            parent.insert(r.randrange(len(parent) + 1), self.value())
        else:  # a value of another node put here (wrong type, same flavour)
            other_parent, other_key = r.choice(paths)
            parent[key] = other_parent[other_key]
        return doc


class _Paths:
    """Every (container, key) of the first ``budget`` nodes of a JSON document, visited depth
    first (children of a container in reverse order), as a sequence ``random.choice`` can pick
    from.

    Why not a list of tuples: a document holding a 100,000-entry list (a mutant of an earlier
    round) meant 200,000 appends per mutation, most of a wire input's cost. Here a visited
    container adds one segment (its keys) and the walk steps through segments; the order and
    the chosen paths are exactly those of the plain list, so an input's index still names the
    same input."""

    __slots__ = ("_segs", "_ends", "_total")

    def __init__(self, doc: Any, budget: int) -> None:
        self._segs: list[tuple[Any, Any]] = []  # (container, its keys) in the order visited
        self._ends: list[int] = []  # cumulative path count at the end of each segment
        self._total = 0
        stack: list[list[Any]] = []  # [container, keys, children not yet visited]
        self._visit(doc, stack)
        seen = 1
        while stack and seen < budget:
            top = stack[-1]
            hi = top[2] = top[2] - 1
            if hi == 0:
                stack.pop()
            seen += 1
            child = top[0][top[1][hi]]
            if isinstance(child, (dict, list)):
                self._visit(child, stack)

    def _visit(self, node: Any, stack: list[list[Any]]) -> None:
        if isinstance(node, dict):
            keys: Any = list(node)
        elif isinstance(node, list):
            keys = range(len(node))
        else:
            return
        if keys:
            self._segs.append((node, keys))
            self._total += len(keys)
            self._ends.append(self._total)
            stack.append([node, keys, len(keys)])

    def __len__(self) -> int:
        return self._total

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        s = bisect.bisect_right(self._ends, i)
        node, keys = self._segs[s]
        return node, keys[i - (self._ends[s] - len(keys))]


def dumps(doc: Any) -> str:
    try:
        return json.dumps(doc, allow_nan=True)
    except (RecursionError, ValueError, TypeError):
        return "[" * 5000 + "]" * 5000
