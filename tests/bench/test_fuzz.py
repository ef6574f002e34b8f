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
    # every failing input is named, so all of them can be re-run after a fix
    import random

    raising = [i for i in range(12) if random.Random(f"selftest:1:{i}").choice((0, 1, 2)) == 1]
    bug = next(b for k, b in res["bugs"].items() if k.startswith("KeyError"))
    assert sorted(bug["indices"]) == raising and bug["count"] == len(raising)


def test_a_stopped_run_says_where_to_continue(tmp_path: Path) -> None:
    """A long run stopped with SIGTERM (the way a session's deadline ends it) still reports what
    ran, and the index it names is where the inputs not yet tried begin (--start)."""
    import signal
    import time

    p = subprocess.Popen([sys.executable, str(BENCH / "fuzz.py"), "--targets", "proc-sysfs", "--inputs", "100000000",
                          "--procs", "1", "--out", str(tmp_path), "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    stats = tmp_path / "stats" / "proc-sysfs-0-0.json"
    deadline = time.monotonic() + 120
    while not stats.exists() and time.monotonic() < deadline:  # the worker has written figures once
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    line = next((ln for ln in out.splitlines() if ln.startswith('{"benchmark": "fuzz"')), None)
    assert line is not None, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
    res = json.loads(line)["targets"]["proc-sysfs"]
    assert 0 < res["inputs"] < 100_000_000
    assert res["next_index"] == {"0": res["inputs"]}  # inputs 0..n-1 ran, n is next
    assert f"next index {res['inputs']} (--start)" in out
    assert res["worker_cpu_seconds"] > 0


def test_json_mutation_paths_are_those_of_a_plain_walk() -> None:
    """fuzz_mutate's segment walk picks exactly the (container, key) a plain depth-first list
    would: an input's index names the same input as before it was made faster."""
    import random

    from fuzz_mutate import Mutator, _Paths

    def plain(doc, budget):
        paths, stack, seen = [], [doc], 0
        while stack and seen < budget:
            node = stack.pop()
            seen += 1
            if isinstance(node, dict):
                for k in list(node):
                    paths.append((node, k))
                    stack.append(node[k])
            elif isinstance(node, list):
                for i in range(len(node)):
                    paths.append((node, i))
                    stack.append(node[i])
        return paths

    rng = random.Random(5)
    m = Mutator(rng, [])
    for n in range(300):
        doc = {"a": [1, {"b": [], "c": {}}, [2, 3]], "d": "x"}
        for _ in range(n % 7):
            doc = m.json(doc)
        budget = rng.choice((3, 50, 5000))
        want = plain(doc, budget)
        got = _Paths(doc, budget)
        assert len(got) == len(want)
        for i in range(0, len(want), max(1, len(want) // 200)):
            assert got[i][0] is want[i][0] and got[i][1] == want[i][1]
