"""``skewd replay``: the command line over replay's core, cluster replay, diff and report.

Parses options, opens the bundles, runs a :class:`ClusterReplay` (agents + controller; agents
alone with ``--no-controller``), prints each step's transitions, incident publications and
suggestions on stdout as they come (paced with ``--speed``, optionally published to NATS), and
writes the report. Statistics, progress and problems go to stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import shutil
import sys
import time
from typing import Sequence, TextIO

from skewd import cliargs
from skewd.model import Catalogue, Finding, Scope, parse_duration
from skewd.model import parse_speed as _parse_speed

from .. import bundle
from .cluster import ClusterReplay
from .core import ReplayError, Replayer, ReplayResult, open_segments, replay_catalogue
from .diff import diff_findings, diff_incidents, incident_stories, occurrences
from .output import (TABLE_HEADER, canonical_json, finding_json, finding_row, fmt_t, incident_json, incident_row,
                     suggestion_json, suggestion_row)
from .progress import Progress

EXIT_OK, EXIT_DIFF, EXIT_USAGE, EXIT_DAMAGED = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="skewd replay",
        description="Replay capture bundles through the agents' rules and the controller, on the recorded "
                    "time: the findings, incidents and remap suggestions the live system published.")
    p.add_argument("bundles", nargs="+", metavar="BUNDLE",
                   help="capture bundle(s): a segment, a node's bundle directory, or a directory of per-node "
                        "bundles (a cluster bundle); several may be given")
    p.add_argument("--rules", action="append", metavar="PATH",
                   help="rule files/directories to use instead of the ones recorded in the bundle (repeatable)")
    p.add_argument("--controller-config", metavar="FILE",
                   help="the controller YAML the live controller ran with (topology, correlation, planner); "
                        "default: the controller's defaults and the topology in the agents' labels")
    p.add_argument("--no-controller", "--no-group", dest="no_controller", action="store_true",
                   help="replay the agents only: no controller, so no group rules, incidents or suggestions")
    p.add_argument("--speed", default="max", help="max (default: as fast as possible), 1x (real time) or 4x, 0.5x ...")
    p.add_argument("--from", dest="t_from", metavar="T",
                   help="evaluate from T: duration after the first recorded evaluation (30s), ISO time, or epoch seconds")
    p.add_argument("--to", dest="t_to", metavar="T", help="stop after T (same forms as --from)")
    p.add_argument("--node", action="append", metavar="N", help="replay only this node (repeatable)")
    p.add_argument("--publish", metavar="URL", help="publish findings (and summaries) to NATS, e.g. nats://127.0.0.1:4222")
    p.add_argument("--report", metavar="OUT.html", help="write a self-contained HTML post-mortem report")
    p.add_argument("--json", action="store_true",
                   help="JSON lines instead of a table: findings as Finding.to_dict(), incidents and suggestions "
                        "as published (their \"kind\" says which)")
    p.add_argument("--diff", nargs=2, metavar=("RULES_A", "RULES_B"),
                   help="compare two rule versions on the bundle: incidents that would open earlier, later, not "
                        "at all or with another culprit; then findings that appear, disappear or change timing")
    p.add_argument("--per-tick", action="store_true",
                   help="evaluate at every tick as it is reached instead of in ranges of ticks "
                        "(same findings; the default at --speed max is range evaluation)")
    p.add_argument("--explain", action="store_true",
                   help="print on stderr how each rule is evaluated (range or per tick, and which window "
                        "functions have range kernels), then replay")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress line or statistics on stderr")
    return p


def parse_time(text: str, start: float) -> float:
    """``--from/--to``: a duration from the first recorded evaluation (``90s``, ``2m``), an ISO-8601
    time (``2024-05-01T12:00:00Z``) or epoch seconds (``1714564800.5``)."""
    s = text.strip()
    try:
        return start + parse_duration(s) if not _is_number(s) else float(s)
    except ValueError:
        pass
    try:
        d = _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"bad time {text!r}: write a duration from the start (30s, 2m), "
                         "an ISO time (2024-05-01T12:00:00Z) or epoch seconds") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=_dt.timezone.utc)
    return d.timestamp()


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def parse_speed(text: str) -> float | None:
    """``max`` → None (as fast as possible); ``1x``, ``10x``, ``0.5x`` → factor
    (:func:`skewd.model.parse_speed`, the syntax ``skewd demo --speed`` shares)."""
    return _parse_speed(text, allow_max=True)


def _first_tick(seg: bundle.Segment) -> float:
    t = seg.ticks()[0]
    return float(t[0]) if len(t) else seg.start


def make_replay(args: argparse.Namespace, segments: list[bundle.Segment], damage: list[bundle.Damage],
                catalogue: Catalogue, rules: Sequence[str] | None, range_eval: bool = True
                ) -> Replayer | ClusterReplay:
    start = min(_first_tick(s) for s in segments)
    t_from = parse_time(args.t_from, start) if args.t_from else None
    t_to = parse_time(args.t_to, start) if args.t_to else None
    rep = Replayer(segments, catalogue, rules=rules, t_from=t_from, t_to=t_to, nodes=args.node,
                   open_damage=damage, range_eval=range_eval)
    if args.no_controller:
        return rep
    try:
        return ClusterReplay(rep, controller_config=args.controller_config)
    except Exception as e:  # the controller's ConfigError, RuleLoadError: an operator's file
        problems = getattr(e, "problems", None) or getattr(e, "issues", None)
        raise ReplayError(f"controller config: {e}" + ("".join(f"\n  {p}" for p in problems) if problems else "")
                          ) from None


def _nodes_of(run: Replayer | ClusterReplay) -> Replayer:
    return run.replayer if isinstance(run, ClusterReplay) else run


def explain(run: Replayer | ClusterReplay) -> list[str]:
    """How replay evaluates each rule: node rules by range (window functions with a range kernel
    computed for all ticks at once, the others by their per-tick kernel at each tick inside the
    range), group rules in the controller at its evaluation times."""
    from skewd.rules.expr import _COND_WINDOW, _WINDOW, RANGE_KERNELS

    rep = _nodes_of(run)
    window_functions = set(_WINDOW) | set(_COND_WINDOW) | {"quantile", "last", "age"}
    lines = []
    mode = "ranges of up to %d ticks" % rep.max_range if rep.range_eval else "per tick (--per-tick or --speed)"
    group = (f"in the controller, every {run.cfg.evaluation_interval:g}s of the summaries' clock"
             if isinstance(run, ClusterReplay) else "not evaluated (--no-controller)")
    lines.append(f"node rules: {mode}; group rules: {group}")
    lines.append("range kernels: " + ", ".join(sorted(RANGE_KERNELS)) + "; every other window function runs "
                 "its per-tick kernel at each tick of a range (bit-identical sums need the per-tick order)")
    seen: set[str] = set()
    for rs in rep.segment_rules():
        if rs.version in seen:
            continue
        seen.add(rs.version)
        for r in rs.rules:
            if not r.enabled:
                continue
            if r.scope in (Scope.TP_GROUP, Scope.CLUSTER):
                how = "per tick (controller)" if isinstance(run, ClusterReplay) else "not evaluated"
            elif not rep.range_eval:
                how = "per tick"
            else:
                # evidence labels are the text of each function call (a bare signal: its last value)
                fns = sorted({lab.split("(")[0] if "(" in lab else "last" for lab in r.compiled.evidence_labels})
                wins = [f for f in fns if f in window_functions]
                ranged = [f for f in wins if f in RANGE_KERNELS]
                per = [f for f in wins if f not in RANGE_KERNELS]
                how = "range" + (f"; range kernels: {', '.join(ranged)}" if ranged else "") + \
                      (f"; per-tick kernels: {', '.join(per)}" if per else "")
            lines.append(f"  {r.id}: {how}")
    return lines


async def drive(run: Replayer | ClusterReplay, speed: float | None, publish: str | None, out: TextIO,
                as_json: bool, err: TextIO, quiet: bool) -> list[Finding]:
    """Run the replay, printing each step's lines as it comes; returns every transition."""
    rep = _nodes_of(run)
    publisher = None
    spool_dir = None
    if publish:
        import tempfile

        from skewd.natsutil import NatsConfig

        from ..publisher import Publisher
        from ..spool import Spool

        spool_dir = tempfile.mkdtemp(prefix="skewd-replay-spool-")
        try:
            publisher = Publisher(NatsConfig.from_dict({"servers": [publish], "name": "skewd-replay"}),
                                  Spool(spool_dir), cluster=rep.cluster)
            await publisher.start()
            await publisher.wait_connected(10.0)
        except BaseException:
            if publisher is not None:
                await publisher.close()
                publisher.spool.close()
            shutil.rmtree(spool_dir, ignore_errors=True)
            raise
    t_first = min((s.start for s in rep.segments), default=0.0)
    t_last = max((s.end for s in rep.segments), default=t_first)
    progress = Progress(t_last - t_first, err, enabled=not quiet)
    wall0 = time.monotonic()
    findings: list[Finding] = []
    if not as_json:
        out.write(TABLE_HEADER + "\n")
    try:
        for ev in run.events():
            if speed is not None:
                delay = (ev.t - t_first) / speed - (time.monotonic() - wall0)
                if delay > 0:
                    await asyncio.sleep(delay)
            for f in ev.findings:
                out.write((finding_json(f) if as_json else finding_row(f)) + "\n")
                if publisher is not None and f.scope.value not in ("tp_group", "cluster"):
                    publisher.publish_finding(f)  # what the agents published; the controller publishes its own
            for inc in ev.incidents:
                out.write((incident_json(inc) if as_json else incident_row(inc)) + "\n")
            for sg in ev.suggestions:
                out.write((suggestion_json(sg) if as_json else suggestion_row(sg)) + "\n")
            if publisher is not None:
                for s in ev.summaries:
                    await publisher.publish_summary(s)
            findings += ev.findings
            progress.update(ev.t - t_first, len(findings))
            if speed is None and publisher is not None:
                await asyncio.sleep(0)  # let the publisher drain while we run
        out.flush()
    finally:
        progress.close()
        if publisher is not None:
            ok = await publisher.wait_drained(30.0)
            await publisher.close()
            publisher.spool.close()
            shutil.rmtree(spool_dir, ignore_errors=True)
            if not ok:
                print("skewd replay: not every finding was acknowledged by NATS within 30s", file=err)
            elif not quiet:
                print(f"skewd replay: published {publisher.stats.published} findings to {publish}", file=err)
    return findings


def main(argv: Sequence[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(list(argv))
    try:
        speed = parse_speed(args.speed)
        if args.report:  # before the replay, not after an hour of it
            cliargs.check_output_file(args.report)
        segments, damage = open_segments(args.bundles)
    except (ValueError, bundle.BundleError) as e:
        print(f"skewd replay: {e}", file=err)
        return EXIT_USAGE
    if not segments:
        for d in damage:
            print(f"skewd replay: {d}", file=err)
        return EXIT_DAMAGED if damage else EXIT_USAGE
    catalogue = replay_catalogue(segments, None if args.quiet else err)
    try:
        if args.diff:
            return _diff(args, catalogue, out, err)
        run = make_replay(args, segments, damage, catalogue, args.rules,
                          range_eval=speed is None and not args.per_tick and not args.publish)
        if args.explain:
            for line in explain(run):
                print(line, file=err)
        findings = asyncio.run(drive(run, speed, args.publish, out, args.json, err, args.quiet))
    except (ReplayError, bundle.BundleError, ValueError) as e:
        print(f"skewd replay: {e}", file=err)
        return EXIT_USAGE
    except Exception as e:
        from skewd.natsutil import NatsError

        if isinstance(e, NatsError):
            print(f"skewd replay: {e}", file=err)
            return EXIT_USAGE
        raise
    result = run.result(findings)
    if args.report:
        from ..report import write_report

        write_report(result, args.report)
        if not args.quiet:
            print(f"skewd replay: report written to {args.report}", file=err)
    return finish(result, err, args.quiet)


def finish(result: ReplayResult, err: TextIO, quiet: bool) -> int:
    """The statistics line, notes and damage on stderr; the exit status."""
    if not quiet:
        span = f"{fmt_t(result.start)} .. {fmt_t(result.end)}" if result.evaluations else "nothing"
        line = (f"skewd replay: {result.evaluations} evaluations on {len(result.nodes)} node(s) ({span}), "
                f"{len(result.findings)} transitions")
        if result.controller:
            shown = len({i.id for i in result.incidents})
            line += (f"; controller: {result.controller_evaluations} evaluations, {shown} incidents published "
                     f"({len(result.held)} still held at the end, "
                     f"{result.controller_status.get('incidents_withheld', 0)} closed while held), "
                     f"{len(result.suggestions)} suggestions")
        else:
            line += "; no controller (--no-controller)"
        print(line, file=err)
    for note in result.stopped_early:
        print(f"skewd replay: {note}", file=err)
    if result.damage:
        print("skewd replay: the bundle is damaged; everything before the damage was replayed:", file=err)
        for d in result.damage:
            print(f"  {d}", file=err)
        return EXIT_DAMAGED
    return EXIT_OK


def _diff(args: argparse.Namespace, catalogue: Catalogue, out: TextIO, err: TextIO) -> int:
    """Replay with each rule set (fresh readers, nothing shared), then print the incident-level
    differences and the finding-level ones; exit 1 when there is any, like ``diff``."""
    runs = []
    for rules in args.diff:
        segs, dmg = open_segments(args.bundles)
        runs.append(make_replay(args, segs, dmg, catalogue, [rules]).run())
    a, b = runs
    inc = diff_incidents(incident_stories(a.incidents, a.suggestions), incident_stories(b.incidents, b.suggestions))
    entries = diff_findings(a.findings, b.findings)
    for change in inc:
        out.write((canonical_json(change.to_dict()) if args.json else change.line()) + "\n")
    for e in entries:
        out.write((canonical_json(e.to_dict()) if args.json else e.line()) + "\n")
    if not args.json:
        n_inc = {k: sum(1 for c in inc if c.kind == k) for k in ("new", "gone", "changed")}
        n = {k: sum(1 for e in entries if e.kind == k) for k in ("appears", "disappears", "timing")}
        na, nb = len({i.id for i in a.incidents}), len({i.id for i in b.incidents})
        out.write(f"# {args.diff[0]} → {args.diff[1]}: incidents {n_inc['new']} new, {n_inc['gone']} gone, "
                  f"{n_inc['changed']} changed ({na} vs {nb} published); findings {n['appears']} appear, "
                  f"{n['disappears']} disappear, {n['timing']} change timing ({len(occurrences(a.findings))} vs "
                  f"{len(occurrences(b.findings))} fired occurrences)\n")
    code = finish(b, err, True)
    if code == EXIT_DAMAGED:
        return code
    return EXIT_DIFF if inc or entries else EXIT_OK
