"""The capture segment format: round trips, and damage found with file and byte offset."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewd.agent import bundle
from skewd.model import SampleBatch

T0 = 1_700_000_000.0  # invented


def batch(i: int, n: int = 5, node: str = "n1") -> SampleBatch:
    return SampleBatch.from_rows([(T0 + i + 0.01 * k, node, f"gpu{k}", "gpu_util_ratio" if k % 2 else "gpu_power_watts",
                                   float(i * 10 + k)) for k in range(n)])


def write_segment(path: Path, chunks: list[list[SampleBatch]], ticks_per_chunk: int = 1) -> bundle.SegmentWriter:
    w = bundle.SegmentWriter(path, {"nodes": ["n1"], "cluster": "c"})
    done = 0
    for k, bs in enumerate(chunks):
        w.write_samples(bs)
        done += len(bs)
        w.write_ticks([(T0 + k, done, 0)])
        w.write_lines(bundle.FINDINGS, [json.dumps({"k": k})], [T0 + k])
    w.close()
    return w


def test_round_trip_keeps_values_names_nan_and_batch_boundaries(tmp_path: Path) -> None:
    weird = SampleBatch.from_rows([(T0, "nöde-β", "meta-llama/Llama-3-8B/0", "vllm_kv_cache_usage_ratio", float("nan")),
                                   (T0, "nöde-β", "", "host_load", -0.0),
                                   (T0 + 0.5, "nöde-β", "udp 10.0.0.1:5000>10.0.0.2:4791", "pkt_x", 1e300)])
    chunks = [[batch(0), batch(1)], [weird], [batch(2, node="n2"), batch(3)]]
    write_segment(tmp_path / "s", chunks)
    seg = bundle.Segment(tmp_path / "s")
    assert seg.verify() == []
    flat = [b for c in chunks for b in c]
    got = list(seg.iter_batches())
    assert [n for n, _ in got] == list(range(len(flat)))
    assert [b for _, b in got] == flat  # SampleBatch equality, NaN == NaN
    assert seg.samples() == SampleBatch.concat(flat)
    assert seg.meta["nodes"] == ["n1", "n2", "nöde-β"]
    assert seg.samples({"gpu_power_watts"}).signals() == {"gpu_power_watts"}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
                                   st.text(max_size=6), st.sampled_from(["a_x", "b_y"]),
                                   st.floats(allow_nan=True, allow_infinity=True)), min_size=1, max_size=8),
                min_size=1, max_size=5))
def test_round_trip_property(tmp_path_factory: pytest.TempPathFactory, rows: list) -> None:
    """Any names (empty, unicode) and any values (NaN, inf, -0.0) survive; times are finite
    (collectors stamp tick times, and SampleBatch equality compares times exactly)."""
    d = tmp_path_factory.mktemp("p") / "s"
    batches = [SampleBatch.from_rows(r) for r in rows]
    w = bundle.SegmentWriter(d, {})
    w.write_samples(batches[:2])
    w.write_samples(batches[2:])
    w.close()
    seg = bundle.Segment(d)
    assert seg.verify() == []
    assert [b for _, b in seg.iter_batches()] == batches


def _chunk(seg_path: Path, file: str, k: int) -> dict:
    entries = [json.loads(x) for x in (seg_path / bundle.INDEX).read_text().splitlines()]
    return [e for e in entries if e["file"] == file][k]


def test_truncated_samples_stop_at_the_last_intact_chunk(tmp_path: Path) -> None:
    chunks = [[batch(i)] for i in range(6)]
    write_segment(tmp_path / "s", chunks)
    c3 = _chunk(tmp_path / "s", bundle.SAMPLES, 3)
    p = tmp_path / "s" / bundle.SAMPLES
    with open(p, "r+b") as f:
        f.truncate(c3["offset"] + c3["length"] // 2)
    seg = bundle.Segment(tmp_path / "s")
    (dmg,) = [d for d in seg.verify() if d.path.endswith(bundle.SAMPLES)]
    assert dmg.offset == c3["offset"] and "truncated" in dmg.message and "chunk 3" in dmg.message
    assert str(dmg).startswith(f"{p}: byte offset {c3['offset']}:")
    assert [b for _, b in seg.iter_batches()] == [c[0] for c in chunks[:3]]
    assert seg.readable_batches() == 3
    # the other files are intact
    assert seg.findings() == [{"k": k} for k in range(6)] and len(seg.ticks()[0]) == 6


def test_bit_flip_is_caught_by_the_crc(tmp_path: Path) -> None:
    chunks = [[batch(i)] for i in range(6)]
    write_segment(tmp_path / "s", chunks)
    c4 = _chunk(tmp_path / "s", bundle.SAMPLES, 4)
    p = tmp_path / "s" / bundle.SAMPLES
    data = bytearray(p.read_bytes())
    pos = c4["offset"] + c4["length"] - 20  # inside the float data of the 5th batch
    data[pos] ^= 0x10
    p.write_bytes(bytes(data))
    seg = bundle.Segment(tmp_path / "s")
    (dmg,) = seg.verify()
    assert dmg.path == str(p) and dmg.offset == c4["offset"]
    assert "CRC32 mismatch in chunk 4" in dmg.message
    assert [b for _, b in seg.iter_batches()] == [c[0] for c in chunks[:4]]


def test_a_slice_worker_skips_the_crc_only_below_its_start(tmp_path: Path) -> None:
    # a replay time slice's worker leaves the chunks before its warm-up to the process that
    # verifies the whole file: a flip there goes unnoticed by the worker, one at or after its
    # start is still caught
    chunks = [[batch(i)] for i in range(6)]
    write_segment(tmp_path / "s", chunks)
    p = tmp_path / "s" / bundle.SAMPLES
    data = bytearray(p.read_bytes())
    for k in (1, 4):
        c = _chunk(tmp_path / "s", bundle.SAMPLES, k)
        data[c["offset"] + c["length"] - 20] ^= 0x10
    p.write_bytes(bytes(data))
    seg = bundle.Segment(tmp_path / "s")
    seg.trust_samples_below(3)
    (dmg,) = seg.verify()
    assert "CRC32 mismatch in chunk 4" in dmg.message and seg.readable_batches() == 4
    whole = bundle.Segment(tmp_path / "s")
    (dmg,) = whole.verify()
    assert "CRC32 mismatch in chunk 1" in dmg.message and whole.readable_batches() == 1


def test_bit_flip_in_json_lines_and_ticks(tmp_path: Path) -> None:
    write_segment(tmp_path / "s", [[batch(i)] for i in range(4)])
    for name in (bundle.FINDINGS, bundle.TICKS):
        c = _chunk(tmp_path / "s", name, 2)
        p = tmp_path / "s" / name
        data = bytearray(p.read_bytes())
        data[c["offset"] + c["length"] - 3] ^= 0x01
        p.write_bytes(bytes(data))
    seg = bundle.Segment(tmp_path / "s")
    bad = {Path(d.path).name: d for d in seg.verify()}
    assert set(bad) == {bundle.FINDINGS, bundle.TICKS}
    assert seg.findings() == [{"k": 0}, {"k": 1}]
    assert seg.ticks()[0].tolist() == [T0, T0 + 1]
    assert seg.readable_until(bundle.FINDINGS) == T0 + 2


def test_damaged_index_line_and_unindexed_tail(tmp_path: Path) -> None:
    write_segment(tmp_path / "s", [[batch(i)] for i in range(4)])
    idx = tmp_path / "s" / bundle.INDEX
    lines = idx.read_text().splitlines(keepends=True)
    # flip a digit inside the 3rd line: the line's own CRC catches it
    bad = lines[2].replace('"length":', '"length":1', 1)
    idx.write_text("".join(lines[:2]) + bad + "".join(lines[3:]))
    seg = bundle.Segment(tmp_path / "s")
    damage = seg.verify()
    offset = sum(len(x.encode()) for x in lines[:2])
    assert any(d.path == str(idx) and d.offset == offset and "line CRC32" in d.message for d in damage)
    # whatever the two good entries cover still reads; the rest of each file is reported
    assert any(d.path.endswith(bundle.SAMPLES) and "trailing bytes" in d.message for d in damage)
    assert len(list(seg.iter_batches())) == 1


def test_index_lines_are_proven_from_their_bytes_and_an_equivalent_rewrite_still_reads(tmp_path: Path) -> None:
    # the reader proves a line from its own bytes (format.raw_line_crc_ok); a line another tool
    # rewrote (other key order, spaces) with the CRC of its canonical form reads as before
    write_segment(tmp_path / "s", [[batch(i)] for i in range(4)])
    idx = tmp_path / "s" / bundle.INDEX
    lines = idx.read_text().splitlines()
    assert all(bundle.format.raw_line_crc_ok(ln.encode()) for ln in lines)
    e = json.loads(lines[1])
    lines[1] = json.dumps(dict(reversed(list(e.items()))), indent=None, separators=(", ", ": "))
    assert not bundle.format.raw_line_crc_ok(lines[1].encode())
    idx.write_text("\n".join(lines) + "\n")
    seg = bundle.Segment(tmp_path / "s")
    assert seg.verify() == []
    assert len(list(seg.iter_batches())) == 4
    # a changed digit fails both ways
    lines[2] = lines[2].replace('"chunk":', '"chunk":1', 1)
    idx.write_text("\n".join(lines) + "\n")
    assert any("line CRC32" in d.message for d in bundle.Segment(tmp_path / "s").verify())


def test_ticks_are_read_once_whole_and_equal_the_batch_by_batch_read(tmp_path: Path) -> None:
    write_segment(tmp_path / "s", [[batch(i)] for i in range(6)])
    seg = bundle.Segment(tmp_path / "s")
    t, b, f = seg.ticks()
    slow = seg._read_ticks()
    assert [x.tolist() for x in (t, b, f)] == [x.tolist() for x in slow]
    assert t.tolist() == [T0 + k for k in range(6)] and b.tolist() == [1, 2, 3, 4, 5, 6]
    assert seg.ticks()[0] is t and not t.flags.writeable  # once, and nobody changes it
    # another process's reading is taken as it is (a slice worker: agent/replay/slices.py)
    other = bundle.Segment(tmp_path / "s")
    other.adopt_ticks(t, b, f)
    assert other.ticks()[0].tolist() == t.tolist() and bundle.TICKS not in other._views


def test_interrupted_recording_reads_up_to_the_last_indexed_chunk(tmp_path: Path) -> None:
    """A crash between a data write and its index line: the tail is reported and ignored."""
    w = bundle.SegmentWriter(tmp_path / "s", {})
    w.write_samples([batch(0)])
    w.write_samples([batch(1)])
    idx = tmp_path / "s" / bundle.INDEX
    lines = idx.read_text().splitlines(keepends=True)
    idx.write_text(lines[0] + lines[1][:25])  # the second index line was cut mid-write
    seg = bundle.Segment(tmp_path / "s")
    damage = seg.verify()
    assert any(d.path == str(idx) and "partial line" in d.message for d in damage)
    assert [b for _, b in seg.iter_batches()] == [batch(0)]
    assert seg.meta["complete"] is False


def test_meta_problems_are_errors_with_position(tmp_path: Path) -> None:
    write_segment(tmp_path / "s", [[batch(0)]])
    m = tmp_path / "s" / bundle.META
    meta = json.loads(m.read_text())
    m.write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(bundle.BundleError, match="format version 99"):
        bundle.Segment(tmp_path / "s")
    m.write_text('{"format": "skewd-capture", "nodes": [')
    with pytest.raises(bundle.BundleError) as ei:
        bundle.Segment(tmp_path / "s")
    assert ei.value.path == str(m) and ei.value.offset is not None and "byte offset" in str(ei.value)


def test_find_segments_accepts_segment_bundle_or_root(tmp_path: Path) -> None:
    for node in ("a", "b"):
        for k in (1, 2):
            write_segment(tmp_path / "root" / node / f"seg-00000{k}", [[batch(k, node=node)]])
    root = tmp_path / "root"
    assert len(bundle.find_segments([root])) == 4
    assert bundle.find_segments([root / "a"]) == [root / "a" / "seg-000001", root / "a" / "seg-000002"]
    assert bundle.find_segments([root / "a" / "seg-000002"]) == [root / "a" / "seg-000002"]


def test_empty_directory_has_no_segment(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(bundle.BundleError, match="no capture segment"):
        bundle.find_segments([tmp_path / "empty"])
    with pytest.raises(bundle.BundleError, match="no such file"):
        bundle.find_segments([tmp_path / "missing"])


def test_stored_rule_file_tampering_is_detected(tmp_path: Path) -> None:
    w = bundle.SegmentWriter(tmp_path / "s", {"rules": {"version": "v"}}, [("/etc/skewd/r.yaml", "rules: []\n")])
    w.close()
    seg = bundle.Segment(tmp_path / "s")
    (p,) = seg.rule_files()
    assert p.read_text() == "rules: []\n" and seg.meta["rules"]["files"][0]["path"] == "/etc/skewd/r.yaml"
    p.write_text("rules: [x]\n")
    with pytest.raises(bundle.BundleError, match="sha256"):
        bundle.Segment(tmp_path / "s").rule_files()


def test_pcapng_blocks_are_well_formed() -> None:
    shb = bundle.pcapng_section_header()
    assert shb[:4] == b"\x0a\x0d\x0d\x0a" and len(shb) % 4 == 0
    epb = bundle.pcapng_packet(0, 1_500_000_000, b"abc")
    assert len(epb) % 4 == 0 and int.from_bytes(epb[4:8], "little") == len(epb)
    ns = (int.from_bytes(epb[12:16], "little") << 32) | int.from_bytes(epb[16:20], "little")
    assert ns == 1_500_000_000
    assert np.frombuffer(epb[-4:], "<u4")[0] == len(epb)
