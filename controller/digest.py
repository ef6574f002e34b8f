"""Digests: what a controller partition hands the leader once per evaluation (MessagePack) -
each node's latest summary less its collective bursts, the derived ctl_* values the cluster-wide
rules read and the alignment reports of its TP groups. Both the partition's side of the exchange
(controller/exchange.py) and the scale-out runtime (controller/scaleout.py) use it.

The summaries travel as columns (schema 2): rows of one binary summary layout
(:class:`skewd.wire.SummaryLayout`) are a :class:`DigestBlock` - the nodes, times and intervals
as lists and the values as one float64 matrix (NaN: missing) - and the layouts and label sets
are written once per message. A JSON summary's signals become their layout
(:func:`skewd.wire.make_layout`: sorted signals and entities, null as NaN) at the partition, so
the leader takes every row in through the binary intake's fast paths, never a dict per node.
Consecutive rows of one layout share a block: the rows stay in the partition's order, so the
leader's store learns new entities in the order the per-dict digests (schema 1) gave it.
"""
from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any, Mapping, Optional

import msgspec
import numpy as np

from skewd import wire

DIGEST_SCHEMA = 2
#: nodes per digest message at most (whatever their size: the leader takes a message at a time)
DIGEST_NODES_PER_MESSAGE = 2000
#: bytes per digest message, estimated as it is built, at most: half NATS's default 1 MiB
#: max_payload, so that what the estimate leaves out (MessagePack framing) cannot cross it
DIGEST_BYTES_PER_MESSAGE = 512 * 1024
_F8 = np.dtype("<f8")
_NAN = float("nan")


# ---------------------------------------------------------------------------------------------
# digests: a partition's share of what the leader needs, once per evaluation
# ---------------------------------------------------------------------------------------------

class DigestBlock(msgspec.Struct, array_like=True):
    """Consecutive rows of one layout: per row a node's latest summary as the partition took it
    in, less its collective bursts (the partition's aligner is their only reader)."""

    layout: int  # index into Digest.layouts
    nodes: list[str]
    t: list[float]
    interval: list[float]
    labels: list[int]  # per row an index into Digest.labels, -1: none
    values: bytes  # float64 LE, len(nodes) rows of the layout's length, NaN: missing


class Digest(msgspec.Struct, array_like=True):
    """What a partition hands the leader at evaluation time ``t`` (MessagePack): the nodes
    that sent a summary since the last digest (``blocks``, their layouts' MessagePack in
    ``layouts`` and their label sets in ``labels``, each once), the derived ctl_* values of its
    nodes that the cluster-wide rules read and the alignment reports of its TP groups
    (incident evidence)."""

    schema: int
    cluster: str
    partition: int
    t: float
    layouts: list[tuple[int, bytes]]  # (layout id, its MessagePack)
    labels: list[dict[str, str]]
    blocks: list[DigestBlock]
    derived: dict[str, dict[str, float]]
    reports: dict[str, dict[str, Any]]


_DIGEST = msgspec.msgpack.Decoder(Digest)
_ENCODER = msgspec.msgpack.Encoder()


def json_columns(signals: Mapping[str, Mapping[str, Optional[float]]],
                 cache: dict[tuple, tuple[wire.SummaryLayout, list, struct.Struct]]) -> tuple[wire.SummaryLayout, bytes]:
    """A JSON summary's signals as a binary summary's layout and values (null: NaN), the burst
    keys left out; ``cache`` (shape → layout, its (signal, entity) pairs and their packer)
    spares working the same shape out again."""
    key = (tuple(signals), tuple(map(tuple, signals.values())))
    known = cache.get(key)
    if known is None:
        lay = wire.make_layout(signals)
        known = cache[key] = (lay, [(s, e) for s, ents in lay.signals for e in ents], struct.Struct(f"<{len(lay)}d"))
    lay, pairs, packer = known
    vals = [signals[s][e] for s, e in pairs]
    if None in vals:
        vals = [_NAN if v is None else v for v in vals]
    return lay, packer.pack(*vals)


def encode_digests(cluster: str, partition: int, t: float, rows: Mapping[str, tuple],
                   derived: Mapping[str, Mapping[str, float]], reports: Mapping[str, Any]) -> list[bytes]:
    """The digest messages of one evaluation, at most :data:`DIGEST_NODES_PER_MESSAGE` nodes
    and about :data:`DIGEST_BYTES_PER_MESSAGE` bytes each (``rows``: node → (t, interval,
    labels, values) of its latest summary, the values a JSON summary's signals or a binary
    one's (layout, float64 bytes))."""
    nodes = list(dict.fromkeys([*rows, *derived]))
    reps = {g: _report_dict(r) for g, r in reports.items()}
    shapes: dict[tuple, tuple] = {}
    out: list[bytes] = []
    msg = _Message(reps)
    for node in nodes:
        cost = msg.cost(node, rows.get(node), derived.get(node), shapes)
        if msg.nodes and (msg.nodes >= DIGEST_NODES_PER_MESSAGE or msg.size + cost > DIGEST_BYTES_PER_MESSAGE):
            out.append(msg.encode(cluster, partition, t))
            msg = _Message({})
            cost = msg.cost(node, rows.get(node), derived.get(node), shapes)
        msg.add(node, cost)
    out.append(msg.encode(cluster, partition, t))
    return out


def _report_dict(report: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` of an alignment report (align_steps.GroupReport: numbers, strings
    and dicts of numbers), without its deep copy of every value: a partition's digest carried
    16 reports a tick, and asdict's walk was most of the digest's encoding."""
    names = _FIELDS.get(type(report))
    if names is None:
        names = _FIELDS[type(report)] = [f.name for f in dataclasses.fields(report)]
    out = {}
    for name in names:
        v = getattr(report, name)
        out[name] = dict(v) if type(v) is dict else v
    return out


_FIELDS: dict[type, list[str]] = {}


class _Message:
    """One digest message as :func:`encode_digests` fills it, node after node: :meth:`cost`
    prepares a node and says how many bytes it adds, :meth:`add` takes it in."""

    def __init__(self, reports: dict[str, dict[str, Any]]) -> None:
        self.reports = reports
        self.layouts: dict[int, int] = {}  # layout id → index in self.raw
        self.raw: list[tuple[int, bytes]] = []
        self.label_sets: dict[tuple, int] = {}
        self.labels: list[dict[str, str]] = []
        self.blocks: list[tuple[int, list, list, list, list, list]] = []  # (layout, nodes, t, interval, labels, values)
        self.derived: dict[str, dict[str, float]] = {}
        self.nodes = 0
        self.size = 64 + len(msgspec.msgpack.encode(reports)) if reports else 64
        self._next: tuple | None = None

    def cost(self, node: str, row: tuple | None, derived: Mapping[str, float] | None,
             shapes: dict[tuple, tuple]) -> int:
        size = 16 + len(node)
        cols = None
        if row is not None:
            st, ival, labels, values = row
            lay, vals = json_columns(values, shapes) if type(values) is dict else values
            lkey = tuple(labels.items()) if labels else None
            cols = (st, ival, labels, lkey, lay, vals)
            size += 24 + len(vals)
            if lay.id not in self.layouts:
                size += 16 + len(lay.raw)
            if lkey is not None and lkey not in self.label_sets:
                size += 8 + sum(len(k) + len(v) + 4 for k, v in lkey)
        if derived:
            derived = {k: v for k, v in derived.items() if v == v}
            size += 8 + sum(len(k) + 10 for k in derived)
        self._next = (node, cols, derived)
        return size

    def add(self, node: str, cost: int) -> None:
        assert self._next is not None and self._next[0] == node
        _, cols, derived = self._next
        self.nodes += 1
        self.size += cost
        if derived is not None:
            self.derived[node] = derived  # type: ignore[assignment]
        if cols is None:
            return
        st, ival, labels, lkey, lay, vals = cols
        li = self.layouts.get(lay.id)
        if li is None:
            li = self.layouts[lay.id] = len(self.raw)
            self.raw.append((lay.id, lay.raw))
        if lkey is None:
            lab = -1
        else:
            lab = self.label_sets.get(lkey, -1)
            if lab < 0:
                lab = self.label_sets[lkey] = len(self.labels)
                self.labels.append(dict(labels))
        if not self.blocks or self.blocks[-1][0] != li:
            self.blocks.append((li, [], [], [], [], []))
        _, ns, ts, ivs, labs, vs = self.blocks[-1]
        ns.append(node)
        ts.append(st)
        ivs.append(ival)
        labs.append(lab)
        vs.append(vals)

    def encode(self, cluster: str, partition: int, t: float) -> bytes:
        blocks = [DigestBlock(li, ns, ts, ivs, labs, b"".join(vs)) for li, ns, ts, ivs, labs, vs in self.blocks]
        return _ENCODER.encode(Digest(DIGEST_SCHEMA, cluster, partition, t, self.raw, self.labels, blocks,
                                      self.derived, self.reports))


def decode_digest(data: bytes, known: Mapping[int, wire.SummaryLayout] | None = None
                  ) -> tuple[Digest, list[wire.SummaryLayout]]:
    """A digest (controller to controller: the server lets only the controller's credential
    publish one) and its layouts (those in ``known``, by id, are not read again), checked:
    ValueError, naming the field, for anything unreadable or inconsistent, and for a digest of
    another schema (a worker running another skewd version)."""
    try:
        d = _DIGEST.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        schema = _schema_of(data)
        if schema is not None and schema != DIGEST_SCHEMA:
            raise ValueError(f"digest schema {schema}; this controller reads {DIGEST_SCHEMA}: every worker of a "
                             f"scaled-out controller must run the same skewd version") from None
        raise ValueError(str(e)) from None
    if d.schema != DIGEST_SCHEMA:
        raise ValueError(f"digest schema {d.schema}; this controller reads {DIGEST_SCHEMA}: every worker of a "
                         f"scaled-out controller must run the same skewd version")
    layouts = []
    for k, (lid, raw) in enumerate(d.layouts):
        lay = (known or {}).get(lid)
        if lay is None or lay.raw != raw:
            try:
                lay = wire.read_layout(raw, lid, max_samples=None)  # (a JSON summary's may be larger)
            except wire.WireError as e:
                raise ValueError(f"digest.layouts[{k}]: {e}") from None
        layouts.append(lay)
    for k, b in enumerate(d.blocks):
        where = f"digest.blocks[{k}]"
        if not 0 <= b.layout < len(layouts):
            raise ValueError(f"{where}.layout: {b.layout} is not one of the digest's {len(layouts)} layouts")
        n = len(b.nodes)
        if not len(b.t) == len(b.interval) == len(b.labels) == n:
            raise ValueError(f"{where}: {n} nodes, {len(b.t)} t, {len(b.interval)} interval, {len(b.labels)} labels")
        if len(b.values) != 8 * n * len(layouts[b.layout]):
            raise ValueError(f"{where}.values: {len(b.values)} bytes; {n} rows of {len(layouts[b.layout])} "
                             f"float64 take {8 * n * len(layouts[b.layout])}")
        if any(not -1 <= i < len(d.labels) for i in b.labels):
            raise ValueError(f"{where}.labels: an index outside the digest's {len(d.labels)} label sets")
        if np.isinf(np.frombuffer(b.values, _F8)).any() or not all(map(math.isfinite, b.t)):
            raise ValueError(f"{where}: an infinite value or time")
    return d, layouts


def _schema_of(data: bytes) -> int | None:
    """The schema a digest says it has (the first item of its array), if it says one."""
    try:
        head = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    return head[0] if isinstance(head, list) and head and type(head[0]) is int else None
