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


def sys_seconds(pid: int | str) -> float:
    """stime alone (kernel time) of a process or ``"PID/task/TID"`` thread."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[12]) / CLK_TCK


def thread_cpu_seconds(pid: int) -> dict[int, tuple[float, float]]:
    """(utime + stime, stime) per thread (TID → seconds), from /proc/PID/task/TID/stat."""
    out: dict[int, tuple[float, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out[int(tid)] = (cpu_seconds(f"{pid}/task/{tid}"), sys_seconds(f"{pid}/task/{tid}"))
        except (OSError, ValueError, IndexError):
            pass
    return out


def thread_split(pid: int, before: dict[int, tuple[float, float]],
                 after: dict[int, tuple[float, float]]) -> dict[str, float]:
    """CPU seconds of the main thread (the event loop: evaluation, summaries, NATS), of the
    other threads together (collector workers, the packet capture thread, /metrics), of the
    busiest other thread (on a busy port the capture thread: it alone drains the ring, while
    collects rotate over the pool's workers) and the kernel's share (stime) of the others
    (softirq work such as the ring copy is charged to whichever thread the CPU was running)."""
    z = (0.0, 0.0)
    main = after.get(pid, z)[0] - before.get(pid, z)[0]
    others = {t: (v[0] - before.get(t, z)[0], v[1] - before.get(t, z)[1]) for t, v in after.items() if t != pid}
    return {"main_thread": main, "other_threads": sum(v[0] for v in others.values()),
            "busiest_other_thread": max((v[0] for v in others.values()), default=0.0),
            "other_threads_sys": sum(v[1] for v in others.values())}


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

    for subject in wire.summary_filters("bench"):  # with or without a placement token, mapped or not
        await nc.subscribe(subject, cb=on_summary)
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
            # a health message names the active collectors; the agent sends one every 10 s, so a
            # short run on a loaded machine may not have seen one yet
            deadline = time.monotonic() + 12.0
            await asyncio.sleep(1.5)
            while not counts["active"] and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
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


# -- real collective traffic on the captured port ------------------------------------------------
#: rank processes and the recorder come from the real-traffic lab; everything here is measurement
TRAFFIC_NODES = 3  # n0, n1: the gloo ranks; n2: on the same collective bridge, no rank (the idle port)


def netdev_packets(ns: str, iface: str) -> tuple[int, int, int, int]:
    """(rx packets, tx packets, rx bytes, tx bytes) of ``iface`` in namespace ``ns``, from its
    /proc/net/dev: what an AF_PACKET socket on that interface is handed (one per skb, so a GSO
    super-packet counts once, as the capture sees it)."""
    from skewd.lab.netlab.topology import ns_exec

    for line in ns_exec(ns, "cat", "/proc/net/dev").stdout.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == iface:
            f = rest.split()
            return int(f[1]), int(f[9]), int(f[0]), int(f[8])
    raise RuntimeError(f"{iface} not in /proc/net/dev of {ns}")


def run_traffic(minutes: float, warmup: float, message_mb: float, period_ms: float, gso: bool,
                prefix: str, subnet: str, py_spy: str | None = None, keep: str | None = None) -> dict:
    """Two gloo ranks (torch.distributed all-reduce over TCP) between network namespaces n0 and
    n1 on a dedicated collective bridge; one real ``skewd agent`` on n0 capturing that port
    (``collectors.pkt.interface: eth1``, otherwise the lab's default agent config) and, in the
    same minutes, one on n2, whose eth1 sits on the same bridge but carries no collective: the
    idle-port peer under the same machine load. Both publish to a nats-server in the lab's
    control namespace; the lab's recorder counts their summaries."""
    from skewd.lab.netlab import product
    from skewd.lab.netlab.procs import Procs
    from skewd.lab.netlab.run import _trap_signals
    from skewd.lab.netlab.score import read_messages
    from skewd.lab.netlab.steps import read_steps
    from skewd.lab.netlab.topology import Topology, ns_exec
    from skewd.lab.netlab.torchenv import resolve

    rt = resolve("torch")
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="skewd-bench-footprint-traffic-"))
    work.mkdir(parents=True, exist_ok=True)
    topo = Topology(prefix, "fp", TRAFFIC_NODES, dedicated=True, subnet=subnet)
    procs = Procs(work / "logs")
    messages = work / "messages.jsonl"
    iface = topo.coll_iface
    roles = {"traffic": 0, "idle": 2}
    restore = _trap_signals()  # SIGTERM/SIGHUP unwind into the teardown below (forked pyroute2 helpers excepted)
    try:
        topo.build()
        if not gso:  # one MSS per skb: the capture sees wire-sized frames, as on a NIC without TSO/GRO
            for i in range(TRAFFIC_NODES):
                ns_exec(topo.node(i), "ip", "link", "set", "dev", iface, "gso_max_segs", "1")
        url = product.start_nats(procs, topo.control, topo.control_ip, work / "nats")
        product.start_recorder(procs, topo.control, url, messages)
        addrs = f"{topo.coll_ip(0)},{topo.coll_ip(1)}"
        steps = [work / f"rank{i}.log" for i in range(2)]
        for i in range(2):
            ctl = work / f"rank{i}.ctl"
            ctl.write_text("{}")
            procs.start(f"rank{i}", topo.node(i),
                        [rt.python, str(product.WORKERS / "rank.py"), "--backend", rt.backend, "--rank", str(i),
                         "--world", "2", "--addrs", addrs, "--port", "29500", "--iface", iface,
                         "--bytes", str(int(message_mb * 1e6)), "--period", f"{period_ms / 1000:.4f}",
                         "--ctl", str(ctl), "--log", str(steps[i])], env={"OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + 240
        while not all(len(read_steps(p)) > 40 for p in steps):
            dead = procs.dead()
            if dead or time.monotonic() > deadline:
                who = dead[0] if dead else procs.procs[-1]
                raise RuntimeError(f"the gloo ranks did not start stepping ({who.name}):\n{who.tail()}")
            time.sleep(0.5)
        agents = {}
        for role, i in roles.items():
            node = f"fp-{role}"
            cfg = product.write_yaml(work / "config" / f"agent-{node}.yaml",
                                     product.agent_config("bench", node, i, url, iface, work / "spool"))
            agents[role] = product.start_agent(procs, topo.node(i), node, cfg)
        t_start = time.monotonic()
        time.sleep(warmup)
        for a in agents.values():
            if not a.alive():
                raise RuntimeError(f"{a.name} exited with {a.popen.returncode}:\n{a.tail()}")
        pids = {r: a.pid for r, a in agents.items()}
        out: dict = {"runtime": rt.detail, "gso": gso, "message_mb": message_mb, "period_ms": period_ms,
                     "loadavg_start": loadavg()}
        c0 = {r: cpu_seconds(p) for r, p in pids.items()}
        th0 = {r: thread_cpu_seconds(p) for r, p in pids.items()}
        n0 = {r: netdev_packets(topo.node(i), iface) for r, i in roles.items()}
        w0, wall0 = time.monotonic(), time.time()
        spy = start_py_spy(pids["traffic"], minutes * 60, py_spy) if py_spy else None
        rss: dict[str, list[int]] = {r: [] for r in pids}
        end = w0 + minutes * 60
        while time.monotonic() < end:
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))
            dead = procs.dead()
            if dead:
                raise RuntimeError(f"{dead[0].name} exited with {dead[0].popen.returncode} during the run:\n"
                                   f"{dead[0].tail()}")
            for r, p in pids.items():
                rss[r].append(status_kib(p, "VmRSS"))
        c1 = {r: cpu_seconds(p) for r, p in pids.items()}
        w1, wall1 = time.monotonic(), time.time()
        n1 = {r: netdev_packets(topo.node(i), iface) for r, i in roles.items()}
        out["loadavg_end"] = loadavg()
        if spy is not None:
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()
        wall = w1 - w0
        msgs = read_messages(messages)
        for r, p in pids.items():
            half = rss[r][len(rss[r]) // 2:] or [0]
            d = [b - a for a, b in zip(n0[r], n1[r])]
            node = f"fp-{r}"
            out[r] = {
                "cpu_s": c1[r] - c0[r], "wall_s": wall, "startup_cpu_s": c0[r],
                "total_wall_s": w1 - t_start + 0.0,
                "thread_cpu_s": thread_split(p, th0[r], thread_cpu_seconds(p)),
                "hwm_kib": status_kib(p, "VmHWM"), "rss_kib": status_kib(p, "VmRSS"),
                "rss_steady_kib": sorted(half)[len(half) // 2], "rss_sampled_max_kib": max(rss[r] or [0]),
                "rss_parts_kib": {k: status_kib(p, k) for k in ("RssAnon", "RssFile", "RssShmem")},
                "port_pps": (d[0] + d[1]) / wall, "port_rx_pps": d[0] / wall, "port_tx_pps": d[1] / wall,
                "port_mbps": (d[2] + d[3]) / wall / 1e6,
                "port_bytes_per_packet": (d[2] + d[3]) / max(1, d[0] + d[1]),
                "summaries": sum(1 for m in msgs if m["msg"].get("kind") == "summary"
                                 and m["msg"].get("node") == node and wall0 <= m["recv"] <= wall1),
            }
        st = [s for s in read_steps(steps[0]) if wall0 <= s[1] <= wall1]
        out["steps_per_s"] = len(st) / wall
        return out
    finally:
        procs.stop()
        topo.teardown()
        restore()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def report_traffic(a: argparse.Namespace) -> int:
    """Run :func:`run_traffic` and print the busy-port agent next to the idle-port one."""
    try:
        r = run_traffic(a.minutes, a.warmup, a.message_mb, a.period_ms, a.gso == "on", a.netns_prefix,
                        a.subnet, a.py_spy, a.keep)
    except (RuntimeError, OSError, TimeoutError) as e:
        print(f"agent footprint (traffic): could not run: {e}", file=sys.stderr)
        return 1
    t, i = r["traffic"], r["idle"]
    print(f"agent footprint under real traffic: 2 ranks, {r['runtime']} all-reduce of {r['message_mb']:g} MB every "
          f"{r['period_ms']:g} ms ({r['steps_per_s']:.1f} steps/s measured), GSO {'on' if r['gso'] else 'off'}; "
          f"{t['wall_s'] / 60:.1f} min measured after {a.warmup:g} s warm-up; load average {r['loadavg_start']} "
          f"at the start, {r['loadavg_end']} at the end ({os.cpu_count()} CPUs)")
    for name, x in (("busy port", t), ("idle port (same run)", i)):
        th = {k: 100.0 * v / x["wall_s"] for k, v in x["thread_cpu_s"].items()}
        print(f"  {name}: captured port {x['port_pps']:,.0f} pkt/s (rx {x['port_rx_pps']:,.0f}, tx "
              f"{x['port_tx_pps']:,.0f}; {x['port_mbps']:.1f} MB/s, {x['port_bytes_per_packet']:,.0f} B/packet); "
              f"CPU {100.0 * x['cpu_s'] / x['wall_s']:.2f} % of one core ({x['cpu_s']:.1f} s in {x['wall_s']:.0f} s; "
              f"main thread {th['main_thread']:.2f} %, others {th['other_threads']:.2f} %"
              + (f" of which kernel {th['other_threads_sys']:.2f} %, busiest {th['busiest_other_thread']:.2f} %"
                 if "busiest_other_thread" in th else "") + "); "
              f"RSS peak {x['hwm_kib'] / 1024:.1f} MiB ({x['hwm_kib'] * 1024 / 1e6:.1f} MB), steady "
              f"{x['rss_steady_kib'] / 1024:.1f} MiB (median of the second half's 5 s samples) = at end "
              + " + ".join(f"{v / 1024:.1f} {k[3:].lower()}" for k, v in x["rss_parts_kib"].items())
              + f"; {x['summaries']} summaries")
    ratio = t["cpu_s"] / i["cpu_s"] if i["cpu_s"] > 0 else float("inf")
    print(f"  busy / idle: CPU {ratio:.2f}x, peak RSS {t['hwm_kib'] / max(1, i['hwm_kib']):.2f}x   "
          f"(goal for the busy port: <= 1 % of a core, <= 80 MB)")
    if a.json:
        print(json.dumps({"benchmark": "agent_footprint_traffic", **r}))
    return 0


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
    ap.add_argument("--traffic", choices=("none", "gloo"), default="none",
                    help="gloo: real collective traffic on the captured port (root; namespaces, torch with gloo)")
    ap.add_argument("--message-mb", type=float, default=2.0, help="--traffic: all-reduce message per step (MB)")
    ap.add_argument("--period-ms", type=float, default=40.0, help="--traffic: step period (ms)")
    ap.add_argument("--gso", choices=("on", "off"), default="on",
                    help="--traffic: off sets gso_max_segs 1 on the collective veths, so TCP hands the capture "
                         "one MSS per packet (many more, smaller packets) instead of GSO super-packets")
    ap.add_argument("--netns-prefix", default=os.environ.get("SKEWD_BENCH_NETNS_PREFIX", "skwbench-"),
                    help="--traffic: prefix of the namespaces it creates (<prefix>fp-*; default "
                         "$SKEWD_BENCH_NETNS_PREFIX or skwbench-)")
    ap.add_argument("--subnet", default=os.environ.get("SKEWD_BENCH_SUBNET", "10.78.0.0/16"),
                    help="--traffic: IPv4 subnet inside those namespaces (a layer-2 island, no route to the host)")
    ap.add_argument("--keep", metavar="DIR", help="--traffic: keep configs, logs and the NATS record in DIR")
    a = ap.parse_args(argv)
    if a.traffic == "gloo":
        return report_traffic(a)
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
