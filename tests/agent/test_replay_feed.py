"""Replay's bulk feed (:mod:`skewd.agent.replay.feed`) hands out exactly the recorded batches:
plain one-node collections as per-layout matrices, anything else (a batch with several
timestamps, a chunk with several nodes) batch by batch, in arrival order, up to each tick's
batch count."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from skewd.agent import bundle
from skewd.agent.replay.feed import SegmentFeed
from skewd.model import SampleBatch


def _batch(t: float | list[float], node: str | list[str], ents: list[str], sig: str, v0: float) -> SampleBatch:
    n = len(ents)
    ts = np.full(n, t) if np.isscalar(t) else np.array(t, dtype=float)
    nodes = np.array([node] * n if isinstance(node, str) else node, dtype=object)
    return SampleBatch(ts, nodes, np.array(ents, dtype=object), np.array([sig] * n, dtype=object),
                       v0 + np.arange(n, dtype=float))


def _write(path: Path) -> list[list[SampleBatch]]:
    chunks = [
        # plain collections of one node: two layouts, interleaved as two collectors would be
        [_batch(1.0, "a", ["gpu0", "gpu1"], "gpu_power_watts", 10), _batch(1.0, "a", ["eth0"], "netdev_rx_bytes_total", 5),
         _batch(1.5, "a", ["gpu0", "gpu1"], "gpu_power_watts", 20), _batch(1.5, "a", ["eth0"], "netdev_rx_bytes_total", 6)],
        # the same layouts again (same dictionaries: the feed keeps its decoded shapes)
        [_batch(2.0, "a", ["gpu0", "gpu1"], "gpu_power_watts", 30), _batch(2.0, "a", ["eth0"], "netdev_rx_bytes_total", 7)],
        # one batch with two timestamps: batch by batch
        [_batch([2.5, 2.6], "a", ["gpu0", "gpu1"], "gpu_power_watts", 40)],
        # two nodes in one chunk, one batch holding both
        [_batch(3.0, ["a", "b"], ["gpu0", "gpu0"], "gpu_power_watts", 50), _batch(3.0, "b", ["eth0"], "netdev_rx_bytes_total", 8)],
    ]
    w = bundle.SegmentWriter(path, {"nodes": ["a", "b"]})
    for c in chunks:
        w.write_samples(c)
    w.close()
    return chunks


def _delivered(feed: SegmentFeed, n: int) -> list[tuple[str, SampleBatch]]:
    """What replay ingests for the batches numbered below ``n``: (node, batch) in arrival order
    for the batch-by-batch chunks, and per layout for the plain ones (rebuilt as batches)."""
    out: list[tuple[str, SampleBatch]] = []
    for ch, a, b in feed.until(n):
        if not ch.fast:
            out += list(ch.batches(a, b, feed.nodes))
            continue
        for shape, ts, vals in ch.collections(a, b):
            assert vals.shape == (len(ts), len(shape.signal))
            out += [(ch.one_node, SampleBatch(np.full(len(shape.signal), t), shape.node, shape.entity, shape.signal, v))
                    for t, v in zip(ts, vals)]
    return out


def _key(item: tuple[str, SampleBatch]) -> tuple:
    node, b = item
    return (node, b.t.tolist(), b.node.tolist(), b.entity.tolist(), b.signal.tolist(), b.value.tolist())


def test_feed_delivers_every_batch_once_by_tick(tmp_path: Path) -> None:
    chunks = _write(tmp_path / "seg")
    seg = bundle.Segment(tmp_path / "seg")
    feed = SegmentFeed(seg, None)
    got = [_delivered(feed, n) for n in (1, 3, 4, 6, 7, 9)]
    flat = [b for c in chunks for b in c]
    # plain chunks: the batches of each layout in order; the others: exactly as recorded, split per node
    assert sorted(map(_key, got[0])) == sorted(map(_key, [("a", flat[0])]))
    assert sorted(map(_key, got[1])) == sorted(map(_key, [("a", b) for b in flat[1:3]]))
    assert sorted(map(_key, got[2])) == sorted(map(_key, [("a", flat[3])]))
    assert sorted(map(_key, got[3])) == sorted(map(_key, [("a", b) for b in flat[4:6]]))
    assert list(map(_key, got[4])) == list(map(_key, [("a", flat[6])]))
    two = flat[7]
    assert list(map(_key, got[5])) == list(map(_key, [("a", two.select(two.node == "a")), ("b", two.select(two.node == "b")),
                                                      ("b", flat[8])]))
    assert feed.done == 9 and feed.until(100) == []
    # the layouts of the first two chunks are the same arrays (the store knows them by identity)
    seg2 = bundle.Segment(tmp_path / "seg")
    f2 = SegmentFeed(seg2, None)
    (c1, a1, b1), = f2.until(4)
    (c2, a2, b2), = f2.until(6)
    assert c1.fast and c2.fast
    assert {id(s) for s, _, _ in c1.collections(a1, b1)} == {id(s) for s, _, _ in c2.collections(a2, b2)}


def test_feed_starts_at_a_batch_number_and_filters_nodes(tmp_path: Path) -> None:
    chunks = _write(tmp_path / "seg")
    flat = [b for c in chunks for b in c]
    seg = bundle.Segment(tmp_path / "seg")
    feed = SegmentFeed(seg, {"b"}, start=5)
    got = _delivered(feed, 100)
    # from batch 5 on: batch 5 is a's (a plain chunk: node filtering is the replay loop's), then only b
    assert sorted(map(_key, got[:1])) == sorted(map(_key, [("a", flat[5])]))
    two = flat[7]
    assert list(map(_key, got[1:])) == list(map(_key, [("b", two.select(two.node == "b")), ("b", flat[8])]))
