"""Agent footprint: the real ``skewd agent`` on this host for N minutes, CPU % of one core and peak RSS.

    python bench/agent_footprint.py [--minutes 10] [--warmup 30] [--pkt-interface auto|NAME|none]
                                    [--py-spy FILE]

Runs ``skewd agent`` as its own process with every collector this host supports at its default
interval, publishing summaries and health to a real ``nats-server`` (started here on a free
loopback port, JetStream in a temporary directory), as a node would in production. The
``pkt`` collector needs an interface: ``auto`` captures on the interface of the default route
(passive; only what that interface already carries). The process's CPU time comes from
``/proc/PID/stat`` (utime + stime), its peak RSS from ``VmHWM`` in ``/proc/PID/status``; the
summaries the agent publishes are counted on NATS to show it did its work all along. The load
average before and after is printed because on a shared machine the CPU figure moves with it.
``--py-spy FILE`` samples the agent over the measured window (py-spy, non-blocking, 100 Hz,
raw collapsed stacks; idle threads excluded) for the split of where the CPU goes.

Goal: < 1 % of one core, < 80 MB peak RSS. Reference: dcgm-exporter's published footprint,
450-510 MiB RSS per node (../shared/facts.md); the ratio printed is that over ours.
Exits non-zero only if the agent could not run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from skewd import wire
from skewd.natsutil import EmbeddedNatsServer, free_port

CLK_TCK = os.sysconf("SC_CLK_TCK")
DCGM_EXPORTER_RSS_MIB = (450.0, 510.0)  # published per-node figure (../shared/facts.md)


def cpu_seconds(pid: int | str) -> float:
    """utime + stime of one process (its threads included), from /proc/PID/stat; ``pid`` may
    also be ``"PID/task/TID"`` for one thread."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """utime + stime per thread (TID → seconds), from /proc/PID/task/TID/stat."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out[int(tid)] = cpu_seconds(f"{pid}/task/{tid}")
        except (OSError, ValueError, IndexError):
            pass
    return out


def thread_split(pid: int, before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """CPU seconds of the main thread (the event loop: evaluation, summaries, NATS) and of the
    other threads together (collector workers, the packet capture thread, /metrics)."""
    main = after.get(pid, 0.0) - before.get(pid, 0.0)
    rest = sum(v - before.get(t, 0.0) for t, v in after.items() if t != pid)
    return {"main_thread": main, "other_threads": rest}


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def default_route_interface() -> str | None:
    """The interface of the IPv4 default route (/proc/net/route), if any."""
    try:
        with open("/proc/net/route") as f:
            next(f)
            for line in f:
                p = line.split()
                if len(p) > 2 and p[1] == "00000000":
                    return p[0]
    except OSError:
        pass
    return None


def write_config(d: Path, nats_url: str, pkt_iface: str | None, qdisc_hz: float | None = None) -> Path:
    cfg = {
        "node": "bench-node",
        "cluster": "bench",
        "nats": {"url": nats_url},
        "spool": {"dir": str(d / "spool")},
        "metrics": {"listen": f"127.0.0.1:{free_port()}"},
        "log": {"level": "warning", "format": "json"},
    }
    collectors: dict = {}
    if pkt_iface:
        collectors["pkt"] = {"interface": pkt_iface}
    if qdisc_hz is not None:
        collectors["netdev"] = {"qdisc_sample_hz": qdisc_hz}
    if collectors:
        cfg["collectors"] = collectors
    p = d / "agent.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return p


async def count_summaries(url: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    import nats

    nc = await nats.connect(url)

    async def on_summary(msg) -> None:
        counts["summaries"] += 1

    async def on_health(msg) -> None:
        counts["health"] += 1
        try:
            h = wire.decode_health(msg.data)
            counts["active"] = sorted(k for k, v in h.collectors.items() if v.state == "active")
        except wire.WireError:
            pass

    await nc.subscribe(wire.subject_filter("summary", cluster="bench"), cb=on_summary)
    await nc.subscribe(wire.subject_filter("health", cluster="bench"), cb=on_health)
    await stop.wait()
    await nc.close()


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def start_py_spy(pid: int, seconds: float, out: str) -> subprocess.Popen | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(exe):
        print("agent footprint: py-spy not found (pip install py-spy); not profiling", file=sys.stderr)
        return None
    return subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100",
                             "-f", "raw", "-o", out, "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run(minutes: float, warmup: float, pkt: str, py_spy: str | None = None, qdisc_hz: float | None = None) -> dict:
    iface = default_route_interface() if pkt == "auto" else (None if pkt == "none" else pkt)
    work = Path(tempfile.mkdtemp(prefix="skewd-bench-footprint-"))
    server = EmbeddedNatsServer(store_dir=str(work / "js"))
    proc: subprocess.Popen | None = None
    try:
        server.start()
        cfg = write_config(work, server.url, iface, qdisc_hz)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKEWD")}
        err = open(work / "agent.log", "wb")
        t_start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "skewd.cli", "agent", "--config", str(cfg)],
                                stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        counts = {"summaries": 0, "health": 0, "active": []}

        async def watch() -> dict:
            stop = asyncio.Event()
            task = asyncio.create_task(count_summaries(server.url, stop, counts))
            out: dict = {}
            await asyncio.sleep(warmup)
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited with {proc.returncode}:\n{(work / 'agent.log').read_text()[-3000:]}")
            c0, w0, s0 = cpu_seconds(proc.pid), time.monotonic(), counts["summaries"]
            th0 = thread_cpu_seconds(proc.pid)
            out["startup_cpu_s"] = c0
            out["loadavg_start"] = loadavg()
            spy = start_py_spy(proc.pid, minutes * 60, py_spy) if py_spy else None
            rss_max = 0
            end = w0 + minutes * 60
            while time.monotonic() < end:
                await asyncio.sleep(min(5.0, max(0.0, end - time.monotonic())))
                if proc.poll() is not None:
                    raise RuntimeError(f"agent exited with {proc.returncode} during the run:\n"
                                       f"{(work / 'agent.log').read_text()[-3000:]}")
                rss_max = max(rss_max, status_kib(proc.pid, "VmRSS"))
            c1, w1 = cpu_seconds(proc.pid), time.monotonic()
            out["thread_cpu_s"] = thread_split(proc.pid, th0, thread_cpu_seconds(proc.pid))
            out["loadavg_end"] = loadavg()
            if spy is not None:
                try:
                    spy.wait(30)
                except subprocess.TimeoutExpired:
                    spy.kill()
            out.update(cpu_s=c1 - c0, wall_s=w1 - w0, total_cpu_s=c1, total_wall_s=w1 - t_start,
                       hwm_kib=status_kib(proc.pid, "VmHWM"), rss_kib=status_kib(proc.pid, "VmRSS"),
                       rss_parts_kib={k: status_kib(proc.pid, k) for k in ("RssAnon", "RssFile", "RssShmem")},
                       rss_sampled_max_kib=rss_max, threads=status_kib(proc.pid, "Threads"),
                       summaries=counts["summaries"] - s0)
            await asyncio.sleep(1.5)  # a last health message names the active collectors
            out["active"] = counts["active"]
            stop.set()
            await task
            return out

        res = asyncio.run(watch())
        res["pkt_interface"] = iface or "-"
        return res
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="measured duration after the warm-up (default 10)")
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds before measuring (imports, first windows)")
    ap.add_argument("--pkt-interface", default="auto",
                    help="interface for the pkt collector: auto (default route), a name, or none")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--py-spy", metavar="FILE", help="profile the agent over the measured window into FILE")
    ap.add_argument("--qdisc-sample-hz", type=float, default=None,
                    help="netdev's root-qdisc samples per second (default: the collector's; 0 = off)")
    a = ap.parse_args(argv)
    try:
        r = run(a.minutes, a.warmup, a.pkt_interface, a.py_spy, a.qdisc_sample_hz)
    except (RuntimeError, OSError) as e:
        print(f"agent footprint: could not run: {e}", file=sys.stderr)
        return 1
    cpu_pct = 100.0 * r["cpu_s"] / r["wall_s"]
    total_pct = 100.0 * r["total_cpu_s"] / r["total_wall_s"]
    hwm_mib = r["hwm_kib"] / 1024
    lo, hi = DCGM_EXPORTER_RSS_MIB
    print(f"agent footprint: skewd agent, {r['wall_s'] / 60:.1f} min measured after {a.warmup:g} s warm-up; "
          f"active collectors: {', '.join(r['active']) or '?'} (pkt on {r['pkt_interface']}); "
          f"{r['summaries']} summaries published to NATS; {r['threads']} threads; "
          f"load average {r['loadavg_start']} at the start, {r['loadavg_end']} at the end ({os.cpu_count()} CPUs)")
    print(f"  CPU: {cpu_pct:.2f} % of one core ({r['cpu_s']:.1f} s CPU in {r['wall_s']:.0f} s)   (goal < 1 %); "
          f"whole run incl. start-up: {total_pct:.2f} % ({r['startup_cpu_s']:.1f} s CPU to start)")
    th = {k: 100.0 * v / r["wall_s"] for k, v in r["thread_cpu_s"].items()}
    print(f"  by thread: main (event loop: rule evaluation, summaries, NATS) {th['main_thread']:.2f} %, "
          f"others (collector workers, packet capture, /metrics) {th['other_threads']:.2f} %")
    print(f"  peak RSS (VmHWM): {hwm_mib:.1f} MiB ({r['hwm_kib'] * 1024 / 1e6:.1f} MB)   (goal < 80 MB); "
          f"RSS at end {r['rss_kib'] / 1024:.1f} MiB = "
          + " + ".join(f"{v / 1024:.1f} {k[3:].lower()}" for k, v in r["rss_parts_kib"].items())
          + " (file: mapped libraries and the packet ring, whose socket mapping counts as file pages)")
    print(f"  reference: dcgm-exporter {lo:.0f}-{hi:.0f} MiB RSS per node (published); "
          f"ratio {lo / hwm_mib:.1f}-{hi / hwm_mib:.1f}x less memory")
    if a.json:
        print(json.dumps({"benchmark": "agent_footprint", "cpu_pct": cpu_pct, "cpu_pct_with_startup": total_pct,
                          "cpu_pct_main_thread": th["main_thread"], "cpu_pct_other_threads": th["other_threads"],
                          "peak_rss_mib": hwm_mib, "peak_rss_mb": r["hwm_kib"] * 1024 / 1e6,
                          "rss_parts_kib": r["rss_parts_kib"],
                          "loadavg": [r["loadavg_start"], r["loadavg_end"]],
                          "minutes": r["wall_s"] / 60, "collectors": r["active"], "summaries": r["summaries"],
                          "ratio_dcgm_exporter": [lo / hwm_mib, hi / hwm_mib]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
