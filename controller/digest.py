"""Digests: what a controller partition hands the leader once per evaluation (MessagePack) -
each node's latest summary less its collective bursts, the derived ctl_* values the cluster-wide
rules read and the alignment reports of its TP groups. Both the partition's side of the exchange
(controller/exchange.py) and the scale-out runtime (controller/scaleout.py) use it."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import msgspec

DIGEST_SCHEMA = 1
#: nodes per digest message: ~1 kB a node (22 summary signals), well under NATS's 1 MiB max_payload
DIGEST_NODES_PER_MESSAGE = 500
#: summary keys a digest leaves out: the collective bursts, read by the partition's aligner only
_PARTITION_ONLY = frozenset({"collective_burst_starts", "collective_burst_bytes"})


# ---------------------------------------------------------------------------------------------
# digests: a partition's share of what the leader needs, once per evaluation
# ---------------------------------------------------------------------------------------------

class DigestRow(msgspec.Struct, array_like=True):
    """One node's latest summary as the partition took it in, less its collective bursts (the
    partition's aligner is their only reader): the leader takes it in as the single-process
    controller takes a summary (topology, engine timelines, window store)."""

    node: str
    t: float
    interval: float
    labels: dict[str, str]
    signals: dict[str, dict[str, Optional[float]]]


class Digest(msgspec.Struct, array_like=True):
    """What a partition hands the leader at evaluation time ``t`` (MessagePack): the nodes
    that sent a summary since the last digest, the derived ctl_* values of its nodes that the
    cluster-wide rules read and the alignment reports of its TP groups (incident evidence)."""

    schema: int
    cluster: str
    partition: int
    t: float
    rows: list[DigestRow]
    derived: dict[str, dict[str, float]]
    reports: dict[str, dict[str, Any]]


_DIGEST = msgspec.msgpack.Decoder(Digest)
_ENCODER = msgspec.msgpack.Encoder()


def encode_digests(cluster: str, partition: int, t: float, rows: Mapping[str, tuple],
                   derived: Mapping[str, Mapping[str, float]], reports: Mapping[str, Any]) -> list[bytes]:
    """The digest messages of one evaluation, at most :data:`DIGEST_NODES_PER_MESSAGE` nodes
    each (``rows``: node → (t, interval, labels, signals) of its latest summary)."""
    nodes = list(dict.fromkeys([*rows, *derived]))
    reps = {g: dataclasses.asdict(r) for g, r in reports.items()}
    out = []
    for i in range(0, max(1, len(nodes)), DIGEST_NODES_PER_MESSAGE):
        chunk = nodes[i:i + DIGEST_NODES_PER_MESSAGE]
        drows = []
        for node in chunk:
            r = rows.get(node)
            if r is None:
                continue
            st, ival, labels, signals = r
            drows.append(DigestRow(node, st, ival, dict(labels),
                                   {k: v for k, v in signals.items() if k not in _PARTITION_ONLY}))
        d = Digest(DIGEST_SCHEMA, cluster, partition, t, drows,
                   {n: {k: v for k, v in derived[n].items() if v == v} for n in chunk if n in derived},
                   reps if i == 0 else {})
        out.append(_ENCODER.encode(d))
    return out


def decode_digest(data: bytes) -> Digest:
    """A digest (controller to controller: the server lets only the controller's credential
    publish one); ValueError for anything unreadable."""
    try:
        d = _DIGEST.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(str(e)) from None
    if d.schema != DIGEST_SCHEMA:
        raise ValueError(f"digest schema {d.schema}; this controller reads {DIGEST_SCHEMA}")
    return d
