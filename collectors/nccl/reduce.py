"""Pure: Inspector records → per-rank signals per collection interval, matching one collective
across the ranks of this node by (communicator, ``coll_sn``).

What names a straggler. In a collective every rank waits inside the kernel until the last rank
has joined, so the rank everybody waits for is the one whose kernel starts **last** and whose
collective takes the **shortest** time (its peers' kernels started earlier and spun). Both are
measured per collective against the other ranks of the same communicator on this node:

- *wait*: this rank's execution time minus the shortest execution time of the same collective
  on this node (durations only: clock-free, the "relative" score NVIDIA's Resiliency Extension
  gives a rank against the fastest one). The straggler waits ~0, its peers wait its lag;
- *start lag* (verbose output only): this rank's first kernel start minus the earliest rank's,
  both read from the same host clock by processes on one node, so no clock sync is involved.

A rank's own history (NVRx's "individual" score) says little here: when one rank lags, every
other rank's collectives get slower, not the culprit's. Ranks on other nodes are not seen; a
straggler on another node makes all local ranks wait alike, and nothing local is named.

Records arrive out of step: each process's dump thread writes on its own schedule, and in
v4.0-v4.2 output each rank's records are samples (the latest collective at each dump). A
collective is therefore held until every local rank of its communicator reported it, or until
one whole further interval passed, then reduced with whichever local ranks reported it (two or
more; one rank alone matches nothing).
"""
from __future__ import annotations

import statistics
from collections import OrderedDict
from dataclasses import dataclass, field

from .parse import Record

#: a rank with no record for this long is gone (process exited, communicator destroyed); the
#: Prometheus mode rewrites its file every >= 30 s, so this spans several of its dumps
IDLE_S = 120.0
#: collectives held for matching at most; the oldest are reduced early beyond it
MAX_PENDING = 100_000


def entity(comm: str, rank: int) -> str:
    """``<comm_id>/r<rank>``: the communicator hash NCCL prints (``0x7f8c496ae9f661``) and the
    rank within it. The rule engine groups ``rank`` entities by what precedes the last ``/``."""
    return f"{comm}/r{rank}"


@dataclass
class _Member:
    exec_s: float
    source: str
    kernel_start_us: int | None


@dataclass
class _Pending:
    born_tick: int
    members: dict[int, _Member] = field(default_factory=dict)


@dataclass
class _Rank:
    """One (host, communicator, rank): progress, totals and this interval's observations."""

    last_sn: int = -1
    last_t: float = 0.0
    matched_total: int = 0
    exec_s: list[float] = field(default_factory=list)
    msg_bytes: list[float] = field(default_factory=list)
    busbw: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    least: int = 0
    lag_s: list[float] = field(default_factory=list)
    last: int = 0

    def clear_interval(self) -> None:
        self.exec_s, self.msg_bytes, self.busbw = [], [], []
        self.wait_s, self.lag_s = [], []
        self.least = self.last = 0


#: the signals :meth:`Reducer.close` can emit (all catalogued in ``catalogue.py``)
SIGNALS = (
    "nccl_collectives_total", "nccl_matched_collectives_total",
    "nccl_collective_exec_p50_seconds", "nccl_message_size_p50_bytes",
    "nccl_bus_bandwidth_p50_bytes_per_second",
    "nccl_collective_wait_p50_seconds", "nccl_collective_least_wait_ratio",
    "nccl_kernel_start_lag_p50_seconds", "nccl_kernel_start_last_ratio",
)


class Reducer:
    """Owns per-rank state and the collectives waiting for their peers; the collector feeds it
    every record of an interval (:meth:`add`) and then asks for that interval's signals
    (:meth:`close`). Time is only what the caller passes in."""

    def __init__(self, idle_s: float = IDLE_S, max_pending: int = MAX_PENDING) -> None:
        self.idle_s = idle_s
        self.max_pending = max_pending
        self._tick = 0
        #: (host, comm, rank) → state
        self._ranks: dict[tuple[str, str, int], _Rank] = {}
        #: (host, comm, sn) → ranks that reported it, oldest first
        self._pending: OrderedDict[tuple[str, str, int], _Pending] = OrderedDict()
        #: (host, comm) → local ranks seen within idle_s (what "everybody reported" means)
        self._local: dict[tuple[str, str], dict[int, float]] = {}
        self.duplicates = 0

    def add(self, rec: Record, t: float) -> bool:
        """Take one record seen during the interval ending at ``t``. False for a record already
        seen (same or older ``coll_sn`` of that rank: a rotated copy, a re-read textfile)."""
        key = (rec.hostname, rec.comm, rec.rank)
        st = self._ranks.get(key)
        if st is None:
            st = self._ranks[key] = _Rank()
        if rec.sn <= st.last_sn:
            self.duplicates += 1
            return False
        st.last_sn, st.last_t = rec.sn, t
        st.exec_s.append(rec.exec_s)
        if rec.msg_bytes == rec.msg_bytes:  # not NaN (a textfile without message_size)
            st.msg_bytes.append(rec.msg_bytes)
        if rec.busbw_bps is not None:
            st.busbw.append(rec.busbw_bps)
        self._local.setdefault((rec.hostname, rec.comm), {})[rec.rank] = t
        pkey = (rec.hostname, rec.comm, rec.sn)
        p = self._pending.get(pkey)
        if p is None:
            p = self._pending[pkey] = _Pending(self._tick)
        p.members[rec.rank] = _Member(rec.exec_s, rec.timing_source, rec.kernel_start_us)
        while len(self._pending) > self.max_pending:
            old_key, old = self._pending.popitem(last=False)
            self._match(old_key, old)
        return True

    def close(self, t: float) -> dict[str, dict[str, float]]:
        """This interval's signals per rank entity, then start the next interval."""
        for hc, ranks in list(self._local.items()):
            for r, seen in list(ranks.items()):
                if t - seen > self.idle_s:
                    del ranks[r]
            if not ranks:
                del self._local[hc]
        done = []
        for pkey, p in self._pending.items():
            local = self._local.get((pkey[0], pkey[1]), {})
            if p.born_tick < self._tick or set(local) <= set(p.members):
                done.append(pkey)
        for pkey in done:
            self._match(pkey, self._pending.pop(pkey))
        out: dict[str, dict[str, float]] = {}
        for (host, comm, rank), st in list(self._ranks.items()):
            if t - st.last_t > self.idle_s:  # its collectives were all reduced long ago
                del self._ranks[(host, comm, rank)]
                continue
            out[entity(comm, rank)] = _signals(st)
            st.clear_interval()
        self._tick += 1
        return out

    def _match(self, pkey: tuple[str, str, int], p: _Pending) -> None:
        """Reduce one collective over the local ranks that reported it."""
        if len(p.members) < 2:
            return
        host, comm, _ = pkey
        states = {r: self._ranks[(host, comm, r)] for r in p.members if (host, comm, r) in self._ranks}
        for r in states:
            states[r].matched_total += 1
        # wait: only against ranks whose time was measured the same way (GPU vs CPU timers)
        by_source: dict[str, list[int]] = {}
        for r, m in p.members.items():
            by_source.setdefault(m.source, []).append(r)
        for ranks in by_source.values():
            if len(ranks) < 2:
                continue
            fastest = min(p.members[r].exec_s for r in ranks)
            for r in ranks:
                if r in states:
                    w = p.members[r].exec_s - fastest
                    states[r].wait_s.append(w)
                    states[r].least += w == 0.0
        starts = {r: m.kernel_start_us for r, m in p.members.items() if m.kernel_start_us is not None}
        if len(starts) >= 2:
            first, latest = min(starts.values()), max(starts.values())
            for r, s in starts.items():
                if r in states:
                    states[r].lag_s.append((s - first) * 1e-6)
                    states[r].last += s == latest


def _signals(st: _Rank) -> dict[str, float]:
    out = {"nccl_collectives_total": float(st.last_sn),
           "nccl_matched_collectives_total": float(st.matched_total)}
    if st.exec_s:
        out["nccl_collective_exec_p50_seconds"] = statistics.median(st.exec_s)
    if st.msg_bytes:
        out["nccl_message_size_p50_bytes"] = statistics.median(st.msg_bytes)
    if st.busbw:
        out["nccl_bus_bandwidth_p50_bytes_per_second"] = statistics.median(st.busbw)
    if st.wait_s:
        out["nccl_collective_wait_p50_seconds"] = statistics.median(st.wait_s)
        out["nccl_collective_least_wait_ratio"] = st.least / len(st.wait_s)
    if st.lag_s:
        out["nccl_kernel_start_lag_p50_seconds"] = statistics.median(st.lag_s)
        out["nccl_kernel_start_last_ratio"] = st.last / len(st.lag_s)
    return out
