"""One collective rank of the lab's tensor-parallel group: compute (a sleep, plus a little real
CPU work a cgroup quota can throttle), then an all-reduce of the step's message, for ever.

Run as a script inside a node's namespace, by whichever interpreter has torch (the lab's
``--torch-python``); it imports nothing from skewd, so it runs in a venv that has no skewd.

Backends:
- ``torch``: ``torch.distributed`` with **gloo** over TCP (``GLOO_SOCKET_IFNAME`` = the
  collective port), rendezvous over the same port; the real collective library.
- ``ring``: where torch is absent, a lock-step ring all-reduce over TCP sockets with numpy:
  reduce-scatter then all-gather, N-1 steps each, every rank sending one chunk to its right
  neighbour (in 64 KiB writes from a sender thread) while receiving one from its left, so the
  wire pattern is a ring collective's.

Step pacing: ``--period`` is the nominal step period. The first ``WARMUP`` steps measure the
all-reduce time; the ranks agree on the slowest (an all-reduce of one number, MAX) and then
compute for ``period - comm`` (at least a fifth of the period) every step, fixed, as a model
does: a slow rank makes the whole group's step longer, it does not shorten anyone's compute.

Fault hook: ``--ctl FILE`` (JSON ``{"extra_sleep_s": 0.02}``) is polled every step (a stat;
read when its mtime changes): extra compute time on this rank, i.e. a straggler.

Ground truth: ``--log FILE`` gets a header line (``# {...}`` JSON: backend, calibration) and one
line per step ``step t_start t_comm_start t_end extra_s`` (wall-clock seconds: the lab's
namespaces share the host's clock), flushed every step.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import sys
import threading
import time

WARMUP = 25
CHUNK = 64 << 10
#: real CPU work per step, whatever the period: what a cgroup cpu quota throttles (the rest of
#: compute is a sleep, so the lab stays CPU-light on a shared 2-core machine)
BUSY_S = 0.002


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("torch", "ring"), required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--addrs", required=True, help="comma-separated collective IPs of ranks 0..world-1")
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--iface", default="eth0")
    p.add_argument("--bytes", type=int, required=True, help="all-reduce message size")
    p.add_argument("--period", type=float, required=True, help="nominal step period (s)")
    p.add_argument("--ctl", required=True)
    p.add_argument("--log", required=True)
    return p.parse_args(argv)


class Control:
    """The straggler knob: a JSON file polled by mtime."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.mtime = 0.0
        self.extra = 0.0

    def poll(self) -> float:
        try:
            m = os.stat(self.path).st_mtime
        except OSError:
            return self.extra
        if m != self.mtime:
            self.mtime = m
            try:
                with open(self.path) as f:
                    self.extra = float(json.load(f).get("extra_sleep_s", 0.0))
            except (OSError, ValueError):
                pass
        return self.extra


def busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


# -- torch backend -------------------------------------------------------------------------------
class TorchComm:
    def __init__(self, a: argparse.Namespace) -> None:
        os.environ["GLOO_SOCKET_IFNAME"] = a.iface
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        master = a.addrs.split(",")[0]
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{a.port}", rank=a.rank,
                                world_size=a.world, timeout=__import__("datetime").timedelta(seconds=120))
        self.buf = torch.ones(max(1, a.bytes // 4), dtype=torch.float32)

    def allreduce(self) -> None:
        self.dist.all_reduce(self.buf)
        self.buf.fill_(1.0)  # keep the values bounded; the bytes on the wire are what matters

    def agree_max(self, v: float) -> float:
        t = self.torch.tensor([v], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


# -- plain ring backend ---------------------------------------------------------------------------
class RingComm:
    """Ring all-reduce over two TCP connections per rank (to the right, from the left)."""

    def __init__(self, a: argparse.Namespace) -> None:
        import numpy as np

        self.np = np
        self.rank, self.n = a.rank, a.world
        addrs = a.addrs.split(",")
        me, right = addrs[a.rank], addrs[(a.rank + 1) % a.world]
        lst = socket.socket()
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind((me, a.port + a.rank))
        lst.listen(1)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.tx = socket.create_connection((right, a.port + (a.rank + 1) % a.world), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        lst.settimeout(120)
        self.rx, _ = lst.accept()
        lst.close()
        for s in (self.tx, self.rx):
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        n_el = max(self.n, a.bytes // 4)
        self.buf = np.ones(n_el, dtype=np.float32)
        bounds = np.linspace(0, n_el, self.n + 1).astype(int)
        self.chunks = [(int(bounds[i]), int(bounds[i + 1])) for i in range(self.n)]
        self.scratch = np.empty(int(max(e - s for s, e in self.chunks)), dtype=np.float32)
        self.sendq: queue.Queue = queue.Queue()
        self.sent = threading.Semaphore(0)
        threading.Thread(target=self._sender, daemon=True).start()

    def _sender(self) -> None:
        while True:
            mv = self.sendq.get()
            for off in range(0, len(mv), CHUNK):
                self.tx.sendall(mv[off:off + CHUNK])
            self.sent.release()

    def _recv_into(self, mv: memoryview) -> None:
        got = 0
        while got < len(mv):
            k = self.rx.recv_into(mv[got:], len(mv) - got)
            if k == 0:
                raise ConnectionError("left neighbour closed the ring")
            got += k

    def _ring(self, buf, op: str) -> None:
        n, r = self.n, self.rank
        for phase in ("reduce", "gather"):
            for s in range(n - 1):
                if phase == "reduce":
                    si, ri = (r - s) % n, (r - s - 1) % n
                else:
                    si, ri = (r - s + 1) % n, (r - s) % n
                a0, a1 = self.chunks[si]
                self.sendq.put(memoryview(buf[a0:a1].copy()).cast("B"))
                b0, b1 = self.chunks[ri]
                tmp = self.scratch[:b1 - b0]
                self._recv_into(memoryview(tmp).cast("B"))
                if phase == "gather":
                    buf[b0:b1] = tmp
                elif op == "sum":
                    buf[b0:b1] += tmp
                else:
                    self.np.maximum(buf[b0:b1], tmp, out=buf[b0:b1])
                self.sent.acquire()

    def allreduce(self) -> None:
        self._ring(self.buf, "sum")
        self.buf.fill(1.0)

    def agree_max(self, v: float) -> float:
        # one element per rank's chunk, so the tiny ring moves something for every rank
        arr = self.np.full(self.n, v, dtype=self.np.float32)
        saved = self.chunks
        self.chunks = [(i, i + 1) for i in range(self.n)]
        try:
            self._ring(arr, "max")
        finally:
            self.chunks = saved
        return float(arr.max())

    def close(self) -> None:
        for s in (self.tx, self.rx):
            try:
                s.close()
            except OSError:
                pass


def main(argv: list[str]) -> int:
    a = parse(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    comm = TorchComm(a) if a.backend == "torch" else RingComm(a)
    ctl = Control(a.ctl)
    comm_times: list[float] = []
    compute = a.period / 2
    with open(a.log, "a", buffering=1) as log:
        step = 0
        while not stop.is_set():
            extra = ctl.poll()
            t0 = time.time()
            busy(BUSY_S)
            rest = compute + extra - (time.time() - t0)
            if rest > 0:
                time.sleep(rest)
            t1 = time.time()
            comm.allreduce()
            t2 = time.time()
            log.write(f"{step} {t0:.6f} {t1:.6f} {t2:.6f} {extra:.4f}\n")
            step += 1
            if step <= WARMUP:
                comm_times.append(t2 - t1)
                if step == WARMUP:
                    comm_times.sort()
                    slowest = comm.agree_max(comm_times[len(comm_times) // 2])
                    compute = max(a.period - slowest, a.period / 5)
                    log.write("# " + json.dumps({"backend": a.backend, "rank": a.rank, "world": a.world,
                                                 "bytes": a.bytes, "period": a.period, "comm_median": slowest,
                                                 "compute": compute, "iface": a.iface}) + "\n")
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
