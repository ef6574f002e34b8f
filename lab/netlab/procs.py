"""Real processes inside the lab's namespaces, each with its own log file in the run directory.

Every process is started with ``ip netns exec`` (so it sees only its namespace's interfaces,
``/sys/class/net`` and ``/proc/net``, as on its own host) in a session of its own, and stopped
in the reverse order of starting: SIGTERM to its process group, SIGKILL after a grace period.
Whatever escapes (a crash of the runner itself) is still inside a lab namespace, where
:func:`skewd.lab.netlab.topology.cleanup` finds it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence


@dataclass
class Proc:
    name: str
    ns: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Procs:
    """Owns every process of one lab run (start, health check, ordered stop)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []

    def start(self, name: str, ns: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None) -> Proc:
        log = self.log_dir / f"{name}.log"
        fh = open(log, "ab")
        full_env = {**os.environ, **(env or {})}
        try:
            p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=fh, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=full_env, cwd=cwd, start_new_session=True)
        finally:
            fh.close()
        proc = Proc(name, ns, p, log)
        self.procs.append(proc)
        return proc

    def dead(self) -> list[Proc]:
        return [p for p in self.procs if not p.alive()]

    def stop(self, procs: Sequence[Proc] | None = None, grace: float = 10.0) -> None:
        """SIGTERM (to the process group), wait up to ``grace``, then SIGKILL; idempotent."""
        targets = list(reversed(self.procs if procs is None else procs))
        for p in targets:
            if p.alive():
                _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in targets:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p.pid, signal.SIGKILL)
                try:
                    p.popen.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        if procs is None:
            self.procs.clear()
        else:
            self.procs = [p for p in self.procs if p not in procs]


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
