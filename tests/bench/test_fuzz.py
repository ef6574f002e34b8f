"""The short fuzz run CI does: every parser for a few seconds from its real samples, and not
one exception outside the parser's documented error type, nor a hang. The long run's figures
are in docs/reliability.md (the command is there)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import fuzz  # noqa: E402

pytestmark = pytest.mark.timeout(180)
SECONDS = 4

@pytest.mark.parametrize("target", list(fuzz.TARGETS))
def test_short_fuzz_run_finds_no_unhandled_exception(target: str, tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(BENCH / "fuzz.py"), "--targets", target, "--seconds", str(SECONDS),
                        "--procs", "1", "--out", str(tmp_path), "--json"], capture_output=True, text=True, timeout=170)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith('{"benchmark": "fuzz"')), None)
    assert line is not None, f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    res = json.loads(line)["targets"][target]
    assert res["inputs"] >= 20, res  # it really ran
    assert res["unhandled"] == 0 and res["hangs"] == 0, "\n".join(
        f"{k} x{b['count']}: {b['message']} (input {b['file'] or b['index']})" for k, b in res["bugs"].items())
    assert p.returncode == 0


def test_an_input_is_reproducible_from_its_index() -> None:
    import random

    ctx = fuzz.TARGETS["proc-sysfs"].load()
    a = fuzz.TARGETS["proc-sysfs"].make(ctx, random.Random("proc-sysfs:1:77"))
    b = fuzz.TARGETS["proc-sysfs"].make(ctx, random.Random("proc-sysfs:1:77"))
    assert a == b


def test_the_harness_counts_an_unhandled_exception_and_a_hang(tmp_path: Path, monkeypatch) -> None:
    """The harness itself: a parser that raises something undocumented, or loops, is reported."""
    calls = {"n": 0}

    def flaky(ctx, data):
        calls["n"] += 1
        if data[:1] == b"\x01":
            raise KeyError("boom")
        if data[:1] == b"\x02":
            while True:
                pass

    t = fuzz.Target("selftest", "a parser that fails", (ValueError,), lambda: {"seeds": [b"\x00"]},
                    lambda c, r: bytes([r.choice((0, 1, 2))]), flaky)
    monkeypatch.setitem(fuzz.TARGETS, "selftest", t)
    res = fuzz.fuzz(["selftest"], inputs=12, procs=1, timeout=0.3, out=tmp_path)["selftest"]
    assert res["inputs"] == 12 and res["unhandled"] >= 1 and res["hangs"] >= 1
    assert any(k.startswith("KeyError") for k in res["bugs"])
