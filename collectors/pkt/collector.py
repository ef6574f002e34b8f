"""pkt collector: per-flow packet timing from a live TPACKET_V3 capture (thin I/O).

The capture thread only copies header bytes out of the kernel ring; ``collect(t)`` decodes
the frames captured since the previous collect and turns them into per-flow features with
the same :class:`FlowTracker` the offline reader uses.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Mapping

from skewd.collectors.base import Availability, Collector, CollectorError, Status
from skewd.model import SampleBatch, parse_duration

from .bpf import FilterError, compile_filter, parse_program
from .catalogue import CATALOGUE
from .features import FlowTracker
from .parse import decode
from .ring import ARPHRD_ETHER, ARPHRD_LOOPBACK, ARPHRD_NONE, Capture, RingConfig, in_netns
from .samples import to_batch

CAP_NET_RAW = 13


def _size(v: Any, key: str) -> int:
    """Bytes from an int or '4MiB' / '512KiB' / '1M' style string."""
    if isinstance(v, bool):
        raise ValueError(f"{key}: expected a size, got {v!r}")
    if isinstance(v, int):
        return v
    s = str(v).strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if s[-1:] in "kmg" else s) * mult)
    except ValueError:
        raise ValueError(f"{key}: bad size {v!r} (write e.g. 1048576 or '1MiB')") from None


class PktCollector(Collector):
    name = "pkt"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"interface", "filter", "filter_program", "snaplen", "ring_block_size", "ring_blocks",
                             "block_timeout", "burst_gap", "flow_timeout", "max_flows", "max_pending_packets",
                             "netns"})

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        super().__init__(node, config, sys_root, proc_root)
        self._capture: Capture | None = None
        self._tracker: FlowTracker | None = None
        self._last_t: float | None = None
        self._cfg_error: str | None = None
        try:
            self._settings()
        except (ValueError, FilterError) as e:
            self._cfg_error = str(e)

    # -- configuration ---------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        c = self.config
        snaplen = int(c.get("snaplen", 128))
        if not 64 <= snaplen <= 65535:
            raise ValueError(f"snaplen {snaplen} must be between 64 and 65535 (headers need ~90 bytes)")
        out = {
            "interface": c.get("interface") or "",
            "snaplen": snaplen,
            "block_size": _size(c.get("ring_block_size", 1 << 20), "ring_block_size"),
            "blocks": int(c.get("ring_blocks", 16)),
            "block_timeout_ms": max(1, int(round(parse_duration(c.get("block_timeout", "10ms")) * 1000))),
            "burst_gap": parse_duration(c.get("burst_gap", "1ms")),
            "flow_timeout": parse_duration(c.get("flow_timeout", "60s")),
            "max_flows": int(c.get("max_flows", 100_000)),
            "max_pending": int(c.get("max_pending_packets", 500_000)),
            "netns": c.get("netns") or None,
            "filter": c.get("filter") or None,
            "filter_program": c.get("filter_program") or None,
        }
        if out["burst_gap"] <= 0:
            raise ValueError("burst_gap must be longer than 0s")
        if out["blocks"] < 2:
            raise ValueError("ring_blocks must be at least 2")
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
        return Status(Availability.ACTIVE, f"capturing on {s['interface']} (filter: {filt}, snaplen {s['snaplen']})")

    def start(self) -> None:
        if self._capture is not None:
            return
        if self._cfg_error:
            raise CollectorError(f"bad collectors.pkt config: {self._cfg_error}", stage="config")
        s = self._settings()
        if not s["interface"]:
            raise CollectorError("no interface configured (set collectors.pkt.interface)", stage="config")
        prog = self._program(s, self._hatype(s))
        cfg = RingConfig(s["interface"], s["snaplen"], min(128, s["snaplen"]), s["block_size"], s["blocks"],
                         s["block_timeout_ms"], prog, s["netns"])
        cap = Capture(cfg, s["max_pending"])
        try:
            cap.start()
        except OSError as e:
            raise CollectorError(f"cannot capture on {s['interface']}: {e}", stage="start") from e
        self._capture = cap
        self._tracker = FlowTracker(s["burst_gap"], s["flow_timeout"], s["max_flows"])
        self._last_t = time.time()
        self.started = True

    def stop(self) -> None:
        cap, self._capture = self._capture, None
        if cap is not None:
            cap.stop()
        self.started = False

    def kernel_stats(self) -> tuple[int, int]:
        """(packets the kernel passed to the socket, packets it dropped), cumulative since start."""
        if self._capture is None:
            return 0, 0
        return self._capture.ring.read_stats()

    def collect(self, t: float) -> SampleBatch:
        cap, tr = self._capture, self._tracker
        if cap is None or tr is None:
            raise CollectorError("pkt collector not started", stage="collect")
        if cap.error is not None:
            raise CollectorError(f"capture thread failed: {cap.error}", stage="read")
        frames = cap.take()
        self.stats.discarded = cap.discarded
        _, drops = cap.ring.read_stats()
        t0 = self._last_t if self._last_t is not None else t
        self._last_t = t
        pk = decode(frames)
        feats = tr.update(pk, t0, t, [self.config.get("interface", "")], {0: drops})
        return to_batch(feats, self.node, t)
