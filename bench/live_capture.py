"""Live capture: the pkt collector's TPACKET_V3 ring against a plain AF_PACKET recv() loop.

    python bench/live_capture.py [--seconds 10] [--senders 2] [--rate 165000] [--payload 64]

Builds two network namespaces joined by a veth pair (names ``skwbench-<pid>-a/-b``, removed
afterwards whatever happens), compiles ``bench/sender.c`` with gcc into a temporary directory
and runs it in namespace A: UDP with ``sendmmsg()`` batches, ``--rate`` packets/s per sender
(``--rate 0``: as fast as a core allows), to an address routed over the veth that namespace B does not
own, so B drops every datagram in the IP layer without answering (no ICMP, no socket work).

Two phases on the same traffic, one after the other, each capturing in its own process on B's
end of the veth:

* **skewd**: the pkt collector as the agent runs it (``PktCollector`` with its default ring,
  ``collect()`` once a second: ring → frames → header decode → per-flow features). The default
  ring is adaptive: 16 x 256 KiB (4 MiB) at start, replaced once by 16 x 1 MiB (16 MiB) at the
  first collect() that sees more than 30k frames/s or a kernel drop, so at this benchmark's rates
  the first second runs on the small ring. ``--ring-block-size`` / ``--ring-blocks`` fix the
  ring (no swap), e.g. ``--ring-block-size 1048576`` for 16 MiB from the start;
* **peer**: a plain ``AF_PACKET`` socket with the default receive buffer and a ``recv_into()``
  loop (what a simple Python capture does).

Reported per phase: packets offered (the senders' count), arriving on B's interface
(``rx_packets``), captured, the kernel's drop counter (``PACKET_STATISTICS``), and the CPU the
capturing process used (``getrusage``; for skewd also the ring thread alone, from
``/proc/self/task/TID/stat``, summed over both rings' threads when the ring was replaced). Goal: >= 300k packets/s offered, >= 99.9 % captured.
Exits non-zero only if it could not run (not root, no gcc, no ip, namespaces refused).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IP_A, IP_B, IP_SINK = "10.213.77.1", "10.213.77.2", "10.213.77.99"  # only inside our namespaces
PORT = 9000
CLK_TCK = os.sysconf("SC_CLK_TCK")
SOL_PACKET, PACKET_STATISTICS = 263, 6


class CannotRun(Exception):
    """The benchmark cannot run on this machine (the reason says what is missing)."""


# ---------------------------------------------------------------------------------------------
# namespaces
# ---------------------------------------------------------------------------------------------

def ip(*args: str) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise CannotRun(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


class VethPair:
    """Namespaces A and B joined by a veth pair; B's end is where the capture runs."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns_a, self.ns_b = f"skwbench-{tag}-a", f"skwbench-{tag}-b"
        self.if_a, self.if_b = f"skba{tag}", f"skbb{tag}"

    def __enter__(self) -> "VethPair":
        try:
            for ns in (self.ns_a, self.ns_b):
                ip("netns", "add", ns)
                for key in ("all", "default"):
                    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"],
                                   capture_output=True)
            ip("link", "add", self.if_a, "netns", self.ns_a, "type", "veth", "peer", "name", self.if_b,
               "netns", self.ns_b)
            ip("-n", self.ns_a, "addr", "add", f"{IP_A}/24", "dev", self.if_a)
            ip("-n", self.ns_b, "addr", "add", f"{IP_B}/24", "dev", self.if_b)
            mac_b = json.loads(ip("-n", self.ns_b, "-j", "link", "show", self.if_b))[0]["address"]
            # the sink address is B's MAC but not B's IP: B's IP layer drops it (forwarding is off)
            ip("-n", self.ns_a, "neigh", "add", IP_SINK, "lladdr", mac_b, "dev", self.if_a, "nud", "permanent")
            ip("-n", self.ns_a, "link", "set", self.if_a, "up")
            ip("-n", self.ns_b, "link", "set", self.if_b, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in (self.ns_a, self.ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def rx_packets(self) -> int:
        st = json.loads(ip("-n", self.ns_b, "-j", "-s", "link", "show", self.if_b))[0]["stats64"]["rx"]
        return int(st["packets"])


def build_sender(work: Path) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise CannotRun("no C compiler (gcc) to build bench/sender.c")
    out = work / "sender"
    r = subprocess.run([cc, "-O2", "-o", str(out), str(HERE / "sender.c")], capture_output=True, text=True)
    if r.returncode != 0:
        raise CannotRun(f"gcc failed on bench/sender.c:\n{r.stderr}")
    return out


# ---------------------------------------------------------------------------------------------
# capture workers (run as child processes: their CPU is theirs alone)
# ---------------------------------------------------------------------------------------------

def _thread_cpu(tid: int) -> float:
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except OSError:
        return float("nan")


def _rusage_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker_skewd(ns: str, iface: str, block_size: int | None, blocks: int | None) -> dict:
    from skewd.collectors.pkt import COLLECTOR as Pkt

    cfg: dict = {"interface": iface, "netns": ns}
    if block_size:
        cfg["ring_block_size"] = block_size
    if blocks:
        cfg["ring_blocks"] = blocks
    col = Pkt("bench", cfg)
    st = col.probe()
    if st.availability.value != "active":
        raise CannotRun(f"pkt collector inactive: {st.reason}")
    col.start()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    # The ring-draining thread, timed alone. With the default (adaptive) ring the collector
    # replaces its 4 MiB ring by a 16 MiB one, and with it the thread, at the first busy
    # collect(): every capture is watched, and a thread's CPU is read just before its capture
    # stops (its /proc/self/task entry is gone after the join), so the figure is the sum over
    # the small ring's thread and the large one's.
    ring_cpu: dict[int, float] = {}
    watched: set[int] = set()
    ring_sizes = [col.ring_bytes]

    def watch() -> None:
        cap = col._capture
        if cap is None or cap._thread is None or id(cap) in watched or cap._thread.native_id is None:
            return
        watched.add(id(cap))
        tid, stop_cap = cap._thread.native_id, cap.stop

        def stop() -> None:
            ring_cpu[tid] = _thread_cpu(tid)
            stop_cap()

        cap.stop = stop  # type: ignore[method-assign]

    watch()
    packets = 0.0
    iface_ent = iface
    c0, w0 = _rusage_cpu(), time.monotonic()
    print("ready", flush=True)
    collects = []
    next_due = time.monotonic()
    while True:  # collect() on a fixed 1 s cadence, as the agent's scheduler calls it
        next_due += 1.0
        done = stop.wait(max(0.0, next_due - time.monotonic()))
        a = time.perf_counter()
        b = col.collect(time.time())
        collects.append(time.perf_counter() - a)
        if col.ring_bytes != ring_sizes[-1]:
            ring_sizes.append(col.ring_bytes)
        watch()
        for _, _, ent, sig, v in b.rows():
            if ent == iface_ent and sig == "pkt_packets_total":
                packets = v
        if done:
            break
    seen, drops = col.kernel_stats()
    c1, w1 = _rusage_cpu(), time.monotonic()
    col.stop()  # the current capture's stop() records its thread's CPU
    return {"captured": int(packets), "kernel_seen": seen, "kernel_drops": drops, "cpu_s": c1 - c0,
            "wall_s": w1 - w0, "ring_thread_cpu_s": sum(ring_cpu.values()) if ring_cpu else float("nan"),
            "ring_threads": len(ring_cpu), "ring_bytes": ring_sizes, "collect_max_s": max(collects),
            "discarded": col.stats.discarded}


def worker_recv(ns: str, iface: str) -> dict:
    from skewd.collectors.pkt.ring import in_netns

    def mk() -> socket.socket:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        s.bind((iface, 0x0003))
        return s

    s = in_netns(ns, mk)
    s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)  # struct tpacket_stats; reading resets it
    s.settimeout(0.2)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    buf = bytearray(2048)
    n = 0
    rcvbuf = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    c0, w0 = _rusage_cpu(), time.monotonic()
    print("ready", flush=True)
    recv_into = s.recv_into
    while not stop.is_set():
        try:
            while True:
                recv_into(buf)
                n += 1
                if n & 0xFFFF == 0 and stop.is_set():
                    break
        except socket.timeout:
            continue
    c1, w1 = _rusage_cpu(), time.monotonic()
    pk, dr = struct.unpack("2I", s.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    s.close()
    return {"captured": n, "kernel_seen": pk, "kernel_drops": dr, "cpu_s": c1 - c0, "wall_s": w1 - w0,
            "rcvbuf": rcvbuf}


# ---------------------------------------------------------------------------------------------
# one phase: capture worker + senders
# ---------------------------------------------------------------------------------------------

def run_phase(kind: str, pair: VethPair, sender: Path, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--ns", pair.ns_b, "--iface", pair.if_b]
    if a.ring_block_size:
        cmd += ["--ring-block-size", str(a.ring_block_size)]
    if a.ring_blocks:
        cmd += ["--ring-blocks", str(a.ring_blocks)]
    w = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = w.stdout.readline().strip()
        if line != "ready":
            w.kill()
            raise CannotRun(f"{kind} capture did not start: {line} {w.stderr.read()[-2000:]}")
        time.sleep(0.3)
        rx0 = pair.rx_packets()
        ncpu = os.cpu_count() or 1
        procs = []
        for k in range(a.senders):
            cpu = (k % ncpu) if a.pin else -1
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", pair.ns_a, str(sender), IP_SINK, str(PORT), str(20000 + 100 * k),
                 str(a.flows), str(a.payload), str(a.seconds), str(a.batch), str(a.rate), str(cpu)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        sent = 0
        sent_rate = 0.0
        for p in procs:
            out, err = p.communicate(timeout=a.seconds + 30)
            if p.returncode != 0:
                raise CannotRun(f"sender failed: {err.strip()}")
            r = json.loads(out)
            sent += r["sent"]
            sent_rate += r["sent"] / r["seconds"]
        time.sleep(0.5)  # the last ring blocks retire (block timeout 10 ms), queues empty
        rx = pair.rx_packets() - rx0
        out, err = w.communicate("stop\n", timeout=60)
        if w.returncode != 0:
            raise CannotRun(f"{kind} capture failed:\n{err[-3000:]}")
        res = json.loads(out.strip().splitlines()[-1])
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    res.update(sent=sent, offered_pps=sent_rate, arrived=rx)
    return res


def describe(name: str, r: dict, seconds: float) -> str:
    cap = r["captured"]
    pct_sent = 100.0 * cap / r["sent"] if r["sent"] else float("nan")
    pct_arr = 100.0 * cap / r["arrived"] if r["arrived"] else float("nan")
    cpu = 100.0 * r["cpu_s"] / r["wall_s"]
    extra = ""
    if "ring_thread_cpu_s" in r:
        rings = " -> ".join(f"{b / (1 << 20):g} MiB" for b in r["ring_bytes"])
        extra = (f"; ring thread{'s' if r['ring_threads'] > 1 else ''} alone "
                 f"{100.0 * r['ring_thread_cpu_s'] / r['wall_s']:.0f} %, "
                 f"slowest collect() {r['collect_max_s'] * 1e3:.0f} ms; ring {rings}")
    return (f"  {name:5}: offered {r['offered_pps'] / 1e3:.0f}k pps ({r['sent']:,} sent), arrived {r['arrived']:,}, "
            f"captured {cap:,} = {pct_sent:.2f} % of sent ({pct_arr:.2f} % of arrived), "
            f"kernel drops {r['kernel_drops']:,}; CPU {cpu:.0f} % of one core{extra}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="sending time per phase")
    ap.add_argument("--senders", type=int, default=2,
                    help="sender processes, one per CPU (one sender tops out near 220-350k packets/s here)")
    ap.add_argument("--rate", type=float, default=165_000.0,
                    help="packets/s per sender, the same in both phases (0: as fast as possible)")
    ap.add_argument("--payload", type=int, default=64, help="UDP payload bytes (frame = payload + 42)")
    ap.add_argument("--flows", type=int, default=8, help="source ports per sender")
    ap.add_argument("--batch", type=int, default=256, help="packets per sendmmsg() call")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True, help="pin senders to CPUs")
    ap.add_argument("--ring-block-size", type=int, default=0, help="override the collector's ring block size")
    ap.add_argument("--ring-blocks", type=int, default=0, help="override the collector's ring block count")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--worker", choices=("skewd", "recv"), help=argparse.SUPPRESS)
    ap.add_argument("--ns", help=argparse.SUPPRESS)
    ap.add_argument("--iface", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        r = worker_skewd(a.ns, a.iface, a.ring_block_size, a.ring_blocks) if a.worker == "skewd" \
            else worker_recv(a.ns, a.iface)
        print(json.dumps(r), flush=True)
        return 0
    try:
        if os.geteuid() != 0:
            raise CannotRun("needs root (network namespaces, AF_PACKET sockets)")
        if shutil.which("ip") is None:
            raise CannotRun("needs iproute2's ip command")
        with tempfile.TemporaryDirectory(prefix="skewd-bench-live-") as d:
            sender = build_sender(Path(d))
            with VethPair() as pair:
                ours = run_phase("skewd", pair, sender, a)
                peer = run_phase("recv", pair, sender, a)
    except CannotRun as e:
        print(f"live capture: could not run: {e}", file=sys.stderr)
        return 1
    print(f"live capture: veth between namespaces, {a.senders} C sendmmsg sender(s), {a.payload + 42}-byte frames, "
          f"{a.seconds:g} s per phase, {os.cpu_count()} cores")
    print(describe("skewd", ours, a.seconds) + "   (goal >= 300k pps offered, >= 99.9 % captured)")
    print(describe("peer", peer, a.seconds) + f" (AF_PACKET recv loop, SO_RCVBUF {peer['rcvbuf']})")
    ours_pct = ours["captured"] / ours["sent"] if ours["sent"] else float("nan")
    peer_pct = peer["captured"] / peer["sent"] if peer["sent"] else float("nan")
    cpp = lambda r: (r["cpu_s"] * 1e6 / r["captured"]) if r["captured"] else float("nan")  # noqa: E731
    print(f"  ratio: skewd keeps {ours_pct / peer_pct:.2f}x the peer's share of packets "
          f"({100 * ours_pct:.2f} % vs {100 * peer_pct:.2f} %); CPU per captured packet "
          f"{cpp(ours):.2f} us vs {cpp(peer):.2f} us")
    if a.json:
        print(json.dumps({"benchmark": "live_capture", "skewd": ours, "peer": peer,
                          "captured_pct": 100 * ours_pct, "peer_captured_pct": 100 * peer_pct}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
