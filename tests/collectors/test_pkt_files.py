"""pkt offline reader against real captures: PcapPlusPlus' public test corpus with tshark's
counts, plus pcap/pcapng variants written by scapy (an independent writer) and damaged files.

The corpus lives in tests/fixtures/pkt/pcapplusplus-200853b3a (all but example.pcap, 3.8 MB);
example.pcap is read from $SKEWD_PCAP_CORPUS or /work/shared/pcaps when present.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from skewd.collectors.pkt.capfile import (CaptureError, frame_pcap, frame_pcap_headers, parse_capture,
                                          read_capture)
from skewd.collectors.pkt.frames import gather
from skewd.collectors.pkt.features import analyze
from skewd.collectors.pkt.parse import counts, decode

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "pkt" / "pcapplusplus-200853b3a"
EXTRA = [Path(os.environ["SKEWD_PCAP_CORPUS"])] if os.environ.get("SKEWD_PCAP_CORPUS") else []
EXTRA.append(Path("/work/shared/pcaps"))


def _table() -> dict[str, tuple[int, int, int, int, int]]:
    rows = {}
    for line in (FIX / "README.md").read_text().splitlines():
        m = re.match(r"\| (\S+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", line)
        if m:
            rows[m.group(1)] = tuple(int(x) for x in m.groups()[1:])
    return rows


TSHARK = _table()

#: where our numbers legitimately differ from tshark's, and why (see README.md of the collector)
KNOWN = {
    # tshark reassembles IP fragments and dissects UDP once per reassembled datagram; three
    # datagrams in this file have their first fragment sent twice, and each copy carries a UDP
    # header on the wire: we count 12 UDP frames where tshark counts 9.
    "ip4_fragments.pcap": {"udp": 12},
}


def corpus_file(name: str) -> Path:
    for d in [FIX, *EXTRA]:
        if (d / name).exists():
            return d / name
    pytest.skip(f"{name} is not in the fixtures (too big to vendor); set SKEWD_PCAP_CORPUS to the "
                f"PcapPlusPlus PcapExamples directory to run it")


def test_table_parsed() -> None:
    assert len(TSHARK) == 32 and TSHARK["example.pcap"] == (4631, 4631, 4492, 139, 10)


@pytest.mark.parametrize("name", sorted(TSHARK))
def test_corpus_counts_match_tshark(name: str) -> None:
    path = corpus_file(name)
    frames, ip, tcp, udp, rtx = TSHARK[name]
    if name.endswith(".zst") and importlib.util.find_spec("zstandard") is None:
        # without the module: a clear error saying what to do, and the same capture
        # decompressed by the zstd tool must then match tshark too
        with pytest.raises(CaptureError, match=r"zstd-compressed.*zstandard.*zstd -d"):
            read_capture(path)
        if not shutil.which("zstd"):
            pytest.skip("zstd tool not installed: the decompressed content cannot be checked")
        out = subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
        cap = parse_capture(np.frombuffer(out, np.uint8), name)
    else:
        cap = read_capture(path)
    pk = decode(cap.frames)
    c = counts(pk)
    want = {"frames": frames, "ip": ip, "tcp": tcp, "udp": udp, **KNOWN.get(name, {})}
    assert {k: c[k] for k in want} == want
    res = analyze(pk)
    got_rtx = sum(p.tcp_retransmits_total for p in res[0].ports) if res else 0
    assert got_rtx == rtx


def test_unsupported_linktype_is_named_and_counted() -> None:
    cap = read_capture(corpus_file("microsecs_big_endian.pcap"))
    assert cap.unsupported == {253: 13}
    assert any("253" in p and "NETLINK" in p for p in cap.problems)
    assert len(cap.frames) == 13 and counts(decode(cap.frames))["undecoded"] == 13
    with pytest.raises(CaptureError, match="link type 253"):
        read_capture(corpus_file("microsecs_big_endian.pcap"), strict=True)


def test_nanosecond_and_big_endian_timestamps() -> None:
    # the same two frames, microsecond vs nanosecond pcap: identical times to the microsecond
    us = read_capture(corpus_file("microsecs.pcap")).frames.ts_ns
    ns = read_capture(corpus_file("nanosecs.pcap")).frames.ts_ns
    assert len(us) == len(ns) == 2
    assert (ns % 1000 != 0).any()  # real sub-microsecond digits survive
    be = read_capture(corpus_file("nanosecs_big_endian.pcap"))
    assert len(be.frames) == 10 and (np.diff(be.frames.ts_ns) >= 0).all()
    assert 1e9 < be.frames.ts_ns[0] / 1e9 < 2e9  # a plausible date: byte order was honoured


def test_pcapng_interfaces_names_and_drops() -> None:
    cap = read_capture(corpus_file("many_interfaces-1.pcapng"))
    names = [i.name for i in cap.interfaces]
    assert names[:3] == ["en0", "awdl0", "bridge0"] and len(names) == 11
    assert {i.linktype for i in cap.interfaces} == {0, 1, 12}  # NULL, Ethernet, raw per interface
    assert all(i.drops == 0 for i in cap.interfaces)  # isb_ifdrop from the statistics blocks
    assert set(np.unique(cap.frames.iface).tolist()) == {0, 10}
    res = analyze(decode(cap.frames), port_names=names, drops={k: 0 for k in range(len(names))})
    assert {p.name for p in res[0].ports} >= {"en0", "lo0"}


def test_pcapng_cooked_interface_and_broken_timestamp_kept_in_capture_order() -> None:
    # frame 2 of this file carries a bogus timestamp (year 2061); analysis stays in capture
    # order, so the handshake is not mistaken for a retransmission (tshark reports none)
    cap = read_capture(corpus_file("pcapng-example.pcapng"))
    assert [i.linktype for i in cap.interfaces] == [1, 113]
    assert cap.frames.ts_ns[1] > cap.frames.ts_ns[2] + 10**18
    assert sum(p.tcp_retransmits_total for p in analyze(decode(cap.frames))[0].ports) == 0


# -- files written by scapy (an independent writer) ------------------------------------------

def _scapy_packets(n: int = 50):
    from scapy.all import IP, UDP, Ether

    pkts = []
    for i in range(n):
        p = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.9.0.1", dst="10.9.0.2") \
            / UDP(sport=1000 + i % 3, dport=5000) / (b"z" * (i % 7 * 10))
        p.time = 1_700_000_000 + i * 0.001 + 123e-9 * (i % 5)
        pkts.append(p)
    return pkts


@pytest.mark.parametrize("nano", [False, True])
@pytest.mark.parametrize("endian", ["<", ">"])
def test_scapy_pcap_variants(tmp_path: Path, nano: bool, endian: str) -> None:
    from scapy.utils import PcapWriter

    path = tmp_path / "x.pcap"
    pkts = _scapy_packets()
    w = PcapWriter(str(path), nano=nano, endianness=endian, linktype=1)
    w.write(pkts)
    w.close()
    cap = read_capture(path)
    assert cap.problems == [] and len(cap.frames) == 50
    res = (cap.frames.ts_ns - 1_700_000_000 * 10**9)
    want = np.array([round((float(p.time) - 1_700_000_000) * 1e9) for p in pkts])
    assert np.abs(res - want).max() <= (1 if nano else 1000)
    pk = decode(cap.frames)
    assert counts(pk)["udp"] == 50
    assert sorted({int(x) for x in pk.sport}) == [1000, 1001, 1002]
    assert (pk.wirelen == [len(bytes(p)) for p in pkts]).all()


def test_scapy_pcapng_with_two_interfaces_and_resolutions(tmp_path: Path) -> None:
    """pcapng with interfaces of different link types and timestamp resolutions, hand-built
    block by block (scapy writes a single interface)."""
    from scapy.all import IP, UDP, Ether

    e = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.9.0.1", dst="10.9.0.2") / UDP(sport=1, dport=2)
    raw_ip = bytes(IP(src="10.9.0.3", dst="10.9.0.4") / UDP(sport=3, dport=4))

    def block(t: int, body: bytes) -> bytes:
        body += b"\0" * (-len(body) % 4)
        return struct.pack("<II", t, len(body) + 12) + body + struct.pack("<I", len(body) + 12)

    def opt(code: int, val: bytes) -> bytes:
        return struct.pack("<HH", code, len(val)) + val + b"\0" * (-len(val) % 4)

    shb = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    idb0 = block(1, struct.pack("<HHI", 1, 0, 0) + opt(2, b"eth9") + opt(9, bytes([9])) + opt(0, b""))
    idb1 = block(1, struct.pack("<HHI", 101, 0, 0) + opt(2, b"tun9") + opt(9, bytes([0x80 | 20])) + opt(0, b""))

    def epb(ifid: int, ticks: int, data: bytes) -> bytes:
        return block(6, struct.pack("<IIIII", ifid, ticks >> 32, ticks & 0xFFFFFFFF, len(data), len(data)) + data)

    t_ns = 1_700_000_000_123_456_789
    t_b2 = (1_700_000_001 << 20) + (1 << 19)  # 2^-20 resolution: 1700000001.5 s
    isb = block(5, struct.pack("<III", 1, 0, 0) + opt(5, struct.pack("<Q", 42)) + opt(0, b""))
    data = shb + idb0 + idb1 + epb(0, t_ns, bytes(e)) + epb(1, t_b2, raw_ip) + isb
    path = tmp_path / "two.pcapng"
    path.write_bytes(data)
    cap = read_capture(path)
    assert cap.problems == []
    assert [i.name for i in cap.interfaces] == ["eth9", "tun9"] and cap.interfaces[1].drops == 42
    assert cap.frames.ts_ns.tolist() == [t_ns, 1_700_000_001_500_000_000]
    assert cap.frames.linktype.tolist() == [1, 101]
    pk = decode(cap.frames)
    assert pk.sport.tolist() == [1, 3] and counts(pk)["udp"] == 2


def test_gzip_capture(tmp_path: Path) -> None:
    src = corpus_file("one_tcp_stream.pcap")
    gz = tmp_path / "s.pcap.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    assert len(read_capture(gz).frames) == 36


# -- damaged files ---------------------------------------------------------------------------

def test_truncated_pcap_keeps_earlier_packets_and_names_offset(tmp_path: Path) -> None:
    data = corpus_file("one_tcp_stream.pcap").read_bytes()
    full = read_capture(corpus_file("one_tcp_stream.pcap"))
    last = int(full.frames.doff[-1]) - 16  # record header of the last frame
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[: last + 30])
    cap = read_capture(cut)
    assert len(cap.frames) == 35
    assert len(cap.problems) == 1 and str(cut) in cap.problems[0] and f"byte offset {last}" in cap.problems[0]
    with pytest.raises(CaptureError) as ei:
        read_capture(cut, strict=True)
    assert len(ei.value.capture.frames) == 35  # type: ignore[attr-defined]
    cut.write_bytes(data[: last + 7])  # inside the record header
    cap = read_capture(cut)
    assert len(cap.frames) == 35 and "truncated record header" in cap.problems[0]


def test_truncated_pcapng_names_offset(tmp_path: Path) -> None:
    data = corpus_file("pcapng-example.pcapng").read_bytes()
    cut = tmp_path / "cut.pcapng"
    cut.write_bytes(data[:-50])
    cap = read_capture(cut)
    assert 0 < len(cap.frames) < 159
    assert any("truncated block at byte offset" in p and str(cut) in p for p in cap.problems)


@pytest.mark.parametrize("content,match", [(b"", "empty file"), (b"GIF89a" + bytes(40), "not a pcap"),
                                           (bytes.fromhex("d4c3b2a10200"), "truncated pcap file header")])
def test_garbage_is_refused(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "bad.pcap"
    p.write_bytes(content)
    with pytest.raises(CaptureError, match=match):
        read_capture(p)


def test_missing_file() -> None:
    with pytest.raises(CaptureError, match="cannot read"):
        read_capture("/nonexistent/x.pcap")


# -- the fast framing path agrees with a sequential walk -------------------------------------

def _synthetic(n: int, seed: int, snap: int = 0, jump_at: int = -1) -> bytes:
    rng = np.random.default_rng(seed)
    sizes = rng.choice([60, 74, 590, 1514, 9000], size=n, p=[0.3, 0.2, 0.2, 0.29, 0.01]).astype(np.int64)
    cap = sizes if not snap else np.minimum(sizes, snap)
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    t = 1_700_000_000.0
    for k in range(n):
        t += rng.exponential(1e-4) + (400 * 86400 if k == jump_at else 0)  # optional clock jump
        # payload bytes are random: they include plenty of plausible-looking "headers"
        out += struct.pack("<IIII", int(t), int((t % 1) * 1e6), int(cap[k]), int(sizes[k]))
        out += rng.integers(0, 256, int(cap[k]), dtype=np.uint8).tobytes()
    return bytes(out)


@pytest.mark.parametrize("seed,snap,jump", [(1, 0, -1), (2, 128, -1), (3, 0, -1), (4, 0, 600)])
def test_lockstep_framing_equals_sequential_walk(seed: int, snap: int, jump: int) -> None:
    # jump: a year-long clock jump early on, so later records fail the timestamp screen
    data = _synthetic(6000, seed, snap, jump)
    a = np.frombuffer(data, np.uint8)
    fast, p1 = frame_pcap(a, False, lockstep=True)
    slow, p2 = frame_pcap(a, False, lockstep=False)
    assert p1 is None and p2 is None and len(slow) == 6000
    assert np.array_equal(fast, slow)
    _, fh, _ = frame_pcap_headers(a, False, lockstep=True)  # headers read during the walk
    assert np.array_equal(fh, gather(a, slow, 16))
    # and when the file is cut mid-record, both keep the same records and report the same offset
    cut = np.frombuffer(data[: len(data) - 500], np.uint8)
    fc = parse_capture(cut, "cut")
    assert len(fc.frames) == int((slow + 16 + 9000 <= len(cut)).sum()) or len(fc.frames) < 6000
    ff, pf = frame_pcap(cut, False, lockstep=True)
    fs, ps = frame_pcap(cut, False, lockstep=False)
    assert np.array_equal(ff, fs) and pf == ps and "truncated record" in ps


@pytest.mark.parametrize("bad_record", [5, 2999, 5990])
@pytest.mark.parametrize("how", ["huge caplen", "caplen off by 3"])
def test_lockstep_framing_equals_sequential_walk_on_damaged_files(bad_record: int, how: str) -> None:
    """A damaged record header mid-file: the lockstep walk (which reads whole headers as it
    goes) keeps exactly the records and headers the sequential walk keeps, with its problem."""
    data = bytearray(_synthetic(6000, 7))
    slow, _ = frame_pcap(np.frombuffer(bytes(data), np.uint8), False, lockstep=False)
    at = int(slow[bad_record]) + 8
    old = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at, 0x7FFFFFF0 if how == "huge caplen" else old + 3)
    a = np.frombuffer(bytes(data), np.uint8)
    fo, fh, fp = frame_pcap_headers(a, False, lockstep=True)
    so, sh, sp = frame_pcap_headers(a, False, lockstep=False)
    assert np.array_equal(fo, so) and np.array_equal(fh, sh) and fp == sp
    if how == "huge caplen":
        assert len(fo) == bad_record and "corrupt record header" in fp
    else:  # the walk continues from a wrong offset: whatever it reads, both read the same
        assert np.array_equal(fo[:bad_record + 1], slow[:bad_record + 1])


def test_pcapng_block_runs_equal_block_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large pcapng files locate packet-block runs with numpy; the result must equal the
    block-by-block walk, also with a second section and non-packet blocks in between."""
    from scapy.all import IP, UDP, Ether
    from scapy.utils import PcapNgWriter

    from skewd.collectors.pkt import capfile

    paths = []
    for k in range(2):
        w = PcapNgWriter(str(tmp_path / f"p{k}.pcapng"))
        for i in range(1500):
            # payloads full of aligned 6s: plausible-looking block types everywhere
            p = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.9.0.1", dst="10.9.0.2") \
                / UDP(sport=1000 + k, dport=2000) / (struct.pack("<II", 6, 32) * (i % 9))
            p.time = 1_700_000_000 + k * 10 + i * 1e-4
            w.write(p)
        w.close()
        paths.append(tmp_path / f"p{k}.pcapng")
    both = tmp_path / "both.pcapng"
    both.write_bytes(paths[0].read_bytes() + paths[1].read_bytes())  # two sections
    fast = read_capture(both)
    monkeypatch.setattr(capfile, "PCAPNG_RUNS_MIN_BYTES", 1 << 62)
    slow = read_capture(both)
    assert fast.problems == slow.problems == []
    assert len(fast.frames) == 3000 and len(fast.interfaces) == 2
    for col in ("doff", "caplen", "wirelen", "ts_ns", "iface", "linktype"):
        assert np.array_equal(getattr(fast.frames, col), getattr(slow.frames, col)), col
