"""Recording capture bundles: the :class:`Recorder` sink and ``skewd record``.

The recorder is a pipeline sink (like the publisher): it sees every SampleBatch the pipeline
ingests, every evaluation time with the transitions it produced, and every node summary, and
writes them as a capture bundle (:mod:`skewd.agent.bundle`, docs/capture-format.md) that
``skewd replay`` turns back into the same findings.

It must never slow the agent down: the sink methods only append to in-memory lists; once per
``flush_interval`` seconds of *tick* time (or ``flush_rows`` samples) the buffers are handed to
a writer thread that encodes Arrow and appends to disk. Flushes happen on tick boundaries, so a
segment always holds whole evaluations. If the disk cannot keep up, buffers grow up to
``max_buffer_rows`` and then the recording of the current segment is abandoned (counted and
logged) rather than the agent blocking or running out of memory.

Bounds: with ``rotate`` = N ≥ 1 the bundle keeps the newest N segments, each closed when it
reaches ``max_bytes / N`` bytes or ``max_duration / N`` seconds, so the whole recording stays
within ``max_bytes`` and covers about the last ``max_duration``. With ``rotate`` = 0 there is
one segment, and recording stops (``full``) when it reaches ``max_bytes`` or ``max_duration``.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import queue
import re
import signal as _signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from skewd import __version__, cliargs
from skewd.model import Catalogue, Finding, SampleBatch, SignalSpec, parse_duration

from . import bundle as B

log = logging.getLogger("skewd.agent.record")

#: rough on-disk cost used to enforce size bounds before the writer thread reports actual sizes
_ROW_BYTES = 40  # t, value, batch + three dictionary indices
_CHUNK_BYTES = 800  # Arrow message headers, dictionaries, the index line


def _summary_line(msg: Any) -> tuple[str, float]:
    from skewd import wire

    if isinstance(msg, Mapping):
        import json

        return json.dumps(dict(msg), sort_keys=True, separators=(",", ":"), allow_nan=False), float(msg["t"])
    return wire.encode(msg).decode("utf-8"), float(msg.t)


class Recorder:
    """A pipeline sink writing a capture bundle to ``directory`` (segments ``seg-NNNNNN``)."""

    def __init__(self, directory: str | Path, *, node: str, cluster: str = "",
                 labels: Mapping[str, str] | None = None, ruleset: Any = None,
                 catalogue: Catalogue | Iterable[SignalSpec] | Callable[[], Iterable[SignalSpec]] | None = None,
                 max_bytes: int = 1 << 30, max_duration: float = 3600.0, rotate: int = 4,
                 settings: Mapping[str, float] | None = None, node_labels: Mapping[str, Mapping[str, str]] | None = None,
                 flush_interval: float = 1.0, flush_rows: int = 50_000, max_buffer_rows: int = 2_000_000,
                 threaded: bool = True) -> None:
        if rotate < 0:
            raise ValueError("rotate must be >= 0")
        self.directory = Path(directory)
        self.node = node
        self.cluster = cluster
        self.node_labels: dict[str, dict[str, str]] = {k: dict(v) for k, v in (node_labels or {}).items()}
        self.node_labels.setdefault(node, {"cluster": cluster, **dict(labels or {})})
        self.max_bytes = int(max_bytes)
        self.max_duration = float(max_duration)
        self.rotate = int(rotate)
        self.seg_bytes = self.max_bytes // max(1, self.rotate)
        self.seg_duration = self.max_duration / max(1, self.rotate)
        self.settings = dict(settings or {})
        self.flush_interval = flush_interval
        self.flush_rows = flush_rows
        self.max_buffer_rows = max_buffer_rows
        self._catalogue_src = catalogue
        self._catalogue: dict[str, SignalSpec] | None = None
        self._rules_meta: dict[str, Any] | None = None
        self._available: list[str] | None = None
        self._rule_texts: list[tuple[str, str]] = []
        self.set_rules(ruleset, roll=False)
        # producer-side buffers (agent thread)
        self._batches: list[SampleBatch] = []
        self._rows = 0
        self._ticks: list[tuple[float, int, int]] = []
        self._findings: list[str] = []
        self._finding_t: list[float] = []
        self._summaries: list[str] = []
        self._summary_t: list[float] = []
        self._packets: list[tuple[int, bytes, int | None, int]] = []
        self._captures: list[Path] = []
        self._seg_batches = 0  # batch numbering within the current segment
        self._last_tick_batches = 0  # batches that preceded the segment's last tick
        self._seg_first_t: float | None = None
        self._last_flush_t: float | None = None
        self._seq = max([int(d.name[4:]) for d in B.segment_dirs(self.directory)] or [0])
        self._need_open = True
        self._ending = False  # the current segment closes at the next batch or tick
        self._seg_est = 0  # estimated bytes of the current segment, producer side
        # shared with the writer thread
        self.bytes_written = 0
        self.segments_written = 0
        self.segments_removed = 0
        self.samples_written = 0
        self.dropped_rows = 0
        self.errors = 0
        self.last_error = ""
        self.full = False
        self.closed = False
        self.current: Path | None = None
        self._q: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._writer: B.SegmentWriter | None = None
        self._flushes = 0
        self.max_pending = 64
        self._submitted = 0
        self._processed = 0
        self._seg_written: tuple[int, int] = (0, 0)  # (segment number, bytes) as the writer last saw it
        self._buf_est = 0
        if threaded:
            self._q = queue.Queue()
            self._thread = threading.Thread(target=self._run, name="skewd-recorder", daemon=True)
            self._thread.start()

    # -- construction from the agent -----------------------------------------------------------
    @classmethod
    def for_agent(cls, cfg: Any, ruleset: Any) -> "Recorder":
        """The recorder a running agent uses: ``<record.dir>/<node>/seg-NNNNNN``."""
        rec = dict(cfg.record or {})
        md = rec.get("max_duration", 3600.0)
        md = parse_duration(md) if isinstance(md, str) else float(md or 3600.0)
        from skewd.catalogue import full_catalogue

        return cls(Path(rec["dir"]) / cfg.node, node=cfg.node, cluster=cfg.cluster, labels=cfg.labels,
                   ruleset=ruleset, catalogue=full_catalogue, max_bytes=int(rec.get("max_bytes", 1 << 30)),
                   max_duration=md, rotate=int(rec.get("rotate", 4)),
                   settings={"evaluation_interval": cfg.evaluation_interval, "lookback": cfg.lookback,
                             "horizon": cfg.horizon, "summary_interval": cfg.summary_interval})

    def set_rules(self, ruleset: Any, roll: bool = True) -> None:
        """Record a new rule set (after a hot reload). Starts a new segment, so every segment
        names exactly the rules that produced its findings."""
        if ruleset is None:
            self._rules_meta, self._rule_texts = None, []
        else:
            texts = []
            for f in ruleset.files:
                try:
                    texts.append((str(f), Path(f).read_text(encoding="utf-8")))
                except OSError as e:  # the rules loaded, so this is a race with an edit
                    log.warning("recorder: cannot snapshot rule file %s: %s", f, e)
            self._rule_texts = texts
            self._rules_meta = {
                "version": ruleset.version,
                "rules": [{"id": r.id, "digest": r.digest, "scope": r.scope.value, "pathology": r.pathology,
                           "source": r.source, "requires": list(r.requires)} for r in ruleset.rules],
            }
        if roll:
            self._roll()

    def set_available_signals(self, signals: Iterable[str] | None, roll: bool = False) -> None:
        """The signals this host's active collectors supply (what the agent passed to
        ``Engine.set_available_signals``). Recorded so replay marks the same rules inactive as
        the live agent did; applies to segments opened from now on. ``roll``: the set changed
        while recording (a collector came up late), so start a new segment that carries it."""
        self._available = None if signals is None else sorted(set(signals))
        if roll:
            self._roll()

    # -- sink protocol ---------------------------------------------------------------------------
    def on_batch(self, batch: SampleBatch) -> None:
        if self.closed or self.full or not len(batch):
            return
        if self._ending:
            self._end_segment()
        self._batches.append(batch)
        self._seg_batches += 1
        self._rows += len(batch)
        self._buf_est += _ROW_BYTES * len(batch)

    def on_tick(self, t: float, findings: list[Finding]) -> None:
        if self.closed or self.full:
            return
        if self._ending:
            self._end_segment()
        self._ticks.append((float(t), self._seg_batches, len(findings)))
        self._last_tick_batches = self._seg_batches
        self._buf_est += 16
        for f in findings:
            line = f.to_json()
            self._findings.append(line)
            self._finding_t.append(float(f.evaluated_at))
            self._buf_est += len(line)
        if self._seg_first_t is None:
            self._seg_first_t = float(t)
        if self._last_flush_t is None:
            self._last_flush_t = float(t)
        if t - self._last_flush_t >= self.flush_interval or self._rows >= self.flush_rows:
            self._last_flush_t = float(t)
            self._flush()
            self._check_bounds(float(t))

    def on_summary(self, msg: Any) -> None:
        """A node summary (``skewd.wire.Summary`` or its dict form)."""
        if self.closed or self.full:
            return
        line, t = _summary_line(msg)
        self._summaries.append(line)
        self._summary_t.append(t)
        self._buf_est += len(line)

    def on_packets(self, packets: Iterable[tuple], linktype: int = 1) -> None:
        """Captured headers: ``(t, bytes)`` or ``(t, bytes, original length)`` tuples, written to
        ``packets.pcapng`` (``linktype`` 1 = Ethernet, 101 = raw IP)."""
        if self.closed or self.full:
            return
        for p in packets:
            ns, data = int(round(float(p[0]) * 1e9)), bytes(p[1])
            orig = int(p[2]) if len(p) > 2 and p[2] is not None else None
            self._packets.append((ns, data, orig, int(linktype)))
            self._buf_est += len(data) + 32

    def on_frames(self, frames: Any) -> None:
        """Frames as the pkt collector holds them (``buf``, ``doff``, ``caplen``, ``wirelen``,
        ``ts_ns``, ``linktype`` arrays): nanosecond timestamps are kept exactly."""
        if self.closed or self.full:
            return
        buf = memoryview(frames.buf)
        for i in range(len(frames.doff)):
            a, n = int(frames.doff[i]), int(frames.caplen[i])
            self._packets.append((int(frames.ts_ns[i]), bytes(buf[a:a + n]), int(frames.wirelen[i]),
                                  int(frames.linktype[i])))
            self._buf_est += n + 32

    def add_capture_file(self, path: str | Path) -> None:
        """Copy a capture file (e.g. a pcapng the pkt collector wrote) into the current segment."""
        if not (self.closed or self.full):
            self._captures.append(Path(path))

    # -- flushing ------------------------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        meta = {"skewd_version": __version__, "segment": self._seq, "recorder_node": self.node,
                "cluster": self.cluster, "nodes": [self.node],
                "node_labels": self.node_labels, "settings": self.settings, "rules": dict(self._rules_meta or {})}
        if self._available is not None:
            meta["available_signals"] = list(self._available)
        return meta

    def _flush(self, force: bool = False) -> None:
        if not (self._batches or self._ticks or self._findings or self._summaries or self._packets or self._captures):
            return
        if not (force or self._q is None or self._submitted - self._processed < self.max_pending):
            if self._rows > self.max_buffer_rows:
                self._abandon("writer cannot keep up with the sample rate")
            return  # keep buffering; try again at the next flush
        if self._need_open:
            self._seq += 1
            self.current = self.directory / f"seg-{self._seq:06d}"
            self._submit(("open", self.current, self._meta(), list(self._rule_texts)))
            self._need_open = False
        work = ("data", self._batches, self._ticks, self._findings, self._finding_t, self._summaries,
                self._summary_t, self._packets, self._captures)
        self._submit(work)
        # what this flush adds on disk, so the bounds hold even while the writer lags behind
        self._seg_est += self._buf_est + _CHUNK_BYTES * 4
        self._clear_buffers()

    def _clear_buffers(self) -> None:
        self._batches, self._ticks, self._findings, self._finding_t = [], [], [], []
        self._summaries, self._summary_t, self._packets, self._captures = [], [], [], []
        self._rows = 0
        self._buf_est = 0

    def _abandon(self, why: str) -> None:
        self.dropped_rows += self._rows
        self.errors += 1
        self.last_error = why
        log.error("recorder: %s; dropping %d buffered samples and starting a new segment", why, self._rows)
        self._clear_buffers()
        self._last_tick_batches = self._seg_batches  # nothing left to carry over
        if self._need_open:
            self._seg_batches = self._last_tick_batches = 0
        self._roll()

    def _submit(self, item: tuple) -> None:
        """Hand work to the writer; never blocks (the queue is unbounded: :meth:`_flush` keeps
        data buffered instead while the writer has ``max_pending`` flushes still to write)."""
        if self._q is None:
            self._handle(item)
            return
        if item[0] == "data":
            self._submitted += 1
        self._q.put_nowait(item)

    def _roll(self) -> None:
        """End the current segment after its last tick. What follows that tick before the next
        batch or tick (its summary, say) still goes into it; the next batch or tick opens a new
        segment (a segment that was never opened just picks up the new settings)."""
        if not self._need_open:
            self._ending = True

    def _end_segment(self) -> None:
        self._ending = False
        # batches ingested after the last tick belong to the next tick: they move on
        carry = min(self._seg_batches - self._last_tick_batches, len(self._batches))
        moved = self._batches[len(self._batches) - carry:] if carry else []
        if carry:
            del self._batches[len(self._batches) - carry:]
        self._flush(force=True)
        self._submit(("close",))
        self._need_open = True
        self._batches = list(moved)
        self._rows = sum(len(b) for b in moved)
        self._buf_est = _ROW_BYTES * self._rows
        self._seg_batches = carry
        self._last_tick_batches = 0
        self._seg_first_t = None
        self._seg_est = 0

    def _check_bounds(self, t: float) -> None:
        seq, written = self._seg_written
        actual = written if seq == self._seq else 0
        too_big = max(actual, self._seg_est) + self._buf_est >= self.seg_bytes
        too_long = self._seg_first_t is not None and t - self._seg_first_t >= self.seg_duration
        if not (too_big or too_long):
            return
        self._flush(force=True)  # a segment ends on this tick: nothing buffered may cross it
        if self.rotate == 0:
            self.full = True
            log.warning("recorder: bundle %s reached its %s limit; recording stopped", self.directory,
                        "size" if too_big else "duration")
            self._submit(("close",))
            return
        self._roll()

    def flush(self) -> None:
        """Write everything buffered and wait until it is on disk (tests, shutdown)."""
        if not self.closed:
            self._flush(force=True)
        if self._q is not None:
            self._q.join()

    def close(self) -> None:
        """Flush, close the current segment (final meta.json) and stop the writer. Idempotent."""
        if self.closed:
            return
        if self._ending:
            self._end_segment()
        if not self.full:
            self._flush(force=True)
        self.closed = True
        self._submit(("close",))
        if self._q is not None:
            self._q.put(("stop",))
            self._thread.join(timeout=30)

    # -- writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        assert self._q is not None
        while True:
            item = self._q.get()
            try:
                if item[0] == "stop":
                    return
                self._handle(item)
            finally:
                if item[0] == "data":
                    self._processed += 1
                self._q.task_done()

    def _catalogue_for(self, names: Iterable[str]) -> list[SignalSpec]:
        if self._catalogue is None:
            src = self._catalogue_src
            try:
                specs = src() if callable(src) else src
                if isinstance(specs, Mapping):
                    specs = specs.values()
                self._catalogue = {s.name: s for s in (specs or [])}
            except Exception as e:  # a broken collector package must not stop the recording
                log.warning("recorder: catalogue unavailable (%s); meta.json lists no signal specs", e)
                self._catalogue = {}
        wanted = set(names)
        for r in (self._rules_meta or {}).get("rules", []):
            wanted.update(r.get("requires", []))
        return [self._catalogue[n] for n in sorted(wanted) if n in self._catalogue]

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        try:
            if kind == "open":
                _, path, meta, texts = item
                self._finish_writer()
                path.parent.mkdir(parents=True, exist_ok=True)
                self._writer = B.SegmentWriter(path, meta, texts)
                self.segments_written += 1
                self._rotate_old()
            elif kind == "data":
                w = self._writer
                if w is None:
                    return
                _, batches, ticks, findings, ft, summaries, st, packets, captures = item
                before = w.bytes_written
                w.write_samples(batches)
                w.write_ticks(ticks)
                w.write_lines(B.FINDINGS, findings, ft)
                w.write_lines(B.SUMMARIES, summaries, st)
                w.write_packets(packets)
                for c in captures:
                    w.add_capture_file(c)
                self._flushes += 1
                if w.meta_stale() or self._flushes % 30 == 0:  # new signals, or a periodic refresh
                    w.write_meta(complete=False, catalogue=self._catalogue_for(w.signals), sync=False)
                self.samples_written += sum(len(b) for b in batches)
                self.bytes_written += w.bytes_written - before
                self._seg_written = (int(w.meta.get("segment", 0)), w.bytes_written)
            elif kind == "close":
                self._finish_writer()
        except Exception as e:  # disk full, permissions...: stop this segment, keep the agent
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            log.error("recorder: writing %s failed: %s", self.current, self.last_error)
            self._writer = None

    def _finish_writer(self) -> None:
        w, self._writer = self._writer, None
        if w is not None:
            w.close(catalogue=self._catalogue_for(w.signals))

    def _rotate_old(self) -> None:
        if self.rotate <= 0:
            return
        segs = B.segment_dirs(self.directory)
        for d in segs[: max(0, len(segs) - self.rotate)]:
            B.remove_segment(d)
            self.segments_removed += 1

    def stats(self) -> dict[str, float]:
        return {"bytes_written": self.bytes_written, "samples_written": self.samples_written,
                "segments_written": self.segments_written, "segments_removed": self.segments_removed,
                "dropped_rows": self.dropped_rows, "errors": self.errors}


# ---------------------------------------------------------------------------------------------
# skewd record
# ---------------------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.I)
_MULT = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """``'512M'``, ``'1GiB'``, ``'1048576'`` → bytes (binary multiples)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"bad size {text!r}: write e.g. 1048576, 64M, 1G")
    return int(float(m.group(1)) * _MULT[(m.group(2) or "")[:1].lower()])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skewd record",
                                description="Record a capture bundle from this host's active collectors "
                                            "(with the agent's rule evaluation) for later `skewd replay`.")
    p.add_argument("--out", "-o", required=True, help="bundle directory to create or extend")
    p.add_argument("--duration", "-d", type=cliargs.duration, default=None,
                   help="stop after this long (e.g. 60s, 5m30s; a bare number is seconds); default: until Ctrl-C")
    p.add_argument("--config", "-c", help="agent config YAML (collectors, intervals, rules, node, labels)")
    p.add_argument("--max-bytes", default="1G", help="stop when the bundle reaches this size (default 1G)")
    p.add_argument("--node", help="override the node name")
    p.add_argument("--rules", action="append", help="rule files/directories (default: config rules, or the shipped packs)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress line on stderr")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    from skewd.rules.engine import RuleSet
    from skewd.rules.loader import load_rules, rule_files

    from .config import ConfigError, load_config
    from .scheduler import collector_config_keys

    try:
        duration = args.duration
        max_bytes = parse_size(args.max_bytes)
    except ValueError as e:
        print(f"skewd record: {e}", file=sys.stderr)
        return 2
    over: dict[str, Any] = {}
    if args.node:
        over["node"] = args.node
    if args.rules:
        over["rules"] = list(args.rules)
    try:
        cfg = load_config(args.config, overrides=over, collector_keys=collector_config_keys())
    except ConfigError as e:
        print("skewd record: invalid config:", file=sys.stderr)
        for pr in e.problems:
            print(f"  {pr}", file=sys.stderr)
        return 2
    from skewd.catalogue import full_catalogue
    from skewd.rules.cli import PACKS

    catalogue = full_catalogue()
    paths = cfg.rules or [str(PACKS)]
    if not cfg.rules and not rule_files(paths):
        print(f"skewd record: no shipped rule packs in {PACKS}; recording samples without rule evaluation",
              file=sys.stderr)
        ruleset = RuleSet([], [], "")
    else:
        res = load_rules(paths, catalogue)
        if not res.ok:
            print("skewd record: rules do not load:", file=sys.stderr)
            for i in res.issues:
                print(f"  {i}", file=sys.stderr)
            return 2
        ruleset = res.ruleset
    try:  # before any collector starts: an unwritable --out fails now, not at the first write
        cliargs.check_output_dir(args.out)
    except cliargs.OutputError as e:
        print(f"skewd record: --out: {e}", file=sys.stderr)
        return 2
    return asyncio.run(_record(cfg, catalogue, ruleset, Path(args.out), duration, max_bytes, args.quiet))


async def _record(cfg: Any, catalogue: Catalogue, ruleset: Any, out: Path, duration: float | None,
                  max_bytes: int, quiet: bool) -> int:
    from skewd.model import NODE_SCOPES

    from . import summary as summary_mod
    from .pipeline import Pipeline
    from skewd.rules.counts import rule_counts

    from .scheduler import Backoff, LiveSource, availability, build_slots

    slots = build_slots(cfg)
    active = [s.name for s in slots if s.active]
    if not active:
        print("skewd record: no collector is active on this host:", file=sys.stderr)
        for s in slots:
            print(f"  {s.name}: {s.status.availability.value} ({s.status.reason})", file=sys.stderr)
        return 2
    recorder = Recorder(out, node=cfg.node, cluster=cfg.cluster, labels=cfg.labels, ruleset=ruleset,
                        catalogue=catalogue, max_bytes=max_bytes, max_duration=1e18, rotate=0,
                        settings={"evaluation_interval": cfg.evaluation_interval, "lookback": cfg.lookback,
                                  "horizon": cfg.horizon, "summary_interval": cfg.summary_interval})
    pipe = Pipeline(catalogue, ruleset, node=cfg.node, cluster=cfg.cluster, labels=cfg.labels,
                    lookback=cfg.lookback, horizon=cfg.horizon, sinks=[recorder])
    pipe.engine.scopes = set(NODE_SCOPES)
    signals, reasons = availability(slots)
    signals |= {s.name for s in catalogue.values() if s.collector == "agent"}
    pipe.engine.set_available_signals(signals, reasons)
    recorder.set_available_signals(signals)
    print(f"skewd record: node {cfg.node}, collectors {', '.join(active)}; rules: "
          f"{rule_counts(pipe.engine).describe()}; writing {out}", file=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (_signal.SIGINT, _signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    def on_change(_slot: Any, _old: Any) -> None:  # a collector came up (or went) while recording
        sig, why = availability(slots)
        sig |= {s.name for s in catalogue.values() if s.collector == "agent"}
        pipe.engine.set_available_signals(sig, why)
        recorder.set_available_signals(sig, roll=True)
        print(f"skewd record: collector {_slot.name} {_slot.status.availability.value}; rules: "
              f"{rule_counts(pipe.engine).describe()}", file=sys.stderr)

    source = LiveSource(slots, backoff=Backoff(cfg.reprobe_min, cfg.reprobe_max), on_change=on_change)
    source.start()
    t0 = time.time()
    next_tick = t0
    next_summary = t0
    findings = 0
    try:
        while not stop.is_set() and not recorder.full:
            now = time.time()
            if duration is not None and now - t0 >= duration:
                break
            delay = next_tick - now
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                    break
                except asyncio.TimeoutError:
                    pass
            now = time.time()
            next_tick = max(next_tick + cfg.evaluation_interval, now)
            for b in source.drain():
                pipe.ingest(b)
            fs = pipe.evaluate(now)
            findings += len(fs)
            for f in fs:
                print(f"  {f.state.value:8} {f.rule_id} {f.node}/{f.entity}: {f.summary}", file=sys.stderr)
            if now >= next_summary:
                next_summary = now + cfg.summary_interval
                recorder.on_summary(summary_mod.make_summary(pipe.store, cfg.node, cfg.cluster, now,
                                                             cfg.summary_interval))
            if not quiet and sys.stderr.isatty():
                sys.stderr.write(f"\r  {now - t0:6.1f}s  {pipe.store.samples_ingested} samples  "
                                 f"{recorder.bytes_written} bytes written  {findings} transitions ")
                sys.stderr.flush()
    finally:
        await source.stop()
        recorder.close()
    if not quiet and sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"skewd record: {pipe.store.samples_ingested} samples, {pipe.ticks} evaluations, {findings} transitions "
          f"→ {recorder.current or out} ({recorder.bytes_written} bytes)"
          + ("; stopped at the size limit" if recorder.full else ""), file=sys.stderr)
    if recorder.errors:
        print(f"skewd record: recording errors: {recorder.last_error}", file=sys.stderr)
        return 1
    return 0
