"""The summary's binary encoding: the JSON summary's meaning (schema 1) in a form the controller
reads without walking a dict of dicts, for clusters where reading summaries is its main cost.

A node sends the same signals and entities summary after summary; only the numbers change. So
the binary summary sends the *layout* (the ordered (signal, entity) pairs) now and then, and
every time the values as one run of little-endian float64s in the layout's order, plus the
collective burst starts (and bytes) as float64 runs. A reader that knows the layout takes the
values as an array; one that does not refuses the summary (:class:`LayoutUnknownError`) until
a summary carrying the layout arrives: the agent sends it with the first summary of a layout,
whenever the layout changes, and every ``publish.summary_layout_every`` seconds.

Bytes on the wire (docs/wire.md has a hexdump)::

    93 53 4b 01                 magic "\\x93SK" + version (= the wire schema, 1)
    9d ...                      a MessagePack array of 13 (:class:`BinarySummary`):
        cluster, node, t, interval, synced, max_error_s, agent_version, labels,
        layout_id, layout (bin: empty, or the layout's MessagePack), values (bin: float64 LE),
        starts (bin: float64 LE), burst_bytes (bin: empty, or one float64 LE per start)

* ``0x93`` is a UTF-8 continuation byte: no UTF-8 text starts with it, so no JSON payload is
  ever taken for a binary one or the other way round (readers dispatch on the first byte).
* ``layout_id`` is a hash of the layout's bytes (:func:`layout_id`: 63 bits of BLAKE2b), so a
  reader checks a carried layout against its id, keeps one copy of a layout many nodes share,
  and a restarted agent sends the same id for the same layout.
* NaN in ``values`` or ``burst_bytes`` is JSON's ``null`` (no valid value); infinities are
  refused, as JSON cannot carry them either. NaN in ``starts`` is a start JSON would send as
  ``null`` (left out by the controller).
* Fields are only ever appended within one version (readers ignore trailing array elements);
  any other change bumps the version byte.

What a binary summary carries is exactly what its JSON carries: :func:`summary_of` gives the
:class:`~skewd.wire.messages.Summary` the JSON reader would, and :class:`SummaryEncoder` writes
JSON instead for the rare summary the binary form cannot carry exactly (burst keys other than
``"0".."n-1"``, names over :data:`MAX_NAME_CHARS`, more than :data:`MAX_LAYOUT_SAMPLES` values).
"""
from __future__ import annotations

import hashlib
import math
import re
import sys
from array import array
from dataclasses import dataclass
from typing import Annotated, Any, Mapping, Optional

import msgspec
import numpy as np

from .base import BINARY_MAGIC, WIRE_SCHEMA, SchemaVersionError, WireError
from .messages import ClockSync, Summary, encode
from .reader import MAX_NAME_CHARS, MAX_PAYLOAD_BYTES, MAX_TIME, show_value

#: what every binary summary of this schema starts with: the magic and the version byte
BINARY_PREFIX = BINARY_MAGIC + bytes([WIRE_SCHEMA])
#: most (signal, entity) pairs a layout may hold: a GPU node sends ~30, one with 16 engines ~130
MAX_LAYOUT_SAMPLES = 4096
#: summary keys that carry per-burst data for alignment, not signals: the binary form sends them
#: as their own float64 runs (``starts``, ``burst_bytes``), positionally (key ``"k"`` = position k)
BURST_STARTS = "collective_burst_starts"
BURST_BYTES = "collective_burst_bytes"
_BURST_KEYS = (BURST_STARTS, BURST_BYTES)
#: layouts a node keeps with a reader (:class:`LayoutBook`): a node whose values come and go
#: (an engine without TTFT this interval) sends a few
LAYOUTS_PER_NODE = 4

_F8 = np.dtype("<f8")
_BIG_ENDIAN = sys.byteorder == "big"
_NAN = float("nan")
_ID_MASK = (1 << 63) - 1

_Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]


class BinarySummary(msgspec.Struct, array_like=True):
    """A binary summary as it travels, after the magic (see the module doc); the values are
    read against a layout with :func:`values_of`. What :func:`read_binary` returns: checked
    for everything that does not need the layout."""

    cluster: _Name
    node: _Name
    t: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIME)]
    interval: Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
    synced: bool
    max_error_s: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIME)]]
    agent_version: str
    labels: dict[_Name, _Name]
    layout_id: Annotated[int, msgspec.Meta(ge=0, le=_ID_MASK)]
    layout: bytes  # empty, or the layout's MessagePack (its hash is layout_id)
    values: bytes  # float64 LE, one per layout pair
    starts: bytes  # float64 LE, the collective burst starts
    burst_bytes: bytes  # empty, or float64 LE, one per start


_FIELDS = BinarySummary.__struct_fields__
_HEADER = msgspec.msgpack.Decoder(BinarySummary)
_LAYOUT = msgspec.msgpack.Decoder(list[tuple[_Name, list[_Name]]])
_ENCODER = msgspec.msgpack.Encoder()
_AT_FIELD = re.compile(r" - at `\$\[(\d+)\]([^`]*)`")


class LayoutUnknownError(WireError):
    """A binary summary without its layout, whose layout id the reader has not learned yet
    (it comes with the node's next summary that carries it)."""


@dataclass(frozen=True, eq=False)
class SummaryLayout:
    """Which (signal, entity) each value of a binary summary is, in order: the signals with
    their entities, and per value position its signal (``names``) and entity (``entities``).
    ``raw`` is the layout's MessagePack, whose hash is ``id``."""

    id: int
    raw: bytes
    signals: tuple[tuple[str, tuple[str, ...]], ...]
    names: tuple[str, ...]
    entities: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.names)


def layout_id(raw: bytes) -> int:
    """The id of the layout whose MessagePack is ``raw``: 63 bits of its BLAKE2b hash."""
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") & _ID_MASK


def _layout(raw: bytes, signals: tuple[tuple[str, tuple[str, ...]], ...]) -> SummaryLayout:
    return SummaryLayout(layout_id(raw), raw, signals, tuple(s for s, es in signals for _ in es),
                         tuple(e for _, es in signals for e in es))


def make_layout(signals: Mapping[str, Any]) -> SummaryLayout:
    """The layout of a summary's ``signals`` (signal → entities), in the order its JSON has
    (sorted signals, sorted entities: ``wire.encode`` sorts keys), the burst keys left out."""
    pairs = tuple((s, tuple(sorted(signals[s]))) for s in sorted(signals) if s not in _BURST_KEYS)
    return _layout(_ENCODER.encode([[s, list(es)] for s, es in pairs]), pairs)


def read_layout(raw: bytes, claimed_id: int, max_samples: int | None = MAX_LAYOUT_SAMPLES) -> SummaryLayout:
    """A carried layout, checked: its hash is the summary's ``layout_id``, it is a list of
    ``[signal, [entity, ...]]`` of names, no signal or (signal, entity) twice, no burst key,
    at most ``max_samples`` pairs (None: no bound; a controller's digest, whose rows may come
    from JSON summaries, bounds its layouts by its message size instead). Every problem raises
    :class:`WireError`."""
    got = layout_id(raw)
    if got != claimed_id:
        raise WireError(f"summary: field 'layout' hashes to layout id {got}, but field 'layout_id' is {claimed_id}")
    try:
        pairs = _LAYOUT.decode(raw)
    except msgspec.ValidationError as e:
        raise WireError(f"summary.layout: {_where(e)}") from None
    except (msgspec.DecodeError, RecursionError, ValueError, OverflowError) as e:
        raise WireError(f"summary.layout: not a MessagePack layout: {e}") from None
    n = sum(len(es) for _, es in pairs)
    if max_samples is not None and n > max_samples:
        raise WireError(f"summary.layout: {n} (signal, entity) pairs; at most {max_samples} are accepted")
    seen: set[str] = set()
    for s, es in pairs:
        if s in seen:
            raise WireError(f"summary.layout: signal {show_value(s)} appears twice")
        if s in _BURST_KEYS:
            raise WireError(f"summary.layout: signal {s!r} travels in its own field (starts, burst_bytes)")
        seen.add(s)
        if len(set(es)) != len(es):
            raise WireError(f"summary.layout: signal {show_value(s)} lists an entity twice")
    return _layout(raw, tuple((s, tuple(es)) for s, es in pairs))


def _where(e: msgspec.ValidationError) -> str:
    """msgspec's message with the array position it names turned into the field name."""
    msg = str(e)
    m = _AT_FIELD.search(msg)
    if m is None:
        return msg
    i = int(m.group(1))
    field = _FIELDS[i] if i < len(_FIELDS) else f"#{i}"
    return f"field {field!r}{m.group(2) and ' ' + m.group(2)}: {msg[:m.start()]}"


def read_binary(data: bytes | bytearray | memoryview) -> BinarySummary:
    """A binary summary's fields, checked for all that does not need its layout: the magic and
    version, every field's type and range (names at most :data:`MAX_NAME_CHARS`, times
    finite in [0, 1e11], ``interval`` and ``max_error_s`` >= 0), whole float64 runs, no
    infinite start, a ``burst_bytes`` run as long as ``starts`` (or empty), at most
    :data:`MAX_PAYLOAD_BYTES`. Every problem raises :class:`WireError` naming the field
    (:class:`SchemaVersionError` for another version)."""
    raw = data if type(data) is bytes else bytes(data)
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise WireError(f"payload is {len(raw)} bytes; the limit is {MAX_PAYLOAD_BYTES}")
    if raw[:4] != BINARY_PREFIX:
        if raw[:3] == BINARY_MAGIC and len(raw) > 3:
            raise SchemaVersionError(
                f"binary summary has version {raw[3]}; this skewd reads version {WIRE_SCHEMA} only "
                f"(producer and consumer run incompatible skewd versions: upgrade the older side)")
        raise WireError(f"payload does not start with the binary summary's magic {BINARY_PREFIX!r}")
    try:
        h = _HEADER.decode(memoryview(raw)[4:])
    except msgspec.ValidationError as e:
        raise WireError(f"summary: {_where(e)}") from None
    except (msgspec.DecodeError, RecursionError, ValueError, OverflowError) as e:
        raise WireError(f"summary: not a binary summary: {e}") from None
    nv, ns, nb = len(h.values), len(h.starts), len(h.burst_bytes)
    if (nv | ns | nb) & 7:
        name, n = next((k, n) for k, n in (("values", nv), ("starts", ns), ("burst_bytes", nb)) if n & 7)
        raise WireError(f"summary: field {name!r} holds {n} bytes, not a whole number of float64s")
    if nb and nb != ns:
        raise WireError(f"summary: field 'burst_bytes' holds {nb // 8} values for {ns // 8} starts")
    if ns:
        starts = floats(h.starts)
        _no_infinity(starts, "starts")
        _STARTS[0] = (h.starts, starts)
        if nb:
            _no_infinity(floats(h.burst_bytes), "burst_bytes")
    return h


#: the starts read_binary checked last, as (the field's bytes, its floats): starts_of takes them
#: from here instead of reading the run a second time (the bytes object is held, so its
#: identity cannot be another summary's)
_STARTS: list[tuple[bytes, list[float]]] = [(b"", [])]


def starts_of(h: BinarySummary) -> list[float]:
    """The summary's burst starts as floats (checked by :func:`read_binary`): read-only, the
    list may be the one read_binary made."""
    raw, starts = _STARTS[0]
    if raw is h.starts:
        return starts
    return floats(h.starts) if h.starts else []


def floats(raw: bytes) -> list[float]:
    """A float64 LE run as Python floats (``array`` is the fastest way there; it reads the
    machine's byte order, which every platform skewd ships for shares)."""
    a = array("d", raw)
    if _BIG_ENDIAN:
        a.byteswap()
    return a.tolist()


def _no_infinity(values: list[float], field: str) -> None:
    s = sum(values)
    if s - s == 0.0:  # finite: no infinity (nor NaN) among them
        return
    for i, v in enumerate(values):
        if v in (math.inf, -math.inf):
            raise WireError(f"summary: field {field!r}[{i}] is {v}: values must be finite or NaN (missing)")


def values_of(h: BinarySummary, layout: SummaryLayout) -> np.ndarray:
    """The summary's values as float64s (a read-only array), one per ``layout`` pair: as many
    as the layout holds, none infinite (NaN: missing)."""
    read_values(h, layout)
    return np.frombuffer(h.values, _F8)


def read_values(h: BinarySummary, layout: SummaryLayout) -> tuple[list[float], bool]:
    """The summary's values as Python floats, checked as by :func:`values_of`, and whether
    none is NaN (the controller's intake needs both; each is made once here)."""
    if len(h.values) != 8 * len(layout):
        raise WireError(f"summary: field 'values' holds {len(h.values) // 8} values; layout {h.layout_id} "
                        f"holds {len(layout)}")
    vals = floats(h.values)
    s = sum(vals)
    if s - s == 0.0:
        return vals, True
    _no_infinity(vals, "values")
    return vals, not any(v != v for v in vals)  # (finite values whose sum overflowed: complete)


def summary_of(h: BinarySummary, layout: SummaryLayout, values: np.ndarray) -> Summary:
    """The :class:`Summary` a binary summary stands for (what the JSON reader gives for the
    same summary sent as JSON): NaN values become None, the bursts ``{"0": ..., "1": ...}``."""
    vals = values.tolist()
    signals: dict[str, dict[str, float | None]] = {}
    i = 0
    for s, es in layout.signals:
        signals[s] = {e: (None if v != v else v) for e, v in zip(es, vals[i:i + len(es)])}
        i += len(es)
    if h.starts:
        starts = floats(h.starts)
        signals[BURST_STARTS] = {str(k): (None if v != v else v) for k, v in enumerate(starts)}
        if h.burst_bytes:
            nb = floats(h.burst_bytes)
            signals[BURST_BYTES] = {str(k): (None if v != v else v) for k, v in enumerate(nb)}
    return Summary(node=h.node, cluster=h.cluster, t=h.t, interval=h.interval, signals=signals,
                   clock_sync=ClockSync(synced=h.synced, max_error_s=h.max_error_s),
                   agent_version=h.agent_version, labels=h.labels, schema=WIRE_SCHEMA)


class LayoutBook:
    """The layouts a reader has learned, by id, and the ones each node uses: every node keeps
    its last :data:`LAYOUTS_PER_NODE`, and a layout no node keeps is forgotten, so the book is
    bounded by the nodes the reader admits. Owned by a reader (the controller's intake,
    :class:`~skewd.wire.decoding.BinarySummaryReader`); :meth:`resolve` finds a summary's layout, :meth:`keep` records
    it for the node once the reader took the summary."""

    def __init__(self, per_node: int = LAYOUTS_PER_NODE) -> None:
        self.per_node = per_node
        self.layouts: dict[int, SummaryLayout] = {}
        self._users: dict[int, int] = {}  # layout id → nodes that keep it
        self._nodes: dict[str, list[int]] = {}  # node → the ids it keeps, most recent last

    def resolve(self, h: BinarySummary) -> SummaryLayout | None:
        """The layout of ``h``: the one it carries (checked, :func:`read_layout`) or the one
        learned under its id; None when neither. Learns nothing (see :meth:`keep`)."""
        lay = self.layouts.get(h.layout_id)
        if h.layout and (lay is None or lay.raw != h.layout):
            lay = read_layout(h.layout, h.layout_id)
        return lay

    def keep(self, node: str, layout: SummaryLayout) -> list[int]:
        """Note that ``node`` uses ``layout``; returns the ids of layouts forgotten meanwhile."""
        ids = self._nodes.get(node)
        if ids is None:
            ids = self._nodes[node] = []
        elif ids and ids[-1] == layout.id:
            return []
        if layout.id in ids:
            ids.remove(layout.id)
            ids.append(layout.id)
            return []
        ids.append(layout.id)
        if layout.id not in self.layouts:
            self.layouts[layout.id] = layout
        self._users[layout.id] = self._users.get(layout.id, 0) + 1
        gone = []
        while len(ids) > self.per_node:
            gone += self._release(ids.pop(0))
        return gone

    def forget_node(self, node: str) -> list[int]:
        """Forget what ``node`` keeps; returns the ids of layouts no node keeps any more."""
        gone = []
        for lid in self._nodes.pop(node, ()):
            gone += self._release(lid)
        return gone

    def _release(self, lid: int) -> list[int]:
        n = self._users.get(lid, 0) - 1
        if n > 0:
            self._users[lid] = n
            return []
        self._users.pop(lid, None)
        self.layouts.pop(lid, None)
        return [lid]


def decode_binary_summary(data: bytes | bytearray | memoryview, book: LayoutBook | None = None) -> Summary:
    """The :class:`Summary` of a binary summary, its layout the one it carries or one ``book``
    learned (then noted for the node in ``book``). :class:`LayoutUnknownError` when neither;
    every other problem :class:`WireError` naming the field."""
    h = read_binary(data)
    lay = (book or LayoutBook()).resolve(h)
    if lay is None:
        raise LayoutUnknownError(f"summary: layout {h.layout_id} of node {show_value(h.node)} is not known yet "
                                 "(it comes with the node's next summary that carries it)")
    vals = values_of(h, lay)
    if book is not None:
        book.keep(h.node, lay)
    return summary_of(h, lay, vals)


def pack(h: BinarySummary) -> bytes:
    """The bytes of a binary summary (prefix + MessagePack)."""
    return BINARY_PREFIX + _ENCODER.encode(h)


class _NotCarried(Exception):
    """The binary form cannot carry this summary exactly (it goes as JSON)."""


def _finite_or_nan(v: Any) -> float:
    if v is None:
        return _NAN
    f = float(v)
    return f if f - f == 0.0 else _NAN


def _bursts(signals: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """The burst starts and bytes as float64 runs, when their keys are ``"0".."n-1"`` in order
    (what agents send) and the bytes' keys the starts' (or no bytes)."""
    starts = signals.get(BURST_STARTS)
    nbytes = signals.get(BURST_BYTES)
    if not starts:
        if starts is not None or nbytes:
            raise _NotCarried("bursts without starts")
        return b"", b""
    keys = list(starts)
    if keys != [str(k) for k in range(len(keys))]:
        raise _NotCarried("burst keys other than 0..n-1")
    sb = np.array([_finite_or_nan(v) for v in starts.values()], dtype=_F8).tobytes()
    if nbytes is None:
        return sb, b""
    if list(nbytes) != keys:
        raise _NotCarried("burst bytes keyed unlike the starts")
    return sb, np.array([_finite_or_nan(v) for v in nbytes.values()], dtype=_F8).tobytes()


class SummaryEncoder:
    """Writes one agent's summaries in the binary encoding (a publisher holds one). A summary
    carries its layout when the layout is not among the node's last :data:`LAYOUTS_PER_NODE`
    (what a reader's :class:`LayoutBook` keeps for the node: a node whose values come and go
    alternates between a few), when it last rode along ``layout_every`` seconds ago or more
    (summary time, so replay is deterministic: a restarted reader learns it within that), and
    after :meth:`resend_layout` (a reconnect, a summary dropped). A summary the binary form
    cannot carry exactly goes as JSON (:func:`~skewd.wire.messages.encode`)."""

    def __init__(self, layout_every: float = 10.0) -> None:
        self.layout_every = layout_every
        self._layouts: dict[tuple, SummaryLayout] = {}  # shape → layout, the last few
        self._sent: dict[int, float] = {}  # layout id → summary time it last rode along, least recently used first
        self.json_fallbacks = 0  # summaries sent as JSON because binary could not carry them

    def resend_layout(self) -> None:
        """Let the next summaries carry their layouts (a reader may have missed them)."""
        self._sent.clear()

    def encode(self, s: Summary) -> bytes:
        try:
            return self._encode(s)
        except _NotCarried:
            self.json_fallbacks += 1
            return encode(s)

    def _encode(self, s: Summary) -> bytes:
        sig = s.signals
        shape = tuple((name, tuple(ents)) for name, ents in sig.items() if name not in _BURST_KEYS)
        lay = self._layouts.get(shape)
        if lay is None:
            for name, ents in shape:
                if len(name) > MAX_NAME_CHARS or any(len(e) > MAX_NAME_CHARS for e in ents):
                    raise _NotCarried("a name longer than MAX_NAME_CHARS")
            lay = make_layout(sig)
            if len(lay) > MAX_LAYOUT_SAMPLES:
                raise _NotCarried("too many values")
            if len(self._layouts) >= 2 * LAYOUTS_PER_NODE:
                self._layouts.clear()
            self._layouts[shape] = lay
        values = np.array([_finite_or_nan(sig[name][e]) for name, e in zip(lay.names, lay.entities)], dtype=_F8)
        starts, nbytes = _bursts(sig)
        t = float(s.t)
        last = self._sent.pop(lay.id, None)
        carry = last is None or not t - last < self.layout_every
        self._sent[lay.id] = t if carry else last  # type: ignore[assignment]
        if len(self._sent) > LAYOUTS_PER_NODE:
            del self._sent[next(iter(self._sent))]
        err = s.clock_sync.max_error_s
        return pack(BinarySummary(
            s.cluster, s.node, t, float(s.interval), bool(s.clock_sync.synced),
            None if err is None or not math.isfinite(err) else float(err), s.agent_version, dict(s.labels),
            lay.id, lay.raw if carry else b"", values.tobytes(), starts, nbytes))
