"""The pkt feature path's per-packet cuts (issue 23 item 6) give exactly what the code before
them gave, on real captures and on random TCP traffic.

Rewritten for CPU per captured packet: the TCP conversation join
(``RetransmitAnalysis._tcp_conversations``: fast retransmissions and handshake RTTs; it hashed
and sorted every packet twice, it now works per flow and searches), the TCP pass around it
(``_tcp``: no gathers when every flow is TCP or the join takes every flow) and the connection
key of the collective silences (hashed per packet, now per flow). :class:`Reference` is the
tracker with the previous code of all three, kept here verbatim; every interval's flow columns, port figures
(silences included), the tracker's state afterwards, and the join's own outputs must be equal.

Captures: the real gloo all-reduce of the footprint benchmark (tests/fixtures/pkt/netlab-gloo-
gso-off, GSO off so one frame per MSS), the real veth TCP-loss recordings (retransmissions,
D-SACKs), the PcapPlusPlus corpus and, when present, ../shared/pcaps (example.pcap and more).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skewd.collectors.pkt.capfile import read_capture
from skewd.collectors.pkt.collective import connection_hash
from skewd.collectors.pkt.features import FlowTracker, IntervalFeatures
from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
from skewd.collectors.pkt.intervals import PortFeatures
from skewd.collectors.pkt.keyhash import hash_rows
from skewd.collectors.pkt.parse import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, Packets, decode
from skewd.collectors.pkt.portstats import PortAggregation
from skewd.collectors.pkt.retransmits import RetransmitAnalysis
from skewd.collectors.pkt.segmented import NONE, excl_cummax, unwrap

from tests.collectors.test_pkt_quiet import assert_same, assert_same_state

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "pkt"
SHARED = Path("/work/shared/pcaps")


def legacy_tcp_conversations(pk: Packets, pr: np.ndarray, ts: np.ndarray, seq: np.ndarray, fl: np.ndarray,
                             seglen: np.ndarray, tslot: np.ndarray
                             ) -> tuple[np.ndarray, list[tuple[np.ndarray, int]]]:
    """``_tcp_conversations`` before the cut (main bddf1cf), verbatim."""
    n = len(pr)
    a = np.stack([pk.src_hi[pr], pk.src_lo[pr], pk.sport[pr].astype(np.uint64)], 1)
    b = np.stack([pk.dst_hi[pr], pk.dst_lo[pr], pk.dport[pr].astype(np.uint64)], 1)
    lt = (a[:, 0] < b[:, 0]) | ((a[:, 0] == b[:, 0]) & ((a[:, 1] < b[:, 1])
                                                       | ((a[:, 1] == b[:, 1]) & (a[:, 2] <= b[:, 2]))))
    lo_ep = np.where(lt[:, None], a, b)
    hi_ep = np.where(lt[:, None], b, a)
    key = np.concatenate([lo_ep, hi_ep], 1)
    ck = hash_rows(key)
    d = (~lt).astype(np.int64)
    o = np.lexsort((pr, ck))
    cks = ck[o]
    cfirst = np.r_[True, cks[1:] != cks[:-1]]
    cgi = np.cumsum(cfirst) - 1
    cgs = np.flatnonzero(cfirst)
    o2 = np.argsort(cgi * 2 + d[o], kind="stable")
    so = o[o2]
    sk = (cgi * 2 + d[o])[o2]
    sfirst = np.r_[True, sk[1:] != sk[:-1]]
    ack = pk.tcp_ack[pr]
    win = pk.tcp_win[pr]
    prev_ack = np.r_[-1, ack[so][:-1]]
    prev_win = np.r_[-1, win[so][:-1]]
    f = fl[so]
    dup = (~sfirst & (seglen[so] == 0) & (ack[so] == prev_ack) & (win[so] == prev_win)
           & ((f & 0x10) > 0) & ((f & (TCP_SYN | TCP_FIN | TCP_RST)) == 0))
    cs = np.cumsum(dup)
    reset = np.maximum.accumulate(np.where(~dup, cs, 0))
    run = np.empty(n, np.int64)
    run[so] = cs - reset
    pos = np.arange(n)
    dd = d[o]
    last = [np.maximum.accumulate(np.where(dd == k, pos, -1)) for k in (0, 1)]
    opp = np.where(dd == 0, last[1], last[0])
    ok = opp >= cgs[cgi]
    oo = o[np.maximum(opp, 0)]
    fast = np.zeros(n, bool)
    fast[o] = ok & (run[oo] >= 2) & (ack[oo] == seq[o]) & (ts[o] - ts[oo] < 20_000_000)
    big = np.iinfo(np.int64).max
    fo = fl[o]
    syn_t = np.minimum.reduceat(np.where(((fo & TCP_SYN) > 0) & ((fo & 0x10) == 0), ts[o], big), cgs)
    after = ((fo & 0x10) > 0) & ((fo & (TCP_SYN | TCP_RST)) == 0) & (ts[o] >= syn_t[cgi])
    ack_t = np.minimum.reduceat(np.where(after, ts[o], big), cgs)
    known = np.flatnonzero((syn_t < big) & (ack_t < big))
    out = []
    for c in known.tolist():
        e = cgs[c + 1] if c + 1 < len(cgs) else n
        out.append((np.unique(tslot[o[cgs[c]:e]]), int(ack_t[c] - syn_t[c])))
    return fast, out


class Reference(FlowTracker):
    """The tracker with the previous TCP pass, join and per-packet connection key."""

    _tcp_conversations = staticmethod(legacy_tcp_conversations)

    def _tcp(self, pk: Packets, rows: np.ndarray, gi: np.ndarray, gs: np.ndarray, ts_rows: np.ndarray,
             slot_g: np.ndarray, F: int, is_tcp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_tcp`` before the cut (main bddf1cf), verbatim."""
        st = self.s
        rtx_g = np.zeros(F, np.int64)
        tcp_any = np.zeros(F, bool)
        closed_g = np.zeros(F, bool)
        tsel = np.flatnonzero(is_tcp[rows])
        if not len(tsel):
            return rtx_g, tcp_any, closed_g
        tg = gi[tsel]
        tslot = slot_g[tg]
        tfirst = np.r_[True, tg[1:] != tg[:-1]]
        tgs = np.flatnonzero(tfirst)
        pr = rows[tsel]
        ts = ts_rows[tsel]
        seq = pk.tcp_seq[pr]
        fl = pk.tcp_flags[pr].astype(np.int64)
        pay = pk.payload[pr]
        seglen = pay + ((fl & TCP_SYN) > 0) + ((fl & TCP_FIN) > 0)
        tcp_any[tg[tgs]] = True
        closed_g[tg[tgs]] = (np.bitwise_or.reduceat(fl, tgs) & (TCP_FIN | TCP_RST)) != 0
        hs = (fl & (TCP_SYN | TCP_ACK)) == TCP_SYN
        # a handshake in the interval takes the full path, which learns its RTT (the reordering
        # threshold) even when every segment is in order
        if not hs.any() and self._tcp_in_order(seq, seglen, ts, tfirst, tgs, tslot):
            self._tcp_spurious(pk, pr, tslot, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
            return rtx_g, tcp_any, closed_g
        tgi = np.cumsum(tfirst) - 1
        u = unwrap(seq, tfirst, st["seq_raw"][tslot[tgs]], st["seq_u"][tslot[tgs]], 32)
        endv = np.where(seglen > 0, u + seglen, NONE)
        excl, incl_last = excl_cummax(endv, tfirst, st["seq_max"][tslot[tgs]])
        backward = (seglen > 0) & (excl != NONE) & (u < excl)
        keepalive = (seglen <= 1) & (u == excl - 1) & ((fl & (TCP_SYN | TCP_FIN | TCP_RST)) == 0)
        # time the highest sequence end last advanced, before each packet
        adv = (endv != NONE) & (endv > excl)
        cm = np.maximum.accumulate(np.where(adv, np.arange(len(tsel)), -1))
        pa = np.r_[-1, cm[:-1]]
        mine = pa >= tgs[tgi]
        t_adv = np.where(mine, ts[np.maximum(pa, 0)], st["adv"][tslot])
        # the conversation join (both directions, capture order) only where it can matter:
        # flows with backward segments (fast retransmission?) or a handshake (its RTT)
        fast = np.zeros(len(tsel), bool)
        irtt_conv_slots: list[tuple[np.ndarray, int]] = []
        need = np.flatnonzero(np.bincount(tg, weights=(backward | hs).astype(np.float64), minlength=F) > 0)
        if len(need):
            want = set(slot_g[need].tolist())
            want |= {r for r in (self._reverse_slot(int(x)) for x in slot_g[need].tolist()) if r is not None}
            sub = np.flatnonzero(np.isin(tslot, np.fromiter(want, np.int64, len(want))))
            fast[sub], irtt_conv_slots = self._tcp_conversations(pk, pr[sub], ts[sub], seq[sub], fl[sub],
                                                                 seglen[sub], tslot[sub])
        for sl_arr, irtt in irtt_conv_slots:
            unknown = st["irtt"][sl_arr] <= 0
            st["irtt"][sl_arr[unknown]] = irtt
        irtt = st["irtt"][tslot]
        thres = np.where(irtt > 0, irtt, 3_000_000)
        ooo = (t_adv >= 0) & (ts - t_adv < thres) & (excl != u + seglen)
        rtx = backward & ~keepalive & (fast | ~ooo)
        rtx_g += np.bincount(tg, weights=rtx.astype(np.float64), minlength=F).astype(np.int64)
        tl = np.r_[tgs[1:], len(tsel)] - 1
        s_sl = tslot[tgs]
        st["seq_raw"][s_sl] = seq[tl]
        st["seq_u"][s_sl] = u[tl]
        st["seq_max"][s_sl] = incl_last
        last_adv = cm[tl]
        st["adv"][s_sl] = np.where(last_adv >= tgs, ts[np.maximum(last_adv, 0)], st["adv"][s_sl])
        self._tcp_spurious(pk, pr, tslot, tslot[rtx], u[rtx], u[rtx] + seglen[rtx])
        return rtx_g, tcp_any, closed_g

    def _ports(self, pk: Packets, ipm: np.ndarray, conn: np.ndarray, *rest) -> list[PortFeatures]:
        per_packet = connection_hash(pk.src_hi, pk.src_lo, pk.dst_hi, pk.dst_lo, pk.sport, pk.dport, pk.proto)
        return PortAggregation._ports(self, pk, ipm, per_packet, *rest)


class Checked(FlowTracker):
    """The tracker under test; every join it runs is also run by the previous code and compared."""

    joins = 0
    fast = 0  # fast retransmissions the joins found
    merged = 0  # joins with two flows in one direction of a conversation (IPv4 and IPv6)

    @staticmethod
    def _tcp_conversations(pk, pr, ts, seq, fl, seglen, tslot):  # type: ignore[override]
        got = RetransmitAnalysis._tcp_conversations(pk, pr, ts, seq, fl, seglen, tslot)
        want = legacy_tcp_conversations(pk, pr, ts, seq, fl, seglen, tslot)
        assert np.array_equal(got[0], want[0])
        assert len(got[1]) == len(want[1])
        for (gs, gr), (ws, wr) in zip(got[1], want[1]):
            assert np.array_equal(gs, ws) and gr == wr
        Checked.joins += 1
        Checked.fast += int(got[0].sum())
        fs = np.flatnonzero(np.r_[True, tslot[1:] != tslot[:-1]])
        Checked.merged += len(np.unique(pk.ipver[pr[fs]])) > 1
        return got


def run_both(pk: Packets, interval: float, ports: list[str] | None = None) -> int:
    """Feed the same intervals to both trackers; returns how many intervals had packets."""
    got, ref = Checked(0.001, flow_timeout=30.0), Reference(0.001, flow_timeout=30.0)
    lo, hi = int(pk.ts_ns.min()), int(pk.ts_ns.max())
    iv = int(interval * 1e9)
    busy = 0
    for a in range(lo, hi + 1, iv):
        idx = np.flatnonzero((pk.ts_ns >= a) & (pk.ts_ns < a + iv))
        part = pk.take(idx)
        busy += len(idx) > 0
        g: IntervalFeatures = got.update(part, a / 1e9, (a + iv) / 1e9, ports, {0: 0})
        w: IntervalFeatures = ref.update(part, a / 1e9, (a + iv) / 1e9, ports, {0: 0})
        assert_same(g, w)
        assert_same_state(got, ref)
    return busy


def captures() -> list[Path]:
    paths = [FIX / "netlab-gloo-gso-off" / "rank0-eth1.pcap.gz",
             *sorted((FIX / "veth-linux-6.18-tcp-loss").glob("*.pcap.gz")),
             *sorted((FIX / "pcapplusplus-200853b3a").glob("*.pcap*"))]
    if SHARED.is_dir():
        paths += sorted(p for p in SHARED.iterdir() if p.suffix in (".pcap", ".pcapng", ".cap"))
    return paths


@pytest.mark.parametrize("path", captures(), ids=lambda p: p.name)
def test_real_captures_give_the_same_features(path: Path) -> None:
    cap = read_capture(path)
    pk = decode(cap.frames)
    if not len(pk):
        pytest.skip(f"{path.name}: no frames")
    span = (int(pk.ts_ns.max()) - int(pk.ts_ns.min())) / 1e9
    for interval in {0.1, 1.0, max(span / 3, 0.001)}:  # several cuts through the same packets
        if span / interval > 3000:
            continue
        run_both(pk, interval, ["eth1"])


def test_the_real_gloo_capture_takes_the_join_and_lists_silences() -> None:
    """The gloo fixture exercises what was rewritten (so the test above can fail)."""
    pk = decode(read_capture(FIX / "netlab-gloo-gso-off" / "rank0-eth1.pcap.gz").frames)
    assert (pk.direction == DIR_IN).any() and (pk.direction == DIR_OUT).any()
    Checked.joins = 0
    tr = Checked(0.001)
    t0 = int(pk.ts_ns.min())
    sil = 0
    for k in range(6):
        part = pk.take(np.flatnonzero((pk.ts_ns >= t0 + k * 10**8) & (pk.ts_ns < t0 + (k + 1) * 10**8)))
        sil += len(tr.update(part, (t0 + k * 10**8) / 1e9, (t0 + (k + 1) * 10**8) / 1e9, ["eth1"]).ports[0].silences)
    assert Checked.joins >= 3 and sil >= 20


def tcp_traffic(rng: np.random.Generator, n: int, t0: float, conversations: int) -> Packets:
    """Random TCP conversations, both directions interleaved in capture order: handshakes,
    data with repeated and backward sequence numbers, runs of duplicate ACKs, FIN/RST; some
    conversations on IPv6 with the same address words as an IPv4 one (two flows of one stream
    of the join) and a few non-IP frames. NOTE: invented traffic, for equivalence only."""
    p = Packets.alloc(n)
    p.ts_ns[:] = np.sort((t0 + rng.uniform(0, 1, n)) * 1e9).astype(np.int64)
    p.wirelen[:] = rng.integers(60, 1514, n)
    ip = rng.random(n) < 0.97
    p.decoded[:] = True
    p.outer_ip[:] = ip
    conv = rng.integers(0, conversations, n)
    rev = rng.random(n) < 0.5
    v6 = (conv % 5 == 4) | ((conv == 0) & (rng.random(n) < 0.3))  # conversation 0: both versions
    p.ipver[:] = np.where(ip, np.where(v6, 6, 4), 0)
    p.proto[:] = np.where(ip, 6, -1)
    host_a, host_b = (conv % 3 + 1).astype(np.uint64), (conv // 3 % 2 + 10).astype(np.uint64)
    port_a, port_b = 40000 + conv % 4, np.full(n, 5201)
    p.src_lo[:] = np.where(ip, np.where(rev, host_b, host_a), 0)
    p.dst_lo[:] = np.where(ip, np.where(rev, host_a, host_b), 0)
    p.sport[:] = np.where(ip, np.where(rev, port_b, port_a), 0)
    p.dport[:] = np.where(ip, np.where(rev, port_a, port_b), 0)
    p.l4ok[:] = ip
    flags = rng.choice([TCP_ACK, TCP_ACK, TCP_ACK | 0x08, TCP_SYN, TCP_SYN | TCP_ACK, TCP_FIN | TCP_ACK,
                        TCP_RST], n, p=[0.5, 0.3, 0.1, 0.03, 0.03, 0.02, 0.02])
    p.tcp_flags[:] = np.where(ip, flags, -1)
    p.payload[:] = np.where(ip & (rng.random(n) < 0.5), rng.choice([0, 48, 1448], n), 0)
    # both directions of a conversation draw sequence and ACK numbers from the same few MSS
    # steps: repeated and backward segments, duplicate ACKs asking for a segment that follows
    base = rng.integers(0, 1 << 32, conversations)
    p.tcp_seq[:] = np.where(ip, (base[conv] + rng.integers(0, 6, n) * 1448) % (1 << 32), 0)
    p.tcp_ack[:] = np.where(ip, (base[conv] + rng.integers(0, 6, n) * 1448) % (1 << 32), 0)
    p.tcp_win[:] = rng.choice([512, 1024], n, p=[0.9, 0.1])
    p.direction[:] = np.where(rev, DIR_IN, DIR_OUT)
    return p


@pytest.mark.parametrize("seed", range(8))
def test_random_tcp_traffic_gives_the_same_features(seed: int) -> None:
    rng = np.random.default_rng(seed)
    Checked.joins = Checked.fast = Checked.merged = 0
    got, ref = Checked(0.001, flow_timeout=3.0), Reference(0.001, flow_timeout=3.0)
    t = 1_700_000_000.0
    for _ in range(12):
        pk = tcp_traffic(rng, int(rng.integers(0, 3000)), t, int(rng.integers(1, 12)))
        assert_same(got.update(pk, t, t + 1, ["eth0"], {0: 0}), ref.update(pk, t, t + 1, ["eth0"], {0: 0}))
        assert_same_state(got, ref)
        t += 1.0 if rng.random() < 0.8 else 5.0  # some flows time out
    assert Checked.joins >= 6 and Checked.fast >= 3 and Checked.merged >= 2
