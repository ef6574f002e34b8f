"""Capture files built to hurt: decompression bombs and pcapng option values no timestamp can
hold. Each gives a clear error or a damage report naming the file and byte offset, in bounded
memory, and the rest of the file is still read."""
from __future__ import annotations

import gzip
import importlib.util
import io
import resource
import struct
from pathlib import Path

import pytest

from skewd.collectors.pkt import cli
from skewd.collectors.pkt.capfile import CaptureError, CaptureLimits, read_capture

PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)


def _bomb(path: Path, zeros: int) -> Path:
    """A pcap header followed by ``zeros`` zero bytes, gzip-compressed (1000:1 and more)."""
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(PCAP_HEADER)
        chunk = b"\0" * min(zeros, 1 << 22)
        for _ in range(zeros // len(chunk)):
            f.write(chunk)
    return path


def test_gzip_bomb_stops_at_the_ratio_with_a_clear_error(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "bomb.pcap.gz", 256 << 20)  # 256 MiB of zeros in ~250 KB
    compressed = bomb.stat().st_size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CaptureError) as e:
        read_capture(bomb)
    grew_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert str(bomb) in str(e.value) and "decompression bomb" in str(e.value)
    assert grew_kb < 80 * 1024, f"peak RSS grew by {grew_kb} KiB reading a {compressed}-byte file"
    # a smaller one within a raised budget is read: zeros are empty 16-byte records
    small = _bomb(tmp_path / "small.pcap.gz", 4 << 20)
    with pytest.raises(CaptureError):
        read_capture(small, limits=CaptureLimits(ratio_floor=1 << 20))
    cap = read_capture(small, limits=CaptureLimits(max_ratio=10_000, ratio_floor=1 << 20))
    assert len(cap.frames) == (4 << 20) // 16 and not cap.problems


def test_cli_takes_the_budget_as_flags(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path / "bomb.pcap.gz", 1 << 20)
    out, err = io.StringIO(), io.StringIO()
    assert cli.main([str(bomb), "--max-decompressed", "512K"], out, err) == 2
    assert "expands past 524288 bytes" in err.getvalue() and "--max-decompressed" in err.getvalue()
    out = io.StringIO()
    assert cli.main([str(bomb), "--max-ratio", "100000"], out, io.StringIO()) == 0
    assert "pcap, 65536 frames" in out.getvalue()


@pytest.mark.skipif(importlib.util.find_spec("zstandard") is None, reason="the zstandard module is not installed")
def test_zstd_bomb_and_damaged_zstd_are_capture_errors(tmp_path: Path) -> None:
    import zstandard

    bomb = tmp_path / "bomb.pcap.zst"
    with open(bomb, "wb") as fo, zstandard.ZstdCompressor(level=19).stream_writer(fo) as w:
        w.write(PCAP_HEADER)
        for _ in range(32):
            w.write(b"\0" * (1 << 22))
    with pytest.raises(CaptureError, match="zstd stream expands past"):
        read_capture(bomb, limits=CaptureLimits(ratio_floor=1 << 20))
    broken = tmp_path / "broken.pcap.zst"
    broken.write_bytes(bomb.read_bytes()[:40] + b"\xff" * 64)
    with pytest.raises(CaptureError, match="damaged zstd stream|expands past"):
        read_capture(broken)


def _block(btype: int, body: bytes) -> bytes:
    n = 12 + len(body)
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


def _idb(opts: bytes) -> bytes:
    return _block(1, struct.pack("<HHI", 1, 0, 0) + opts + struct.pack("<HH", 0, 0))


def _epb(iface: int, data: bytes) -> bytes:
    return _block(6, struct.pack("<IIIII", iface, 0, 1_000_000, len(data), len(data)) + data + b"\0" * (-len(data) % 4))


ETH = bytes(12) + b"\x08\x00" + bytes(46)


@pytest.mark.parametrize("opt, what", [
    (struct.pack("<HH", 9, 1) + b"\x7f\0\0\0", "if_tsresol 10^-127"),  # decimal exponent 127
    (struct.pack("<HH", 9, 1) + b"\xff\0\0\0", "if_tsresol 2^-127"),  # binary exponent 127
    (struct.pack("<HH", 14, 8) + struct.pack("<q", 1 << 62), "if_tsoffset 4611686018427387904"),
    (struct.pack("<HH", 14, 8) + struct.pack("<q", -(1 << 63)), "if_tsoffset -9223372036854775808"),
])
def test_pcapng_option_values_out_of_range_are_reported_with_offset(tmp_path: Path, opt: bytes, what: str) -> None:
    shb = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    good, bad = _idb(b""), _idb(opt)
    f = tmp_path / "opts.pcapng"
    f.write_bytes(shb + good + bad + _epb(0, ETH) + _epb(1, ETH) + _epb(0, ETH))
    cap = read_capture(f)
    bad_at = len(shb) + len(good)
    assert any(p.startswith(f"{f}: interface 1 (block at byte offset {bad_at}): {what}") for p in cap.problems), \
        cap.problems
    assert len(cap.frames) == 2 and set(cap.frames.iface.tolist()) == {0}  # the good interface's packets stay
    assert cap.frames.ts_ns.tolist() == [1_000_000 * 1000] * 2
