"""The spool on a bad day: a full filesystem (a real tmpfs, filled), a process killed mid-write,
a permissive umask, and what each fsync policy actually does."""
from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skewd.agent.spool import Spool, SpoolUnavailable

from .diskfull import SmallFs, mount_small_fs


@pytest.fixture
def smallfs(tmp_path: Path):
    yield from mount_small_fs(tmp_path / "fs", 256 * 1024)


def _append(sp: Spool, i: int, size: int = 200) -> int:
    return sp.append(f"skewd.v1.finding.c.n.R-{i}", {"Nats-Msg-Id": f"id-{i}"}, bytes([i % 256]) * size)


def _ids(sp: Spool) -> list[str]:
    return [r.headers["Nats-Msg-Id"] for r in sp.peek(1_000_000)]


def test_full_disk_keeps_records_in_memory_in_order_and_returns_to_disk(smallfs: SmallFs, caplog) -> None:
    caplog.set_level(logging.WARNING, "skewd.agent.spool")
    d = smallfs.path / "spool"
    sp = Spool(d)
    try:
        for i in range(20):
            _append(sp, i)
        smallfs.fill()
        for i in range(20, 60):  # the disk soon refuses these (the segment's last page may take a few): none may raise
            _append(sp, i)
        assert sp.degraded and 20 <= sp.in_memory <= 40 and sp.lost == 0 and sp.write_errors >= 1
        assert "No space left" in sp.last_error
        assert _ids(sp) == [f"id-{i}" for i in range(60)]  # what was on disk first, then memory, in order
        # no partial record left behind: the files hold exactly the whole records indexed
        assert sum(p.stat().st_size for p in d.glob("*.seg")) == sp.stats()["disk_bytes"]
        # consuming works while full: acks of disk and memory records
        sp.ack(sp.peek(30)[-1].seq)
        assert _ids(sp) == [f"id-{i}" for i in range(30, 60)]
        smallfs.free()
        sp.maintain()  # what the publisher's timer calls: held records go back to disk
        assert not sp.degraded and sp.in_memory == 0
        _append(sp, 60)
        assert sp.in_memory == 0
        assert any("takes writes again" in r.message for r in caplog.records)
    finally:
        sp.close()
    with Spool(d) as sp2:  # everything not acked survived on disk, in order, nothing counted lost
        assert _ids(sp2) == [f"id-{i}" for i in range(30, 61)]
        assert sp2.dropped == 0 and sp2.corrupt == 0


def test_memory_overflow_refuses_and_counts_what_it_cannot_keep(smallfs: SmallFs) -> None:
    d = smallfs.path / "spool"
    with Spool(d, memory_bytes=2000) as sp:
        _append(sp, 0)
        smallfs.fill()
        kept = refused = 0
        for i in range(1, 30):
            try:
                _append(sp, i)
                kept += 1
            except SpoolUnavailable:
                refused += 1
        assert sp.in_memory and refused and sp.lost == refused
        assert len(_ids(sp)) == 1 + kept  # the kept ones are all still there, on disk or in memory
        smallfs.free()
        _append(sp, 99)  # the next append writes the held records first, then itself
        assert sp.in_memory == 0 and _ids(sp)[-1] == "id-99" and len(_ids(sp)) == 2 + kept


def test_a_partial_write_is_cut_back_to_whole_records(smallfs: SmallFs) -> None:
    d = smallfs.path / "spool"
    with Spool(d, segment_bytes=1 << 20) as sp:
        _append(sp, 0, size=100)
        smallfs.fill()
        smallfs.filler.unlink()
        # leave ~1.5 pages free: a 6 KiB record starts to be written and runs out of room
        with open(smallfs.filler, "wb") as f:
            f.write(b"\0" * (smallfs.size - smallfs.used() - 6144))
        for i in range(1, 4):
            _append(sp, i, size=6000)
        assert sp.in_memory >= 1 and sp.write_errors >= 1
        assert sum(p.stat().st_size for p in d.glob("*.seg")) == sp.stats()["disk_bytes"]
        on_disk = sp.depth - sp.in_memory
    with Spool(d) as sp2:  # reopening finds no torn record: the cut left whole records only
        assert sp2.corrupt == 0 and _ids(sp2) == [f"id-{i}" for i in range(on_disk)]


def test_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        d = tmp_path / "var" / "spool" / "node1"
        with Spool(d) as sp:
            _append(sp, 0)
            sp.ack(sp.peek(1)[0].seq)  # writes state.json
            _append(sp, 1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "var").stat().st_mode) == 0o700  # parents it had to create too
    files = list(d.iterdir())
    assert {p.name for p in files} >= {"lock", "state.json"} and any(p.suffix == ".seg" for p in files)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), [(p.name, oct(p.stat().st_mode)) for p in files]


def test_an_old_world_readable_spool_is_tightened_on_open(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    with Spool(d) as sp:
        _append(sp, 0)
    os.chmod(d, 0o777)
    for p in d.iterdir():
        os.chmod(p, 0o666)
    with Spool(d) as sp:
        assert _ids(sp) == ["id-0"]
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in d.iterdir() if p.name != "lock")


@pytest.mark.parametrize("policy, per_append", [("always", True), ("interval", False), ("never", False)])
def test_fsync_policy_does_what_it_says(tmp_path: Path, monkeypatch, policy: str, per_append: bool) -> None:
    calls: list[int] = []
    real = os.fsync

    def counting_fsync(fd: int) -> None:  # observe the syscalls; the real fsync still runs
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    sp = Spool(tmp_path / "s", fsync=policy, fsync_interval=0.05)
    try:
        calls.clear()
        for i in range(5):
            _append(sp, i)
        assert (len(calls) >= 5) == per_append, calls
        if policy == "interval":  # an idle spool is synced by maintain() once the interval passed
            before = len(calls)
            time.sleep(0.06)
            sp.maintain()
            assert len(calls) == before + 1
            sp.maintain()  # nothing new to sync
            assert len(calls) == before + 1
        if policy == "never":
            time.sleep(0.06)
            sp.maintain()
            assert calls == []
    finally:
        sp.close()
    assert (calls != []) == (policy != "never")  # close syncs unless "never"


_WRITER = r"""
import sys
from skewd.agent.spool import Spool
sp = Spool(sys.argv[1], segment_bytes=1 << 16, fsync="never")
i = int(sys.argv[2])
while True:
    sp.append("s", {"Nats-Msg-Id": f"id-{i}"}, b"x" * (i % 700))
    sys.stdout.write(f"{i}\n")
    sys.stdout.flush()
    i += 1
"""


def test_kill_9_mid_write_loses_no_appended_record(tmp_path: Path) -> None:
    """An append that returned is in the kernel: a SIGKILL at any moment loses none of them and
    leaves no damage a reopen would have to skip (the torn tail, if any, is cut silently)."""
    d = tmp_path / "spool"
    acked: list[int] = []
    reported = 0
    nxt = 0
    for round_ in range(12):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, str(d), str(nxt)], stdout=subprocess.PIPE, text=True)
        seen = []
        deadline = time.monotonic() + 10
        assert p.stdout is not None
        while len(seen) < 200 + 97 * round_ % 400 and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            seen.append(int(line))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        acked += seen
        reported += len(seen)
        with Spool(d) as sp:
            ids = [int(r.headers["Nats-Msg-Id"][3:]) for r in sp.peek(1_000_000)]
            assert sp.corrupt == 0
        assert ids[: len(acked)] == acked, f"round {round_}: lost or reordered records"
        assert ids == sorted(set(ids))
        nxt = ids[-1] + 1
        acked = ids  # a record written but not yet reported is kept too
    print(f"\nkill -9: 12 kills mid-append, {reported} appends reported done, {len(ids)} records on disk, "
          "0 lost, 0 reordered")
