"""Retransmission analysis of the flow tracker: TCP (Wireshark's classification, D-SACK
spurious resends) and RoCE (PSN not above the highest seen per destination QP).

Definitions:
- TCP retransmission: a segment with data (or SYN/FIN) starting below the highest sequence
  end already seen in the same direction of the flow, classified as Wireshark does: keep-alives
  are ignored, fast retransmissions (answering >= 2 duplicate ACKs) count, segments arriving
  within the handshake RTT (or 3 ms) of the last forward progress are reordering and do not.
  Sequence numbers are unwrapped, so flows crossing 2**32 are handled.
- spurious TCP retransmission: a retransmission whose bytes a D-SACK block (RFC 2883) in the
  reverse flow's ACKs covers, in the same or the next interval: the receiver had them already
  (a tail-loss probe answered by a D-SACK, a fast retransmission caused by reordering).
- RoCE retransmission: a request packet whose PSN (unwrapped modulo 2**24) is not above the
  highest PSN already seen for the same destination QP in the flow (ACK/CNP packets excluded).

Why apart from :mod:`.tracker`: this is the one part of the feature path that reads transport
headers and reasons about protocol semantics (sequence spaces, duplicate ACKs, handshakes); the
tracker's gaps and bursts need only times and lengths. It is a mixin because it reads and
updates the tracker's per-flow state columns in place (no copy per interval).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .keyhash import hash_rows
from .parse import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, Packets
from .segmented import NONE, excl_cummax, overlapping, unwrap

ROCE_NO_PSN = (17, 18, 0x81)  # ACK, atomic ACK, CNP: not part of the request PSN sequence


class RetransmitAnalysis:
    """TCP and RoCE retransmission counting for :class:`~.tracker.FlowTracker` (its base class).

    Reads and writes the tracker's per-slot state ``s`` (``seq_raw``, ``seq_u``, ``seq_max``,
    ``adv``, ``irtt``, ``srtx``), its RoCE PSN marks ``psn``, and owns the D-SACK matching
    state ``_rtx_open`` / ``_spurious_new`` (declared in the tracker's ``__init__``).
    """

    s: dict[str, np.ndarray]
    psn: dict[tuple[int, int], tuple[int, int, int]]
    _rtx_open: tuple[np.ndarray, np.ndarray, np.ndarray]
    _spurious_new: tuple[np.ndarray, np.ndarray]
    #: slot of a flow's opposite direction (the tracker's slot table)
    _reverse_slot: Callable[[int], int | None]

    def _roce(self, pk: Packets, rr: np.ndarray, rg: np.ndarray, slot_g: np.ndarray, F: int) -> np.ndarray:
        """RoCE retransmissions per flow: PSN not above the highest seen for the same dest QP.
        ``rr``: the request packets (indices into ``pk``, grouped by flow), ``rg``: their flow."""
        qp = pk.bth_qp[rr].astype(np.int64)
        comp = rg * (1 << 24) + qp
        if (comp[1:] < comp[:-1]).any():  # several QPs interleaved in a flow: group by QP too
            o2 = np.argsort(comp, kind="stable")
            rr, comp, rg, qp = rr[o2], comp[o2], rg[o2], qp[o2]
        rfirst = np.r_[True, comp[1:] != comp[:-1]]
        rgs = np.flatnonzero(rfirst)
        rslot = slot_g[rg]
        init = np.array([self.psn.get((int(s), int(q)), (-1, -1, int(NONE)))
                         for s, q in zip(rslot[rgs].tolist(), qp[rgs].tolist())], np.int64).reshape(-1, 3)
        psn = pk.bth_psn[rr].astype(np.int64)
        rl = np.r_[rgs[1:], len(rr)] - 1
        expect = np.empty(len(psn), np.int64)
        expect[1:] = (psn[:-1] + 1) & 0xFFFFFF
        expect[rgs] = np.where(init[:, 0] >= 0, (init[:, 0] + 1) & 0xFFFFFF, psn[rgs])
        if (psn == expect).all():  # every PSN one above the previous: no retransmission (fast path)
            u_first = np.where(init[:, 0] >= 0, init[:, 1] + 1, psn[rgs])
            u_last = u_first + (rl - rgs)
            for s_, q, raw, uu in zip(rslot[rgs].tolist(), qp[rgs].tolist(), psn[rl].tolist(), u_last.tolist()):
                self.psn[(s_, q)] = (raw, uu, uu)
            return np.zeros(F, np.int64)
        u = unwrap(psn, rfirst, init[:, 0], init[:, 1], 24)
        excl, incl_last = excl_cummax(u, rfirst, init[:, 2])
        rr = (excl != NONE) & (u <= excl)
        for s_, q, raw, uu, mx in zip(rslot[rgs].tolist(), qp[rgs].tolist(), psn[rl].tolist(),
                                      u[rl].tolist(), incl_last.tolist()):
            self.psn[(s_, q)] = (raw, uu, mx)
        return np.bincount(rg, weights=rr.astype(np.float64), minlength=F).astype(np.int64)

    def _tcp(self, pk: Packets, rows: np.ndarray, gi: np.ndarray, gs: np.ndarray, ts_rows: np.ndarray,
             slot_g: np.ndarray, F: int, is_tcp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Retransmissions per flow, classified the way Wireshark's TCP analysis does:
        a segment starting below the highest sequence end seen is a keep-alive (ignored),
        a fast retransmission (the peer sent >= 2 duplicate ACKs asking for exactly this
        sequence number within 20 ms), out-of-order (it came within the handshake RTT, or
        3 ms, of the last forward progress: reordering, not loss) or else a retransmission."""
        st = self.s
        rtx_g = np.zeros(F, np.int64)
        tcp_any = np.zeros(F, bool)
        closed_g = np.zeros(F, bool)
        tcp_rows = is_tcp[rows]
        if tcp_rows.all():  # only TCP flows (a collective port): the flow grouping as it is
            n_t, tg, pr, ts, tgs = len(rows), gi, rows, ts_rows, gs
            tfirst = np.zeros(n_t, bool)
            tfirst[gs] = True
        else:
            tsel = np.flatnonzero(tcp_rows)
            n_t = len(tsel)
            if not n_t:
                return rtx_g, tcp_any, closed_g
            tg = gi[tsel]
            tfirst = np.r_[True, tg[1:] != tg[:-1]]
            tgs = np.flatnonzero(tfirst)
            pr = rows[tsel]
            ts = ts_rows[tsel]
        del tcp_rows
        tslot = slot_g[tg]
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
        cm = np.maximum.accumulate(np.where(adv, np.arange(n_t), -1))
        pa = np.r_[-1, cm[:-1]]
        mine = pa >= tgs[tgi]
        t_adv = np.where(mine, ts[np.maximum(pa, 0)], st["adv"][tslot])
        # the conversation join (both directions, capture order) only where it can matter:
        # flows with backward segments (fast retransmission?) or a handshake (its RTT)
        fast = np.zeros(n_t, bool)
        irtt_conv_slots: list[tuple[np.ndarray, int]] = []
        need = np.flatnonzero(np.bincount(tg, weights=(backward | hs).astype(np.float64), minlength=F) > 0)
        if len(need):
            want = set(slot_g[need].tolist())
            want |= {r for r in (self._reverse_slot(int(x)) for x in slot_g[need].tolist()) if r is not None}
            joined = np.isin(tslot[tgs], np.fromiter(want, np.int64, len(want)))  # per TCP flow
            if joined.all():  # the usual case on a collective port: one conversation
                fast, irtt_conv_slots = self._tcp_conversations(pk, pr, ts, seq, fl, seglen, tslot)
            else:
                sub = np.flatnonzero(np.repeat(joined, np.diff(np.r_[tgs, n_t])))
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
        tl = np.r_[tgs[1:], n_t] - 1
        s_sl = tslot[tgs]
        st["seq_raw"][s_sl] = seq[tl]
        st["seq_u"][s_sl] = u[tl]
        st["seq_max"][s_sl] = incl_last
        last_adv = cm[tl]
        st["adv"][s_sl] = np.where(last_adv >= tgs, ts[np.maximum(last_adv, 0)], st["adv"][s_sl])
        self._tcp_spurious(pk, pr, tslot, tslot[rtx], u[rtx], u[rtx] + seglen[rtx])
        return rtx_g, tcp_any, closed_g

    def _tcp_spurious(self, pk: Packets, pr: np.ndarray, tslot: np.ndarray, r_slot: np.ndarray,
                      r_lo: np.ndarray, r_hi: np.ndarray) -> None:
        """Count the retransmissions the receiver reports as spurious (``srtx`` per flow).

        A receiver that gets bytes it already holds says so with a D-SACK block in its next ACK
        (RFC 2883; Linux sends one for every duplicate unless net.ipv4.tcp_dsack=0): a tail-loss
        probe answered that way, or a fast retransmission caused by reordering, cost nothing on
        the wire. A retransmission (``r_slot``/``r_lo``/``r_hi``: its flow and unwrapped byte
        range, found in this interval by :meth:`_tcp`) is spurious when a D-SACK from the peer
        overlaps its bytes, in this interval or the next one (a D-SACK follows its duplicate by
        about one round trip; the unmatched ones are carried one interval in ``_rtx_open``).
        ``pr``/``tslot``: this interval's TCP packets and their flow slots, in flow order, after
        the flows' sequence state was updated. Each retransmission counts at most once, so a
        flow's spurious count never exceeds its retransmission count."""
        st = self.s
        c_slot, c_lo, c_hi = self._rtx_open
        self._spurious_new = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if not len(c_slot) and not len(r_slot):  # no resend to judge (the usual interval)
            return
        cand_slot, cand_lo, cand_hi = np.r_[c_slot, r_slot], np.r_[c_lo, r_lo], np.r_[c_hi, r_hi]
        d_slot = d_lo = d_hi = np.zeros(0, np.int64)
        dl = pk.tcp_dsack_lo[pr]
        has = np.flatnonzero(dl >= 0)
        if len(has) and len(cand_slot):
            # a D-SACK travels in the ACK flow and speaks of the reverse (data) flow's bytes
            ack_slots, inv = np.unique(tslot[has], return_inverse=True)
            rev = np.array([-1 if (r := self._reverse_slot(int(x))) is None else r for x in ack_slots.tolist()],
                           np.int64)
            data = rev[inv.ravel()]
            ok = data >= 0
            ok[ok] &= st["seq_raw"][data[ok]] >= 0
            data, raw_lo, raw_hi = data[ok], dl[has][ok], pk.tcp_dsack_hi[pr][has][ok]
            half, mask = 1 << 31, (1 << 32) - 1
            d_slot = data
            d_lo = st["seq_u"][data] + (((raw_lo - st["seq_raw"][data] + half) & mask) - half)
            d_hi = d_lo + ((raw_hi - raw_lo) & mask)
        hit = overlapping(cand_slot, cand_lo, cand_hi, d_slot, d_lo, d_hi)
        if hit.any():
            inc_slot, inc = np.unique(cand_slot[hit], return_counts=True)
            st["srtx"][inc_slot] += inc
            self._spurious_new = (inc_slot, inc.astype(np.int64))
        keep = ~hit[len(c_slot):]  # this interval's unmatched retransmissions wait one more interval
        self._rtx_open = (r_slot[keep], r_lo[keep], r_hi[keep])

    def _spurious_rows(self, sl: np.ndarray) -> np.ndarray:
        """Per output row (flow slots ``sl``): spurious retransmissions found in this interval."""
        out = np.zeros(len(sl))
        inc_slot, inc = self._spurious_new
        if len(inc_slot) and len(sl):
            o = np.argsort(sl)
            pos = np.searchsorted(sl[o], inc_slot)
            pos = np.minimum(pos, len(sl) - 1)
            found = sl[o][pos] == inc_slot
            out[o[pos[found]]] = inc[found]
        self._spurious_new = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        return out

    def _tcp_in_order(self, seq: np.ndarray, seglen: np.ndarray, ts: np.ndarray, tfirst: np.ndarray,
                      tgs: np.ndarray, tslot: np.ndarray) -> bool:
        """Fast path for the usual case: every segment starts exactly where the previous one of
        its flow ended (so nothing can be a retransmission). Updates the flow state and says
        True; False means the full analysis must run (it then updates the state itself)."""
        st = self.s
        mask = (1 << 32) - 1
        n = len(seq)
        expect = np.empty(n, np.int64)
        expect[1:] = (seq[:-1] + seglen[:-1]) & mask
        first_sl = tslot[tgs]
        smax, sraw, su = st["seq_max"][first_sl], st["seq_raw"][first_sl], st["seq_u"][first_sl]
        expect[tgs] = np.where(smax != NONE, smax & mask, np.where(sraw >= 0, sraw, seq[tgs]))
        if not (seq == expect).all():
            return False
        # unwrapped values follow from the segment lengths
        tl = np.r_[tgs[1:], n] - 1
        u_first = np.where(sraw >= 0, su + (((seq[tgs] - sraw + (1 << 31)) & mask) - (1 << 31)), seq[tgs])
        cs = np.cumsum(seglen)
        before_last = cs[tl] - seglen[tl] - (cs[tgs] - seglen[tgs])  # lengths of all but the last
        u_last = u_first + before_last
        data = np.add.reduceat(seglen > 0, tgs) > 0
        st["seq_raw"][first_sl] = seq[tl]
        st["seq_u"][first_sl] = u_last
        st["seq_max"][first_sl] = np.where(data, u_last + seglen[tl], smax)
        last_data_t = np.maximum.reduceat(np.where(seglen > 0, ts, -1), tgs)
        st["adv"][first_sl] = np.where(last_data_t >= 0, last_data_t, st["adv"][first_sl])
        return True

    @staticmethod
    def _tcp_conversations(pk: Packets, pr: np.ndarray, ts: np.ndarray, seq: np.ndarray, fl: np.ndarray,
                           seglen: np.ndarray, tslot: np.ndarray
                           ) -> tuple[np.ndarray, list[tuple[np.ndarray, int]]]:
        """Both directions of each TCP conversation in this batch, joined in capture order:
        which segments answer the peer's duplicate ACKs (fast retransmissions), and the
        handshake RTT (SYN to the first ACK) of conversations whose handshake is seen.

        The packets come grouped by flow (one direction of a conversation) in capture order, so
        the conversation keys are hashed once per flow and the per-direction streams are the
        flows themselves, put in conversation order without sorting the packets; the latest
        packet of the other direction before each packet is a binary search in its stream.
        Two flows of one stream (the same 5-tuple with another IP version, or a key collision)
        are merged in capture order by one sort, as a join of the packets would."""
        n = len(pr)
        if not n:
            return np.zeros(0, bool), []
        fs = np.flatnonzero(np.r_[True, tslot[1:] != tslot[:-1]])  # first packet of each flow
        fe = np.r_[fs[1:], n]
        fp = pr[fs]
        a = np.stack([pk.src_hi[fp], pk.src_lo[fp], pk.sport[fp].astype(np.uint64)], 1)
        b = np.stack([pk.dst_hi[fp], pk.dst_lo[fp], pk.dport[fp].astype(np.uint64)], 1)
        lt = (a[:, 0] < b[:, 0]) | ((a[:, 0] == b[:, 0]) & ((a[:, 1] < b[:, 1])
                                                           | ((a[:, 1] == b[:, 1]) & (a[:, 2] <= b[:, 2]))))
        ck = hash_rows(np.concatenate([np.where(lt[:, None], a, b), np.where(lt[:, None], b, a)], 1))
        d = (~lt).astype(np.int64)
        fo = np.lexsort((d, ck))  # flows by conversation, then direction
        ckf, df = ck[fo], d[fo]
        new_conv = np.r_[True, ckf[1:] != ckf[:-1]]
        new_stream = new_conv | np.r_[True, df[1:] != df[:-1]]
        flen = (fe - fs)[fo]
        # packets in stream order (conversation, direction, capture order)
        so = np.repeat(fs[fo] - np.r_[0, np.cumsum(flen)[:-1]], flen) + np.arange(n)
        sid_f = np.cumsum(new_stream) - 1
        sid = np.repeat(sid_f, flen)  # stream of each packet, in stream order
        if not new_stream.all():  # a stream of several flows: capture order across them
            o = np.lexsort((pr[so], sid))
            so, sid = so[o], sid[o]
        cid_f = np.cumsum(new_conv) - 1
        S = int(sid_f[-1]) + 1
        s_first = np.r_[True, sid[1:] != sid[:-1]]
        s_start = np.flatnonzero(s_first)
        s_conv = np.zeros(S, np.int64)
        s_conv[sid_f] = cid_f
        cgs = s_start[np.flatnonzero(np.r_[True, s_conv[1:] != s_conv[:-1]])]
        cgi = s_conv[sid]
        # per (conversation, direction) stream: duplicate-ACK run lengths
        sp = pr[so]
        ack = pk.tcp_ack[sp]
        win = pk.tcp_win[sp]
        prev_ack = np.r_[-1, ack[:-1]]
        prev_win = np.r_[-1, win[:-1]]
        f = fl[so]
        dup = (~s_first & (seglen[so] == 0) & (ack == prev_ack) & (win == prev_win)
               & ((f & 0x10) > 0) & ((f & (TCP_SYN | TCP_FIN | TCP_RST)) == 0))
        cs = np.cumsum(dup)
        reset = np.maximum.accumulate(np.where(~dup, cs, 0))
        run = cs - reset  # in stream order
        # the latest packet of the other direction before each packet: the other stream of the
        # conversation (its neighbour, if it has one) searched by capture position
        other = np.full(S, -1, np.int64)
        if S > 1:
            pair = s_conv[1:] == s_conv[:-1]
            other[:-1][pair] = np.arange(1, S)[pair]
            other[1:][pair] = np.arange(S - 1)[pair]
        big_n = int(pr.max()) + 1
        skey = sid * big_n + sp
        osid = other[sid]
        has = osid >= 0
        j = np.searchsorted(skey, np.where(has, osid, 0) * big_n + sp) - 1
        ok = has & (j >= 0)
        ok[ok] &= sid[j[ok]] == osid[ok]
        jj = np.maximum(j, 0)
        tso = ts[so]
        fast = np.zeros(n, bool)
        fast[so] = ok & (run[jj] >= 2) & (ack[jj] == seq[so]) & (tso - tso[jj] < 20_000_000)
        # handshake RTT: first SYN (no ACK) to the first ACK without SYN after it
        big = np.iinfo(np.int64).max
        syn_t = np.minimum.reduceat(np.where(((f & TCP_SYN) > 0) & ((f & 0x10) == 0), tso, big), cgs)
        after = ((f & 0x10) > 0) & ((f & (TCP_SYN | TCP_RST)) == 0) & (tso >= syn_t[cgi])
        ack_t = np.minimum.reduceat(np.where(after, tso, big), cgs)
        known = np.flatnonzero((syn_t < big) & (ack_t < big))
        out = []
        for c in known.tolist():
            e = cgs[c + 1] if c + 1 < len(cgs) else n
            out.append((np.unique(tslot[so[cgs[c]:e]]), int(ack_t[c] - syn_t[c])))
        return fast, out
