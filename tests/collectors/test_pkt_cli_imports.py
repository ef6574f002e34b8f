"""``skewd pkt FILE`` imports only what reading a capture needs.

Every module the command imports is paid on every run, before the first packet is read (issue
#23: >= 1.5 M packets/s wall through the CLI; numpy alone is a sixth of a 1 M-packet run). The
live collector (ring, BPF), the agent, controller, rule language, fault lab, transport and the
data model's catalogue have no part in reading a file; an import that slips into the pkt path
shows up here, not as a slower command nobody notices.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pkt" / "veth-linux-6.18-tcp-loss" / "wire-drop.pcap.gz"

#: module name prefixes ``skewd pkt FILE --json`` must not load
FORBIDDEN = ("skewd.agent", "skewd.controller", "skewd.rules", "skewd.lab", "skewd.model", "skewd.catalogue",
             "skewd.wire", "skewd.collectors.pkt.collector", "skewd.collectors.pkt.ring",
             "skewd.collectors.pkt.bpf", "skewd.collectors.pkt.samples", "nats", "pyarrow", "msgspec", "yaml",
             "prometheus_client", "zstandard")

PROGRAM = """
import os, sys
out = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the JSON lines go nowhere; the module list to `out`
from skewd.cli import main
rc = main(["pkt", sys.argv[1], "--json"])
sys.stdout.flush()
os.write(out, ("rc=%d\\n" % rc + "\\n".join(sorted(sys.modules))).encode())
"""


def test_reading_a_capture_imports_nothing_of_the_live_agent_or_controller() -> None:
    p = subprocess.run([sys.executable, "-c", PROGRAM, str(CAPTURE)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    first, *mods = p.stdout.splitlines()
    assert first in ("rc=0", "rc=1"), (first, p.stderr)  # 1: read with problems, still features
    assert "skewd.collectors.pkt.features" in mods  # it really read the capture
    loaded = sorted(m for m in mods if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert not loaded, f"skewd pkt FILE imported {loaded}"
