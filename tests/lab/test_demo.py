"""``skewd demo`` runs on a fresh machine after the Quickstart setup, ends by itself, and shows
the controller naming the injected straggler."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_demo_lists_scenarios():
    p = subprocess.run([sys.executable, "-m", "skewd.cli", "demo", "--list"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ew1-tp-straggler" in p.stdout and "healthy-tp" in p.stdout


def test_demo_names_the_straggler_and_ends_by_itself():
    p = subprocess.run([sys.executable, "-m", "skewd.cli", "demo", "--plain", "--speed", "60"],
                       capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("skewd demo: finished · injected EW-1 on ")
    culprit = last.split("injected EW-1 on ")[1].split(" ")[0]
    assert f"culprit named: {culprit}" in last
    assert any("firing" in line and "EW-1-tp-straggler" in line and f" {culprit} " in line
               for line in p.stdout.splitlines())
    # the header says how many of the agents' rules run (it used to print 0 active, 0 inactive)
    counts = re.search(r"rules: (\d+) active, (\d+) inactive", p.stdout)
    assert counts and int(counts[1]) >= 30
