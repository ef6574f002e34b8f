"""Live capture: an AF_PACKET socket with a TPACKET_V3 memory-mapped receive ring.

Why this shape: a plain ``recv()`` loop in Python keeps about half of a busy port's packets,
scapy's sniffer about one percent (measured here). With TPACKET_V3 the kernel writes frames
into shared blocks and hands over a whole block at a time; Python only walks the block's
frame list and copies the first ``width`` bytes of each frame out with one numpy gather.
The kernel filter (classic BPF, see :mod:`bpf`) runs before the copy and truncates every
accepted frame to ``snaplen``. ``PACKET_STATISTICS`` reports what the kernel dropped because
the ring was full, which is itself a signal (timing features then miss packets).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np

from .frames import DIR_IN, DIR_OUT, Frames, gather

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
TPACKET_V3 = 2
SO_ATTACH_FILTER = 26
ETH_P_ALL = 0x0003
TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_VLAN_VALID = 0x10
TPACKET3_HDRLEN = 48  # TPACKET_ALIGN(sizeof(struct tpacket3_hdr)): struct sockaddr_ll follows
ARPHRD_ETHER, ARPHRD_LOOPBACK, ARPHRD_NONE = 1, 772, 0xFFFE
#: link-layer type of the device → pcap LINKTYPE the parser understands
HATYPE_LINKTYPE = {ARPHRD_ETHER: 1, ARPHRD_LOOPBACK: 1, ARPHRD_NONE: 101}
CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/run/netns"

T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a short-lived thread that joined network namespace ``netns`` (a name
    under /run/netns or a path such as /proc/PID/ns/net). setns() affects only that thread,
    and sockets keep their namespace for life, so nothing needs restoring."""
    if not netns:
        return fn()
    out: dict[str, object] = {}
    path = netns if netns.startswith("/") else os.path.join(NETNS_RUN_DIR, netns)

    def body() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"setns({path}): {os.strerror(e)}")
            finally:
                os.close(fd)
            out["v"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            out["e"] = e

    t = threading.Thread(target=body, name=f"pkt-netns-{netns}", daemon=True)
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]  # type: ignore[misc]
    return out["v"]  # type: ignore[return-value]


@dataclass
class RingConfig:
    interface: str
    snaplen: int = 128
    width: int = 96  # header bytes kept per frame for parsing (<= snaplen)
    block_size: int = 1 << 20
    blocks: int = 16
    block_timeout_ms: int = 10
    filter: list[tuple[int, int, int, int]] | None = None  # classic BPF (None = accept all)
    netns: str | None = None


class Ring:
    """One TPACKET_V3 ring on one interface. Not thread-safe: one reader thread drains it."""

    def __init__(self, cfg: RingConfig) -> None:
        self.cfg = cfg
        self.sock: socket.socket | None = None
        self.mm: mmap.mmap | None = None
        self.block = 0
        self.kernel_packets = 0  # PACKET_STATISTICS accumulated (each read resets the kernel's)
        self.kernel_drops = 0
        self.freeze_count = 0
        self.ifindex = 0
        self._stats_lock = threading.Lock()

    def open(self) -> None:
        c = self.cfg
        if c.block_size % mmap.PAGESIZE or c.block_size < 1 << 14:
            raise ValueError(f"ring block size {c.block_size} must be a multiple of the page size and >= 16 KiB")
        frame = 1 << max(11, (c.snaplen + TPACKET3_HDRLEN + 32 + 15).bit_length())  # nominal (V3 packs)
        frame = min(frame, c.block_size)

        def setup() -> tuple[socket.socket, int]:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: nothing arrives yet
            try:
                idx = socket.if_nametoindex(c.interface)
                s.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
                if c.filter is not None:
                    from .bpf import pack

                    prog = pack(c.filter)
                    buf = ctypes.create_string_buffer(prog)
                    fprog = struct.pack("HL", len(c.filter), ctypes.addressof(buf))
                    s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
                req = struct.pack("7I", c.block_size, c.blocks, frame, c.block_size // frame * c.blocks,
                                  c.block_timeout_ms, 0, 0)
                s.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
                s.bind((c.interface, ETH_P_ALL))  # filter and ring in place before traffic flows
                return s, idx
            except BaseException:
                s.close()
                raise

        self.sock, self.ifindex = in_netns(c.netns, setup)
        self.mm = mmap.mmap(self.sock.fileno(), c.block_size * c.blocks, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        self._arr = np.frombuffer(self.mm, np.uint8)
        self.block = 0
        self.read_stats()  # start the kernel counters from zero

    def close(self) -> None:
        if self.mm is not None:
            self._arr = None
            try:
                self.mm.close()
            except BufferError:  # a numpy view still alive; the mapping goes with the socket
                pass
            self.mm = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def fileno(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def read_stats(self) -> tuple[int, int]:
        """Cumulative (packets seen by the socket, packets dropped because the ring was full)."""
        if self.sock is None:
            return self.kernel_packets, self.kernel_drops
        with self._stats_lock:
            raw = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12)
            pk, dr, fr = struct.unpack("3I", raw)
            self.kernel_packets += pk
            self.kernel_drops += dr
            self.freeze_count += fr
            return self.kernel_packets, self.kernel_drops

    def wait(self, timeout: float, poller: "select.poll | None" = None) -> bool:
        """Block until a block is ready (poll on the socket) or the timeout passes. ``poller``:
        a poll object with the socket registered (and possibly a wake-up fd), kept by the caller
        instead of building one per wait."""
        if self._ready():
            return True
        if poller is None:
            poller = select.poll()
            poller.register(self.fileno(), select.POLLIN | select.POLLERR)
        return bool(poller.poll(int(timeout * 1000)))

    def _ready(self) -> bool:
        off = self.block * self.cfg.block_size
        return bool(self._arr[off + 8] & TP_STATUS_USER)

    def drain(self, max_blocks: int | None = None) -> list[Frames]:
        """Copy out every block the kernel has handed over, and give the blocks back."""
        out: list[Frames] = []
        bs = self.cfg.block_size
        n = 0
        while self._ready() and (max_blocks is None or n < max_blocks):
            base = self.block * bs
            fr = self._block_frames(base)
            if fr is not None:
                out.append(fr)
            self._arr[base + 8: base + 12] = 0  # TP_STATUS_KERNEL: the kernel may refill it
            self.block = (self.block + 1) % self.cfg.blocks
            n += 1
        return out

    def _block_frames(self, base: int) -> Frames | None:
        a = self._arr
        mv = memoryview(self.mm)
        num, first = struct.unpack_from("<II", mv, base + 12)
        if num == 0:
            return None
        # walk the block's frame list (next offsets); everything else is vectorised
        offs = np.empty(num, np.int64)
        u32 = struct.Struct("<I").unpack_from
        o = base + first
        for i in range(num):
            offs[i] = o
            o += u32(mv, o)[0]
        h = gather(a, offs, TPACKET3_HDRLEN + 12)
        w = h[:, :28].copy().view("<u4")
        sec, nsec, snap, wire = (w[:, k].astype(np.int64) for k in (1, 2, 3, 4))
        mac = np.ascontiguousarray(h[:, 24:26]).view("<u2")[:, 0].astype(np.int64)
        hatype = np.ascontiguousarray(h[:, TPACKET3_HDRLEN + 8: TPACKET3_HDRLEN + 10]).view("<u2")[:, 0].astype(np.int32)
        pkttype = h[:, TPACKET3_HDRLEN + 10]
        loop_out = (pkttype == 4) & (hatype == ARPHRD_LOOPBACK)
        if loop_out.any():  # loopback shows each packet twice (sent, received): keep one, as libpcap does
            keep = ~loop_out
            offs, sec, nsec, snap, wire, mac, hatype, pkttype = (x[keep] for x in (
                offs, sec, nsec, snap, wire, mac, hatype, pkttype))
            num = len(offs)
            if num == 0:
                return None
        width = self.cfg.width
        heads = gather(a, offs + mac, width)
        direction = np.where(pkttype == 4, DIR_OUT, np.where(pkttype <= 3, DIR_IN, 0)).astype(np.int8)
        lt = np.full(num, -1, np.int32)
        for ha, linktype in HATYPE_LINKTYPE.items():
            lt[hatype == ha] = linktype
        lt[lt < 0] = 0x10000 + hatype[lt < 0]  # unknown device type: reported as undecoded
        return Frames(heads.ravel(), np.arange(num, dtype=np.int64) * width, np.minimum(snap, width), wire,
                      sec * 1_000_000_000 + nsec, lt, np.zeros(num, np.int32), direction)


class Capture:
    """A ring drained by a background thread into a bounded list of frame batches."""

    def __init__(self, cfg: RingConfig, max_pending: int = 500_000) -> None:
        self.ring = Ring(cfg)
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: list[Frames] = []
        self._npending = 0
        self.discarded = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1  # stop() writes here to end the thread's poll at once

    #: the capture thread's poll timeout: stop() wakes it through a pipe, so on an idle port
    #: it wakes only this often (it was every 0.1 s) and stop() still returns at once
    POLL_TIMEOUT = 1.0

    def start(self) -> None:
        self.ring.open()
        self._stop.clear()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._run, name=f"pkt-capture-{self.ring.cfg.interface}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            poller = select.poll()
            poller.register(self.ring.fileno(), select.POLLIN | select.POLLERR)
            poller.register(self._wake_r, select.POLLIN)
            while not self._stop.is_set():
                if not self.ring.wait(self.POLL_TIMEOUT, poller):
                    continue
                for fr in self.ring.drain():
                    with self._lock:
                        if self._npending + len(fr) > self.max_pending:
                            self.discarded += len(fr)
                            continue
                        self._pending.append(fr)
                        self._npending += len(fr)
        except BaseException as e:  # surfaced by take()
            self.error = e

    def take(self) -> Frames:
        """Frames captured since the previous take. Frames still in a block the kernel has not
        handed over yet (at most ``block_timeout`` old) belong to the next take."""
        with self._lock:
            parts, self._pending, self._npending = self._pending, [], 0
        return Frames.concat(parts)

    def stop(self) -> None:
        self._stop.set()
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass  # the pipe is full: the thread is being woken anyway
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        self.ring.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
