"""Pure: NCCL Inspector output (JSON lines and the Prometheus textfile) → :class:`Record`.

The Inspector (NCCL >= 2.28 profiler plugin, ``ext-profiler/inspector``, later
``plugins/profiler/inspector`` in NVIDIA/nccl) writes, per process, ``<hostname>-pid<pid>.log``
in ``NCCL_INSPECTOR_DUMP_DIR``: compact JSON objects, one per line (``json.cc`` prints no
spaces and ends each object with ``\\n``; doubles with ``%lf``, NaN as the string ``"nan"``).
Two layouts exist, and one file never mixes them:

- **v4.0-v4.2, self-contained records**: every line is
  ``{"header": {id, rank, n_ranks, nnodes}, "metadata": {inspector_output_format_version,
  git_rev, rec_mechanism, dump_timestamp_us, hostname, pid}, "coll_perf": {coll, coll_sn,
  coll_msg_size_bytes, coll_exec_time_us, [coll_timing_source], coll_algobw_gbs,
  coll_busbw_gbs, [event_trace_sn, event_trace_ts]}}``. The dump thread writes the *latest*
  completed collective of each communicator at each dump, so collectives completing faster
  than ``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS`` are sampled, not all written.
- **v4.3+, dump markers**: a ``{"header", "metadata", "dump_stats": {coll_records,
  p2p_records, [proxy_records], ...}}`` line, then that many ``{"coll_perf": ...}``,
  ``{"p2p_perf": ...}`` and ``{"proxy_trace": ...}`` lines that belong to it (the header is
  not repeated). A ring buffer keeps every collective of at least
  ``NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES``. :class:`JsonStream` restores the context as the
  upstream ``inspector_json_reader.py`` does, one stream per file.

``event_trace_ts`` (verbose, ``NCCL_INSPECTOR_DUMP_VERBOSE=1``) holds host wall-clock
microseconds (``gettimeofday`` in the NCCL process): ``kernel_start_ts`` is when the profiler
saw a channel's kernel start. Every process on one host reads the same clock, so start times
of one collective compare across ranks of a node without any clock sync.

Prometheus mode (``NCCL_INSPECTOR_PROM_DUMP=1``, one ``nccl_inspector_metrics_<gpu uuid>.prom``
per GPU, rewritten every >= 30 s with the latest collective per communicator) is parsed by
:func:`parse_textfile` through the exporter collector's Prometheus text reader.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from skewd.collectors.exporter.parse import series

#: the JSON layouts this reader understands (major version 4)
KNOWN_VERSIONS = re.compile(r"^v4\.\d+$")

#: ``message_size`` label units of the Prometheus mode (``inspectorFormatHumanReadableSize``, base 1024)
_SIZE_UNITS = {"B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "TB": 1024 ** 4}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(B|KB|MB|GB|TB)\s*$")

PROM_EXEC = "nccl_collective_exec_time_microseconds"
PROM_BUSBW = "nccl_bus_bandwidth_gbs"
PROM_ALGOBW = "nccl_algorithm_bandwidth_gbs"


class RecordError(ValueError):
    """A line or series that is not a usable Inspector record; ``str(e)`` names the field."""


class OrphanPayload(RecordError):
    """A v4.3+ payload line with no dump marker before it: reading started in the middle of a
    dump (a file picked up at its end, a truncated file). Expected, not an operator problem."""


@dataclass(frozen=True, slots=True)
class Record:
    """One completed collective of one rank, as the Inspector reported it (base units)."""

    comm: str                 #: ``header.id``: the communicator hash, same on every rank
    rank: int
    n_ranks: int
    nnodes: int
    hostname: str
    pid: int | None
    coll: str                 #: AllReduce, ReduceScatter, AllGather, Broadcast, ...
    sn: int                   #: ``coll_sn``: the communicator's collective sequence number
    msg_bytes: float
    exec_s: float             #: ``coll_exec_time_us`` in seconds
    timing_source: str        #: kernel_gpu / kernel_cpu / collective_cpu; "" when not written
    busbw_bps: float | None   #: bytes/s (NCCL's GB/s are 1e9 bytes)
    algobw_bps: float | None
    #: earliest ``kernel_start_ts`` over the channels, µs on the host clock (verbose mode only)
    kernel_start_us: int | None = None


# -- JSON ------------------------------------------------------------------------------------------
def _get(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(obj, dict):
        raise RecordError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise RecordError(f"{where}.{key}: missing")
    return obj[key]


def _int(obj: Mapping[str, Any], key: str, where: str, lo: int = 0) -> int:
    v = _get(obj, key, where)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise RecordError(f"{where}.{key}: expected an integer >= {lo}, got {v!r}")
    return v


def _num(obj: Mapping[str, Any], key: str, where: str) -> float:
    v = _get(obj, key, where)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise RecordError(f"{where}.{key}: expected a non-negative number, got {v!r}")
    return float(v)


def _bw(obj: Mapping[str, Any], key: str) -> float | None:
    """A bandwidth in GB/s → bytes/s; ``"nan"`` (json.cc's NaN) or absent → None."""
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return float(v) * 1e9


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    v = _get(obj, key, where)
    if not isinstance(v, str) or not v:
        raise RecordError(f"{where}.{key}: expected a non-empty string, got {v!r}")
    return v


def _kernel_start(trace: Any) -> int | None:
    """Earliest non-zero ``kernel_start_ts`` of ``event_trace_ts`` (0 = the event never came)."""
    if not isinstance(trace, dict):
        return None
    events = trace.get("kernel_events")
    if not isinstance(events, list):
        return None
    starts = [e.get("kernel_start_ts") for e in events if isinstance(e, dict)]
    starts = [s for s in starts if isinstance(s, int) and not isinstance(s, bool) and s > 0]
    return min(starts) if starts else None


def check_version(metadata: Any) -> str:
    version = _str(metadata, "inspector_output_format_version", "metadata")
    if not KNOWN_VERSIONS.match(version):
        raise RecordError(f"metadata.inspector_output_format_version: {version!r} is not a layout "
                          "this reader knows (v4.0-v4.4); update skewd or report the new format")
    return version


def record_from(header: Any, metadata: Any, perf: Any, top: Mapping[str, Any] | None = None) -> Record:
    """Build a Record from the three parts of one collective; raises RecordError."""
    comm = _str(header, "id", "header")
    n_ranks = _int(header, "n_ranks", "header", 1)
    rank = _int(header, "rank", "header")
    if rank >= n_ranks:
        raise RecordError(f"header.rank: {rank} is not below header.n_ranks {n_ranks}")
    pid = metadata.get("pid") if isinstance(metadata, dict) else None
    trace = perf.get("event_trace_ts") if isinstance(perf, dict) else None
    if trace is None and top is not None:  # tolerated: event traces written beside coll_perf
        trace = top.get("event_trace_ts")
    timing = perf.get("coll_timing_source", "") if isinstance(perf, dict) else ""
    return Record(
        comm=comm, rank=rank, n_ranks=n_ranks, nnodes=_int(header, "nnodes", "header", 1),
        hostname=_str(metadata, "hostname", "metadata"),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        coll=_str(perf, "coll", "coll_perf"),
        sn=_int(perf, "coll_sn", "coll_perf"),
        msg_bytes=_num(perf, "coll_msg_size_bytes", "coll_perf"),
        exec_s=_num(perf, "coll_exec_time_us", "coll_perf") * 1e-6,
        timing_source=timing if isinstance(timing, str) else "",
        busbw_bps=_bw(perf, "coll_busbw_gbs"), algobw_bps=_bw(perf, "coll_algobw_gbs"),
        kernel_start_us=_kernel_start(trace))


@dataclass
class JsonStream:
    """Reads one Inspector JSON file line by line, restoring v4.3+ dump context.

    One instance per file, never shared (the upstream reader's rule): a marker's header and
    metadata apply to the payload lines after it in the same file only. ``reset()`` when the
    file is truncated or reading starts mid-file.
    """

    header: dict | None = None
    metadata: dict | None = None
    remaining: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        self.header, self.metadata, self.remaining = None, None, {}

    def feed(self, line: bytes | str) -> Record | None:
        """The collective on this line, or None for lines that carry none (markers, P2P,
        proxy traces, blank lines). Raises RecordError (OrphanPayload for a payload line with
        no marker before it)."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        line = line.strip().lstrip("\0")  # NULs: a writer without O_APPEND after copytruncate
        if not line:
            return None
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise RecordError(f"not a JSON object ({e})") from None
        except RecursionError:
            raise RecordError("not a JSON object (nested deeper than any Inspector record)") from None
        if not isinstance(obj, dict):
            raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
        if "dump_stats" in obj:
            return self._marker(obj)
        if "header" in obj or "metadata" in obj:  # v4.0-v4.2 self-contained record
            check_version(_get(obj, "metadata", "record"))
            self.reset()
            if "coll_perf" not in obj:
                return None  # a P2P record (p2p_perf) or something newer: no collective
            return record_from(_get(obj, "header", "record"), obj["metadata"], obj["coll_perf"], obj)
        # v4.3+ payload: context from the marker before it
        if len(obj) != 1:
            raise RecordError(f"payload line with {len(obj)} keys {sorted(obj)}; expected one of "
                              "coll_perf, p2p_perf, proxy_trace")
        kind = next(iter(obj))
        if self.header is None:
            raise OrphanPayload(f"{kind} line without a dump_stats marker before it")
        if self.remaining.get(kind, 0) <= 0:
            raise RecordError(f"{kind} line beyond the counts of its dump_stats marker "
                              f"({self.remaining})")
        self.remaining[kind] -= 1
        if kind != "coll_perf":
            return None
        return record_from(self.header, self.metadata, obj["coll_perf"])

    def _marker(self, obj: dict) -> None:
        self.reset()
        header = _get(obj, "header", "dump marker")
        metadata = _get(obj, "metadata", "dump marker")
        check_version(metadata)
        _str(header, "id", "header")
        _str(metadata, "hostname", "metadata")
        stats = obj["dump_stats"]
        counts = {"coll_perf": _int(stats, "coll_records", "dump_stats"),
                  "p2p_perf": _int(stats, "p2p_records", "dump_stats")}
        proxy = stats.get("proxy_records", 0) if isinstance(stats, dict) else 0
        counts["proxy_trace"] = proxy if isinstance(proxy, int) and not isinstance(proxy, bool) and proxy >= 0 else 0
        self.header, self.metadata, self.remaining = header, metadata, counts
        return None


# -- Prometheus textfile ---------------------------------------------------------------------------
def message_bytes(label: str) -> float:
    """``message_size`` label (``"2.00GB"``, ``"512B"``; base 1024, two decimals) → bytes."""
    m = _SIZE.match(label)
    if not m:
        raise RecordError(f"message_size: {label!r} is not a size such as 2.00GB")
    return float(m.group(1)) * _SIZE_UNITS[m.group(2)]


def complete_lines(text: str) -> str:
    """The text up to its last newline: the Inspector rewrites a .prom file in place (fopen
    "w", then fwrite), so a reader can catch it half written."""
    cut = text.rfind("\n")
    return text[: cut + 1] if cut >= 0 else ""


@dataclass
class Textfile:
    """What one Prometheus textfile held."""

    records: list[Record] = field(default_factory=list)
    #: series that could not become a record, with the reason
    problems: list[str] = field(default_factory=list)
    #: Inspector v5 aggregated series (no rank, no coll_sn) were present
    aggregated: bool = False


def _label_int(labels: Mapping[str, str], *names: str) -> int:
    for n in names:
        if n in labels:
            try:
                v = int(labels[n])
            except ValueError:
                raise RecordError(f"label {n}={labels[n]!r}: expected an integer") from None
            if v < 0:
                raise RecordError(f"label {n}={v}: expected >= 0")
            return v
    raise RecordError(f"label {' or '.join(names)}: missing")


def parse_textfile(text: str) -> Textfile:
    """Records of one ``nccl_inspector_metrics_<uuid>.prom``: the three gauges of one
    (communicator, rank, collective) share their labels and become one Record.

    Label names follow the writer (``inspector_prom.cc``: ``nranks``; the README says
    ``n_ranks``: both are read). ``pid`` and ``coll_timing_source`` are read when present.
    v5 writes aggregated buckets without ``rank``/``coll_sn`` (``version``, ``node``,
    ``gpu`` labels): those carry no per-rank timing and set ``aggregated``.
    Raises ValueError when the complete lines are not Prometheus text.
    """
    out = Textfile()
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for names, labels, value in series(complete_lines(text)):
        name = names[-1]
        if name not in (PROM_EXEC, PROM_BUSBW, PROM_ALGOBW):
            continue
        if "coll_sn" not in labels or "rank" not in labels:
            if "version" in labels or "gpu" in labels:
                out.aggregated = True
            else:
                out.problems.append(f"{name}: series without rank or coll_sn labels ({sorted(labels)})")
            continue
        key = (labels.get("comm_id", ""), labels["rank"], labels["coll_sn"])
        g = groups.setdefault(key, {"labels": labels})
        g[name] = value
    for key, g in groups.items():
        labels = g["labels"]
        try:
            if PROM_EXEC not in g:
                raise RecordError(f"{PROM_EXEC}: missing for this comm_id/rank/coll_sn")
            exec_us = g[PROM_EXEC]
            if not math.isfinite(exec_us) or exec_us < 0:
                raise RecordError(f"{PROM_EXEC}: {exec_us!r} is not a duration")
            n_ranks = _label_int(labels, "n_ranks", "nranks")
            rank = _label_int(labels, "rank")
            if not labels.get("comm_id"):
                raise RecordError("label comm_id: missing")
            if rank >= max(n_ranks, 1):
                raise RecordError(f"label rank: {rank} is not below n_ranks {n_ranks}")
            busbw, algobw = g.get(PROM_BUSBW), g.get(PROM_ALGOBW)
            pid = labels.get("pid", "")
            out.records.append(Record(
                comm=labels["comm_id"], rank=rank, n_ranks=max(n_ranks, 1),
                nnodes=max(_label_int(labels, "n_nodes"), 1),
                hostname=labels.get("hostname", ""), pid=int(pid) if pid.isdigit() else None,
                coll=labels.get("collective", ""), sn=_label_int(labels, "coll_sn"),
                msg_bytes=message_bytes(labels["message_size"]) if "message_size" in labels else math.nan,
                exec_s=exec_us * 1e-6, timing_source=labels.get("coll_timing_source", ""),
                busbw_bps=busbw * 1e9 if busbw is not None and math.isfinite(busbw) else None,
                algobw_bps=algobw * 1e9 if algobw is not None and math.isfinite(algobw) else None))
        except RecordError as e:
            out.problems.append(f"comm_id={key[0]} rank={key[1]} coll_sn={key[2]}: {e}")
    out.records.sort(key=lambda r: (r.comm, r.rank, r.sn))
    return out
