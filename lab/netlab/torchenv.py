"""Which interpreter runs the collective ranks: one with torch (gloo), or the plain ring fallback.

Looked for, in order: the explicit ``--torch-python`` / ``$SKEWD_LAB_TORCH_PYTHON``; the vLLM CPU
venv the tests build with ``scripts/vllm-cpu-venv.sh`` (``$SKEWD_VLLM_VENV``, default
``.venv-vllm`` beside the checkout), which carries CPU torch with gloo. Without one, the ranks
run the plain-Python ring all-reduce (:mod:`skewd.lab.netlab.workers.rank`, ``--backend ring``)
with this interpreter, which needs numpy (a skewd dependency).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = "import torch, torch.distributed as d; assert d.is_available() and d.is_gloo_available(); print(torch.__version__)"


@dataclass(frozen=True)
class RankRuntime:
    python: str
    backend: str  # "torch" | "ring"
    detail: str  # torch version, or why the fallback runs


def probe_torch(python: str) -> str | None:
    """torch's version when ``python`` imports torch.distributed with gloo, else None."""
    try:
        r = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def candidates(explicit: str | None = None) -> list[str]:
    out = []
    for c in (explicit, os.environ.get("SKEWD_LAB_TORCH_PYTHON")):
        if c:
            out.append(c)
    venv = Path(os.environ.get("SKEWD_VLLM_VENV", ROOT / ".venv-vllm"))
    out.append(str(venv / "bin" / "python"))
    return out


def ring_available(python: str = sys.executable) -> str | None:
    """None when ``python`` can run the ring fallback, else why not."""
    try:
        r = subprocess.run([python, "-c", "import numpy"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python}: {e}"
    return None if r.returncode == 0 else f"{python} has no numpy for the ring fallback"


def resolve(backend: str = "auto", explicit: str | None = None) -> RankRuntime:
    """The rank runtime for ``backend`` ("auto", "torch" or "ring"); raises RuntimeError when the
    requested one cannot run."""
    if backend in ("auto", "torch"):
        for c in candidates(explicit):
            if Path(c).exists():
                v = probe_torch(c)
                if v:
                    return RankRuntime(c, "torch", f"torch {v} (gloo)")
        if backend == "torch" or explicit:
            raise RuntimeError(f"no interpreter with torch.distributed gloo among {candidates(explicit)}; build one "
                               "with scripts/vllm-cpu-venv.sh or pass --backend ring")
    why = ring_available()
    if why:
        raise RuntimeError(why)
    return RankRuntime(sys.executable, "ring", "plain-Python ring all-reduce (no torch with gloo found)")
