"""Offline packet-timing speed: pcap → frames → headers → per-flow features, against scapy and dpkt.

    .venv/bin/python bench/pkt_offline.py [--packets 1000000] [--flows 1000] [--snaplen 0]
        [--repeat 3] [--scapy-packets 30000] [--dpkt-packets 0] [--pcapng] [--cli [--cli-peer SKEWD]] [--json]

Generates a pcap of N packets with numpy (scapy would need minutes for a million packets):
Ethernet/IPv4, a mix of UDP (a third RoCEv2 on 4791, with BTH and in-order PSNs) and TCP (in
order sequence numbers) over F flows, varied frame sizes (64/200/590/1514, so records have
different lengths), header-only snaplen optional. All three readers then work on that one file
in the same run (the machine is shared and noisy: the ratios are what to rely on):

* **skewd**: ``read_capture`` → ``decode`` → ``analyze`` (one interval, every analysis path
  active: per-flow counts, rates, gap p50/p99/max, jitter, bursts, TCP and RoCE
  retransmission analysis, ECN, port aggregates). Best and median of ``--repeat`` runs.
* **dpkt** (``dpkt.pcap.UniversalReader`` + ``dpkt.ethernet.Ethernet(buf)``, which parses
  Ethernet, IP and TCP/UDP eagerly) and **scapy** (``PcapReader``: full dissection of every
  packet into layer objects, scapy's default layers). Each peer feeds the same pure-Python
  per-flow accumulator, written as a user of that library would:

  - flow key: direction-aware (IP protocol, source address, destination address, source
    port, destination port), ports 0 for non-TCP/UDP; non-IP frames are counted, not keyed;
  - per packet: a dict lookup, packets += 1, bytes += wire length (scapy: ``pkt.wirelen``
    from the record header; dpkt does not expose it, so 14 + IP total length, identical for
    this file), last timestamp, the gap to the flow's previous packet appended to a list
    (clock steps back read as 0), a burst counted when the gap is >= 1 ms (and at the first
    packet);
  - at the end, per flow (numpy): gap p50/p99 (linear interpolation), gap max, jitter
    (population stddev / mean of the gaps), first/last time.

  That is a subset of skewd's work (no TCP/RoCE retransmission analysis, ECN, burst bytes,
  port aggregates). The peers' per-flow results are checked against skewd's on the same
  packets, so all three compute the same numbers. scapy manages a few thousand packets per
  second, so it reads only the first ``--scapy-packets`` packets of the file (per-packet
  rates are compared; the output says so); dpkt reads ``--dpkt-packets`` (0 = all).

With ``--cli`` the command users run, ``skewd pkt FILE --json``, is timed too, each run a new
process (interpreter start-up, imports, reading, features and the JSON lines written to
/dev/null): its goal (issue #23) is >= 1.5 M packets/s wall clock, compared with scapy's wall rate.
It runs with a bytecode cache (written by an untimed first run into a temporary
PYTHONPYCACHEPREFIX), as an installed skewd does; ``--cli-no-bytecode`` times a source checkout
under PYTHONDONTWRITEBYTECODE=1 instead, which compiles skewd's modules on every run.
``--cli-peer SKEWD`` times another skewd executable (e.g. main's ``.venv/bin/skewd``) on the same
file, interleaved with ours: the before/after comparison on a shared machine.

Rates are packets per CPU second (``time.process_time``: user + system of this process, so
page faults on the memory-mapped file and on fresh array memory count) and per wall-clock
second. The median skewd run's system time and page-fault count are printed too: on a
loaded VM a first-touched page costs microseconds, a large share of skewd's time. Goals (issue #9):
skewd >= 1.5 M packets/s on one core, >= 250x scapy, >= 20x dpkt. The ratios are skewd's
median CPU rate over the peer's CPU rate. Exits non-zero only if it could not run (a peer
library missing included), never because a goal is missed.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import numpy as np


def make_pcap(path: str, n: int = 1_000_000, flows: int = 1000, snaplen: int = 0, seed: int = 1,
              nano: bool = False) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.choice(np.array([64, 200, 590, 1514]), size=n, p=[0.3, 0.4, 0.1, 0.2]).astype(np.int64)
    caplen = sizes if not snaplen else np.minimum(sizes, snaplen)
    flow = rng.integers(0, flows, n)
    is_tcp = flow % 3 == 0
    ts = 1_700_000_000 * 10**9 + np.cumsum(rng.exponential(2_000, n)).astype(np.int64)  # ~500k pps
    hdr = np.zeros((n, 16 + 54), np.uint8)
    rec = hdr[:, :16].view("<u4")
    rec[:, 0] = ts // 10**9
    rec[:, 1] = (ts % 10**9) if nano else (ts % 10**9) // 1000
    rec[:, 2] = caplen
    rec[:, 3] = sizes
    f = hdr[:, 16:]
    f[:, 0:6] = [2, 0, 0, 0, 0, 2]
    f[:, 6:12] = [2, 0, 0, 0, 0, 1]
    f[:, 12:14] = [8, 0]
    f[:, 14] = 0x45
    tot = sizes - 14
    f[:, 16] = tot >> 8
    f[:, 17] = tot & 255
    f[:, 22] = 64
    f[:, 23] = np.where(is_tcp, 6, 17)
    f[:, 26:30] = [10, 0, 0, 1]
    f[:, 28] = flow >> 8
    f[:, 29] = flow & 255
    f[:, 30:34] = [10, 0, 1, 1]
    sport = 10000 + flow
    dport = np.where(is_tcp, 5201, np.where(flow % 3 == 1, 4791, 5000))
    f[:, 34], f[:, 35] = sport >> 8, sport & 255
    f[:, 36], f[:, 37] = dport >> 8, dport & 255
    # TCP: increasing sequence numbers per flow, data offset 5, ACK flag
    seq = np.zeros(n, np.int64)
    pay = sizes - 54
    o = np.argsort(flow, kind="stable")
    cs = np.cumsum(pay[o])
    seq[o] = cs - pay[o]
    seq = (seq + flow * 7919) & 0xFFFFFFFF
    f[:, 38:42] = seq.astype(">u4").view(np.uint8).reshape(n, 4)
    f[:, 46] = np.where(is_tcp, 0x50, 0)
    f[:, 47] = np.where(is_tcp, 0x10, 0)
    udplen = sizes - 34
    f[:, 38] = np.where(is_tcp, f[:, 38], udplen >> 8)
    f[:, 39] = np.where(is_tcp, f[:, 39], udplen & 255)
    roce = ~is_tcp & (dport == 4791)
    f[:, 42] = np.where(roce, 4, f[:, 42])  # BTH opcode RC SEND_ONLY
    psn = np.zeros(n, np.int64)
    psn[o] = np.arange(n) - np.searchsorted(flow[o], flow[o])
    f[:, 51] = np.where(roce, (psn >> 16) & 255, f[:, 51])
    f[:, 52] = np.where(roce, (psn >> 8) & 255, f[:, 52])
    f[:, 53] = np.where(roce, psn & 255, f[:, 53])
    reclen = 16 + caplen
    offs = 24 + np.r_[0, np.cumsum(reclen)[:-1]]
    out = np.zeros(24 + int(reclen.sum()), np.uint8)
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out[:24] = np.frombuffer(np.array([magic, 0x00040002, 0, 0, snaplen or 262144, 1], "<u4").tobytes()[:24],
                             np.uint8)
    w = min(70, int(reclen.min()))
    view = np.ndarray((len(out) - w + 1,), np.dtype((np.void, w)), buffer=out, strides=(1,))
    view[offs] = np.ascontiguousarray(hdr[:, :w]).view(np.dtype((np.void, w))).ravel()
    with open(path, "wb") as fh:
        fh.write(out.tobytes())


def pcap_to_pcapng(src: str, dst: str) -> None:
    """Rewrap a pcap (from make_pcap) as pcapng: SHB, one IDB (ns resolution), one EPB per record."""
    import struct

    from skewd.collectors.pkt.capfile import frame_pcap_headers

    a = np.fromfile(src, np.uint8)
    offs, h, _ = frame_pcap_headers(a, False)
    u = np.ascontiguousarray(h).view("<u4")
    ts = u[:, 0].astype(np.int64) * 10**9 + u[:, 1].astype(np.int64) * (1 if a[0] == 0x4D else 1000)
    cap = u[:, 2].astype(np.int64)
    pad = (-cap) % 4
    blen = 32 + cap + pad
    n = len(offs)
    shb = struct.pack("<IIIHHqI", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1, 28)
    idb_body = struct.pack("<HHI", 1, 0, 0) + struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)
    idb = struct.pack("<II", 1, 12 + len(idb_body)) + idb_body + struct.pack("<I", 12 + len(idb_body))
    head = np.frombuffer(shb + idb, np.uint8)
    starts = len(head) + np.r_[0, np.cumsum(blen)[:-1]]
    out = np.zeros(len(head) + int(blen.sum()), np.uint8)
    out[: len(head)] = head
    hdr = np.zeros((n, 7), "<u4")
    hdr[:, 0], hdr[:, 1], hdr[:, 2] = 6, blen, 0
    hdr[:, 3], hdr[:, 4] = ts >> 32, ts & 0xFFFFFFFF
    hdr[:, 5], hdr[:, 6] = cap, u[:, 3]
    view = np.ndarray((len(out) - 27,), np.dtype((np.void, 28)), buffer=out, strides=(1,))
    view[starts] = hdr.view(np.dtype((np.void, 28))).ravel()
    # packet data: copy record bodies with one gather per 64-byte slice
    w = int(cap.min())
    body = np.ndarray((len(a) - w + 1,), np.dtype((np.void, w)), buffer=a, strides=(1,))[offs + 16]
    dview = np.ndarray((len(out) - w + 1,), np.dtype((np.void, w)), buffer=out, strides=(1,))
    dview[starts + 28] = body
    rest = np.flatnonzero(cap > w)
    for k in rest.tolist():  # the few bytes beyond the shortest frame (not timed)
        o, c = int(offs[k]) + 16, int(cap[k])
        out[starts[k] + 28 + w: starts[k] + 28 + c] = a[o + w: o + c]
    trail = starts + blen - 4
    tv = np.ndarray((len(out) - 3,), np.dtype((np.void, 4)), buffer=out, strides=(1,))
    tv[trail] = blen.astype("<u4").view(np.dtype((np.void, 4)))
    out.tofile(dst)



# ---------------------------------------------------------------------------------------------
# peers: what a user of scapy or dpkt writes for the same per-flow features
# ---------------------------------------------------------------------------------------------

BURST_GAP = 0.001
_PROTO_NAMES = {6: "tcp", 17: "udp", 1: "icmp"}


class PyFlows:
    """Per-flow accumulator in plain Python (one dict lookup and a few updates per packet)."""

    def __init__(self, burst_gap: float = BURST_GAP) -> None:
        self.flows: dict[tuple, list] = {}
        self.other = 0
        # timestamps arrive as float seconds (0.24 us resolution at today's epoch): a gap of
        # exactly burst_gap must not read as a hair below it (the file's times are whole us)
        self.burst_gap = burst_gap - 5e-7

    def add(self, key: tuple, t: float, wire: int) -> None:
        st = self.flows.get(key)
        if st is None:  # packets, bytes, first, last, gaps, bursts
            self.flows[key] = [1, wire, t, t, [], 1]
            return
        g = t - st[3]
        if g < 0:
            g = 0.0
        st[0] += 1
        st[1] += wire
        st[3] = t
        st[4].append(g)
        if g >= self.burst_gap:
            st[5] += 1

    def finish(self) -> dict[tuple, dict[str, float]]:
        out = {}
        for key, (n, b, first, last, gaps, bursts) in self.flows.items():
            f = {"packets": n, "bytes": b, "start": first, "end": last, "bursts": bursts,
                 "gap_mean": np.nan, "gap_p50": np.nan, "gap_p99": np.nan, "gap_max": np.nan, "jitter": np.nan}
            if gaps:
                g = np.asarray(gaps)
                p50, p99 = np.percentile(g, (50, 99))
                mean = g.mean()
                f.update(gap_p50=p50, gap_p99=p99, gap_max=g.max(), gap_mean=mean,
                         jitter=g.std() / mean if len(g) >= 2 and mean > 0 else np.nan)
            out[key] = f
        return out


def peer_dpkt(path: str, limit: int) -> tuple[int, dict, int]:
    """dpkt: reader + Ethernet/IP/TCP/UDP parse (dpkt decodes the nested layers eagerly)."""
    import dpkt

    acc = PyFlows()
    add = acc.add
    IP, TCP, UDP = dpkt.ip.IP, dpkt.tcp.TCP, dpkt.udp.UDP
    Ethernet = dpkt.ethernet.Ethernet
    n = 0
    with open(path, "rb") as fh:
        for ts, buf in dpkt.pcap.UniversalReader(fh):
            n += 1
            ip = Ethernet(buf).data
            if isinstance(ip, IP):
                l4 = ip.data
                if isinstance(l4, (TCP, UDP)):
                    key = (ip.p, ip.src, ip.dst, l4.sport, l4.dport)
                else:
                    key = (ip.p, ip.src, ip.dst, 0, 0)
                add(key, ts, 14 + ip.len)
            else:
                acc.other += 1
            if n == limit:
                break
    return n, acc.finish(), acc.other


def peer_scapy(path: str, limit: int) -> tuple[int, dict, int]:
    """scapy: ``PcapReader`` (full dissection into layer objects)."""
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.utils import PcapReader

    acc = PyFlows()
    add = acc.add
    n = 0
    with PcapReader(path) as r:
        for p in r:
            n += 1
            if IP in p:
                ip = p[IP]
                l4 = ip.payload
                if isinstance(l4, (TCP, UDP)):
                    key = (ip.proto, ip.src, ip.dst, l4.sport, l4.dport)
                else:
                    key = (ip.proto, ip.src, ip.dst, 0, 0)
                add(key, float(p.time), p.wirelen)
            else:
                acc.other += 1
            if n == limit:
                break
    return n, acc.finish(), acc.other


def _entity(key: tuple) -> str:
    """skewd's entity name for a peer's flow key (addresses as bytes or dotted strings)."""
    import socket

    proto, src, dst, sport, dport = key
    if isinstance(src, bytes):
        src, dst = socket.inet_ntoa(src), socket.inet_ntoa(dst)
    name = _PROTO_NAMES.get(proto, f"ip{proto}")
    return f"{name} {src}:{sport}>{dst}:{dport}" if proto in (6, 17) else f"{name} {src}>{dst}"


def compare(peer: dict, feats) -> list[str]:
    """Differences between a peer's per-flow results and skewd's features of the same packets."""
    ours = {e: i for i, e in enumerate(feats.entities)}
    c = feats.flows
    out = []
    for key, f in peer.items():
        e = _entity(key)
        i = ours.get(e)
        if i is None:
            out.append(f"{e}: not a skewd flow")
            continue
        exact = (("packets", "packets"), ("bytes", "bytes"), ("bursts", "bursts"))
        for pk_, sk in exact:
            if f[pk_] != c[sk][i]:
                out.append(f"{e}: {pk_} {f[pk_]} vs skewd {c[sk][i]}")
        # times within 1 us (float seconds carry ~0.2 us at today's epoch); jitter compared as
        # its standard deviation (jitter x mean gap), which that rounding moves by under 1 us
        m = float(f["gap_mean"])
        for pk_, sk, scale in (("gap_p50", "gap_p50_seconds", 1.0), ("gap_p99", "gap_p99_seconds", 1.0),
                               ("gap_max", "gap_max_seconds", 1.0), ("start", "start_seconds", 1.0),
                               ("end", "end_seconds", 1.0), ("jitter", "jitter_cov", m)):
            a, b = float(f[pk_]), float(c[sk][i])
            if not (abs(a - b) * scale <= 1e-6 or (np.isnan(a) and np.isnan(b))):
                out.append(f"{e}: {pk_} {a:.9g} vs skewd {b:.9g}")
    if len(peer) != len(feats.entities):
        out.append(f"{len(peer)} flows vs skewd {len(feats.entities)}")
    return out


def _skewd_features(path: str, limit: int):
    """skewd's features of the first ``limit`` packets (for the agreement check; not timed)."""
    from skewd.collectors.pkt.capfile import read_capture
    from skewd.collectors.pkt.features import analyze
    from skewd.collectors.pkt.parse import decode

    fr = read_capture(path).frames
    if limit < len(fr):
        fr = fr.select(np.arange(limit))
    return analyze(decode(fr), burst_gap=BURST_GAP)[0]


def _cli_env(cache: str | None) -> dict[str, str]:
    """The environment of a timed ``skewd pkt`` process. With ``cache`` (a directory), bytecode is
    written there on an untimed first run and read on the timed ones: what an installed skewd
    does (pip compiles a wheel's modules at install). Without it, a checkout run with
    PYTHONDONTWRITEBYTECODE=1 (this workplace sets it) compiles skewd's ~20 modules of the pkt
    path from source on every run (~30 ms of CPU on a 2026 Xeon)."""
    env = dict(os.environ)
    if cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache
    return env


def _run_child(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, user + system CPU seconds) of one child process, output to /dev/null."""
    import subprocess

    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = b""
    if p.stderr:
        err = p.stderr.read()
        p.stderr.close()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {err.decode(errors='replace').strip()}")
    return wall, ru.ru_utime + ru.ru_stime


def _time_cli(path: str, n: int, repeat: int, peers: list[str] | None = None, bytecode: bool = True) -> dict:
    """``skewd pkt FILE --json`` as a user runs it, each run a new process: wall clock (what the
    goal is about: >= 1.5 M packets/s) and the child's CPU time (user + system), medians.

    ``peers``: other ``skewd`` executables (another checkout's venv, e.g. main's) timed on the
    same file in the same loop, their runs interleaved with ours so a busy machine weighs on all
    alike. ``bytecode``: time with cached bytecode, as installed (see :func:`_cli_env`)."""
    import statistics

    cmds = {"skewd": [sys.executable, "-m", "skewd.cli", "pkt", path, "--json"]}
    for k, exe in enumerate(peers or []):
        cmds[f"peer{k + 1}"] = [exe, "pkt", path, "--json"]
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds}
    with tempfile.TemporaryDirectory(prefix="skewd-pycache-") as cache:
        env = _cli_env(cache if bytecode else None)
        if bytecode:
            for cmd in cmds.values():
                _run_child(cmd, env)  # untimed: writes the bytecode the timed runs read
        for _ in range(repeat):
            for name, cmd in cmds.items():
                times[name].append(_run_child(cmd, env))
    where = "cached bytecode, as installed" if bytecode else "no bytecode cache: compiled from source every run"
    out: dict = {"cmd": "skewd pkt FILE --json", "runs": repeat, "bytecode": "cached" if bytecode else "none",
                 "goal_pps_wall": 1.5e6}
    for name, tl in times.items():
        walls, cpus = [w for w, _ in tl], [c for _, c in tl]
        r = {"wall_s": walls, "cpu_s": cpus, "pps_wall_median": n / statistics.median(walls),
             "pps_wall_best": n / min(walls), "pps_cpu_median": n / statistics.median(cpus)}
        label = "skewd pkt FILE --json" if name == "skewd" else f"peer {' '.join(cmds[name][:1])} pkt FILE --json"
        if name == "skewd":
            out.update(r)
        else:
            r["cmd"] = " ".join(cmds[name][:2]) + " FILE --json"
            r["ratio_cpu"] = statistics.median(cpus) / statistics.median(out["cpu_s"])
            r["ratio_wall"] = statistics.median(walls) / statistics.median(out["wall_s"])
            out[name] = r
        print(f"  {label} (new process each run, {repeat} runs, {where}): median "
              f"{statistics.median(walls):.3f}s wall = {_rate(r['pps_wall_median'])} packets/s wall "
              f"(best {_rate(r['pps_wall_best'])}), {statistics.median(cpus):.3f}s CPU = "
              f"{_rate(r['pps_cpu_median'])} per CPU second"
              + (f"; goal >= 1.5 M packets/s wall: {'met' if r['pps_wall_median'] >= 1.5e6 else 'not met'}"
                 if name == "skewd" else f"; its CPU / ours {r['ratio_cpu']:.3f}, wall / ours {r['ratio_wall']:.3f}"))
    return out


def _rate(n: float) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k"


def main(argv: list[str] | None = None) -> int:
    import json
    import statistics

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--flows", type=int, default=1000)
    ap.add_argument("--snaplen", type=int, default=0)
    ap.add_argument("--interval", type=float, default=0.0)
    ap.add_argument("--repeat", type=int, default=3, help="skewd runs (best and median reported)")
    ap.add_argument("--pcapng", action="store_true", help="rewrap the generated file as pcapng")
    ap.add_argument("--scapy-packets", type=int, default=30_000, help="scapy reads this prefix (0 = all)")
    ap.add_argument("--dpkt-packets", type=int, default=0, help="dpkt reads this prefix (0 = all)")
    ap.add_argument("--no-peers", action="store_true", help="time skewd only")
    ap.add_argument("--cli", action="store_true",
                    help="also time the command users run, `skewd pkt FILE --json` (a fresh process: start-up, "
                         "imports and JSON output included; output to /dev/null), --repeat times")
    ap.add_argument("--cli-peer", action="append", default=[], metavar="SKEWD",
                    help="with --cli: also time this skewd executable (e.g. another checkout's .venv/bin/skewd) on "
                         "the same file, runs interleaved with ours (repeatable)")
    ap.add_argument("--cli-no-bytecode", action="store_true",
                    help="with --cli: time without a bytecode cache (a source checkout under "
                         "PYTHONDONTWRITEBYTECODE=1 compiles skewd's modules every run); default: cached, as installed")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    a = ap.parse_args(argv)
    try:
        from skewd.collectors.pkt.capfile import read_capture
        from skewd.collectors.pkt.features import analyze
        from skewd.collectors.pkt.parse import decode
    except ImportError as e:
        print(f"could not run: {e}", file=sys.stderr)
        return 2
    missing = []
    if not a.no_peers:
        for name, mods in (("dpkt", ("dpkt",)), ("scapy", ("scapy.layers.inet", "scapy.utils"))):
            try:  # imported here, so the timed runs never pay for imports
                for mod in mods:
                    __import__(mod)
            except ImportError:
                missing.append(name)
    res: dict = {"benchmark": "pkt_offline", "packets": a.packets, "flows": a.flows, "snaplen": a.snaplen,
                 "format": "pcapng" if a.pcapng else "pcap",
                 "goals": {"skewd_pps_cpu": 1.5e6, "vs_scapy": 250, "vs_dpkt": 20}}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.pcap")
        t = time.perf_counter()
        make_pcap(path, a.packets, a.flows, a.snaplen)
        if a.pcapng:
            pcap_to_pcapng(path, path + "ng")
            os.unlink(path)
            path += "ng"
        res["file_mb"] = os.path.getsize(path) / 1e6
        print(f"generated {a.packets} packets over {a.flows} flows ({'pcapng' if a.pcapng else 'pcap'}"
              f"{f', snaplen {a.snaplen}' if a.snaplen else ', full frames'}), {res['file_mb']:.0f} MB "
              f"in {time.perf_counter() - t:.1f}s")
        runs = []
        for _ in range(a.repeat):
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            c0, t0 = time.process_time(), time.perf_counter()
            cap = read_capture(path)
            t1 = time.perf_counter()
            pk = decode(cap.frames)
            t2 = time.perf_counter()
            out = analyze(pk, interval=a.interval or None, burst_gap=BURST_GAP)
            t3, c3 = time.perf_counter(), time.process_time()
            r3 = resource.getrusage(resource.RUSAGE_SELF)
            runs.append((c3 - c0, t3 - t0, t1 - t0, t2 - t1, t3 - t2, r3.ru_stime - r0.ru_stime,
                         r3.ru_minflt - r0.ru_minflt))
            del cap, pk
        n = a.packets
        cpu, tot, fr, de, fe, _, _ = min(runs)
        med_run = sorted(runs)[len(runs) // 2]
        med_cpu = statistics.median(r[0] for r in runs)
        med_wall = statistics.median(r[1] for r in runs)
        sk = {"pps_cpu": n / cpu, "pps_wall": n / min(r[1] for r in runs), "pps_cpu_median": n / med_cpu,
              "pps_wall_median": n / med_wall, "runs": a.repeat,
              "stages_wall_s": {"frame": fr, "decode": de, "features": fe},
              "median_run_sys_s": med_run[5], "median_run_page_faults": med_run[6],
              "intervals": len(out), "flows": len(out[-1].entities)}
        res["skewd"] = sk
        print(f"skewd (read_capture -> decode -> analyze, every analysis path): best of {a.repeat}: "
              f"frame {fr:.3f}s  decode {de:.3f}s  features {fe:.3f}s  total {tot:.3f}s wall, {cpu:.3f}s CPU")
        print(f"  skewd: {_rate(sk['pps_cpu'])} packets/s per CPU second (median {_rate(sk['pps_cpu_median'])}), "
              f"{_rate(sk['pps_wall'])} packets/s wall clock (median {_rate(sk['pps_wall_median'])}); "
              f"{len(out)} interval(s), {sk['flows']} flows; goal >= 1.5 M packets/s on one core: "
              f"{'met' if sk['pps_cpu_median'] >= 1.5e6 else 'not met'}")
        print(f"    median run: {med_run[0]:.3f}s CPU, of which {med_run[5]:.3f}s system time "
              f"({med_run[6]} page faults: fresh memory for arrays and the file mapping)")
        if a.cli:
            res["skewd_cli"] = _time_cli(path, n, a.repeat, a.cli_peer, not a.cli_no_bytecode)
        peers = [] if a.no_peers else [
            ("dpkt", "dpkt UniversalReader + Ethernet/IP/TCP/UDP parse", peer_dpkt, a.dpkt_packets, 20),
            ("scapy", "scapy PcapReader (full dissection)", peer_scapy, a.scapy_packets, 250)]
        for name, what, fn, limit, goal in peers:
            if name in missing:
                print(f"  peer {name}: NOT MEASURED ({name} is not installed: pip install -e '.[dev]')")
                res[name] = None
                continue
            lim = limit if 0 < limit < n else n
            c0, t0 = time.process_time(), time.perf_counter()
            got, flows, other = fn(path, lim)
            c1, t1 = time.process_time(), time.perf_counter()
            pr = {"packets": got, "pps_cpu": got / (c1 - c0), "pps_wall": got / (t1 - t0),
                  "prefix": got < n, "flows": len(flows)}
            diffs = compare(flows, _skewd_features(path, got)) if got else ["no packets read"]
            pr["agrees_with_skewd"] = not diffs
            pr["ratio_cpu"] = sk["pps_cpu_median"] / pr["pps_cpu"]
            pr["ratio_wall"] = sk["pps_wall_median"] / pr["pps_wall"]
            pr["goal_ratio"] = goal
            res[name] = pr
            scope = (f"first {got:,} of {n:,} packets only (too slow for all): per-packet rates compared"
                     if pr["prefix"] else f"all {got:,} packets")
            print(f"  peer {what}: {_rate(pr['pps_cpu'])} packets/s per CPU second, {_rate(pr['pps_wall'])} "
                  f"wall clock ({scope}; per-flow counts, bytes, gaps, jitter, bursts in Python)")
            print(f"    per-flow results on the same packets {'match skewd' if not diffs else 'DIFFER from skewd'}"
                  f" ({len(flows)} flows){': ' + '; '.join(diffs[:5]) if diffs else ''}")
        if not a.no_peers:
            parts = []
            for name, _, _, _, goal in peers:
                pr = res.get(name)
                if pr:
                    parts.append(f"skewd/{name} {pr['ratio_cpu']:.0f}x per CPU second, {pr['ratio_wall']:.0f}x wall "
                                 f"(goal >= {goal}x: {'met' if pr['ratio_cpu'] >= goal else 'not met'})")
            print("  ratio (skewd median): " + "; ".join(parts))
            cli, sc = res.get("skewd_cli"), res.get("scapy")
            if cli and sc:
                cli["ratio_wall_vs_scapy"] = cli["pps_wall_median"] / sc["pps_wall"]
                print(f"  ratio (skewd pkt --json, median wall, whole command) / scapy wall: "
                      f"{cli['ratio_wall_vs_scapy']:.0f}x")
        la = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else []
        res["loadavg"] = " ".join(la)
        print(f"  load average {res['loadavg']} on {os.cpu_count()} cores")
    if a.json:
        print(json.dumps(res, default=float))
    if missing:
        print(f"could not measure {', '.join(missing)}: not installed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
