"""Time-sliced replay: one recording replayed by several processes at once, with the very events
of the serial replay.

The ticks are cut into ``jobs`` slices of equal tick counts at boundaries ``b1 < b2 < ...``.
This process replays slice 0 from the start (streaming its events as they come); worker process
``j`` starts a warm-up (:meth:`Replayer.warmup`: the longest rule window plus the lookback and
two gc periods) before ``bj``, evaluates through it without yielding anything, and replays its
slice from ``bj`` on.

Why the result is the serial replay's, not an approximation of it: every slice stops at each
boundary and hashes its whole decision state there (:meth:`Replayer.state_digest`: alert states
with their start times and evidence, held alerts, gc and summary schedule, entity ids, block
rows and every sample a rule can still read). A worker's slice is used only if its digest at
``bj`` equals the digest of the process that replayed up to ``bj``; the replay from ``bj`` on is a
function of that state and the recording, so its events are the serial ones. If they differ (an
alert active since before the warm-up: its start time is in every later transition), the slice
is thrown away and the process that holds the serial state simply goes on through it: slower,
never different. :attr:`SliceStats` says which boundaries were handed over.

Workers are separate processes (``spawn``: no fork of a process holding Arrow's threads) that
open the bundle themselves; only events (findings and summaries, picklable dataclasses of our
own) travel back, never capture data.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator


from .core import Replayer
from .events import Checkpoint, Event


@dataclass
class SliceStats:
    """What the sliced replay did: the boundaries, and for each whether the worker's state
    matched (handed over) or the serial replay went on through its slice (fallback)."""

    boundaries: list[float] = field(default_factory=list)
    handed_over: list[bool] = field(default_factory=list)


def boundaries(rep: Replayer, jobs: int) -> list[float]:
    """Tick times cutting the replay into ``jobs`` slices of equal tick counts; a slice shorter
    than two warm-ups is not worth a process (fewer boundaries)."""
    t = rep.tick_times()
    if len(t) < 2 or jobs < 2:
        return []
    warm = rep.warmup()
    out: list[float] = []
    for j in range(1, jobs):
        b = float(t[min(len(t) - 1, (len(t) * j) // jobs)])
        lo = out[-1] if out else float(t[0])
        if b - lo >= 2 * warm and float(t[-1]) - b >= warm and b > float(t[0]):
            out.append(b)
    return out


def _spec(rep: Replayer) -> dict[str, Any]:
    return {"paths": [str(s.path) for s in rep.segments], "rules": rep.rule_paths, "t_from": rep.t_from,
            "t_to": rep.t_to, "nodes": sorted(rep.only) if rep.only is not None else None,
            "range_eval": rep.range_eval, "max_range": rep.max_range, "horizon": rep.horizon,
            "max_nodes": rep.max_nodes, "ticks": rep.tick_index()}


def _stats(rep: Replayer, mark: dict) -> dict:
    """What a chunk of a worker's replay adds to the result (since ``mark``)."""
    ingested = sum(p.store.samples_ingested for p in rep.pipelines.values())
    out = {"evaluations": rep.evaluations - mark.get("evaluations", 0), "start": rep.start, "end": rep.end,
           "stopped_early": list(rep.stopped_early), "ingested": ingested - mark.get("ingested", 0)}
    mark.update(evaluations=rep.evaluations, ingested=ingested)
    return out


def _worker(conn: Any, spec: dict, warm_from: float, emit_from: float, checkpoints: list[float]) -> None:
    """One slice in its own process: report the digest at ``emit_from``, then a chunk of events
    at every later checkpoint (waiting there for "continue" or "stop"), then the last chunk."""
    try:
        from .core import open_segments, replay_catalogue

        segs, _ = open_segments(spec["paths"])
        rep = Replayer(segs, replay_catalogue(segs), rules=spec["rules"], t_from=spec["t_from"], t_to=spec["t_to"],
                       nodes=spec["nodes"], range_eval=spec["range_eval"], max_range=spec["max_range"],
                       max_nodes=spec["max_nodes"])
        rep.horizon = spec["horizon"]
        rep.adopt_tick_index(spec["ticks"])
        events: list[Event] = []
        mark: dict = {}
        for x in rep.steps(warm_from, emit_from, checkpoints):
            if isinstance(x, Event):
                events.append(x)
                continue
            if x.t == emit_from:
                conn.send(("start", x.t, x.digest))
                continue
            conn.send(("chunk", x.t, events, x.digest, _stats(rep, mark)))
            events = []
            if conn.recv() != "continue":
                return
        conn.send(("chunk", math.inf, events, None, _stats(rep, mark)))
    except BaseException:  # reported to the parent, which raises it
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, ValueError):
            pass
    finally:
        conn.close()


class _Worker:
    def __init__(self, ctx: Any, spec: dict, warm_from: float, emit_from: float, checkpoints: list[float]) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, spec, warm_from, emit_from, checkpoints), daemon=True)
        self.proc.start()
        child.close()

    def recv(self) -> tuple:
        try:
            msg = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"replay slice worker {self.proc.pid} died (exit code {self.proc.exitcode})") from None
        if msg[0] == "error":
            raise RuntimeError("replay slice worker failed:\n" + msg[1])
        return msg

    def send(self, cmd: str) -> None:
        try:
            self.conn.send(cmd)
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        self.send("stop")
        self.conn.close()
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def sliced_events(rep: Replayer) -> Iterator[Event]:
    """:meth:`Replayer.events` with ``rep.jobs`` time slices (module doc). ``rep`` replays slice
    0 itself and ends with the result's counts of the whole replay."""
    bounds = boundaries(rep, rep.jobs)
    rep.slice_stats = SliceStats(list(bounds))
    local = rep.steps(None, None, bounds)
    if not bounds:
        yield from (x for x in local if isinstance(x, Event))
        return
    warm = rep.warmup()
    ctx = mp.get_context("spawn")
    spec = _spec(rep)
    workers = {j: _Worker(ctx, spec, bounds[j - 1] - warm, bounds[j - 1], bounds[j - 1:])
               for j in range(1, len(bounds) + 1)}

    def local_until() -> Iterator[Event]:
        for x in local:
            if isinstance(x, Checkpoint):
                state["digest"] = x.digest
                return
            yield x
        state["digest"] = None

    def take(msg: tuple) -> Iterator[Event]:
        _, _, events, digest, st = msg
        rep.evaluations += st["evaluations"]
        if st["evaluations"]:
            rep.start, rep.end = min(rep.start, st["start"]), max(rep.end, st["end"])
        rep.stopped_early += [m for m in st["stopped_early"] if m not in rep.stopped_early]
        rep.samples_elsewhere += st["ingested"]
        for ev in events:
            rep.summaries += ev.summaries
            yield ev
        state["digest"] = digest

    state: dict[str, Any] = {"digest": None}
    owner: _Worker | None = None  # None: this process holds the serial state
    try:
        yield from local_until()
        for j in range(1, len(bounds) + 1):
            w = workers.pop(j)
            if state["digest"] is None:  # the replay ended before this boundary (--to)
                w.stop()
                continue
            kind, _, digest = w.recv()
            adopted = digest == state["digest"]
            rep.slice_stats.handed_over.append(adopted)
            if adopted:
                if owner is None:
                    local.close()
                else:
                    owner.stop()
                owner = w
                yield from take(w.recv())
            else:
                w.stop()
                if owner is None:
                    yield from local_until()
                else:
                    owner.send("continue")
                    yield from take(owner.recv())
    finally:
        for w in workers.values():
            w.stop()
        if owner is not None:
            owner.stop()
        local.close()


class ParallelReplayer(Replayer):
    """A :class:`Replayer` whose :meth:`events` come from ``jobs`` time slices replayed in
    parallel processes (:func:`sliced_events`): the same events as the serial replay. Callers:
    ``skewd replay --jobs``, bench/replay_speed.py."""

    def __init__(self, *args: Any, jobs: int = 2, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.jobs = max(1, int(jobs))

    def events(self) -> Iterator[Event]:
        if self.jobs > 1:
            yield from sliced_events(self)
        else:
            yield from super().events()


__all__ = ["ParallelReplayer", "SliceStats", "boundaries", "sliced_events"]
