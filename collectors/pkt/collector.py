"""pkt collector: per-flow packet timing from a live TPACKET_V3 capture (thin I/O).

The capture thread only copies header bytes out of the kernel ring; ``collect(t)`` decodes
the frames captured since the previous collect and turns them into per-flow features with
the same :class:`FlowTracker` the offline reader uses.

Ring size (when ``ring_block_size``/``ring_blocks`` are not set): the kernel hands a block
over when it is full *or* ``block_timeout`` after its first frame, so below the rate that
fills a block within one timeout every block carries one timeout's worth of frames and the
ring absorbs a reader stall of ``blocks x block_timeout`` whatever the block size (measured:
16 x 1 MiB and 16 x 256 KiB both drop after ~150 ms at 30k pkt/s). Block size only matters
above that rate: a header-only frame (snaplen 128) takes 216 bytes of a block, so 256 KiB
blocks fill before the timeout above ~120k frames/s, 1 MiB blocks above ~480k (300k pkt/s
fill 0.65 MiB per 10 ms). So the ring starts at 16 x 256 KiB (4 MiB) and is replaced once by
16 x 1 MiB (16 MiB) the first time a collection interval sees more than ``GROW_PPS`` frames
per second or any kernel drop; it stays large afterwards. The ring's pages are pinned kernel
memory and count in RSS one for one.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from skewd.collectors.base import (Availability, Collector, CollectorError, Connection, Status, config_duration,
                                   config_int)
from skewd.model import SampleBatch

from .bpf import FilterError, compile_filter, parse_program
from .catalogue import CATALOGUE
from .tracker import FlowTracker
from .frames import Frames
from .ignore import End, connection_mask, end_of, flow_keys
from .parse import decode
from .ring import ARPHRD_ETHER, ARPHRD_LOOPBACK, ARPHRD_NONE, Capture, RingConfig, in_netns
from .samples import to_batch

CAP_NET_RAW = 13
log = logging.getLogger(__name__)

#: adaptive ring (see the module docstring): start small, grow once under load
SMALL_BLOCK_SIZE = 256 << 10
LARGE_BLOCK_SIZE = 1 << 20
DEFAULT_BLOCKS = 16
#: frames/s into the ring (after the filter) that trigger the large ring: a quarter of the
#: rate at which 256 KiB blocks of header-only frames fill before the 10 ms block timeout,
#: so traffic that ramps up within a second still finds the small ring at full tolerance
GROW_PPS = 30_000
#: shortest span a rate is judged over: the first collect runs right after start() (the kernel
#: counted frames since the socket opened, often milliseconds earlier), and a few frames in a
#: millisecond are no rate; a real burst of GROW_PPS still fills 3,000 frames in this span
MIN_RATE_SPAN_S = 0.1
#: own connections remembered for leaving out: the current one and a few before it, whose last
#: packets (FIN, late retransmissions) may still come after a reconnect
IGNORED_CONNECTIONS = 8


def _size(v: Any, key: str) -> int:
    """Bytes from an int or '4MiB' / '512KiB' / '1M' style string."""
    if isinstance(v, bool):
        raise ValueError(f"collectors.pkt.{key}: expected a size, got {v!r}")
    if isinstance(v, int):
        return v
    s = str(v).strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if s[-1:] in "kmg" else s) * mult)
    except ValueError:
        raise ValueError(f"collectors.pkt.{key}: bad size {v!r} (write e.g. 1048576 or '1MiB')") from None


class PktCollector(Collector):
    name = "pkt"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"interface", "filter", "filter_program", "snaplen", "ring_block_size", "ring_blocks",
                             "block_timeout", "burst_gap", "flow_timeout", "max_flows", "max_pending_packets",
                             "netns", "max_listed_silences"})
    config_docs = {
        "interface": ("none (required)", "device to capture on"),
        "netns": ("the agent's", "capture inside a network namespace (`/run/netns/NAME` or `/proc/PID/ns/net`)"),
        "filter": ("all", "generated kernel filter: `ip`, `ip6`, `tcp`, `udp`, `[tcp|udp] [src|dst] port N`, "
                   "`host A.B.C.D`, `roce`, joined with `or`"),
        "filter_program": ("none", "a classic BPF program: `tcpdump -ddd` text or `[[code, jt, jf, k], ...]`"),
        "snaplen": ("`128`", "bytes of each frame the kernel copies (headers only)"),
        "ring_block_size": ("adaptive (256 KiB, then 1 MiB)", "TPACKET_V3 block size; setting it fixes the ring"),
        "ring_blocks": ("`16`", "TPACKET_V3 blocks; setting it fixes the ring"),
        "block_timeout": ("`10ms`", "the kernel hands over a partly filled block after this long"),
        "burst_gap": ("`1ms`", "an idle gap at least this long ends a burst"),
        "flow_timeout": ("`60s`", "a flow idle this long is forgotten"),
        "max_flows": ("`100000`", "most flows tracked at once (least recently active evicted first)"),
        "max_pending_packets": ("`500000`", "frames buffered between collects; beyond it frames are discarded"),
        "max_listed_silences": ("`256`", "collective silences listed per port and collect"),
    }

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        super().__init__(node, config, sys_root, proc_root)
        self._capture: Capture | None = None
        self._tracker: FlowTracker | None = None
        self._last_t: float | None = None
        self._cfg_error: str | None = None
        self._ring_cfg: RingConfig | None = None
        self._carry: Frames | None = None  # frames the replaced ring held at the swap
        self._dedupe_ns: int | None = None  # the new ring's frames up to here were in the old one
        self._base_packets = 0  # kernel counters of replaced rings, so ours stay cumulative
        self._base_drops = 0
        self._last_stats = (0, 0)
        self._last_mono = 0.0  # monotonic time of the last kernel-stats read (rate for the ring)
        self._last_rate = 0
        self._discarded_before = 0
        self._adaptive = False
        #: the agent's own connections to leave out (see ignore_connections), newest last; the
        #: tracker is told to forget their flows by the collect thread (``_ignore_applied``)
        self._ignore: tuple[tuple[End, End], ...] = ()
        self._ignore_applied: tuple[tuple[End, End], ...] = ()
        try:
            self._settings()
        except (ValueError, FilterError) as e:
            self._cfg_error = str(e)

    # -- configuration ---------------------------------------------------------------------
    @classmethod
    def config_problems(cls, config: Mapping[str, Any]) -> list[str]:
        """The settings' errors (kept by the constructor for probe(), reported at load time)."""
        try:
            err = cls("config-check", config)._cfg_error
        except ValueError as e:  # a setting even the constructor could not read
            err = str(e)
        if not err:
            return []
        return [err if err.startswith("collectors.") else f"collectors.pkt: {err}"]

    def _settings(self) -> dict[str, Any]:
        c = self.config
        snaplen = config_int(c, "snaplen", 128, self.name, 64, 65535, "headers need ~90 bytes")
        out = {
            "interface": c.get("interface") or "",
            "snaplen": snaplen,
            "block_size": _size(c.get("ring_block_size", LARGE_BLOCK_SIZE), "ring_block_size"),
            "blocks": config_int(c, "ring_blocks", DEFAULT_BLOCKS, self.name, minimum=2),
            # neither geometry key set: start with small blocks and grow under load
            "adaptive": "ring_block_size" not in c and "ring_blocks" not in c,
            "block_timeout_ms": max(1, int(round(config_duration(c, "block_timeout", "10ms", self.name) * 1000))),
            "burst_gap": config_duration(c, "burst_gap", "1ms", self.name),
            "flow_timeout": config_duration(c, "flow_timeout", "60s", self.name),
            "max_flows": config_int(c, "max_flows", 100_000, self.name, minimum=1),
            "max_pending": config_int(c, "max_pending_packets", 500_000, self.name, minimum=1),
            "max_listed_silences": config_int(c, "max_listed_silences", 256, self.name, minimum=1),
            "netns": c.get("netns") or None,
            "filter": c.get("filter") or None,
            "filter_program": c.get("filter_program") or None,
        }
        if out["filter"] and out["filter_program"]:
            raise ValueError("set either filter or filter_program, not both")
        if out["filter_program"]:
            parse_program(out["filter_program"], snaplen)
        elif out["filter"]:
            compile_filter(out["filter"], snaplen)  # syntax check; the link type is known at start
        return out

    def _program(self, s: dict[str, Any], hatype: int) -> list[tuple[int, int, int, int]]:
        if s["filter_program"]:
            return parse_program(s["filter_program"], s["snaplen"])
        link = "raw" if hatype == ARPHRD_NONE else "ethernet"
        if s["filter"] and hatype not in (ARPHRD_ETHER, ARPHRD_LOOPBACK, ARPHRD_NONE):
            raise FilterError(f"no generated filters for device type {hatype}; use filter_program")
        return compile_filter(s["filter"], s["snaplen"], link)

    def _hatype(self, s: dict[str, Any]) -> int:
        def read() -> int:
            with open(f"/sys/class/net/{s['interface']}/type") as f:  # /sys follows the netns of the opener
                return int(f.read().strip())

        if s["netns"]:
            try:
                return in_netns(s["netns"], read)
            except OSError:
                return ARPHRD_ETHER
        try:
            return int((self.sys_root / "class/net" / s["interface"] / "type").read_text().strip())
        except (OSError, ValueError):
            return ARPHRD_ETHER

    # -- lifecycle -------------------------------------------------------------------------
    def _has_cap_net_raw(self) -> bool | None:
        try:
            for line in (self.proc_root / "self/status").read_text().splitlines():
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_RAW & 1)
        except (OSError, ValueError, IndexError):
            return None
        return None

    def probe(self) -> Status:
        if self._cfg_error:
            return Status(Availability.NEEDS_OPERATOR, f"bad collectors.pkt config: {self._cfg_error}")
        s = self._settings()
        if not s["interface"]:
            return Status(Availability.ABSENT, "no interface configured (set collectors.pkt.interface)")
        cap = self._has_cap_net_raw()
        if cap is False:
            return Status(Availability.NEEDS_OPERATOR,
                          "packet capture needs CAP_NET_RAW: run the agent as root, or grant it "
                          "(setcap cap_net_raw+ep, or add NET_RAW to the container's capabilities)")
        if s["netns"]:
            path = s["netns"] if s["netns"].startswith("/") else os.path.join("/run/netns", s["netns"])
            if not os.path.exists(path):
                return Status(Availability.NEEDS_OPERATOR, f"network namespace {s['netns']!r} not found ({path})")

        def check() -> list[str] | None:
            try:
                socket.if_nametoindex(s["interface"])
            except OSError:
                return sorted(n for _, n in socket.if_nameindex())
            sk = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            sk.close()
            return None

        try:
            missing = in_netns(s["netns"], check)
        except PermissionError:
            return Status(Availability.NEEDS_OPERATOR,
                          "cannot open an AF_PACKET socket (permission denied): packet capture needs CAP_NET_RAW")
        except OSError as e:
            return Status(Availability.UNAVAILABLE, f"cannot open an AF_PACKET socket: {e}")
        if missing is not None:
            where = f" in network namespace {s['netns']}" if s["netns"] else ""
            return Status(Availability.NEEDS_OPERATOR,
                          f"interface {s['interface']!r} not found{where} (have: {', '.join(missing)})")
        filt = s["filter"] or ("raw program" if s["filter_program"] else "none")
        ring = (f"ring {SMALL_BLOCK_SIZE * s['blocks'] >> 20} MiB, {LARGE_BLOCK_SIZE * s['blocks'] >> 20} MiB "
                f"above {GROW_PPS // 1000}k pkt/s" if s["adaptive"] else f"ring {s['block_size'] * s['blocks'] >> 10} KiB")
        return Status(Availability.ACTIVE,
                      f"capturing on {s['interface']} (filter: {filt}, snaplen {s['snaplen']}, {ring})")

    def start(self) -> None:
        if self._capture is not None:
            return
        if self._cfg_error:
            raise CollectorError(f"bad collectors.pkt config: {self._cfg_error}", stage="config")
        s = self._settings()
        if not s["interface"]:
            raise CollectorError("no interface configured (set collectors.pkt.interface)", stage="config")
        prog = self._program(s, self._hatype(s))
        block_size = SMALL_BLOCK_SIZE if s["adaptive"] else s["block_size"]
        cfg = RingConfig(s["interface"], s["snaplen"], min(128, s["snaplen"]), block_size, s["blocks"],
                         s["block_timeout_ms"], prog, s["netns"])
        cap = Capture(cfg, s["max_pending"])
        try:
            cap.start()
        except OSError as e:
            raise CollectorError(f"cannot capture on {s['interface']}: {e}", stage="start") from e
        self._capture = cap
        self._ring_cfg = cfg
        self._carry, self._dedupe_ns = None, None
        self._base_packets = self._base_drops = self._discarded_before = 0
        self._last_stats = (0, 0)
        self._last_mono = time.monotonic()
        self._adaptive = s["adaptive"]
        self._tracker = FlowTracker(s["burst_gap"], s["flow_timeout"], s["max_flows"], s["max_listed_silences"])
        self._last_t = time.time()
        self.started = True

    def stop(self) -> None:
        cap, self._capture = self._capture, None
        if cap is not None:
            cap.stop()
        self.started = False

    @property
    def ring_bytes(self) -> int:
        """Size of the capture ring now in use (0 when not capturing)."""
        c = self._ring_cfg
        return c.block_size * c.blocks if c is not None and self._capture is not None else 0

    def kernel_stats(self) -> tuple[int, int]:
        """(packets the kernel passed to the socket, packets it dropped), cumulative since start
        (packets that arrived while an old and a new ring overlapped count once per ring)."""
        if self._capture is None:
            return 0, 0
        pk, dr = self._capture.ring.read_stats()
        return self._base_packets + pk, self._base_drops + dr

    def _grow_ring(self) -> None:
        """Replace the small ring by the large one without a gap: the new socket is bound (and
        receiving) before the old one closes; frames both rings saw are kept from the old one."""
        old, cfg = self._capture, self._ring_cfg
        assert old is not None and cfg is not None
        big = RingConfig(cfg.interface, cfg.snaplen, cfg.width, LARGE_BLOCK_SIZE, cfg.blocks,
                         cfg.block_timeout_ms, cfg.filter, cfg.netns)
        new = Capture(big, old.max_pending)
        try:
            new.start()
        except (OSError, ValueError) as e:  # e.g. no memory for 16 MiB: keep the small ring
            log.warning("pkt: could not enlarge the capture ring on %s (%s); keeping %d KiB",
                        cfg.interface, e, cfg.block_size * cfg.blocks >> 10)
            self._adaptive = False
            return
        # the old ring hands over its last, partly filled block after one block timeout
        time.sleep(2 * cfg.block_timeout_ms / 1000)
        pk, dr = old.ring.read_stats()  # before close: the kernel's unread counts die with the socket
        old.stop()
        self._base_packets += pk
        self._base_drops += dr
        carry = old.take()
        self._discarded_before += old.discarded
        self._carry = carry if len(carry) else None
        self._dedupe_ns = int(carry.ts_ns.max()) if len(carry) else None
        self._capture, self._ring_cfg = new, big
        log.info("pkt: capture ring on %s enlarged to %d MiB (%d frames/s seen)", cfg.interface,
                 big.block_size * big.blocks >> 20, self._last_rate)

    def collect(self, t: float) -> SampleBatch:
        cap, tr = self._capture, self._tracker
        if cap is None or tr is None:
            raise CollectorError("pkt collector not started", stage="collect")
        if cap.error is not None:
            raise CollectorError(f"capture thread failed: {cap.error}", stage="read")
        frames = cap.take()
        if self._dedupe_ns is not None:  # after a ring swap, until the new ring is past the old
            newer = frames.ts_ns > self._dedupe_ns
            frames = frames.select(np.flatnonzero(newer))
            if newer.any():
                self._dedupe_ns = None
        if self._carry is not None:
            frames, self._carry = Frames.concat([self._carry, frames]), None
        packets, drops = self.kernel_stats()
        now = time.monotonic()
        t0 = self._last_t if self._last_t is not None else t
        self._last_t = t
        # before decoding: the decode of a busy interval is the longest the ring thread waits.
        # The rate is over the real time between the kernel-stats reads, not ``t - t0``: the
        # first ``t`` comes right after start() while the collect itself may run much later (a
        # loaded machine), which once made 1.9k pkt/s look like 1.9 M and grew the ring for good
        self._maybe_grow(packets, drops, max(now - self._last_mono, MIN_RATE_SPAN_S))
        self._last_mono = now
        cap = self._capture or cap
        self.stats.discarded = cap.discarded + self._discarded_before
        pk = self._leave_out_own(decode(frames))
        feats = tr.update(pk, t0, t, [self.config.get("interface", "")], {0: drops})
        return to_batch(feats, self.node, t)

    def ignore_connections(self, conns: Sequence[Connection]) -> None:
        """Leave these TCP connections (the agent's own NATS client) out of every feature, both
        directions, from the next collect on; flows already tracked from their first packets
        are forgotten then. Each call adds to the connections already left out (the newest
        ``IGNORED_CONNECTIONS`` are kept). Safe to call from another thread than collect()'s."""
        ends = []
        for (la, lp), (ra, rp) in conns:
            try:
                ends.append((end_of(la, lp), end_of(ra, rp)))
            except ValueError:  # not an IP address (a Unix socket): nothing on the wire
                log.debug("pkt: not ignoring %r: not an IP connection", ((la, lp), (ra, rp)))
        merged = tuple(c for c in self._ignore if c not in ends) + tuple(ends)
        self._ignore = merged[-IGNORED_CONNECTIONS:]

    def _leave_out_own(self, pk: Any) -> Any:
        """``pk`` without the packets of the ignored connections; forgets their flows the first
        time a connection is seen here (the tracker belongs to the collect thread)."""
        conns = self._ignore
        if conns != self._ignore_applied:
            new = [c for c in conns if c not in self._ignore_applied]
            if new and self._tracker is not None:
                self._tracker.forget(flow_keys(new))
            self._ignore_applied = conns
        if not conns:
            return pk
        mine = connection_mask(pk, conns)
        return pk.take(np.flatnonzero(~mine)) if mine.any() else pk

    def _maybe_grow(self, packets: int, drops: int, dt: float) -> None:
        prev_packets, prev_drops = self._last_stats
        self._last_stats = (packets, drops)
        cfg = self._ring_cfg
        if not self._adaptive or cfg is None or cfg.block_size >= LARGE_BLOCK_SIZE or dt <= 0:
            return
        self._last_rate = int((packets - prev_packets) / dt)
        if self._last_rate > GROW_PPS or drops > prev_drops:
            self._grow_ring()
