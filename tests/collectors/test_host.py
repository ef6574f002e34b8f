"""host collector over real and constructed /proc trees, and against this machine's /proc."""
from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from skewd.collectors.base import Availability, CollectorError
from skewd.collectors.host import COLLECTOR as Host
from skewd.model import SampleBatch

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "host"
VM = FIX / "vm-2cpu-linux-6.18" / "proc"  # real: copied from this build VM
BIG = FIX / "constructed-16cpu-cpu5-offline" / "proc"  # constructed, see its NOTE.md


def values(batch: SampleBatch) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for _, _, e, s, v in batch.rows():
        assert (e, s) not in out, f"duplicate {e} {s}"
        out[(e, s)] = v
    return out


def test_real_vm_proc_values() -> None:
    # cpu0 line: 26971 0 5407 783676 277 0 198 1575 0 0 (USER_HZ ticks)
    v = values(Host("n", proc_root=VM).collect(4.0))
    assert v[("cpu0", "host_cpu_user_seconds_total")] == pytest.approx(269.71)
    assert v[("cpu0", "host_cpu_system_seconds_total")] == pytest.approx(54.07)
    assert v[("cpu0", "host_cpu_softirq_seconds_total")] == pytest.approx(1.98)
    assert v[("cpu0", "host_cpu_steal_seconds_total")] == pytest.approx(15.75)
    assert v[("cpu0", "host_cpu_idle_seconds_total")] == pytest.approx(7836.76)
    assert v[("cpu0", "host_cpu_busy_seconds_total")] == pytest.approx((26971 + 5407 + 198) / 100)
    # node line: 76415 0 11968 1542936 1607 0 353 3122 0 0
    assert v[("", "host_node_cpu_busy_seconds_total")] == pytest.approx((76415 + 11968 + 353) / 100)
    assert v[("", "host_node_cpu_iowait_seconds_total")] == pytest.approx(16.07)
    assert v[("", "host_cpus_online")] == 2
    assert v[("", "host_procs_running")] == 4
    assert v[("cpu1", "host_softirq_net_rx_total")] == 16616
    assert v[("cpu0", "host_softirq_net_tx_total")] == 687
    assert v[("", "host_tcp_retrans_segs_total")] == 2
    assert v[("", "host_tcp_out_segs_total")] == 25281
    assert v[("", "host_tcp_in_segs_total")] == 36530
    assert v[("", "host_tcp_out_rsts_total")] == 314
    assert v[("", "host_load1")] == 2.37 and v[("", "host_load15")] == 0.88
    # /proc/net/netstat TcpExt: every tail-loss probe of this VM was answered by a D-SACK
    assert v[("", "host_tcp_loss_probes_total")] == 358
    assert v[("", "host_tcp_dsack_recv_total")] == v[("", "host_tcp_dsack_recv_segs_total")] == 358
    assert v[("", "host_tcp_timeouts_total")] == 2
    assert v[("", "host_tcp_orig_data_sent_total")] == 56769
    assert v[("", "host_ip_in_ce_packets_total")] == 0
    assert {e for e, _ in v} == {"", "cpu0", "cpu1"}


NETNS = FIX / "netns-veth-linux-6.18"  # real: namespaces on a veth bridge, see its NOTE.md


def kernel_delta(scenario: str) -> dict[str, float]:
    """Increase of every node counter between the scenario's two real snapshots (20 s apart)."""
    a = values(Host("n", proc_root=NETNS / scenario / "t0" / "proc").collect(0.0))
    b = values(Host("n", proc_root=NETNS / scenario / "t1" / "proc").collect(20.0))
    return {s: b[("", s)] - a[("", s)] for e, s in b if e == "" and s.endswith("_total")}


def unconfirmed_share(d: dict[str, float]) -> float:
    """Resent segments no D-SACK called spurious, per data segment sent (first time or again)."""
    resent = d["host_tcp_retrans_segs_total"]
    return (resent - d["host_tcp_dsack_recv_segs_total"]) / (d["host_tcp_orig_data_sent_total"] + resent)


def test_kernel_loss_classification_in_real_namespaces() -> None:
    """What EW-6-tcp-loss-storm reads, on real snapshots: a healthy node resends hundreds of
    segments but its peers D-SACK nearly all of them; a node behind a dropping qdisc or link
    resends with no D-SACK; a node whose peer's ACKs are dropped resends too, but the
    D-SACKs and undone timeouts show it spurious."""
    healthy = kernel_delta("healthy")
    assert healthy["host_tcp_retrans_segs_total"] == 441 and healthy["host_tcp_dsack_recv_segs_total"] == 407
    assert healthy["host_tcp_loss_probes_total"] == 6 and healthy["host_tcp_fast_retransmits_total"] == 438
    assert healthy["host_tcp_timeouts_total"] == 0
    assert unconfirmed_share(healthy) < 1e-4
    tbf = kernel_delta("tbf-drops")
    assert tbf["host_tcp_timeouts_total"] == 1196 and tbf["host_tcp_retrans_fail_total"] == 4979
    assert tbf["host_tcp_dsack_recv_segs_total"] == 0 and unconfirmed_share(tbf) > 0.5
    wire = kernel_delta("wire-drop-sender")
    assert wire["host_tcp_lost_retransmits_total"] == 11701 and unconfirmed_share(wire) > 0.2
    for victim in ("wire-drop-ack-victim", "pfifo-ack-victim"):
        d = kernel_delta(victim)
        assert d["host_tcp_timeouts_total"] > 0
        assert d["host_tcp_loss_undo_total"] == d["host_tcp_timeouts_total"], victim  # every RTO undone
        assert unconfirmed_share(d) < 1e-3, victim


def test_netstat_fields_missing_on_an_older_kernel_are_not_emitted(tmp_path: Path) -> None:
    """A kernel without TCPDSACKRecvSegs (older than the fixtures' 6.18) leaves it out: rules
    reading it see no data there rather than a zero. NOTE: the netstat here is the real 6.18
    file with that one column removed, to stand for an older kernel's layout."""
    shutil.copytree(VM, tmp_path / "proc")
    path = tmp_path / "proc" / "net" / "netstat"
    lines = path.read_text().splitlines()
    head, vals = lines[0].split(), lines[1].split()
    k = head.index("TCPDSACKRecvSegs")
    lines[0], lines[1] = " ".join(head[:k] + head[k + 1:]), " ".join(vals[:k] + vals[k + 1:])
    path.write_text("\n".join(lines) + "\n")
    v = values(Host("n", proc_root=tmp_path / "proc").collect(0.0))
    assert ("", "host_tcp_dsack_recv_segs_total") not in v
    assert v[("", "host_tcp_dsack_recv_total")] == 358 and v[("", "host_tcp_loss_probes_total")] == 358


def test_node_aggregate_equals_the_sum_of_cpus_when_all_are_online() -> None:
    """Within a few ticks: the kernel formats the aggregate and the per-CPU lines at slightly
    different moments (this real capture has system 11968 vs 5407 + 6560 = 11967)."""
    v = values(Host("n", proc_root=VM).collect(0.0))
    for mode in ("user", "system", "softirq", "idle", "busy", "steal"):
        total = v[("cpu0", f"host_cpu_{mode}_seconds_total")] + v[("cpu1", f"host_cpu_{mode}_seconds_total")]
        assert v[("", f"host_node_cpu_{mode}_seconds_total")] == pytest.approx(total, abs=0.05)


def test_large_layout_with_an_offline_cpu_and_a_net_rx_hot_spot() -> None:
    v = values(Host("n", proc_root=BIG).collect(0.0))
    cpu_time = {e for e, s in v if s == "host_cpu_busy_seconds_total"}
    assert cpu_time == {f"cpu{i}" for i in range(16)} - {"cpu5"}
    assert v[("", "host_cpus_online")] == 15
    # /proc/softirqs has a column per possible CPU, offline cpu5 included
    rx = {e: val for (e, s), val in v.items() if s == "host_softirq_net_rx_total"}
    assert len(rx) == 16 and "cpu5" in rx
    assert max(rx, key=rx.get) == "cpu3" and rx["cpu3"] == 912345678
    assert v[("cpu3", "host_cpu_softirq_seconds_total")] == 19000.0
    # the aggregate keeps offline cpu5's time, so it exceeds the online CPUs' sum
    online_busy = sum(val for (e, s), val in v.items() if s == "host_cpu_busy_seconds_total")
    assert v[("", "host_node_cpu_busy_seconds_total")] > online_busy
    assert v[("", "host_tcp_retrans_segs_total")] == 41234567
    assert v[("", "host_udp_rcvbuf_errors_total")] == 31870


def test_cpu_time_that_steps_backwards_is_held(tmp_path: Path) -> None:
    """proc(5): per-CPU iowait/idle may decrease; that must not look like a counter reset."""
    root = tmp_path / "proc"
    shutil.copytree(VM, root)
    c = Host("n", proc_root=root)
    v1 = values(c.collect(1.0))
    stat = (root / "stat").read_text()
    # cpu1 iowait 1330 → 1200 (backwards), idle 759259 → 759400 (forwards)
    (root / "stat").write_text(stat.replace("cpu1 49444 0 6560 759259 1330", "cpu1 49444 0 6560 759400 1200"))
    v2 = values(c.collect(2.0))
    assert v2[("cpu1", "host_cpu_iowait_seconds_total")] == v1[("cpu1", "host_cpu_iowait_seconds_total")] == 13.30
    assert v2[("cpu1", "host_cpu_idle_seconds_total")] == pytest.approx(7594.00)
    (root / "stat").write_text(stat.replace("cpu1 49444 0 6560 759259 1330", "cpu1 49444 0 6560 759500 1400"))
    v3 = values(c.collect(3.0))
    assert v3[("cpu1", "host_cpu_iowait_seconds_total")] == pytest.approx(14.00)


def test_missing_files(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text((VM / "stat").read_text())
    c = Host("n", proc_root=tmp_path)
    st = c.probe()
    assert st.availability is Availability.ACTIVE
    assert "softirqs" in st.reason and "snmp" in st.reason and "netstat" in st.reason
    sigs = c.collect(0.0).signals()
    assert "host_cpu_busy_seconds_total" in sigs and "host_tcp_retrans_segs_total" not in sigs
    empty = Host("n", proc_root=tmp_path / "nothing")
    st = empty.probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "nothing/stat" in st.reason
    with pytest.raises(CollectorError):
        empty.collect(0.0)


def test_config_validation_and_loadavg_switch() -> None:
    with pytest.raises(ValueError, match="user_hz"):
        Host("n", {"user_hz": "100"})
    assert "host_load1" not in Host("n", {"loadavg": False}, proc_root=VM).collect(0.0).signals()
    v = values(Host("n", {"user_hz": 1000}, proc_root=VM).collect(0.0))
    assert v[("cpu0", "host_cpu_user_seconds_total")] == pytest.approx(26.971)


def test_catalogue_covers_exactly_what_the_fixtures_emit() -> None:
    cat = {s.name: s for s in Host.catalogue}
    emitted = Host("n", proc_root=VM).collect(0.0).signals() | Host("n", proc_root=BIG).collect(0.0).signals()
    assert emitted - set(cat) == set()
    assert set(cat) - emitted == set()
    for s in cat.values():
        assert s.collector == "host"
        assert s.name.endswith("_total") == (s.kind.value == "counter")
    b = Host("n", proc_root=BIG).collect(0.0)
    for _, _, e, sig, _ in b.rows():  # entity shape matches the declared scope
        assert (cat[sig].scope.value == "cpu") == e.startswith("cpu")
        assert (cat[sig].scope.value == "node") == (e == "")


def test_probe_and_collect_on_this_host() -> None:
    c = Host("here")
    st = c.probe()
    assert st.availability is Availability.ACTIVE, st
    c.start()
    v = values(c.collect(1.0))
    c.stop()
    c.stop()
    assert v[("", "host_cpus_online")] == os.cpu_count()
    assert {e for e, s in v if s == "host_cpu_busy_seconds_total"} == {f"cpu{i}" for i in range(os.cpu_count() or 0)}


def test_busy_time_follows_real_cpu_burn_on_the_pinned_core() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    c = Host("here")
    result: dict[str, float] = {}

    def burn() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        t0 = time.thread_time()
        end = time.monotonic() + 0.6
        x = 0
        while time.monotonic() < end:
            x += 1
        result["used"] = time.thread_time() - t0

    before = values(c.collect(0.0))
    th = threading.Thread(target=burn)
    th.start()
    th.join()
    after = values(c.collect(1.0))
    key = (f"cpu{cpu}", "host_cpu_busy_seconds_total")
    # tick-sampled accounting: allow a few 10 ms ticks of slack
    assert after[key] - before[key] >= result["used"] - 0.05
    assert result["used"] > 0.1  # the burn really ran


def test_tcp_segments_sent_over_loopback_are_counted() -> None:
    c = Host("here")
    before = values(c.collect(0.0))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    n = 50
    for _ in range(n):
        cli.sendall(b"x" * 100)
        peer.recv(100)
    for s in (cli, peer, srv):
        s.close()
    after = values(c.collect(1.0))
    # both ends are on this host: >= n data segments out and in, plus handshake/ACKs
    assert after[("", "host_tcp_out_segs_total")] - before[("", "host_tcp_out_segs_total")] >= n
    assert after[("", "host_tcp_in_segs_total")] - before[("", "host_tcp_in_segs_total")] >= n


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="creating a network namespace needs root")
@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip to create the namespace")
def test_net_counters_come_from_the_configured_namespace() -> None:
    """With ``netns`` the TCP counters are the namespace's own: traffic inside it shows there
    and not in this process's namespace, which the collector without ``netns`` keeps reading."""
    import subprocess
    from skewd.collectors.netdev.netns import run_in_netns

    ns = f"skt-host-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=10)
        inside, outside = Host("n", {"netns": ns}), Host("n")
        assert inside.probe().availability is Availability.ACTIVE and ns in inside.probe().reason
        assert values(inside.collect(0.0))[("", "host_tcp_out_segs_total")] == 0  # a fresh namespace: nothing sent

        def talk() -> None:
            srv = socket.socket()
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            cli = socket.create_connection(srv.getsockname())
            peer, _ = srv.accept()
            for _ in range(200):
                cli.sendall(b"x" * 100)
                peer.recv(100)
            for s in (cli, peer, srv):
                s.close()

        run_in_netns(ns, talk)
        a_in, a_out = values(inside.collect(1.0)), values(outside.collect(1.0))
        assert a_in[("", "host_tcp_out_segs_total")] >= 200
        # exactly what a process started in the namespace reads (nothing else runs there)
        ref = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp", "/proc/net/netstat"],
                             capture_output=True, text=True, check=True, timeout=10).stdout
        from skewd.collectors.host import parse
        want = {s.signal: s.value for s in parse.parse_snmp(ref) + parse.parse_netstat(ref)}
        assert want["host_tcp_orig_data_sent_total"] >= 200
        assert {sig: a_in[("", sig)] for sig in want} == want
        # the collector without netns reads this process's namespace, which did not see it
        assert a_out[("", "host_tcp_out_segs_total")] != a_in[("", "host_tcp_out_segs_total")]
        # the CPU signals stay machine-wide
        assert a_in[("", "host_cpus_online")] == os.cpu_count()
    finally:
        subprocess.run(["ip", "netns", "del", ns], timeout=10)
    gone = Host("n", {"netns": ns})
    st = gone.probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "not found" in st.reason
    assert "host_tcp_out_segs_total" not in gone.collect(2.0).signals()
    with pytest.raises(ValueError, match="netns"):
        Host("n", {"netns": 3})
