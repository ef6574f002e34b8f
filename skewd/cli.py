"""The ``skewd`` command. Subcommands live with the code they drive; this only dispatches."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from skewd import __version__


def _availability():
    """Which catalogued signals this host can supply, and why the others are missing."""
    from skewd.agent.check import host_availability

    return host_availability()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skewd", description="Skew detection for GPU inference clusters.")
    p.add_argument("--version", action="version", version=f"skewd {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    from skewd.rules import cli as rules_cli

    rules_cli.add_parser(sub)
    sig = sub.add_parser("signals", help="list the signal catalogue")
    sig.add_argument("--json", action="store_true")
    # commands implemented by other packages register lazily (their modules may be heavy)
    for name, mod, help_ in DELEGATED:
        sp = sub.add_parser(name, help=help_, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(module=mod)
    return p


#: commands implemented by other packages: they parse their own arguments (their modules may be
#: heavy, so they are imported only when used)
DELEGATED = (
        ("pkt", "skewd.collectors.pkt.cli", "per-flow packet timing features of a pcap/pcapng file"),
        ("agent", "skewd.agent.main", "run the node agent (or --check what this host supports)"),
        ("up", "skewd.agent.up", "embedded local stack: nats-server, controller, agent, live view"),
        ("record", "skewd.agent.record", "record a capture bundle from this host's collectors"),
        ("replay", "skewd.agent.replay", "replay capture bundles through the rules"),
        ("controller", "skewd.controller.main", "run the controller"),
        ("demo", "skewd.lab.demo", "a simulated 4-node cluster, live"),
        ("nats-auth", "skewd.natsauth", "generate NATS users and per-role permissions (docs/security.md)"),
)


#: exit status of a command whose reader went away (``skewd replay --json | head``): what a
#: shell reports for a process ended by SIGPIPE, the Unix way of saying "nobody was listening"
EXIT_BROKEN_PIPE = 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Output to a pipe whose reader has gone (``| head``) ends the command
    quietly with status 141, as ``cat`` or ``grep`` would, instead of a BrokenPipeError
    traceback."""
    try:
        rc = _main(argv)
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe cannot be handled
        return rc
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again (Python's
    documented recipe for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = {name: mod for name, mod, _ in DELEGATED}
    if argv and argv[0] in delegated:
        return _delegate(argv[0], delegated[argv[0]], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd == "rules":
        from skewd.catalogue import full_catalogue
        from skewd.rules import cli as rules_cli

        return rules_cli.run(args, full_catalogue(), _availability)
    if args.cmd == "signals":
        return _signals(args.json)
    return _delegate(args.cmd, args.module, args.rest)


def parse_command(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a whole ``skewd ...`` command line without running it (the doc tests check every
    command the docs show this way). Delegated commands are parsed by their module's
    ``build_parser()``. Raises SystemExit, as argparse does, on a bad command line."""
    argv = list(argv)
    delegated = {name: mod for name, mod, _ in DELEGATED}
    if argv and argv[0] in delegated:
        mod = importlib.import_module(delegated[argv[0]])
        ns = mod.build_parser().parse_args(argv[1:])
        ns.cmd = argv[0]
        return ns
    return build_parser().parse_args(argv)


def _delegate(cmd: str, mod_name: str, rest: list[str]) -> int:
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and mod_name.startswith(e.name):
            print(f"skewd {cmd}: not available in this build ({mod_name} missing)", file=sys.stderr)
            return 2
        raise
    return int(mod.main(rest) or 0)


def _signals(as_json: bool) -> int:
    import json

    from skewd.catalogue import full_catalogue

    cat = full_catalogue()
    if as_json:
        print(json.dumps([{"name": s.name, "kind": s.kind.value, "unit": s.unit, "scope": s.scope.value,
                           "collector": s.collector, "desc": s.desc} for s in cat.values()], indent=2))
        return 0
    for s in sorted(cat.values(), key=lambda s: (s.collector, s.name)):
        print(f"{s.collector:9} {s.name:48} {s.kind.value:7} {s.unit:10} {s.scope.value:10} {s.desc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
