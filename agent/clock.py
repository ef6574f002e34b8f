"""Is this node's clock synchronised, and how far off may it be? (``adjtimex(2)``)

The controller aligns collective bursts across nodes by timestamp, so each summary carries the
kernel's own view of the clock: ``STA_UNSYNC`` / ``TIME_ERROR`` mean unsynchronised, and
``maxerror`` (microseconds, maintained by chrony/ntpd) bounds the error. Read-only: modes=0.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

TIME_ERROR = 5
STA_UNSYNC = 0x0040


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """struct timex from <sys/timex.h> (glibc, 64-bit Linux: x86-64 and aarch64)."""

    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time", _Timeval), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long),
                ("jitter", ctypes.c_long), ("shift", ctypes.c_int), ("stabil", ctypes.c_long),
                ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long),
                ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int), ("_pad", ctypes.c_int * 11)]


@dataclass(frozen=True)
class ClockState:
    synced: bool
    max_error_s: float | None
    source: str


def clock_state() -> ClockState:
    """The kernel's clock discipline state; never raises (unknown → unsynced, error None)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        tx = _Timex()
        state = libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError) as e:
        return ClockState(False, None, f"adjtimex unavailable: {e}")
    if state < 0:
        return ClockState(False, None, f"adjtimex failed: errno {ctypes.get_errno()}")
    synced = state != TIME_ERROR and not (tx.status & STA_UNSYNC)
    return ClockState(synced, tx.maxerror / 1e6 if tx.maxerror >= 0 else None, "adjtimex")
