"""The CPU vLLM venv the tests share (``scripts/vllm-cpu-venv.sh``: CPU torch with gloo +
``vllm --no-deps``; about 3 GB, built once, then reused): the vLLM plugin tests run vLLM's
classes in it, the real-traffic lab's smoke runs its torch.distributed ranks with it.

``$SKEWD_VLLM_VENV`` points at it (default ``.venv-vllm`` beside the checkout);
``SKEWD_SKIP_VLLM=1`` says not to build it on this machine.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def skip_requested() -> bool:
    return os.environ.get("SKEWD_SKIP_VLLM") == "1"


def venv_dir() -> Path:
    return Path(os.environ.get("SKEWD_VLLM_VENV", ROOT / ".venv-vllm"))


def build() -> tuple[Path, subprocess.CompletedProcess]:
    """Build (or reuse) the venv; returns its python and the script's result to check."""
    venv = venv_dir()
    r = subprocess.run(["bash", str(ROOT / "scripts" / "vllm-cpu-venv.sh"), str(venv)], capture_output=True,
                       text=True, timeout=1500)
    return venv / "bin" / "python", r
