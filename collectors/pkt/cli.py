"""``skewd pkt FILE`` — per-flow packet timing features of a pcap/pcapng capture.

Exit status: 0 read completely; 1 read with problems (truncated file, frames of an
unsupported link type: the features cover what could be read, the problems go to stderr);
2 nothing could be read.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Sequence, TextIO

import numpy as np

from skewd import cliargs

from .capfile import DEFAULT_LIMITS, CaptureError, CaptureLimits, read_capture
from .features import IntervalFeatures, analyze
from .parse import counts, decode


def _ratio(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write a number such as 100") from None
    if not 1 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skewd pkt", description="Per-flow packet timing features of a capture file "
                                "(pcap or pcapng, optionally .gz or .zst).")
    p.add_argument("file", help="capture file")
    p.add_argument("--json", action="store_true", help="JSON lines: one object per flow and interval, then ports")
    p.add_argument("--interval", type=cliargs.duration, default=None,
                   help="features per interval of this length (e.g. 1s, 100ms, 5 = 5s; aligned to Unix time); "
                        "default: the whole capture as one interval")
    p.add_argument("--burst-gap", type=cliargs.duration, default=0.001,
                   help="idle gap that separates two bursts of a flow (default 1ms)")
    p.add_argument("--top", type=int, default=40, help="table: the N flows with most bytes per interval (0 = all)")
    p.add_argument("--max-decompressed", type=cliargs.size, default=DEFAULT_LIMITS.max_decompressed, metavar="SIZE",
                   help="a .gz/.zst capture may expand to at most this much (default 4G)")
    p.add_argument("--max-ratio", type=_ratio, default=DEFAULT_LIMITS.max_ratio, metavar="N",
                   help=f"... and to at most N times its compressed size, or {DEFAULT_LIMITS.ratio_floor >> 20}M "
                        f"if more (default {DEFAULT_LIMITS.max_ratio:g}; decompression bombs reach 1000)")
    return p


def _num(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _fmt_s(v: float) -> str:
    if v != v:
        return "-"
    if v >= 1:
        return f"{v:.2f}s"
    if v >= 1e-3:
        return f"{v * 1e3:.2f}ms"
    return f"{v * 1e6:.0f}us"


def _fmt_n(v: float) -> str:
    if v != v:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= div:
            return f"{v / div:.1f}{unit}"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


_TABLE = (("flow", None), ("pkts", "packets"), ("bytes", "bytes"), ("pps", "packets_per_second"),
          ("B/s", "bytes_per_second"), ("share", "bytes_share_ratio"), ("gap p50", "gap_p50_seconds"),
          ("gap p99", "gap_p99_seconds"), ("gap max", "gap_max_seconds"), ("jitter", "jitter_cov"),
          ("bursts", "bursts"), ("burst B", "burst_bytes"), ("rtx", "tcp_retransmits"),
          ("spur", "tcp_spurious_retransmits"))


def _table(iv: IntervalFeatures, top: int, out: TextIO) -> None:
    f = iv.flows
    order = sorted(range(len(iv.entities)), key=lambda i: -f["bytes"][i])
    order = [i for i in order if f["packets"][i] > 0]
    hidden = 0
    if top and len(order) > top:
        hidden = len(order) - top
        order = order[:top]
    rows = []
    for i in order:
        row = [iv.entities[i]]
        for title, col in _TABLE[1:]:
            v = float(f[col][i])
            if col.endswith("_seconds"):
                row.append(_fmt_s(v))
            elif col == "bytes_share_ratio":
                row.append("-" if v != v else f"{v * 100:.1f}%")
            elif col == "jitter_cov":
                row.append("-" if v != v else f"{v:.2f}")
            else:
                row.append(_fmt_n(v))
        rows.append(row)
    head = [t for t, _ in _TABLE]
    widths = [max(len(head[k]), *(len(r[k]) for r in rows)) if rows else len(head[k]) for k in range(len(head))]
    line = "  ".join(h.ljust(widths[0]) if k == 0 else h.rjust(widths[k]) for k, h in enumerate(head))
    print(line, file=out)
    for r in rows:
        print("  ".join(c.ljust(widths[0]) if k == 0 else c.rjust(widths[k]) for k, c in enumerate(r)), file=out)
    if hidden:
        print(f"... {hidden} more flow(s) (--top 0 shows all)", file=out)
    for p in iv.ports:
        extra = ""
        if p.kernel_drops_total is not None:
            extra += f", dropped by the capturing kernel {p.kernel_drops_total}"
        print(f"port {p.name}: {p.flows} flow(s), max flow share "
              f"{'-' if p.share_max != p.share_max else f'{p.share_max * 100:.1f}%'}, "
              f"gini {'-' if p.gini != p.gini else f'{p.gini:.2f}'}, bursts {p.bursts_total}, "
              f"tcp retransmissions {p.tcp_retransmits_total}, non-IP frames {p.other_total}{extra}", file=out)


#: how json.dumps writes the non-finite floats (NaN is written as null: JSON has no NaN)
_NON_FINITE = {"nan": "null", "inf": "Infinity", "-inf": "-Infinity"}


def _json_floats(values: list[float]) -> list[str]:
    """Each float as ``json.dumps`` writes it (``float.__repr__``), NaN as null."""
    fix = _NON_FINITE
    return [fix.get(s, s) for s in map(float.__repr__, values)]


def _flow_lines(iv: IntervalFeatures) -> str:
    """The JSON lines of an interval's flows that carried packets: every column as a float
    (NaN as null), keys sorted, exactly as ``json.dumps(row, sort_keys=True)`` writes them.

    Written column by column, not row by row: each column becomes Python floats once and
    their JSON text in one pass, and each line is one ``%`` of a template holding the sorted
    keys. A dict per flow encoded by ``json.dumps`` took 17 ms for the thousand flows of a
    1 M-packet file (3 % of ``skewd pkt --json``'s CPU); this takes 10 ms."""
    packets = np.asarray(iv.flows["packets"], dtype=float)
    keep = np.flatnonzero(~(packets <= 0))
    if not len(keep):
        return ""
    fields: dict[str, list[str] | str] = {"type": json.dumps("flow"), "interval_start": json.dumps(iv.t0),
                                          "interval_end": json.dumps(iv.t1)}
    fields["flow"] = [json.dumps(iv.entities[i]) for i in keep.tolist()]
    for k, v in iv.flows.items():
        fields[k] = _json_floats(np.asarray(v, dtype=float)[keep].tolist())
    keys = sorted(fields)
    template = "{" + ", ".join(f"{json.dumps(k)}: %s" for k in keys) + "}\n"
    const = {k: v for k, v in fields.items() if isinstance(v, str)}
    cols = [[const[k]] * len(keep) if k in const else fields[k] for k in keys]
    return "".join(template % row for row in zip(*cols))


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return _run(args, out, err)
    except BrokenPipeError:  # `skewd pkt ... | head`: the reader went away, not an error
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        cap = read_capture(args.file, limits=CaptureLimits(max_decompressed=args.max_decompressed,
                                                           max_ratio=args.max_ratio))
    except CaptureError as e:
        print(f"skewd pkt: {e}", file=err)
        return 2
    for p in cap.problems:
        print(f"skewd pkt: warning: {p}", file=err)
    pk = decode(cap.frames)
    c = counts(pk)
    if c["frames"] and c["undecoded"] == c["frames"]:
        print(f"skewd pkt: {args.file}: no frame could be decoded (see the warnings above)", file=err)
        return 2
    names = [i.name or Path(args.file).name for i in cap.interfaces] or [Path(args.file).name]
    drops = {k: i.drops for k, i in enumerate(cap.interfaces) if i.drops is not None}
    try:
        intervals = analyze(pk, args.interval, args.burst_gap, names, drops)
    except ValueError as e:
        print(f"skewd pkt: {e}", file=err)
        return 2
    if args.json:
        for iv in intervals:
            out.write(_flow_lines(iv))
            for p in iv.ports:
                row = {"type": "port", "interval_start": iv.t0, "interval_end": iv.t1}
                row.update({k: _num(v) for k, v in vars(p).items() if k != "silences"})
                # every silence of the port's collective traffic that ended in the interval
                sl = p.silences
                row["collective_connections"] = sl.connections
                row["collective_silences"] = [
                    {"end": e / 1e9, "seconds": n / 1e9, "by_send": bool(k), "sent_bytes": int(b)}
                    for e, n, k, b in zip(sl.end_ns.tolist(), sl.length_ns.tolist(), sl.by_send.tolist(),
                                          sl.sent_bytes.tolist())]
                print(json.dumps(row, sort_keys=True), file=out)
        summary = {"type": "capture", "file": args.file, "format": cap.format, **c,
                   "unsupported_linktypes": {str(k): v for k, v in cap.unsupported.items()},
                   "problems": cap.problems}
        print(json.dumps(summary, sort_keys=True), file=out)
    else:
        print(f"{args.file}: {cap.format}, {c['frames']} frames ({c['ip']} IP, {c['tcp']} TCP, {c['udp']} UDP"
              f"{', %d undecoded' % c['undecoded'] if c['undecoded'] else ''})", file=out)
        for iv in intervals:
            print(f"\ninterval {iv.t0:.6f} .. {iv.t1:.6f} ({iv.duration:.3f}s)", file=out)
            _table(iv, args.top, out)
    return 1 if cap.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
