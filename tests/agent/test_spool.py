"""The on-disk spool: FIFO order, bounds with drop-oldest, persistence and crash recovery."""
from __future__ import annotations

import json
import logging
import os
import struct
from collections import deque
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skewd.agent.spool import HEADER_SIZE, RecordTooLarge, Spool, SpoolError, encode_record


def _fill(sp: Spool, n: int, start: int = 0, size: int = 10) -> list[int]:
    return [sp.append(f"skewd.v1.finding.c.n.R-{i}", {"Nats-Msg-Id": f"id-{i}"}, bytes([i % 256]) * size)
            for i in range(start, start + n)]


def _ids(sp: Spool, n: int = 10_000) -> list[str]:
    return [r.headers["Nats-Msg-Id"] for r in sp.peek(n)]


def _segments(d: Path) -> list[Path]:
    return sorted(d.glob("*.seg"))


def test_fifo_peek_does_not_consume_and_ack_does(tmp_path: Path) -> None:
    with Spool(tmp_path) as sp:
        seqs = _fill(sp, 5)
        assert seqs == sorted(seqs) and len(set(seqs)) == 5
        first = sp.peek(2)
        assert [r.headers["Nats-Msg-Id"] for r in first] == ["id-0", "id-1"]
        assert first[0].subject == "skewd.v1.finding.c.n.R-0" and first[1].payload == b"\x01" * 10
        assert _ids(sp) == [f"id-{i}" for i in range(5)]  # peek is repeatable
        assert sp.ack(first[-1].seq) == 2
        assert _ids(sp) == ["id-2", "id-3", "id-4"] and sp.depth == 3
        assert sp.ack(first[-1].seq) == 0  # acking again is harmless


def test_queue_survives_restart(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    _fill(sp, 6)
    sp.ack(sp.peek(2)[-1].seq)
    sp.close()
    with Spool(tmp_path) as sp2:
        assert _ids(sp2) == [f"id-{i}" for i in range(2, 6)]
        new = sp2.append("s", {"Nats-Msg-Id": "after"}, b"")
        assert new > sp2.peek(10)[-2].seq  # seqs keep increasing across restarts
        assert _ids(sp2)[-1] == "after"


def test_second_open_of_the_same_dir_is_refused(tmp_path: Path) -> None:
    with Spool(tmp_path):
        with pytest.raises(SpoolError, match="in use by another process"):
            Spool(tmp_path)


def test_message_bound_drops_oldest_and_counts_persistently(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, "skewd.agent.spool")
    sp = Spool(tmp_path, max_messages=10, max_bytes=None)
    _fill(sp, 25)
    assert sp.depth == 10 and sp.dropped == 15
    assert _ids(sp) == [f"id-{i}" for i in range(15, 25)]  # newest kept, in order
    assert any("full" in r.message and "evicted" in r.message for r in caplog.records)
    sp.close()
    with Spool(tmp_path, max_messages=10, max_bytes=None) as sp2:
        assert sp2.dropped == 15 and _ids(sp2) == [f"id-{i}" for i in range(15, 25)]


def test_byte_bound_drops_oldest_and_bounds_disk(tmp_path: Path) -> None:
    rec = len(encode_record(1, "skewd.v1.finding.c.n.R-0", {"Nats-Msg-Id": "id-0"}, b"x" * 100))
    limit = rec * 8 + rec // 2  # room for 8 records
    with Spool(tmp_path, max_bytes=limit, max_messages=None, segment_bytes=rec * 3) as sp:
        _fill(sp, 50, size=100)
        assert sp.depth == 8 and sp.dropped == 42 and sp.bytes <= limit
        assert _ids(sp) == [f"id-{i}" for i in range(42, 50)]
        disk = sum(p.stat().st_size for p in _segments(tmp_path))
        assert disk <= limit + rec * 3  # bound + at most one segment of consumed prefix


def test_a_record_larger_than_the_bound_is_refused_without_evicting(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=1000) as sp:
        _fill(sp, 3)
        with pytest.raises(RecordTooLarge, match="exceeds the spool bound"):
            sp.append("s", {}, b"x" * 2000)
        assert sp.depth == 3 and sp.dropped == 0


def test_consumed_segments_are_deleted(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=200) as sp:
        _fill(sp, 40)
        assert len(_segments(tmp_path)) > 5
        sp.ack(sp.peek(100)[-1].seq)
        assert sp.depth == 0
        _fill(sp, 1, start=40)
        assert len(_segments(tmp_path)) == 1  # only the segment being written remains
        assert _ids(sp) == ["id-40"]


def test_torn_tail_is_truncated_and_earlier_records_kept(tmp_path: Path, caplog) -> None:
    sp = Spool(tmp_path, fsync="always")
    _fill(sp, 5)
    sp.close()
    seg = _segments(tmp_path)[-1]
    size = seg.stat().st_size
    with open(seg, "r+b") as f:  # crash in the middle of writing record 5's body
        f.truncate(size - 4)
    caplog.set_level(logging.WARNING, "skewd.agent.spool")
    with Spool(tmp_path) as sp2:
        assert _ids(sp2) == ["id-0", "id-1", "id-2", "id-3"]
        assert any("torn or corrupt" in r.message and "kept the 4 record(s)" in r.message for r in caplog.records)
        sp2.append("s", {"Nats-Msg-Id": "next"}, b"ok")  # appends continue from the last good record
    with Spool(tmp_path) as sp3:
        assert _ids(sp3) == ["id-0", "id-1", "id-2", "id-3", "next"]


@pytest.mark.parametrize("damage", ["half_header", "garbage", "bad_crc"])
def test_damaged_tail_variants_recover(tmp_path: Path, damage: str) -> None:
    sp = Spool(tmp_path)
    _fill(sp, 3)
    sp.close()
    seg = _segments(tmp_path)[-1]
    data = bytearray(seg.read_bytes())
    if damage == "half_header":
        data += encode_record(99, "s", {}, b"tail")[:HEADER_SIZE // 2]
    elif damage == "garbage":
        data += os.urandom(37)
    else:  # last record's payload flipped: CRC no longer matches
        data[-1] ^= 0xFF
    seg.write_bytes(bytes(data))
    with Spool(tmp_path) as sp2:
        expected = ["id-0", "id-1", "id-2"] if damage != "bad_crc" else ["id-0", "id-1"]
        assert _ids(sp2) == expected


def test_corruption_in_the_middle_skips_only_the_damaged_record(tmp_path: Path, caplog) -> None:
    sp = Spool(tmp_path)
    _fill(sp, 5, size=50)
    sp.close()
    seg = _segments(tmp_path)[-1]
    data = bytearray(seg.read_bytes())
    rec_len = HEADER_SIZE + struct.unpack_from("<I", data, 4)[0]
    data[rec_len * 2 + HEADER_SIZE + 5] ^= 0xFF  # inside record 3's body
    seg.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, "skewd.agent.spool")
    with Spool(tmp_path) as sp2:
        assert _ids(sp2) == ["id-0", "id-1", "id-3", "id-4"]
        assert sp2.dropped == 1  # the lost record is counted, not silently gone
        assert any("skipped" in r.message for r in caplog.records)


def test_damage_after_open_is_dropped_at_the_head_and_the_rest_delivered(tmp_path: Path, caplog) -> None:
    with Spool(tmp_path) as sp:
        _fill(sp, 3, size=50)
        seg = _segments(tmp_path)[-1]
        with open(seg, "r+b") as f:  # the disk rots record 1 under a running agent
            f.seek(HEADER_SIZE + 3)
            f.write(b"\x00\x00")
        caplog.set_level(logging.ERROR, "skewd.agent.spool")
        # the corrupt head is dropped and counted; the intact records behind it still come out
        assert [r.headers["Nats-Msg-Id"] for r in sp.peek(10)] == ["id-1", "id-2"]
        assert sp.dropped == 1 and sp.corrupt == 1 and sp.depth == 2
        assert any("corrupt on disk" in r.message for r in caplog.records)


def test_missing_or_broken_state_resends_rather_than_loses(tmp_path: Path, caplog) -> None:
    sp = Spool(tmp_path)
    _fill(sp, 4)
    sp.ack(sp.peek(2)[-1].seq)
    sp.close()
    (tmp_path / "state.json").write_text("{not json")
    caplog.set_level(logging.WARNING, "skewd.agent.spool")
    with Spool(tmp_path) as sp2:
        # the consumed head segment may still be on disk: at-least-once means it comes back
        assert _ids(sp2)[-2:] == ["id-2", "id-3"]
        assert any("state.json unreadable" in r.message for r in caplog.records)


def test_state_file_is_plain_json(tmp_path: Path) -> None:
    with Spool(tmp_path, max_messages=2) as sp:
        _fill(sp, 5)
    st_ = json.loads((tmp_path / "state.json").read_text())
    assert st_["dropped"] == 3 and isinstance(st_["head_seq"], int)


@pytest.mark.parametrize("kw, msg", [({"fsync": "sometimes"}, "fsync policy"),
                                     ({"max_bytes": 0}, "max_bytes"),
                                     ({"max_messages": -1}, "max_messages")])
def test_bad_settings_are_refused(tmp_path: Path, kw: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        Spool(tmp_path, **kw)


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
def test_every_fsync_policy_persists_on_close(tmp_path: Path, policy: str) -> None:
    with Spool(tmp_path, fsync=policy) as sp:
        _fill(sp, 3)
    with Spool(tmp_path) as sp2:
        assert sp2.depth == 3


def test_use_after_close_is_an_error(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    sp.close()
    sp.close()  # idempotent
    with pytest.raises(SpoolError, match="closed"):
        sp.append("s", {}, b"")


# A model check: any interleaving of appends, acks and restarts behaves like a bounded deque.
_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.binary(max_size=300)),
    st.tuples(st.just("ack"), st.integers(0, 6)),
    st.tuples(st.just("reopen"), st.none()),
), max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, max_messages=st.integers(1, 8))
def test_spool_behaves_like_a_bounded_fifo(tmp_path_factory, ops, max_messages: int) -> None:
    d = tmp_path_factory.mktemp("spool")
    kw = dict(max_messages=max_messages, max_bytes=None, segment_bytes=256)
    sp = Spool(d, **kw)
    model: deque[bytes] = deque()
    dropped = 0
    try:
        for op, arg in ops:
            if op == "append":
                sp.append("s", {}, arg)
                model.append(arg)
                if len(model) > max_messages:
                    model.popleft()
                    dropped += 1
            elif op == "ack":
                head = sp.peek(arg)
                if head:
                    sp.ack(head[-1].seq)
                for _ in head:
                    model.popleft()
            else:
                sp.close()
                sp = Spool(d, **kw)
            assert [r.payload for r in sp.peek(100)] == list(model)
            assert sp.depth == len(model) and sp.dropped == dropped
    finally:
        sp.close()
