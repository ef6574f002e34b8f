"""The ``nccl`` collector: per-rank collective timing from the NCCL Inspector profiler plugin.

Thin I/O: follow the JSON files of the Inspector's dump directory (:mod:`.tail`), re-read its
Prometheus textfiles when they change, hand every record to the :class:`~.reduce.Reducer` and
emit what it reduced for the interval. Parsing is in :mod:`.parse`, matching in :mod:`.reduce`.
Only this host's records count (``hostname``): a dump directory on a shared file system holds
every node's files, and timestamps of different hosts do not compare.
"""
from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any, Mapping

from skewd.collectors.base import Availability, Collector, Status
from skewd.model import BatchBuilder, SampleBatch

from . import parse
from .catalogue import CATALOGUE
from .reduce import Reducer
from .tail import DirTailer

log = logging.getLogger(__name__)

#: suffixes of compressed rotations: never text to follow
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip")
#: a Prometheus textfile larger than this is refused (the Inspector's are a few KB per GPU)
MAX_TEXTFILE_BYTES = 4 << 20
#: how many problems of one file are logged before the rest are only counted
_LOG_PER_FILE = 3
PROM_PREFIX, PROM_SUFFIX = "nccl_inspector_metrics_", ".prom"


def _path(config: Mapping[str, Any], key: str) -> Path | None:
    v = config.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"collectors.nccl.{key}: expected a path, got {v!r}")
    p = Path(v)
    if not p.is_absolute():
        raise ValueError(f"collectors.nccl.{key}: {v!r} must be an absolute path (the agent's working "
                         "directory is not the NCCL job's)")
    return p


def _hostname(config: Mapping[str, Any]) -> str:
    v = config.get("hostname")
    if v is None:
        return socket.gethostname()
    if not isinstance(v, str) or not v or any(c.isspace() or c == "/" for c in v):
        raise ValueError(f"collectors.nccl.hostname: expected a host name as NCCL processes report it "
                         f"(or \"*\" for any), got {v!r}")
    return v


def _max_read(config: Mapping[str, Any]) -> int:
    v = config.get("max_read_bytes", 8 << 20)
    if isinstance(v, bool) or not isinstance(v, int) or not (64 << 10) <= v <= (1 << 30):
        raise ValueError(f"collectors.nccl.max_read_bytes: expected an integer from 65536 to "
                         f"1073741824, got {v!r}")
    return v


class NcclCollector(Collector):
    name = "nccl"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"dump_dir", "textfile", "hostname", "max_read_bytes"})
    config_docs = {
        "dump_dir": ("none", "the jobs' `NCCL_INSPECTOR_DUMP_DIR` as the agent sees it (absolute path)"),
        "textfile": ("none", "an Inspector `.prom` file, or a directory of `nccl_inspector_metrics_*.prom`"),
        "hostname": ("this host's name", "the `metadata.hostname` the jobs report; other hosts' files are "
                     "skipped (`\"*\"` for node-local dump directories in Kubernetes)"),
        "max_read_bytes": ("`8388608`", "at most this much is read per collection (the rest next time)"),
    }

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        super().__init__(node, config, sys_root, proc_root)
        self.dump_dir = _path(self.config, "dump_dir")
        self.textfile = _path(self.config, "textfile")
        self.hostname = _hostname(self.config)
        self.max_read = _max_read(self.config)
        self.reducer = Reducer()
        self.tailer: DirTailer[parse.JsonStream] | None = None
        if self.dump_dir is not None:
            self.tailer = DirTailer(self.dump_dir, self._accept_json, parse.JsonStream,
                                    live=lambda n: n.endswith(".log"), max_bytes=self.max_read)
        #: textfile path → (inode, size, mtime_ns) last parsed: an unchanged file is not re-read
        self._textfile_seen: dict[Path, tuple[int, int, int]] = {}
        #: bad lines per file: a broken file is logged a few times, then only counted
        self._problem_counts: dict[str, int] = {}
        self._foreign: set[str] = set()
        self._aggregated_warned = False
        #: the latest problem (also logged): why records are missing, for ``unavailable_reason``
        self.last_problem = ""

    def _problem(self, file: str, where: str, msg: str, stage: str = "parse") -> None:
        """Count a bad line or series (self-telemetry), keep it for ``unavailable_reason`` and log
        the first few of each file."""
        self.stats.error(stage)
        self.last_problem = f"{where}: {msg}"
        n = self._problem_counts[file] = self._problem_counts.get(file, 0) + 1
        if n <= _LOG_PER_FILE:
            log.warning("nccl: %s: %s%s", where, msg,
                        " (further problems in this file are only counted)" if n == _LOG_PER_FILE else "")

    # -- which files --------------------------------------------------------------------------------
    def _accept_json(self, name: str) -> bool:
        """``<hostname>-pid<pid>.log`` and its rotations; another host's files are not ours."""
        if name.startswith(".") or name.endswith(_COMPRESSED) or ".log" not in name:
            return False
        if self.hostname == "*":
            return True
        if name.startswith(f"{self.hostname}-pid"):
            return True
        host = name.split("-pid", 1)[0] if "-pid" in name else ""
        if host and host not in self._foreign:
            self._foreign.add(host)
            log.info("nccl: skipping %s/%s: written by host %r, this node reads %r "
                     "(collectors.nccl.hostname)", self.dump_dir, name, host, self.hostname)
        return False

    def _textfiles(self) -> list[Path]:
        p = self.textfile
        if p is None:
            return []
        if p.is_dir():
            try:
                return sorted(q for q in p.iterdir()
                              if q.name.startswith(PROM_PREFIX) and q.name.endswith(PROM_SUFFIX))
            except OSError:
                return []
        return [p] if p.exists() else []

    # -- lifecycle ----------------------------------------------------------------------------------
    def probe(self) -> Status:
        try:
            return self._probe()
        except Exception as e:  # probe never raises
            return Status(Availability.UNAVAILABLE, f"nccl probe failed unexpectedly: {e!r}")

    def _probe(self) -> Status:
        if self.dump_dir is None and self.textfile is None:
            return Status(Availability.NEEDS_OPERATOR if self.config.get("required") else Availability.ABSENT,
                          "no NCCL Inspector output configured: set collectors.nccl.dump_dir to the "
                          "jobs' NCCL_INSPECTOR_DUMP_DIR (JSON mode) or collectors.nccl.textfile to "
                          "its Prometheus textfile directory (NCCL_INSPECTOR_PROM_DUMP=1)")
        ok: list[str] = []
        bad: list[str] = []
        for key, path, what in (("dump_dir", self.dump_dir, "JSON"), ("textfile", self.textfile, "textfile")):
            if path is None:
                continue
            state = _path_state(path, want_dir=key == "dump_dir")
            if state:
                bad.append(f"collectors.nccl.{key} {path}: {state}")
                continue
            if key == "dump_dir":
                ok.append(self._describe_dump_dir())
            else:
                n = len(self._textfiles())
                ok.append(f"textfile {path} ({n} Inspector .prom file(s))" if path.exists()
                          else f"textfile {path} (not written yet)")
        if ok:
            msg = "; ".join(ok + bad)
            return Status(Availability.ACTIVE, msg)
        return Status(Availability.NEEDS_OPERATOR, "; ".join(bad))

    def _describe_dump_dir(self) -> str:
        d = self.dump_dir
        assert d is not None
        if not d.exists():
            return (f"waiting for {d} to appear (NCCL creates it at its first dump; its parent exists)")
        names = [e for e in os.listdir(d) if ".log" in e and not e.endswith(_COMPRESSED)]
        mine = [n for n in names if self._accept_json(n)]
        msg = f"following {d} for host {self.hostname!r}: {len(mine)} Inspector JSON file(s)"
        others = sorted({n.split("-pid", 1)[0] for n in names if n not in mine and "-pid" in n})
        if others:
            msg += (f", skipping {len(names) - len(mine)} of other hosts ({', '.join(others[:5])}; set "
                    "collectors.nccl.hostname if one of them is this node)")
        return msg

    def start(self) -> None:
        super().start()
        if self.tailer is not None:
            self.tailer.prime()  # what is already there is history, not this interval

    def stop(self) -> None:
        super().stop()  # nothing held open between collections

    # -- collection ---------------------------------------------------------------------------------
    def collect(self, t: float) -> SampleBatch:
        if self.tailer is not None:
            self._collect_json(t)
        if self.textfile is not None:
            self._collect_textfiles(t)
        b = BatchBuilder(self.node)
        for ent, sigs in sorted(self.reducer.close(t).items()):
            for sig, v in sigs.items():
                b.add(t, ent, sig, v)
        return b.build()

    def _take(self, rec: parse.Record, t: float) -> None:
        if self.hostname != "*" and rec.hostname != self.hostname:
            self.stats.discarded += 1
            if rec.hostname not in self._foreign:
                self._foreign.add(rec.hostname)
                log.info("nccl: skipping records of host %r, this node reads %r (collectors.nccl.hostname)",
                         rec.hostname, self.hostname)
            return
        if not self.reducer.add(rec, t):
            self.stats.discarded += 1

    def _collect_json(self, t: float) -> None:
        assert self.tailer is not None
        res = self.tailer.poll()
        for ev in res.events:
            log.info("nccl: %s", ev)
        for chunk in res.files:
            for line_no, line in chunk.lines:
                try:
                    rec = chunk.context.feed(line)
                except parse.OrphanPayload:
                    self.stats.discarded += 1  # picked up mid-dump: the next marker restores context
                    continue
                except parse.RecordError as e:
                    path = f"{self.dump_dir}/{chunk.name}"
                    where = f"{path}:{line_no}" if line_no else f"{path} (a line read after resuming mid-file)"
                    self._problem(path, where, f"{e}; line skipped (is this NCCL Inspector JSON output?)")
                    continue
                if rec is not None:
                    self._take(rec, t)

    def _collect_textfiles(self, t: float) -> None:
        for path in self._textfiles():
            try:
                st = path.stat()
                sig = (st.st_ino, st.st_size, st.st_mtime_ns)
                if self._textfile_seen.get(path) == sig:
                    continue
                if st.st_size > MAX_TEXTFILE_BYTES:
                    raise OSError(f"{st.st_size} bytes, over {MAX_TEXTFILE_BYTES}: not an Inspector textfile?")
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError as e:
                self._problem(str(path), str(path), str(e), stage="read")
                continue
            try:
                tf = parse.parse_textfile(text)
            except ValueError as e:
                self._problem(str(path), str(path), f"not Prometheus text ({e})")
                continue
            self._textfile_seen[path] = sig
            if tf.aggregated and not self._aggregated_warned:
                self._aggregated_warned = True
                self.last_problem = (f"{path}: aggregated Inspector v5 series (no rank, no coll_sn) carry no "
                                     "per-rank timing; use JSON mode (collectors.nccl.dump_dir)")
                log.warning("nccl: %s", self.last_problem)
            for p in tf.problems:
                self._problem(str(path), str(path), p)
            for rec in tf.records:
                self._take(rec, t)
        for path in list(self._textfile_seen):
            if not path.exists():
                del self._textfile_seen[path]

    def unavailable_reason(self, signal_name: str) -> str:
        return self.last_problem or super().unavailable_reason(signal_name)


def _path_state(path: Path, want_dir: bool) -> str:
    """"" when ``path`` is usable (or can still appear), else what an operator must fix."""
    if path.exists():
        if want_dir and not path.is_dir():
            return "exists but is not a directory"
        if path.is_dir() and not os.access(path, os.R_OK | os.X_OK):
            return "not readable by the agent (permissions)"
        if path.is_file() and not os.access(path, os.R_OK):
            return "not readable by the agent (permissions)"
        return ""
    parent = path.parent
    if not parent.is_dir():
        return (f"does not exist, nor does its parent {parent} (NCCL creates only the last "
                "directory: check the path)")
    return ""
