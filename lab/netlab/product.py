"""The product under test, as a user deploys it: a JetStream ``nats-server``, one ``skewd
controller`` and one ``skewd agent`` per node, real processes with **default configs**.

What the configs set is only what a user must: the cluster name and the NATS URL (controller);
cluster, node name, labels (``tp_group``, ``tp_rank``, ``model``), NATS URL and
``collectors.pkt.interface`` = the collective port (agents; the pkt collector captures one
interface). One lab-only line: ``spool.dir`` in the run directory, because several agents share
this machine's disk and the default ``/var/lib/skewd/spool/<node>`` would mix the spools of two
labs running side by side. Every ``SKEWD_*`` variable is removed from the processes'
environment so nothing overrides the files behind the user's back.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import yaml

from skewd.natsutil import find_nats_server

from .procs import Proc, Procs

NATS_PORT = 4222
TP_GROUP = "tp0"
MODEL = "lab-model"
WORKERS = Path(__file__).resolve().parent / "workers"


def clean_env() -> dict[str, str]:
    """The runner's environment without any SKEWD_* override (config comes from the files)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SKEWD_")}


def agent_config(cluster: str, node: str, rank: int, nats_url: str, coll_iface: str, spool_dir: Path,
                 record_dir: Path | None = None) -> dict:
    cfg = {
        "cluster": cluster,
        "node": node,
        "labels": {"tp_group": TP_GROUP, "tp_rank": str(rank), "model": MODEL},
        "nats": {"url": nats_url},
        "collectors": {"pkt": {"interface": coll_iface}},
        "spool": {"dir": str(spool_dir)},  # lab-only: see the module docstring
    }
    if record_dir is not None:  # --record: what the agent saw, for `skewd replay` after the run
        cfg["record"] = {"dir": str(record_dir)}
    return cfg


def controller_config(cluster: str, nats_url: str) -> dict:
    return {"cluster": cluster, "nats": {"url": nats_url}}


def write_yaml(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def wait_file_text(path: Path, needle: str, timeout: float, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if needle in path.read_text(errors="replace"):
                return
        except OSError:
            pass
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) before '{needle}':\n{proc.tail()}")
        time.sleep(0.2)
    raise TimeoutError(f"no '{needle}' in {path} after {timeout:.0f}s" + (f":\n{proc.tail()}" if proc else ""))


def start_nats(procs: Procs, ns: str, ip: str, store: Path) -> str:
    """A JetStream nats-server on the control namespace's eth0; returns its URL once ready."""
    store.mkdir(parents=True, exist_ok=True)
    p = procs.start("nats-server", ns, [find_nats_server(), "-a", ip, "-p", str(NATS_PORT), "-js",
                                        "-sd", str(store)], env=clean_env())
    wait_file_text(p.log, "Server is ready", 30, p)
    return f"nats://{ip}:{NATS_PORT}"


def start_recorder(procs: Procs, ns: str, url: str, out: Path) -> Proc:
    ready = out.with_suffix(".ready")
    p = procs.start("recorder", ns, [sys.executable, str(WORKERS / "recorder.py"), "--url", url, "--out", str(out),
                                     "--ready", str(ready)], env=clean_env())
    deadline = time.monotonic() + 60
    while not ready.exists():
        if not p.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the lab's NATS recorder did not start:\n{p.tail()}")
        time.sleep(0.2)
    return p


def start_controller(procs: Procs, ns: str, cfg: Path) -> Proc:
    return procs.start("controller", ns, [sys.executable, "-m", "skewd.cli", "controller", "--config", str(cfg)],
                       env=clean_env())


def start_agent(procs: Procs, ns: str, node: str, cfg: Path) -> Proc:
    return procs.start(f"agent-{node}", ns, [sys.executable, "-m", "skewd.cli", "agent", "--config", str(cfg)],
                       env=clean_env())
