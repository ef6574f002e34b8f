"""What a fuzz target is, and where its inputs start: the real samples on disk.

Paths to the repository, its fixtures and ../shared (the public captures, vLLM pages), the
:class:`Target` record every parser registers, and the generic ways to turn samples into
mutants (:func:`make_text`, :func:`make_bytes`). Shared by the per-parser target modules
(:mod:`fuzz_targets`, :mod:`fuzz_nvml`, :mod:`fuzz_bundle`) and the harness (:mod:`fuzz`).
"""
from __future__ import annotations

import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fuzz_mutate import Mutator


ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.nvml_double (the NVML target's library) lives beside bench/
    sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("SKEWD_SHARED", ROOT.parent.parent / "shared"))
if not SHARED.exists():
    SHARED = Path("/work/shared")
FIX = ROOT / "tests" / "fixtures"


@dataclass
class Target:
    """One parser (or a family of small ones) under test: how to make an input, how to run it,
    and which exceptions the parser documents."""

    name: str
    what: str
    expected: tuple[type[BaseException], ...]
    load: Callable[[], Any]
    make: Callable[[Any, random.Random], bytes]
    run: Callable[[Any, bytes], None]


def _read_seeds(paths: list[Path], limit: int = 64 << 10) -> list[bytes]:
    out = []
    for p in paths:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if data:
            out.append(data[:limit])
    return out


def _yaml_pieces(paths: list[Path], size: int = 4096) -> list[str]:
    """Rule/YAML files, and large ones cut into documents of a few top-level list items each."""
    out = []
    for p in paths:
        text = p.read_text(errors="replace")
        out.append(text[: 1 << 16])
        if len(text) <= size:
            continue
        head_end = text.find("\nrules:")
        head = "required_engine_version: 1\nrules:\n"
        body = text[head_end + 7:] if head_end >= 0 else text
        items = re.split(r"(?m)^(?=  - id:)", body)
        for i in range(0, len(items), 3):
            out.append(head + "".join(items[i:i + 3]))
    return out


def make_text(ctx: dict, rng: random.Random, tokens: list[str], max_len: int = 1 << 16) -> bytes:
    m = Mutator(rng, ctx["seeds"], tokens, max_len)
    s = rng.choice(ctx["seeds"])
    if isinstance(s, bytes):
        s = s.decode("utf-8", "replace")
    return m.text(s).encode("utf-8", "surrogatepass")


def make_bytes(ctx: dict, rng: random.Random, ints: list[int] | None = None, max_len: int = 1 << 16) -> bytes:
    m = Mutator(rng, ctx["seeds"], None, max_len)
    return m.bytes_(rng.choice(ctx["seeds"]), ints=ints)
