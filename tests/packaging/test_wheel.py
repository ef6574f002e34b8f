"""What a user gets from ``pip install skewd``: the distribution is built (sdist, then the wheel
from the sdist, as ``python -m build`` and PyPI users do), installed into a fresh venv without
the source tree on the path, and the CLI is run from there.

An editable install (the dev venv) reads data files straight from the checkout, so it hides a
wheel that leaves them out; this test is the only place that sees what users see.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path | str]:
    """sdist + wheel built from a copy-free checkout; the build log is kept for warnings."""
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: build with this venv's setuptools (the `test` extra pins >= 77), so the
    # test needs no index for the build backend
    r = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], cwd=out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = list(out.glob("skewd-*.whl"))
    sdists = list(out.glob("skewd-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0], "log": r.stdout + r.stderr}


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    """A fresh venv with only the wheel and its declared dependencies (pip may use its cache
    and the configured indexes; the wheel's own deps are all that is installed)."""
    d = tmp_path_factory.mktemp("venv")
    r = _run([sys.executable, "-m", "venv", str(d)], cwd=d)
    assert r.returncode == 0, r.stderr
    r = _run([str(d / "bin" / "python"), "-m", "pip", "install", "-q", str(built["wheel"])], cwd=d, timeout=540)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return d


def _clean_env(tmp: Path) -> dict[str, str]:
    """No PYTHONPATH and a cwd outside the checkout: nothing but the installed wheel imports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SKEWD_"))}
    env["HOME"] = str(tmp)
    return env


def _skewd(venv: Path, *args: str, tmp: Path) -> subprocess.CompletedProcess:
    return _run([str(venv / "bin" / "skewd"), *args], cwd=tmp, env=_clean_env(tmp))


def test_build_emits_no_ignored_package_warnings(built):
    """setuptools' 'Package would be ignored' means data silently missing from some build."""
    log = str(built["log"])
    assert "would be ignored" not in log and "absent from the `packages` configuration" not in log, log[-2000:]
    assert "as a TOML table is deprecated" not in log


def test_wheel_carries_every_data_file_of_the_checkout(built):
    """Each YAML the CLI reads at run time (rule packs, pack tests, exporter mappings, fault-lab
    scenarios) is in the wheel at its ``skewd.*`` path."""
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    layout = {"rules": "skewd/rules", "collectors": "skewd/collectors", "lab": "skewd/lab"}
    expected = set()
    for top, dest in layout.items():
        for f in (ROOT / top).rglob("*.yaml"):
            expected.add(f"{dest}/{f.relative_to(ROOT / top).as_posix()}")
    assert any("scenarios/ew1-tp-straggler.yaml" in e for e in expected)
    assert expected and expected <= names, sorted(expected - names)


def test_metadata_declares_spdx_license_and_runtime_deps(built):
    with zipfile.ZipFile(built["wheel"]) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
    assert re.search(r"^License-Expression: Apache-2\.0$", meta, re.M), meta[:1500]
    requires = re.findall(r"^Requires-Dist: (\S+?)[\s;>=<!~\[]", meta, re.M)
    unconditional = {m.group(1).lower() for m in re.finditer(r"^Requires-Dist: ([A-Za-z0-9_.-]+)[^;\n]*$", meta, re.M)}
    assert {"scapy", "pyroute2"}.isdisjoint(unconditional), "test-only packages are runtime dependencies"
    assert "zstandard" in {r.lower() for r in requires}  # declared, in the zstd extra
    assert "Apache License" in (ROOT / "LICENSE").read_text()


def test_installed_wheel_runs_the_cli(venv, tmp_path):
    """The commands a new user runs first, from the wheel alone."""
    py = str(venv / "bin" / "python")
    # the runtime does not need the test-only packages
    r = _run([py, "-c", "import importlib.util as u; print(u.find_spec('scapy'), u.find_spec('pyroute2'))"],
             cwd=tmp_path, env=_clean_env(tmp_path))
    assert r.stdout.strip() == "None None", r.stdout + r.stderr
    r = _run([py, "-c", "import skewd, os; print(os.path.dirname(skewd.__file__))"], cwd=tmp_path, env=_clean_env(tmp_path))
    assert r.returncode == 0 and str(ROOT) not in r.stdout, r.stdout + r.stderr

    r = _skewd(venv, "demo", "--list", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    shipped = sorted(p.stem for p in (ROOT / "lab" / "sim" / "scenarios").glob("*.yaml"))
    listed = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    assert set(shipped) <= set(listed), sorted(set(shipped) - set(listed))

    r = _skewd(venv, "rules", "lint", tmp=tmp_path)  # the shipped packs (default path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _skewd(venv, "rules", "test", tmp=tmp_path)  # the packs' own tests
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert re.search(r"rule tests: [1-9]\d* passed, 0 failed", r.stdout), r.stdout[-500:]

    r = _skewd(venv, "agent", "--check", tmp=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    m = re.search(r"rules: (\d+) active, (\d+) inactive, (\d+) controller-evaluated", r.stdout)
    assert m and int(m.group(1)) + int(m.group(2)) > 0 and int(m.group(3)) > 0, r.stdout[-2000:]

    # the local broker `skewd up` / `skewd demo` start comes with the wheel's dependencies
    assert (venv / "bin" / "nats-server").exists()
