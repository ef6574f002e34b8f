"""What a bundle reader accepts: size and depth limits, and field-by-field checks of untrusted content.

Bundles are shared (an operator attaches one to a ticket, a colleague replays it), so a reader
trusts nothing in them beyond what it checks. ``meta.json`` is validated field by field against
what the recorder writes (types, finite numbers, a bounded node count, stored rule paths that
stay inside the segment) and read under :class:`BundleLimits` (size, JSON depth). Index entries
and Arrow schemas get the same treatment: CRCs that match prove only that nothing changed since
the writer, not that the writer was skewd. The checks return descriptions of what is wrong; the
reader (:mod:`.reader`) turns them into a ``BundleError`` or a ``Damage``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from .format import RULES_DIR, indexed_name, spec_from_dict

@dataclass(frozen=True)
class BundleLimits:
    """What a reader accepts before it calls a segment unusable (``skewd replay --limit``).

    The recorder writes one node per agent (a fault-lab bundle: one per simulated node, tens);
    meta.json is a few hundred KB with a full catalogue. The bounds sit far above that and
    below what costs an operator's laptop its memory (each node replays in its own pipeline)."""

    meta_bytes: int = 64 << 20
    json_depth: int = 32
    nodes: int = 1024
    signals: int = 100_000
    labels: int = 256  # labels per node
    text: int = 4096  # characters of a node name, label, signal name
    index_bytes: int = 1 << 30
    line_bytes: int = 16 << 20  # one index or JSON line

    @classmethod
    def from_items(cls, items: Sequence[str]) -> "BundleLimits":
        """``KEY=VALUE`` strings (positive integers); raises ValueError naming a bad one."""
        known = {f for f in cls.__dataclass_fields__}
        out: dict[str, int] = {}
        for item in items:
            k, sep, v = item.partition("=")
            k = k.strip()
            if not sep or k not in known:
                raise ValueError(f"bundle limit {item!r}: write KEY=VALUE with KEY one of {', '.join(sorted(known))}")
            try:
                n = int(v)
            except ValueError:
                raise ValueError(f"bundle limit {k}: {v!r} is not an integer") from None
            if n < 1:
                raise ValueError(f"bundle limit {k} must be at least 1")
            out[k] = n
        return cls(**out)


DEFAULT_LIMITS = BundleLimits()


def _depth_ok(doc: Any, limit: int) -> bool:
    """True when ``doc`` nests at most ``limit`` containers deep (iterative: the point is to
    refuse what recursive walks, json.dumps and deepcopy among them, would choke on). Walks
    level by level and only through containers: every index line passes through here."""
    level = [doc] if isinstance(doc, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return False
        nxt: list[Any] = []
        for node in level:
            nxt.extend(v for v in (node.values() if isinstance(node, dict) else node) if isinstance(v, (dict, list)))
        level = nxt
    return True


def _few_brackets(raw: bytes | str, limit: int) -> bool:
    """True when ``raw`` holds at most ``limit`` opening brackets: then its JSON cannot nest
    deeper than ``limit`` (a cheap exit before :func:`_depth_ok` walks the document)."""
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{") <= limit
    return raw.count(b"[") + raw.count(b"{") <= limit


def loads_bounded(raw: bytes | str, depth: int) -> Any:
    """``json.loads`` that raises ValueError (never RecursionError) for input nested deeper than
    ``depth``, or for the non-standard NaN/Infinity tokens (the writers never emit them)."""
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {depth} levels") from None
    if not _few_brackets(raw, depth) and not _depth_ok(doc, depth):
        raise ValueError(f"JSON nested deeper than {depth} levels")
    return doc


def loads_bounded_lenient(raw: bytes | str, depth: int) -> Any:
    """:func:`loads_bounded` accepting NaN/Infinity (finding evidence may carry them)."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {depth} levels") from None
    if not _few_brackets(raw, depth) and not _depth_ok(doc, depth):
        raise ValueError(f"JSON nested deeper than {depth} levels")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def is_num(v: Any) -> bool:
    """A finite JSON number that is also a finite float (10**400 is an int but no time)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return abs(v) < 1 << 1000 if isinstance(v, int) else math.isfinite(v)


def is_int(v: Any, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < 1 << 63


class MetaCheck:
    """Collects what is wrong with a meta.json document (see module doc)."""

    #: settings replay steps by: positive, finite, and not so small that stepping never ends
    SETTINGS = {"evaluation_interval": (1e-3, 86400.0), "summary_interval": (1e-3, 86400.0),
                "lookback": (1e-3, 30 * 86400.0), "horizon": (1e-3, 30 * 86400.0)}

    def __init__(self, limits: BundleLimits) -> None:
        self.limits = limits
        self.problems: list[str] = []

    def bad(self, field_: str, why: str) -> None:
        self.problems.append(f"{field_}: {why}")

    def is_text(self, v: Any) -> bool:
        """A string within the text limit that UTF-8 can encode: JSON's "\udcff" escape decodes
        to a lone surrogate, which no subject, file name or log line can carry."""
        if not isinstance(v, str) or len(v) > self.limits.text:
            return False
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    def text(self, v: Any, field_: str, optional: bool = True) -> None:
        if v is None and optional:
            return
        if not self.is_text(v):
            self.bad(field_, f"expected UTF-8 text of at most {self.limits.text} characters, got {describe(v)}")

    def texts(self, v: Any, field_: str, most: int) -> None:
        if v is None:
            return
        if not isinstance(v, list):
            self.bad(field_, f"expected a list of names, got {describe(v)}")
        elif len(v) > most:
            self.bad(field_, f"{len(v)} entries; the limit is {most} (skewd replay --limit)")
        elif not all(self.is_text(x) for x in v):
            self.bad(field_, "expected names (text)")

    def check(self, m: dict[str, Any]) -> list[str]:
        lim = self.limits
        self.texts(m.get("nodes"), "nodes", lim.nodes)
        for k in ("cluster", "recorder_node", "skewd_version"):
            self.text(m.get(k), k)
        cl = m.get("cluster")
        if isinstance(cl, str) and any(c in cl for c in " .*>\t"):
            # what the agent and controller configs accept: the replayed controller runs in it (an
            # empty cluster is a recording made without one; cluster replay names it "replay")
            self.bad("cluster", f"{cl[:40]!r} is not a cluster name (no spaces, dots, '*' or '>')")
        labels = m.get("node_labels")
        if labels is not None:
            if not isinstance(labels, dict) or len(labels) > lim.nodes:
                self.bad("node_labels", f"expected a mapping of at most {lim.nodes} nodes, got {describe(labels)}")
            else:
                for n, lab in labels.items():
                    if not isinstance(lab, dict) or len(lab) > lim.labels or not all(
                            isinstance(k, str) and isinstance(v, str) and len(k) <= lim.text and len(v) <= lim.text
                            for k, v in lab.items()) or len(n) > lim.text:
                        self.bad(f"node_labels.{n[:40]}", f"expected at most {lim.labels} text labels")
                        break
        st = m.get("settings")
        if st is not None:
            if not isinstance(st, dict):
                self.bad("settings", f"expected a mapping, got {describe(st)}")
            else:
                for k, (lo, hi) in self.SETTINGS.items():
                    if k in st and not (is_num(st[k]) and lo <= st[k] <= hi):
                        self.bad(f"settings.{k}", f"expected seconds in {lo:g}..{hi:g}, got {describe(st[k])}")
        tr = m.get("time_range")
        if tr is not None:
            if not isinstance(tr, dict):
                self.bad("time_range", f"expected a mapping, got {describe(tr)}")
            else:
                for k in ("start", "end"):
                    if tr.get(k) is not None and not is_num(tr[k]):
                        self.bad(f"time_range.{k}", f"expected a finite time, got {describe(tr[k])}")
        cat = m.get("catalogue")
        if cat is not None:
            if not isinstance(cat, list) or len(cat) > lim.signals:
                self.bad("catalogue", f"expected a list of at most {lim.signals} signals, got {describe(cat)}")
            else:
                for i, d in enumerate(cat):
                    try:
                        if not isinstance(d, dict) or any(not isinstance(d.get(k), str) or len(d[k]) > lim.text
                                                          for k in ("name", "kind", "unit", "scope")):
                            raise ValueError("expected name, kind, unit and scope as text")
                        if d.get("wrap_bits") is not None and not (is_int(d["wrap_bits"]) and d["wrap_bits"] <= 64):
                            raise ValueError("wrap_bits must be an integer up to 64")
                        spec_from_dict(d)
                    except (ValueError, TypeError, KeyError) as e:
                        self.bad(f"catalogue[{i}]", str(e)[:200])
                        break
        self.texts(m.get("signals"), "signals", lim.signals)
        self.texts(m.get("available_signals"), "available_signals", lim.signals)
        rules = m.get("rules")
        if rules is not None:
            if not isinstance(rules, dict):
                self.bad("rules", f"expected a mapping, got {describe(rules)}")
            else:
                self.text(rules.get("version"), "rules.version")
                files = rules.get("files")
                if files is not None and (not isinstance(files, list) or len(files) > 10_000):
                    self.bad("rules.files", f"expected a list of stored rule files, got {describe(files)}")
                elif files:
                    for i, f in enumerate(files):
                        stored = f.get("stored") if isinstance(f, dict) else None
                        if not (isinstance(stored, str) and isinstance(f.get("sha256"), str)
                                and stored.startswith(RULES_DIR + "/") and ".." not in Path(stored).parts
                                and "\0" not in stored and len(stored) <= lim.text):
                            self.bad(f"rules.files[{i}]", "expected {stored: rules/<name>, sha256: <hex>}")
                            break
                if rules.get("rules") is not None and not isinstance(rules.get("rules"), list):
                    self.bad("rules.rules", f"expected a list, got {describe(rules.get('rules'))}")
        return self.problems


def describe(v: Any) -> str:
    """A short description of a value for an error message."""
    if isinstance(v, (dict, list)):
        return f"a {type(v).__name__} of {len(v)}"
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def entry_problem(e: dict[str, Any]) -> str:
    """What is wrong with the shape of an index entry ("" when nothing): a matching line CRC
    proves only that the line was not changed after it was written."""
    if not isinstance(e.get("file"), str) or not indexed_name(e["file"]):
        return f"file {describe(e.get('file'))} is not a data file of a segment"
    for k in ("chunk", "offset", "length", "crc32"):
        if not is_int(e.get(k)):
            return f"{k} {describe(e.get(k))} is not a non-negative integer"
    if e["crc32"] >= 1 << 32:
        return "crc32 is not a 32-bit value"
    for k in ("t_min", "t_max"):
        if e.get(k) is not None and not is_num(e[k]):
            return f"{k} {describe(e[k])} is not a finite time"
    for k in ("batches", "ticks"):
        v = e.get(k)
        if v is not None and not (isinstance(v, list) and len(v) == 2 and all(is_int(x) for x in v)):
            return f"{k} {describe(v)} is not a [first, end] pair of integers"
    if e.get("rows") is not None and not is_int(e["rows"]):
        return f"rows {describe(e['rows'])} is not a non-negative integer"
    return ""


def schema_problem(got: pa.Schema, want: pa.Schema) -> str:
    """Why a stream's schema cannot be read as ``want`` ("" when it can): the same columns, of
    the same kinds (numbers as numbers, names as strings or dictionaries of strings)."""
    for f in want:
        i = got.get_field_index(f.name)
        if i < 0:
            return f"no column {f.name!r}"
        t = got.field(i).type
        if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type):
            ok = pa.types.is_string(t) or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type)
                                           and pa.types.is_integer(t.index_type))
        else:
            ok = pa.types.is_integer(t) or pa.types.is_floating(t)
        if not ok:
            return f"column {f.name!r} is {t}, expected {f.type}"
    return ""
