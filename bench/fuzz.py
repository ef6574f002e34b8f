"""Mutational fuzzing of every parser skewd runs on input it does not control.

    python bench/fuzz.py                                  # every target, 20 s each, 2 processes
    python bench/fuzz.py --inputs 1000000 --procs 2 --out /tmp/fuzz   # the long run (docs/reliability.md)
    python bench/fuzz.py --targets pcap,wire --seconds 60
    python bench/fuzz.py --target pcap --reproduce /tmp/fuzz/crashes/pcap/<file>.bin

Each target starts from real samples (the shipped rule packs and rule tests, the recorded
/proc, sysfs and NVML fixtures, the vLLM and exporter pages in tests/fixtures and
../shared/vllm-metrics, the public captures in ../shared/pcaps and tests/fixtures/pkt, a
capture bundle and wire messages written by skewd itself) and feeds the parser mutants: byte
flips and splices, interesting numbers (2**64, 1e309, NaN, 400-digit integers), a dictionary of
the format's own tokens, and structure-aware edits (JSON values of the wrong type or nested
thousands deep, YAML aliases and anchors, pcapng options, bundle files re-sealed with valid
CRCs so the content, not the checksum, is what is wrong).

Every input is derived from (target, --seed, its index) alone, so a finding reproduces from its
index. Per target the harness counts inputs, exceptions of the parser's *documented* error
type (handled), anything else (unhandled: a bug; the input is saved under ``--out/crashes``),
hangs (an input using more than ``--timeout`` seconds of CPU: interrupted by SIGPROF, or killed
by the watchdog when stuck in C code), and the worker's peak RSS. Hangs are measured in CPU
time, not wall time, so a worker starved by a busy machine is not mistaken for one. Workers run under an address-space
cap (``--memory``) so a memory bomb shows up as a MemoryError instead of taking the machine.

Exit status: 0 when no target had an unhandled exception or a hang, 1 otherwise.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.nvml_double (the NVML target's library) lives beside bench/
    sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("SKEWD_SHARED", ROOT.parent.parent / "shared"))
if not SHARED.exists():
    SHARED = Path("/work/shared")
FIX = ROOT / "tests" / "fixtures"

# ---------------------------------------------------------------------------------------------
# Mutation
# ---------------------------------------------------------------------------------------------

#: numbers that break parsers: type limits, float edges, non-finite spellings, huge integers
NUMBERS = ["0", "-0", "1", "-1", "7", "255", "256", "-129", "65535", "65536", "2147483647", "2147483648",
           "-2147483649", "4294967295", "4294967296", "9007199254740993", "9223372036854775807",
           "9223372036854775808", "18446744073709551615", "18446744073709551616", "1e308", "1e309", "-1e309",
           "4.9e-324", "1e-400", "NaN", "nan", "-nan", "+Inf", "-Inf", "inf", "Infinity", ".inf", "-.inf", ".nan",
           "0x7fffffff", "0xffffffffffffffff", "1_000", "0o777", "0b101", "1.", ".5", "1e", "--1", "+-1",
           "9" * 400, "-" + "9" * 60, "1" + "0" * 30 + "h", "99999999999999999999999h", "0.000000001ms",
           "\u0663", "\u00b2", "\uff11", "1\u00a0", "NaN\u00a0"]
#: characters that change meaning in one format or another
SPECIAL = ["\0", "\n", "\r", "\t", " ", "\\", "\"", "'", "{", "}", "[", "]", "(", ")", ":", ",", "#", "&", "*",
           "!", "|", ">", "<", "=", "%", "@", "`", "\u2028", "\ufeff", "\udcff", "\U0001f600", "\x85"]


class Mutator:
    """Text, byte and JSON-value mutations driven by one ``random.Random``."""

    def __init__(self, rng: random.Random, seeds: list, tokens: list[str] | None = None,
                 max_len: int = 1 << 16, deep: int = 3000) -> None:
        self.rng = rng
        self.seeds = seeds
        self.tokens = tokens or []
        self.max_len = max_len
        self.deep = deep  # deepest nesting value() makes (JSON parsers recurse: 3000 finds that)

    # -- text ----------------------------------------------------------------------------------
    def text(self, s: str, rounds: int | None = None) -> str:
        r = self.rng
        for _ in range(rounds or r.choice((1, 1, 2, 3, 5, 8))):
            s = r.choice(self._TEXT_OPS)(self, s)
            if len(s) > self.max_len:
                s = s[: self.max_len]
        return s

    def _pos(self, s: str) -> int:
        return self.rng.randint(0, len(s)) if s else 0

    def _t_insert_token(self, s: str) -> str:
        tok = self.rng.choice(self.tokens or SPECIAL)
        i = self._pos(s)
        return s[:i] + tok + s[i:]

    def _t_insert_special(self, s: str) -> str:
        i = self._pos(s)
        return s[:i] + self.rng.choice(SPECIAL) * self.rng.choice((1, 1, 2, 3, 50)) + s[i:]

    def _t_number(self, s: str) -> str:
        nums = list(re.finditer(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", s))
        new = self.rng.choice(NUMBERS)
        if not nums:
            i = self._pos(s)
            return s[:i] + new + s[i:]
        m = self.rng.choice(nums)
        return s[: m.start()] + new + s[m.end():]

    def _t_delete(self, s: str) -> str:
        if not s:
            return s
        a = self._pos(s)
        b = min(len(s), a + self.rng.choice((1, 1, 2, 4, 16, 128)))
        return s[:a] + s[b:]

    def _t_duplicate(self, s: str) -> str:
        if not s:
            return s
        a = self._pos(s)
        b = min(len(s), a + self.rng.choice((1, 4, 16, 64, 512)))
        return s[:b] + s[a:b] * self.rng.choice((1, 2, 8, 100)) + s[b:]

    def _t_line(self, s: str) -> str:
        lines = s.split("\n")
        if not lines:
            return s
        r = self.rng
        i = r.randrange(len(lines))
        op = r.randrange(5)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(r.randrange(len(lines) + 1), lines[i])
        elif op == 2:
            j = r.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3:
            lines[i] = " " * r.choice((1, 2, 4)) + lines[i]
        else:
            lines[i] = lines[i].lstrip(" ")
        return "\n".join(lines)

    def _t_splice(self, s: str) -> str:
        other = self.rng.choice(self.seeds)
        if isinstance(other, bytes):
            other = other.decode("utf-8", "replace")
        if not isinstance(other, str) or not other:
            return s
        a = self.rng.randrange(len(other))
        piece = other[a: a + self.rng.choice((8, 64, 512))]
        i = self._pos(s)
        return s[:i] + piece + s[i:]

    def _t_char(self, s: str) -> str:
        if not s:
            return s
        i = self.rng.randrange(len(s))
        return s[:i] + chr(self.rng.choice((self.rng.randrange(32, 127), self.rng.randrange(0, 0x2000),
                                            ord(s[i]) ^ (1 << self.rng.randrange(7))))) + s[i + 1:]

    def _t_nest(self, s: str) -> str:
        i = self._pos(s)
        o, c = self.rng.choice((("[", "]"), ("{", "}"), ("(", ")")))
        n = self.rng.choice((10, 100, 1000, 5000))
        return s[:i] + o * n + s[i:i + 5] + c * n + s[i + 5:]

    def _t_truncate(self, s: str) -> str:
        return s[: self._pos(s)]

    _TEXT_OPS = [_t_insert_token, _t_insert_token, _t_insert_special, _t_number, _t_number, _t_delete,
                 _t_duplicate, _t_line, _t_line, _t_splice, _t_char, _t_nest, _t_truncate]

    # -- bytes ---------------------------------------------------------------------------------
    def bytes_(self, b: bytes, rounds: int | None = None, ints: list[int] | None = None) -> bytes:
        r = self.rng
        a = bytearray(b)
        for _ in range(rounds or r.choice((1, 1, 2, 3, 6))):
            op = r.randrange(9)
            n = len(a)
            if op == 0 and n:  # bit flip
                i = r.randrange(n)
                a[i] ^= 1 << r.randrange(8)
            elif op == 1 and n:  # random byte
                a[r.randrange(n)] = r.randrange(256)
            elif op in (2, 3) and n >= 4:  # an interesting integer over 1/2/4/8 aligned bytes
                width = r.choice((1, 2, 4, 4, 8))
                i = r.randrange(0, max(1, n - width + 1))
                if r.random() < 0.7:
                    i -= i % 4
                v = r.choice(ints or [0]) if ints and r.random() < 0.6 else r.choice(
                    (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, (1 << 63) - 1,
                     1 << 63, (1 << 64) - 1, r.getrandbits(32)))
                v &= (1 << (8 * width)) - 1
                a[i:i + width] = v.to_bytes(width, r.choice(("little", "big")))
            elif op == 4 and n:  # delete a range
                i = r.randrange(n)
                del a[i:i + r.choice((1, 4, 16, 64, 1024))]
            elif op == 5 and n:  # duplicate a range
                i = r.randrange(n)
                j = min(n, i + r.choice((4, 16, 64, 256, 4096)))
                a[j:j] = a[i:j] * r.choice((1, 2, 4))
            elif op == 6 and n:  # truncate
                del a[r.randrange(n):]
            elif op == 7:  # splice from another seed
                other = r.choice(self.seeds)
                if isinstance(other, (bytes, bytearray)) and other:
                    i = r.randrange(len(other))
                    piece = other[i:i + r.choice((16, 64, 1024))]
                    k = r.randrange(n + 1)
                    a[k:k] = piece
            elif op == 8 and n:  # insert random bytes
                k = r.randrange(n + 1)
                a[k:k] = bytes(r.randrange(256) for _ in range(r.choice((1, 3, 8))))
            if len(a) > self.max_len:
                del a[self.max_len:]
        return bytes(a)

    # -- JSON values ---------------------------------------------------------------------------
    def value(self) -> Any:
        r = self.rng
        k = r.randrange(16)
        if k == 0:
            return None
        if k == 1:
            return r.choice((True, False))
        if k == 2:
            return r.choice((0, -1, 1, 2 ** 31, 2 ** 53 + 1, 2 ** 64, -(2 ** 63) - 1, 10 ** 400))
        if k == 3:
            return r.choice((1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"), 0.5))
        if k == 4:
            return r.choice(("", "x", "\0", "\udcff", "a" * 10_000, "1e400", "NaN", "seg-000001", "../../etc/passwd",
                             "/etc/passwd", "rules/../../x"))
        if k == 5:
            return []
        if k == 6:
            return {}
        if k == 7:  # deep nesting
            v: Any = 1
            for _ in range(r.choice((50, min(500, self.deep), self.deep))):
                v = [v] if r.random() < 0.5 else {"a": v}
            return v
        if k == 8:  # a large flat list
            return list(range(r.choice((1000, 100_000))))
        if k == 9:
            return {str(i): i for i in range(r.choice((10, 10_000)))}
        if k == 10:
            return [r.choice(("x", 1, None, [], {}))] * r.randrange(1, 5)
        return r.choice(NUMBERS)

    def json(self, doc: Any) -> Any:
        """Replace, delete or add one node of a JSON document (a copy is not made: pass one)."""
        r = self.rng
        paths: list[tuple[Any, Any]] = []  # (container, key)
        stack = [doc]
        seen = 0
        while stack and seen < 5000:
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
        if not paths:
            return self.value() if r.random() < 0.5 else doc
        parent, key = r.choice(paths)
        op = r.randrange(6)
        if op <= 2:
            parent[key] = self.value()
        elif op == 3 and isinstance(parent, dict):
            del parent[key]
        elif op == 3:
            del parent[key]
        elif op == 4 and isinstance(parent, dict):
            parent[r.choice(("x", "", "nodes", "t", "kind", "schema", "format_version"))] = self.value()
        elif op == 4:
            parent.insert(r.randrange(len(parent) + 1), self.value())
        else:  # a value of another node put here (wrong type, same flavour)
            other_parent, other_key = r.choice(paths)
            parent[key] = other_parent[other_key]
        return doc


def dumps(doc: Any) -> str:
    try:
        return json.dumps(doc, allow_nan=True)
    except (RecursionError, ValueError, TypeError):
        return "[" * 5000 + "]" * 5000


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------

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


# -- YAML and rules ----------------------------------------------------------------------------
YAML_TOKENS = ["&a ", "*a", "&b [*a, *a, *a, *a]", "<<: *a", "!!python/object/apply:os.system ['true']",
               "!!binary", "!!float", "!!int", "!!timestamp 2023-13-45", "!!set", "!!omap", "? ", "- ", ": ",
               "---\n", "...\n", "%YAML 1.1\n", "|\n", ">-\n", "{a: 1}", "[1, 2]", "~", "null", "yes", "NO",
               "2001-12-14t21:59:43.10-05:00", "0o17", "1:30:00", "\"\\u0000\"", "'''", "\t", "\n  ", "\n- ",
               "expr: ", "params: ", "for: ", "id: ", "scope: ", "rules:\n", "macros:\n", "lists:\n",
               "override: {expr: append}", "required_engine_version: ", "pathology: {a: 1}", "tags: [stable]"]
EXPR_TOKENS = ["rate(", "avg(", "increase(", "quantile(", "last(", "age(", "gaps(", "longest_gap(", "peer_median(",
               "peer_zscore(", "bitand(", "default(", "greatest(", "least(", "abs(", "spread(", "rank(", "p99(",
               " and ", " or ", "not ", " > ", " < ", " == ", " != ", " in ", " not in ", " ** ", " % ", " / ", "-",
               "(", ")", ", ", "1m", "30s", "5m", "250ms", "1h30m", "0s", "99999999999999999999999h", "1e309",
               "10**400", "entity", "node", "[1, 2]", "'x'", "__class__", ".__dict__", "lambda x: x", "x[0]",
               "f(*a)", "f(k=1)", "#", "_d0_", "0.5", "gpu_utilization_ratio", "vllm_kv_cache_usage_ratio",
               "host_tcp_retrans_segs_total", "pcie_rx_bytes_total", "netdev_qdisc_backlog_bytes"]


def _rule_files() -> list[Path]:
    return (sorted((ROOT / "rules" / "packs").glob("*.yaml")) + sorted((ROOT / "tests" / "rules" / "data").glob("*.yaml"))
            + sorted((ROOT / "rules" / "tests").glob("*.yaml")))


def load_yaml() -> dict:
    files = _rule_files() + sorted((ROOT / "lab" / "sim" / "scenarios").glob("*.yaml")) \
        + sorted((ROOT / "collectors" / "exporter" / "mappings").glob("*.yaml")) \
        + sorted((FIX / "exporter" / "mappings").glob("*.yaml")) + sorted((ROOT / "deploy").rglob("*.yaml"))
    return {"seeds": _yaml_pieces(files)}


def make_text(ctx: dict, rng: random.Random, tokens: list[str], max_len: int = 1 << 16) -> bytes:
    m = Mutator(rng, ctx["seeds"], tokens, max_len)
    s = rng.choice(ctx["seeds"])
    if isinstance(s, bytes):
        s = s.decode("utf-8", "replace")
    return m.text(s).encode("utf-8", "surrogatepass")


def run_yaml(ctx: dict, data: bytes) -> None:
    from skewd.rules.yamlpos import load

    load(data.decode("utf-8", "replace"), "fuzz.yaml")


class _RuleEval:
    """Evaluates a loaded rule set on a few ticks of made-up samples for every signal it reads."""

    def __init__(self) -> None:
        from skewd.catalogue import full_catalogue

        self.cat = full_catalogue()

    def run(self, ruleset: Any, rng_seed: int) -> None:
        import numpy as np

        from skewd.model import BatchBuilder
        from skewd.rules.engine import Engine
        from skewd.rules.store import WindowStore

        store = WindowStore(self.cat, horizon=120.0)
        eng = Engine(ruleset, store, lookback=30.0)
        signals = sorted({s for r in ruleset.rules for s in r.requires if s in self.cat})
        rng = np.random.default_rng(rng_seed)
        vals = np.array([0.0, 1.0, -1.0, 0.5, 1e308, -1e308, np.nan, np.inf, -np.inf, 2.0 ** 64, 5e-324, 1e9])
        for tick in range(3):
            t = 1_700_000_000.0 + tick
            b = BatchBuilder("n1")
            for s in signals:
                scope = self.cat[s].scope.value
                for e in ("", f"{scope}0", f"{scope}1") if scope != "node" else ("",):
                    b.add(t, e, s, float(vals[rng.integers(len(vals))]))
            store.ingest(b.build())
            eng.evaluate(t)


def load_rules_ctx() -> dict:
    return {"seeds": _yaml_pieces(_rule_files()), "eval": _RuleEval()}


def run_rules(ctx: dict, data: bytes) -> None:
    from skewd.rules.loader import load_rules

    name = "/fuzz/rules.yaml"
    res = load_rules([name], ctx["eval"].cat, texts={name: data.decode("utf-8", "replace")})
    if res.ok and res.ruleset.rules:
        ctx["eval"].run(res.ruleset, zlib.crc32(data))


def load_expr() -> dict:
    """(scope, params, expr) of every shipped rule, and the packs' macros and lists."""
    import yaml

    seeds, macros, lists = [], [], []
    for p in _rule_files():
        if ".bad." in p.name:
            continue
        try:
            doc = yaml.safe_load(p.read_text())
        except (yaml.YAMLError, RecursionError):
            continue
        if not isinstance(doc, dict):
            continue
        macros += [m for m in doc.get("macros") or [] if isinstance(m, dict)]
        lists += [x for x in doc.get("lists") or [] if isinstance(x, dict)]
        for r in doc.get("rules") or []:
            if isinstance(r, dict) and isinstance(r.get("expr"), str) and r.get("scope"):
                seeds.append({"scope": r["scope"], "params": r.get("params") or {}, "expr": r["expr"]})
    return {"seeds": seeds, "macros": macros, "lists": lists, "eval": _RuleEval(),
            "texts": [s["expr"] for s in seeds]}


def make_expr(ctx: dict, rng: random.Random) -> bytes:
    seed = json.loads(json.dumps(rng.choice(ctx["seeds"])))
    m = Mutator(rng, ctx["texts"], EXPR_TOKENS, 8192, deep=400)
    if rng.random() < 0.85:
        seed["expr"] = m.text(seed["expr"])
    if rng.random() < 0.3 and seed["params"]:
        k = rng.choice(sorted(seed["params"]))
        seed["params"][k] = rng.choice((rng.choice(NUMBERS), m.value(), m.text(str(seed["params"][k]))))
    if rng.random() < 0.1:
        seed["scope"] = rng.choice(("gpu", "node", "engine", "cluster", "tp_group", "flow", "bogus"))
    return dumps(seed).encode("utf-8", "surrogatepass")


def run_expr(ctx: dict, data: bytes) -> None:
    from skewd.rules.loader import load_rules

    d = json.loads(data)
    rule = {"id": "FUZZ", "pathology": "custom-fuzz", "scope": d["scope"], "layer": "host",
            "params": d["params"], "expr": d["expr"]}
    doc = {"required_engine_version": 1, "macros": ctx["macros"], "lists": ctx["lists"], "rules": [rule]}
    name = "/fuzz/expr.yaml"
    res = load_rules([name], ctx["eval"].cat, texts={name: dumps(doc)})
    if res.ok:
        ctx["eval"].run(res.ruleset, zlib.crc32(data))


# -- Prometheus text ---------------------------------------------------------------------------
PROM_TOKENS = ["# HELP ", "# TYPE ", " counter\n", " gauge\n", " histogram\n", " summary\n", " untyped\n",
               "{", "}", "=\"", "\",", "le=\"+Inf\"", "le=\"NaN\"", "le=\"abc\"", "_bucket", "_count", "_sum",
               "_total", "_created", "vllm:", "model_name=\"m\"", "engine=\"0\"", " NaN", " +Inf", " -Inf",
               " 1e309", " 1 1700000000000", "\\n", "\\\"", "# EOF\n", "nccl_collective_exec_time_microseconds",
               "rank=\"x\"", "coll_sn=\"-1\"", "message_size=\"2.00GB\"", "DCGM_FI_DEV_GPU_UTIL", "gpu=\"0\""]


def load_prom() -> dict:
    paths = sorted((SHARED / "vllm-metrics").glob("*.prom")) + sorted(FIX.glob("vllm/*/*")) \
        + sorted(FIX.glob("exporter/*/metrics.prom")) + sorted(FIX.glob("nccl/inspector-prom*/**/*.prom"))
    pages = [p.decode("utf-8", "replace") for p in _read_seeds([p for p in paths if p.is_file()], 1 << 20)]
    seeds = list(pages)
    for page in pages:  # families one by one and a few together: most mutants then stay small
        fams = re.split(r"(?m)^(?=# HELP )", page)
        seeds += [f for f in fams if f.strip()]
        seeds += ["".join(fams[i:i + 4]) for i in range(0, len(fams), 4)]
    from skewd.catalogue import full_catalogue
    from skewd.collectors.exporter import mapping as mapping_mod

    cat = full_catalogue()
    mappings = []
    for name in ("dcgm-exporter", "doca-telemetry"):
        try:
            mappings.append(mapping_mod.load(mapping_mod.resolve(name), cat))
        except Exception:  # noqa: BLE001 - a mapping renamed since: fuzz with those that load
            pass
    return {"seeds": seeds, "mappings": mappings}


def run_prom(ctx: dict, data: bytes) -> None:
    from skewd.collectors.exporter.parse import apply
    from skewd.collectors.nccl.parse import parse_textfile
    from skewd.collectors.vllm.parse import derive, parse_page

    text = data.decode("utf-8", "replace")
    k = zlib.crc32(data) % 3
    if k == 0:
        page = parse_page(text)
        prev = None
        for eng in page.values():
            derive(prev, eng, 1.0)
            derive(eng, eng, 0.0)
            prev = eng
    elif k == 1:
        for mp_ in ctx["mappings"]:
            apply(mp_, text)
    else:
        parse_textfile(text)


# -- captures ----------------------------------------------------------------------------------
PCAP_INTS = [0xA1B2C3D4, 0xA1B23C4D, 0x0A0D0D0A, 0x1A2B3C4D, 1, 2, 3, 5, 6, 9, 14, 0x7F, 0x80, 0xFF, 1 << 28,
             (1 << 28) + 1, 65535, 0xFFFFFFF0, 12, 16, 24, 28, 32, 101, 113, 276, 0x0800, 0x86DD, 0x8100, 4791]


def _captures() -> list[Path]:
    files = sorted(p for p in (SHARED / "pcaps").glob("*") if p.suffix in (".pcap", ".cap", ".pcapng"))
    files += sorted(p for p in FIX.glob("pkt/**/*") if p.suffix in (".pcap", ".pcapng", ".cap"))
    return files


def load_pcap() -> dict:
    seeds = _read_seeds(_captures(), 16 << 10)
    zst = SHARED / "pcaps" / "pcapng-example.pcapng.zst"
    if zst.exists():
        try:
            import zstandard

            seeds.append(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(zst.read_bytes())).read(16 << 10))
        except ImportError:
            pass
    return {"seeds": seeds}


def make_bytes(ctx: dict, rng: random.Random, ints: list[int] | None = None, max_len: int = 1 << 16) -> bytes:
    m = Mutator(rng, ctx["seeds"], None, max_len)
    return m.bytes_(rng.choice(ctx["seeds"]), ints=ints)


def run_pcap(ctx: dict, data: bytes) -> None:
    import numpy as np

    from skewd.collectors.pkt.capfile import parse_capture
    from skewd.collectors.pkt.parse import counts, decode

    cap = parse_capture(np.frombuffer(data, np.uint8), "fuzz.pcap")
    counts(decode(cap.frames))


def load_capfile() -> dict:
    ctx = load_pcap()
    raw = ctx["seeds"][:12]
    seeds = list(raw) + [gzip.compress(s) for s in raw]
    try:
        import zstandard

        seeds += [zstandard.ZstdCompressor().compress(s) for s in raw]
    except ImportError:
        pass
    d = Path(tempfile.mkdtemp(prefix="skewd-fuzz-cap-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    return {"seeds": seeds, "dir": d}


def run_capfile(ctx: dict, data: bytes) -> None:
    from skewd.collectors.pkt.capfile import CaptureLimits, read_capture

    p = ctx["dir"] / "in.cap"
    p.write_bytes(data)
    read_capture(p, limits=CaptureLimits(max_decompressed=16 << 20, ratio_floor=4 << 20))


# -- /proc and sysfs files ---------------------------------------------------------------------
def load_procfs() -> dict:
    """(kind, text) seeds from the recorded trees; the kind picks the parse function."""
    seeds: list[bytes] = []

    def add(kind: str, paths: list[Path]) -> None:
        for p in paths:
            if p.is_file():
                seeds.append(kind.encode() + b"\n" + p.read_bytes()[: 32 << 10])

    for tree in FIX.glob("host/*/proc"):
        add("stat", [tree / "stat"])
        add("softirqs", [tree / "softirqs"])
        add("snmp", [tree / "net" / "snmp"])
        add("loadavg", [tree / "loadavg"])
    rdma = list(FIX.glob("rdma/*/sys/class/infiniband/*/ports/*"))
    for port in rdma:
        for f in port.rglob("*"):
            if f.is_file():
                add("rdma:" + str(f.relative_to(port)), [f])
    add("rdma-resource", list(FIX.glob("rdma/*/*.json")))
    for dev in FIX.glob("pcie/*/sys/bus/pci/devices/*"):
        for name in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width",
                     "aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal", "numa_node", "class"):
            add("pcie:" + name, [dev / name])
    for speed in FIX.glob("netdev/*/sys/class/net/*/speed"):
        add("netdev-speed", [speed])
    for jf in FIX.glob("nccl/*/*.json*"):
        add("nccl-json", [jf])
    for pf in FIX.glob("nccl/*/*.prom"):
        add("nccl-prom", [pf])
    seeds += [b"pci-class\n0x0302", b"pci-address\n0000:3b:00.0", b"bus-id\n00000000:1B:00.0"]
    return {"seeds": seeds}


def make_procfs(ctx: dict, rng: random.Random) -> bytes:
    seed = rng.choice(ctx["seeds"])
    kind, _, body = seed.partition(b"\n")
    m = Mutator(rng, ctx["seeds"], ["\n", " ", ":", "\t", "N/A (no PMA)", "4: ACTIVE", "100 Gb/sec (4X EDR)",
                                     "Unknown", "-1", "8.0 GT/s PCIe", "16 GT/s", "x16", "TOTAL_ERR_COR ", "cpu",
                                     "cpu99 ", "procs_running ", "Tcp: ", "Udp: ", "NET_RX:", "{", "}",
                                     "\"coll_perf\":", "\"dump_stats\":"], 1 << 15)
    if rng.random() < 0.5:
        new = m.text(body.decode("utf-8", "replace")).encode("utf-8", "surrogatepass")
    else:
        new = m.bytes_(body)
    return kind + b"\n" + new


def run_procfs(ctx: dict, data: bytes) -> None:
    from skewd.collectors.host import parse as host
    from skewd.collectors.nccl import parse as nccl
    from skewd.collectors.netdev import parse as netdev
    from skewd.collectors.nvml_backend import normalise_bus_id
    from skewd.collectors.pcie import parse as pcie
    from skewd.collectors.rdma import parse as rdma

    kind_b, _, body = data.partition(b"\n")
    kind = kind_b.decode("utf-8", "replace")
    text = body.decode("utf-8", "replace")
    if kind == "stat":
        host.parse_stat(text)
    elif kind == "softirqs":
        host.parse_softirqs(text)
    elif kind == "snmp":
        host.parse_snmp(text)
    elif kind == "loadavg":
        host.parse_loadavg(text)
    elif kind.startswith("rdma:"):
        rdma.port_samples("mlx5_0/1", {kind[5:]: text})
    elif kind == "rdma-resource":
        rdma.resource_samples(text)
    elif kind.startswith("pcie:"):
        if kind == "pcie:class":
            pcie.pci_class(text)
        else:
            pcie.device_samples({kind[5:]: text})
    elif kind == "netdev-speed":
        netdev.speed_samples("eth0", text)
    elif kind == "nccl-json":
        stream = nccl.JsonStream()
        for line in body.splitlines():
            try:
                stream.feed(line)
            except nccl.RecordError:
                pass
    elif kind == "nccl-prom":
        nccl.parse_textfile(text)
    elif kind == "pci-class":
        pcie.parse_class_filter(text)
    elif kind == "pci-address":
        pcie.normalise_address(text)
    elif kind == "bus-id":
        normalise_bus_id(text)


# -- NVML --------------------------------------------------------------------------------------
NVML_ERRORS = ["NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_GPU_IS_LOST",
               "NVML_ERROR_UNKNOWN", "NVML_ERROR_TIMEOUT", "NVML_ERROR_INVALID_ARGUMENT",
               "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_INSUFFICIENT_SIZE", "NVML_ERROR_CORRUPTED_INFOROM"]
FIELD_TYPES = ["DOUBLE", "UNSIGNED_INT", "UNSIGNED_LONG", "UNSIGNED_LONG_LONG", "SIGNED_LONG_LONG",
               "SIGNED_INT", "UNSIGNED_SHORT"]


def load_nvml() -> dict:
    import yaml

    dumps_ = [yaml.safe_load(p.read_text()) for p in sorted(FIX.glob("gpu/*.yaml"))]
    for d in dumps_:
        d.pop("events", None)  # the XID waiter thread is not what is fuzzed here
    return {"seeds": dumps_}


#: NVML calls answering a structure (the double builds pynvml's ctypes type from its fields)
_NVML_STRUCTS = {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo"}
_NVML_FIXED = {"nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceRegisterEvents"}


def _nvml_int(rng: random.Random, old: Any = 0) -> int:
    """Any value NVML's unsigned ctypes results can carry (the binding returns them as int)."""
    k = rng.randrange(5)
    if k == 0:
        return rng.choice((0, 1, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF))
    if k == 1:
        return rng.getrandbits(rng.choice((8, 16, 32)))
    if k == 2 and isinstance(old, int) and not isinstance(old, bool):
        return (old * rng.choice((0, 2, 1000, 1 << 20))) & 0xFFFFFFFF
    if k == 3:
        return rng.choice(((1 << 64) - 1, 1 << 63, rng.getrandbits(64)))
    return rng.getrandbits(32)


def _nvml_answer(rng: random.Random, old: Any, error_ok: bool = True) -> Any:
    """A new answer in a place that takes an int, an error or a sequence of answers."""
    k = rng.randrange(6)
    if k == 0 and error_ok:
        return rng.choice(NVML_ERRORS)
    if k == 1 and error_ok:
        return {"seq": [rng.choice(NVML_ERRORS) if rng.random() < 0.3 else _nvml_int(rng, old)
                        for _ in range(rng.randrange(1, 4))]}
    if isinstance(old, float) and rng.random() < 0.5:
        return rng.choice((float("nan"), float("inf"), -0.0, 1e308, -1.0))
    return _nvml_int(rng, old)


def _nvml_mutate_spec(rng: random.Random, spec: dict) -> None:
    fns = [f for f in spec if f not in _NVML_FIXED]
    if not fns:
        return
    fn = rng.choice(fns)
    v = spec[fn]
    if fn in _NVML_STRUCTS:
        if rng.random() < 0.25 or not isinstance(v, dict) or "seq" in v:
            spec[fn] = rng.choice(NVML_ERRORS)
            return
        k = rng.choice(sorted(v))
        if k == "busId":
            text = Mutator(rng, [v[k]]).text(str(v[k]))
            v[k] = text.encode("ascii", "replace")[:15].decode("ascii")
        else:
            v[k] = _nvml_int(rng, v[k]) & (0xFF if k in ("bus", "device") else 0xFFFFFFFF)
        return
    if fn == "nvmlDeviceGetFieldValues" and isinstance(v, dict) and v:
        k = rng.choice(sorted(v))
        cur = v[k]
        if isinstance(cur, dict) and "value" in cur and rng.random() < 0.5:
            cur["type"] = rng.choice(FIELD_TYPES)
            cur["value"] = _nvml_int(rng, cur["value"]) if cur["type"] != "DOUBLE" else \
                rng.choice((float("nan"), float("inf"), 1e308, -1.0, 0.5))
            return
        v[k] = _nvml_answer(rng, cur)
        return
    if fn == "nvmlDeviceGetNvLinkState":  # a list of per-link states, or an error
        if isinstance(v, list) and v and rng.random() < 0.8:
            i = rng.randrange(len(v))
            v[i] = rng.choice(NVML_ERRORS) if rng.random() < 0.3 else _nvml_int(rng, v[i])
        else:
            spec[fn] = rng.choice(NVML_ERRORS) if rng.random() < 0.5 else [_nvml_int(rng) for _ in range(18)]
        return
    if isinstance(v, dict) and v and "seq" not in v:  # answers keyed by an argument (clock type, ...)
        k = rng.choice(sorted(v))
        v[k] = _nvml_answer(rng, v[k])
        return
    if isinstance(v, (dict, list)):
        spec[fn] = rng.choice(NVML_ERRORS)
        return
    spec[fn] = _nvml_answer(rng, v)


def make_nvml(ctx: dict, rng: random.Random) -> bytes:
    dump = json.loads(json.dumps(rng.choice(ctx["seeds"])))
    specs = [dump["defaults"]] + list(dump.get("gpus") or [])
    for _ in range(rng.choice((1, 2, 4, 8))):
        _nvml_mutate_spec(rng, rng.choice(specs))
    return json.dumps(dump).encode()


def run_nvml(ctx: dict, data: bytes) -> None:
    from tests.nvml_double import NvmlDouble  # noqa: PLC0415 - the pynvml-faithful double (see its doc)

    from skewd.collectors.base import CollectorError
    from skewd.collectors.gpu.collector import GpuCollector
    from skewd.collectors.nvml_backend import NvmlBackend
    from skewd.collectors.pcie.collector import PcieCollector

    dump = json.loads(data)
    lib = NvmlDouble(dump)
    backend = NvmlBackend(lib)
    for c in (GpuCollector("fuzz", {"xid_events": False}, backend=backend),
              PcieCollector("fuzz", {"nvml": True}, sys_root="/nonexistent", backend=backend)):
        c.probe()
        try:
            for t in (1.0, 2.0):
                c.collect(t)
        except CollectorError:
            pass
        finally:
            c.stop()


# -- wire messages -----------------------------------------------------------------------------
def _sample_messages() -> list[bytes]:
    from skewd import wire
    from skewd.model import Finding, Layer, Scope, Severity, State

    f = Finding(rule_id="EW-1-straggler", pathology="EW-1", severity=Severity.CRITICAL, layer=Layer.NETWORK,
                scope=Scope.NODE, node="n1", entity="", state=State.FIRING, active_at=1_700_000_000.5,
                evaluated_at=1_700_000_010.0, cluster="c1", labels={"model": "m"}, summary="slow",
                evidence={"rate(x, 1m)": 1.5}, mitigation="drain")
    msgs = [wire.encode(f)]
    s = wire.Summary(node="n1", cluster="c1", t=1_700_000_000.0, interval=1.0,
                     signals={"pkt_flow_gap_p99_seconds": {"": 0.01, "udp 10.0.0.1:1>10.0.0.2:2": 0.2},
                              "collective_burst_starts": {"0": 1_699_999_999.5}},
                     clock_sync=wire.ClockSync(True, 0.002), agent_version="0.1.0", labels={"model": "m"})
    msgs.append(wire.encode(s))
    h = wire.Health(node="n1", cluster="c1", t=1_700_000_000.0,
                    collectors={"gpu": wire.CollectorHealth(state="active", reason="")},
                    rules=wire.RulesHealth(active=3, inactive={"X": "no signal"}),
                    last_reload=wire.ReloadStatus(ok=True), spool_depth=2, drops={"spool_full": 1},
                    agent_version="0.1.0")
    msgs.append(wire.encode(h))
    return msgs


def load_wire() -> dict:
    return {"seeds": _sample_messages()}


def make_wire(ctx: dict, rng: random.Random) -> bytes:
    seed = rng.choice(ctx["seeds"])
    m = Mutator(rng, ctx["seeds"], ['"schema": 99', '"kind": "summary"', "NaN", "Infinity", "-Infinity", "1e400",
                                    "[", "{", '"t": ', '"labels": [1, 2]', "\\u0000", "\\ud800"], 1 << 16)
    k = rng.randrange(3)
    if k == 0:
        doc = json.loads(seed)
        for _ in range(rng.choice((1, 1, 2, 3))):
            doc = m.json(doc)
        return dumps(doc).encode("utf-8", "surrogatepass")
    if k == 1:
        return m.text(seed.decode()).encode("utf-8", "surrogatepass")
    return m.bytes_(seed)


def run_wire(ctx: dict, data: bytes) -> None:
    from skewd import wire

    k = zlib.crc32(data) % 4
    if k == 0:
        wire.decode(data)
    elif k == 1:
        wire.decode_finding(data)
    elif k == 2:
        wire.decode_summary(data)
    else:
        wire.decode_health(data)


# -- capture bundles ---------------------------------------------------------------------------
RULES_FOR_BUNDLE = """required_engine_version: 1
rules:
  - id: FUZZ-busy
    pathology: custom-fuzz
    scope: node
    layer: host
    expr: avg(host_procs_running, 10s) > 2
  - id: FUZZ-kv
    pathology: custom-fuzz
    scope: engine
    layer: engine
    for: 2s
    expr: last(vllm_kv_cache_usage_ratio, 5s) > 0.5
"""


def _seed_bundle(d: Path) -> Path:
    """A small segment written by skewd's own SegmentWriter: samples of two nodes, ticks, findings,
    summaries, a stored rule file, a packets block."""
    from skewd import wire
    from skewd.agent import bundle as B
    from skewd.agent import summary as summary_mod
    from skewd.catalogue import full_catalogue
    from skewd.model import BatchBuilder, Finding, Layer, Scope, Severity, State
    from skewd.rules.store import WindowStore

    cat = full_catalogue()
    seg = d / "seg-000001"
    meta = {"cluster": "fz", "nodes": ["n1", "n2"], "recorder_node": "n1",
            "node_labels": {"n1": {"cluster": "fz", "model": "m"}, "n2": {"cluster": "fz", "model": "m"}},
            "settings": {"evaluation_interval": 1.0, "summary_interval": 1.0, "lookback": 30.0, "horizon": 120.0},
            "available_signals": None}
    w = B.SegmentWriter(seg, meta, [("rules.yaml", RULES_FOR_BUNDLE)])
    stores = {n: WindowStore(cat) for n in ("n1", "n2")}
    t0 = 1_700_000_000.0
    for k in range(8):
        t = t0 + k
        batches = []
        for n in ("n1", "n2"):
            b = BatchBuilder(n)
            b.add(t, "", "host_procs_running", float(k % 4))
            b.add(t, "engine0", "vllm_kv_cache_usage_ratio", 0.1 * k)
            b.add(t, "cpu0", "host_cpu_user_seconds_total", 10.0 + k)
            batches.append(b.build())
            stores[n].ingest(batches[-1])
        w.write_samples(batches)
        w.write_ticks([(t, w.batches, k % 2)])
        lines = []
        for n in ("n1", "n2"):
            msg = summary_mod.make_summary(stores[n], n, "fz", t, 1.0)
            lines.append(wire.encode(msg).decode())
        w.write_lines(B.SUMMARIES, lines, [t, t])
        if k % 3 == 0:
            f = Finding(rule_id="FUZZ-busy", pathology="custom-fuzz", severity=Severity.WARNING, layer=Layer.HOST,
                        scope=Scope.NODE, node="n1", entity="", state=State.FIRING, active_at=t, evaluated_at=t,
                        cluster="fz")
            w.write_lines(B.FINDINGS, [json.dumps(f.to_dict())], [t])
        w.write_packets([(int(t * 1e9), bytes(14) + b"\x45" + bytes(40), None, 1)])
    w.close([cat[s] for s in ("host_procs_running", "vllm_kv_cache_usage_ratio", "host_cpu_user_seconds_total")])
    return seg


def _pack(files: dict[str, bytes]) -> bytes:
    out = bytearray()
    for name in sorted(files):
        nb = name.encode()
        out += len(nb).to_bytes(2, "little") + nb + len(files[name]).to_bytes(4, "little") + files[name]
    return bytes(out)


def _unpack(data: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    i = 0
    while i + 6 <= len(data):
        n = int.from_bytes(data[i:i + 2], "little")
        name = data[i + 2:i + 2 + n].decode("utf-8", "replace")
        ln = int.from_bytes(data[i + 2 + n:i + 6 + n], "little")
        files[name] = data[i + 6 + n:i + 6 + n + ln]
        i += 6 + n + ln
    return files


def load_bundle() -> dict:
    base = Path(tempfile.mkdtemp(prefix="skewd-fuzz-bundle-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    seg = _seed_bundle(base / "seed")
    files = {str(p.relative_to(seg)): p.read_bytes() for p in sorted(seg.rglob("*")) if p.is_file()}
    from skewd.agent.replay import replay_catalogue  # noqa: F401 - imported once, not per input
    from skewd.catalogue import full_catalogue

    return {"seeds": [files], "dir": base / "in", "cat": full_catalogue(), "texts": [
        v for v in files.values()]}


def _reseal(files: dict[str, bytes], changed: str) -> None:
    """Make the index (and meta.json's rule checksums) agree with a changed file again: the
    damage is then in the content, which is what the readers must survive."""
    from skewd.agent import bundle as B

    if changed.startswith("rules/") and "meta.json" in files:
        try:
            meta = json.loads(files["meta.json"])
            for f in (meta.get("rules") or {}).get("files") or []:
                if isinstance(f, dict) and f.get("stored") == changed:
                    f["sha256"] = hashlib.sha256(files[changed]).hexdigest()
            files["meta.json"] = json.dumps(meta).encode()
        except (ValueError, AttributeError, TypeError, RecursionError):
            pass
        return
    if "index.jsonl" not in files or changed in ("index.jsonl", "meta.json"):
        return
    lines = files["index.jsonl"].split(b"\n")
    entries = []
    for ln in lines:
        try:
            entries.append(json.loads(ln) if ln.strip() else None)
        except (ValueError, RecursionError):
            entries.append(None)
    mine = [e for e in entries if isinstance(e, dict) and e.get("file") == changed]
    data = files[changed]
    if mine:
        # keep the chunk boundaries; the last chunk absorbs a change of length
        off = 0
        for k, e in enumerate(mine):
            ln_ = e.get("length") if isinstance(e.get("length"), int) else 0
            if k == len(mine) - 1:
                ln_ = max(0, len(data) - off)
            e["offset"], e["length"] = off, ln_
            e["crc32"] = zlib.crc32(data[off:off + ln_])
            off += ln_
    out = []
    for raw, e in zip(lines, entries):
        if isinstance(e, dict) and e.get("file") == changed:
            e.pop("line_crc32", None)
            e["line_crc32"] = B.line_crc(e)
            out.append(B.canon(e).encode() if _finite_json(e) else raw)
        else:
            out.append(raw)
    files["index.jsonl"] = b"\n".join(out)


def _finite_json(e: Any) -> bool:
    try:
        json.dumps(e, allow_nan=False)
        return True
    except (ValueError, TypeError, RecursionError):
        return False


def make_bundle(ctx: dict, rng: random.Random) -> bytes:
    files = dict(rng.choice(ctx["seeds"]))
    m = Mutator(rng, ctx["texts"], None, 1 << 20)
    for _ in range(rng.choice((1, 1, 2))):
        name = rng.choice(sorted(files))
        data = files[name]
        if name == "meta.json" or (name == "index.jsonl" and rng.random() < 0.5) or \
                (name.endswith(".jsonl") and rng.random() < 0.7):
            if name == "meta.json":
                try:
                    doc = json.loads(data)
                except (ValueError, RecursionError):  # an earlier round made it unreadable
                    files[name] = m.bytes_(data)
                    continue
                for _ in range(rng.choice((1, 1, 2, 3))):
                    doc = m.json(doc)
                files[name] = dumps(doc).encode("utf-8", "surrogatepass")
            else:
                lines = data.split(b"\n")
                i = rng.randrange(len(lines))
                try:
                    doc = json.loads(lines[i]) if lines[i].strip() else {}
                    doc = m.json(doc)
                    if isinstance(doc, dict) and name == "index.jsonl":
                        doc.pop("line_crc32", None)
                        from skewd.agent import bundle as B

                        if _finite_json(doc):
                            doc["line_crc32"] = B.line_crc(doc)
                    lines[i] = dumps(doc).encode("utf-8", "surrogatepass")
                except (ValueError, RecursionError):
                    lines[i] = m.bytes_(lines[i])
                files[name] = b"\n".join(lines)
        elif name.endswith(".yaml"):
            files[name] = m.text(data.decode("utf-8", "replace")).encode("utf-8", "surrogatepass")
        elif rng.random() < 0.15:
            del files[name]
            continue
        else:
            files[name] = m.bytes_(data, ints=[0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 8, 0x10000000])
        if rng.random() < 0.85:
            _reseal(files, name)
    return _pack(files)


def run_bundle(ctx: dict, data: bytes) -> None:
    from skewd.agent import bundle as B
    from skewd.agent.replay import ClusterReplay, ReplayError, Replayer

    d: Path = ctx["dir"]
    shutil.rmtree(d, ignore_errors=True)
    seg_dir = d / "seg-000001"
    for name, content in _unpack(data).items():
        if ".." in name or name.startswith("/") or not name:
            continue
        p = seg_dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    try:
        seg = B.Segment(seg_dir)
    except B.BundleError:
        return
    try:
        seg.verify()
        for _ in seg.iter_batches():
            pass
        seg.ticks()
        seg.findings()
        seg.summaries()
        seg.readable_batches()
        for name in (B.SAMPLES, B.TICKS, B.FINDINGS, B.SUMMARIES):
            seg.readable_until(name)
        (seg.start, seg.end, seg.nodes, seg.node_labels, seg.settings, seg.cluster, seg.catalogue())
        try:
            # as `skewd replay` runs by default: the nodes and the controller fed with what they sent
            ClusterReplay(Replayer([seg], ctx["cat"])).run()
        except (ReplayError, B.BundleError):
            pass
    finally:
        seg.close()


TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("yaml", "rules/yamlpos.py: YAML with positions, alias and depth budgets", (),
           load_yaml, lambda c, r: make_text(c, r, YAML_TOKENS), run_yaml),
    Target("rules", "rules/loader.py + expr.py: rule files loaded, compiled and evaluated", (),
           load_rules_ctx, lambda c, r: make_text(c, r, YAML_TOKENS + EXPR_TOKENS), run_rules),
    Target("expr", "rules/expr.py: expressions (and params) compiled and evaluated", (),
           load_expr, make_expr, run_expr),
    Target("prometheus", "collectors/vllm, exporter, nccl: Prometheus text pages", (ValueError,),
           load_prom, lambda c, r: make_text(c, r, PROM_TOKENS, 1 << 17), run_prom),
    Target("pcap", "collectors/pkt/capfile.py + parse.py: pcap/pcapng framing and header decode",
           (), load_pcap, lambda c, r: make_bytes(c, r, PCAP_INTS), run_pcap),
    Target("capture-file", "collectors/pkt/capfile.py: files, gzip/zstd under the decompression budget",
           (), load_capfile, lambda c, r: make_bytes(c, r, PCAP_INTS), run_capfile),
    Target("proc-sysfs", "collectors/{host,rdma,pcie,netdev,nccl}/parse.py: /proc, sysfs, Inspector files",
           (ValueError,), load_procfs, make_procfs, run_procfs),
    Target("nvml", "collectors/nvml_backend.py + gpu/pcie parse: NVML answers through the pynvml double",
           (), load_nvml, make_nvml, run_nvml),
    Target("wire", "skewd/wire.py: decode of findings, summaries, health", (), load_wire, make_wire, run_wire),
    Target("bundle", "agent/bundle/ + agent/replay (nodes and controller): segments with CRC-consistent tampering",
           (), load_bundle, make_bundle, run_bundle),
]}


def _expected(name: str) -> tuple[type[BaseException], ...]:
    """The documented error types of a target (imported lazily: workers import what they run)."""
    if name == "yaml":
        from skewd.rules.yamlpos import YamlError

        return (YamlError,)
    if name in ("pcap", "capture-file"):
        from skewd.collectors.pkt.capfile import CaptureError

        return (CaptureError,)
    if name == "wire":
        from skewd.wire import WireError

        return (WireError,)
    if name == "bundle":
        from skewd.agent.bundle import BundleError

        return (BundleError,)
    return TARGETS[name].expected


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

SETUP_FAILED = 3


class Hang(BaseException):
    """Raised by SIGPROF inside an input that used more CPU time than the per-input timeout."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0.0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _where(tb: Any) -> str:
    """The innermost frame inside skewd's own code (not bench/), else the innermost frame."""
    frames = traceback.extract_tb(tb)
    mine = [f for f in frames if f.filename.startswith(str(ROOT)) and "/bench/" not in f.filename
            and "/tests/" not in f.filename]
    f = (mine or frames or [None])[-1]
    if f is None:
        return "?"
    return f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} ({f.name})"


@dataclass
class Stats:
    target: str
    shard: int
    part: int = 0
    inputs: int = 0
    handled: int = 0
    unhandled: int = 0
    hangs: int = 0
    seconds: float = 0.0
    peak_rss_kb: int = 0
    baseline_rss_kb: int = 0
    slowest_s: float = 0.0
    first_index: int = 0
    next_index: int = 0
    bugs: dict[str, dict] = field(default_factory=dict)  # key → {count, type, message, where, index, file}


def _record(st: Stats, out: Path, key: str, info: dict, data: bytes | None) -> None:
    bug = st.bugs.get(key)
    if bug is None:
        fname = ""
        if data is not None:
            d = out / "crashes" / st.target
            d.mkdir(parents=True, exist_ok=True)
            stem = hashlib.sha1(key.encode()).hexdigest()[:12]
            (d / f"{stem}.bin").write_bytes(data)
            (d / f"{stem}.txt").write_text(f"{key}\nindex {info['index']}\n\n{info.get('traceback', '')}")
            fname = str(d / f"{stem}.bin")
        bug = st.bugs[key] = {**{k: v for k, v in info.items() if k != "traceback"}, "count": 0, "file": fname}
    bug["count"] += 1


def _stats_path(out: Path, target: str, shard: int, part: int, suffix: str = "") -> Path:
    return out / "stats" / f"{target}-{shard}-{part}{suffix}.json"


def _write_stats(st: Stats, out: Path, suffix: str = "") -> None:
    p = _stats_path(out, st.target, st.shard, st.part, suffix)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(st.__dict__))
    tmp.replace(p)


def worker(name: str, shard: int, part: int, seed: int, start: int, stop: int, deadline: float, timeout: float,
           out: str, memory: int, progress: Any) -> None:
    """Fuzz inputs ``start..stop-1`` of ``name`` (until ``deadline``, a time.time())."""
    outp = Path(out)
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    import warnings

    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.CRITICAL)  # parsers log what they reject; millions of lines help nobody
    t = TARGETS[name]
    try:
        ctx = t.load()
        expected = _expected(name)
        t.make(ctx, random.Random(0))
    except Exception:  # noqa: BLE001 - the harness itself is broken for this target: say so, stop
        traceback.print_exc()
        os._exit(SETUP_FAILED)
    st = Stats(name, shard, part, first_index=start, next_index=start,
               baseline_rss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    # CPU time, not wall time: on a machine shared with other work a starved worker is not a hang
    signal.signal(signal.SIGPROF, _on_alarm)
    signal.setitimer(signal.ITIMER_PROF, 10 * timeout)
    try:  # first use: lazy imports and caches, not counted as an input
        t.run(ctx, t.make(ctx, random.Random(f"{name}:warm-up")))
    except BaseException:  # noqa: BLE001 - the input's outcome does not matter here
        pass
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    t0 = time.monotonic()
    last_write = t0
    try:
        for i in range(start, stop):
            if time.time() >= deadline:
                break
            data = t.make(ctx, random.Random(f"{name}:{seed}:{i}"))
            progress.value = i
            began = time.perf_counter()
            signal.setitimer(signal.ITIMER_PROF, timeout)
            try:
                t.run(ctx, data)
            except expected:
                st.handled += 1
            except Hang:
                st.hangs += 1
                _record(st, outp, f"hang: > {timeout:g}s CPU", {"type": "Hang", "message": f"input used > {timeout:g}s of CPU",
                                                            "where": "", "index": i}, data)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - every other exception is what we are looking for
                signal.setitimer(signal.ITIMER_PROF, 0)
                where = _where(e.__traceback__)
                st.unhandled += 1
                _record(st, outp, f"{type(e).__name__} at {where}",
                        {"type": type(e).__name__, "message": str(e)[:300], "where": where, "index": i,
                         "traceback": "".join(traceback.format_exception(e))[-6000:]}, data)
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            st.slowest_s = max(st.slowest_s, time.perf_counter() - began)
            st.inputs += 1
            st.next_index = i + 1
            now = time.monotonic()
            if now - last_write >= 5.0:
                st.seconds = now - t0
                st.peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                _write_stats(st, outp)
                last_write = now
    finally:
        st.seconds = time.monotonic() - t0
        st.peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        _write_stats(st, outp)
        cleanup = ctx.get("dir") if isinstance(ctx, dict) else None
        if isinstance(cleanup, Path):
            shutil.rmtree(cleanup.parent if cleanup.name == "in" else cleanup, ignore_errors=True)


@dataclass
class Job:
    target: str
    shard: int
    part: int
    start: int
    stop: int
    deadline: float


def run_jobs(jobs: list[Job], procs: int, seed: int, timeout: float, out: Path, memory: int,
             log: Callable[[str], None]) -> None:
    """Run jobs ``procs`` at a time, each in its own process. A worker stuck on one input (in C
    code, where SIGPROF cannot interrupt) for 5x the timeout of CPU time, or 60x of wall time,
    is killed and its input recorded as a hang; a
    worker that dies (a crash in C, the kernel's OOM killer) has its input recorded as
    unhandled. Either way the job continues after that input in a new process."""
    ctx = mp.get_context("fork")
    pending = list(jobs)
    running: list[list[Any]] = []  # [job, proc, progress, last index, since]
    grace = max(5 * timeout, 10.0)
    while pending or running:
        while pending and len(running) < procs:
            j = pending.pop(0)
            progress = ctx.Value("q", j.start)
            p = ctx.Process(target=worker, args=(j.target, j.shard, j.part, seed, j.start, j.stop, j.deadline,
                                                 timeout, str(out), memory, progress), daemon=True)
            p.start()
            running.append([j, p, progress, -1, (time.monotonic(), _cpu_seconds(p.pid))])
        time.sleep(0.2)
        still = []
        for item in running:
            j, p, progress, last, since = item
            cur = int(progress.value)
            if not p.is_alive():
                p.join()
                if p.exitcode == SETUP_FAILED:
                    raise SystemExit(f"fuzz target {j.target}: setting up its seeds failed (traceback above)")
                if p.exitcode != 0:
                    _killed(out, j, cur, f"worker died (exit {p.exitcode}): a crash in native code or a memory kill",
                            hang=False)
                    log(f"  {j.target}#{j.shard}: worker died (exit {p.exitcode}) at input {cur}")
                    if cur + 1 < j.stop and time.time() < j.deadline:
                        pending.insert(0, Job(j.target, j.shard, j.part + 1, cur + 1, j.stop, j.deadline))
                continue
            if cur != last:
                item[3], item[4] = cur, (time.monotonic(), _cpu_seconds(p.pid))
                still.append(item)
                continue
            cpu = _cpu_seconds(p.pid) - since[1]
            if cpu > grace or time.monotonic() - since[0] > 12 * grace:
                p.kill()
                p.join()
                _killed(out, j, cur, f"hang: stuck > {grace:g}s CPU in native code (killed by the watchdog)", hang=True)
                log(f"  {j.target}#{j.shard}: input {cur} stuck ({cpu:.0f}s CPU): killed, recorded as a hang")
                if cur + 1 < j.stop and time.time() < j.deadline:
                    pending.insert(0, Job(j.target, j.shard, j.part + 1, cur + 1, j.stop, j.deadline))
                continue
            still.append(item)
        running = still


def _killed(out: Path, j: Job, index: int, key: str, hang: bool) -> None:
    """Count the input a killed worker was on (regenerate it with --index)."""
    st = Stats(j.target, j.shard, j.part, inputs=1, hangs=int(hang), unhandled=int(not hang),
               first_index=index, next_index=index + 1)
    _record(st, out, key, {"type": "Hang" if hang else "Died", "message": key, "where": "", "index": index}, None)
    _write_stats(st, out, ".killed")


def merge(out: Path) -> dict[str, dict]:
    """Per target: totals over every stats file (shards, and parts after a killed worker)."""
    by: dict[str, dict] = {}
    for p in sorted((out / "stats").glob("*.json")):
        try:
            s = Stats(**json.loads(p.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        agg = by.setdefault(s.target, {"target": s.target, "inputs": 0, "handled": 0, "unhandled": 0, "hangs": 0,
                                       "cpu_seconds": 0.0, "peak_rss_kb": 0, "baseline_rss_kb": 0,
                                       "slowest_s": 0.0, "bugs": {}})
        agg["inputs"] += s.inputs
        agg["handled"] += s.handled
        agg["unhandled"] += s.unhandled
        agg["hangs"] += s.hangs
        agg["cpu_seconds"] += s.seconds
        agg["peak_rss_kb"] = max(agg["peak_rss_kb"], s.peak_rss_kb)
        agg["baseline_rss_kb"] = max(agg["baseline_rss_kb"], s.baseline_rss_kb)
        agg["slowest_s"] = max(agg["slowest_s"], s.slowest_s)
        for k, b in s.bugs.items():
            if k in agg["bugs"]:
                agg["bugs"][k]["count"] += b["count"]
            else:
                agg["bugs"][k] = dict(b)
    for agg in by.values():
        agg["what"] = TARGETS[agg["target"]].what
        agg["inputs_per_second"] = agg["inputs"] / agg["cpu_seconds"] if agg["cpu_seconds"] else 0.0
    return by


def fuzz(targets: list[str], *, inputs: int = 0, seconds: float = 0.0, procs: int = 2, seed: int = 1,
         timeout: float = 5.0, out: Path | None = None, memory: int = 3 << 30, start: int = 0,
         log: Callable[[str], None] = lambda s: None) -> dict[str, dict]:
    """Run the harness; returns per-target totals (see :func:`merge`). With ``inputs``, each
    target's inputs are split over ``procs`` shards; otherwise each target runs ``seconds``
    of wall time in one process (targets side by side, ``procs`` at a time)."""
    out = Path(out or tempfile.mkdtemp(prefix="skewd-fuzz-"))
    shutil.rmtree(out / "stats", ignore_errors=True)
    shutil.rmtree(out / "crashes", ignore_errors=True)
    for t in targets:
        if t not in TARGETS:
            raise SystemExit(f"unknown target {t!r}; known: {', '.join(TARGETS)}")
    jobs: list[Job] = []
    if inputs:
        per = (inputs + procs - 1) // procs
        jobs = [Job(t, k, 0, start + k * per, start + min(inputs, (k + 1) * per), float("inf"))
                for t in targets for k in range(procs)]
    else:
        jobs = [Job(t, 0, 0, 0, 1 << 62, 0.0) for t in targets]
    if not inputs:  # deadlines start when a job starts, not when it was queued
        for j in jobs:
            j.deadline = -seconds
    _run_timed(jobs, procs, seed, timeout, out, memory, log)
    return merge(out)


def _run_timed(jobs: list[Job], procs: int, seed: int, timeout: float, out: Path, memory: int,
               log: Callable[[str], None]) -> None:
    """run_jobs, with relative deadlines (negative: seconds from the job's start) made absolute
    as each batch of ``procs`` jobs starts."""
    for i in range(0, len(jobs), procs):
        batch = jobs[i:i + procs]
        for j in batch:
            if j.deadline < 0:
                j.deadline = time.time() + 3.0 - j.deadline  # + the worker's set-up time
        run_jobs(batch, procs, seed, timeout, out, memory, log)


def _table(res: dict[str, dict]) -> str:
    head = f"{'target':14} {'inputs':>11} {'unhandled':>9} {'hangs':>5} {'inputs/s':>9} {'peak RSS':>9} {'slowest':>8}"
    lines = [head, "-" * len(head)]
    for name, a in res.items():
        lines.append(f"{name:14} {a['inputs']:>11,} {a['unhandled']:>9} {a['hangs']:>5} {a['inputs_per_second']:>9.0f} "
                     f"{a['peak_rss_kb'] / 1024:>7.0f}MB {a['slowest_s']:>7.2f}s")
    for name, a in res.items():
        for k, b in sorted(a["bugs"].items(), key=lambda kv: -kv[1]["count"]):
            lines.append(f"  {name}: {k} x{b['count']}: {b['message'][:160]!r} (input {b['file'] or b['index']})")
    return "\n".join(lines)


def reproduce(target: str, path: Path | None, index: int | None, seed: int) -> int:
    """Run one input (a saved file, or regenerated from its index) and show what happens."""
    t = TARGETS[target]
    ctx = t.load()
    data = path.read_bytes() if path else t.make(ctx, random.Random(f"{target}:{seed}:{index}"))
    try:
        t.run(ctx, data)
    except _expected(target) as e:
        print(f"handled: {type(e).__name__}: {e}")
        return 0
    print("no exception")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated (default all: {', '.join(TARGETS)})")
    ap.add_argument("--target", help="one target (with --reproduce)")
    ap.add_argument("--inputs", type=int, default=0, help="inputs per target, split over the processes")
    ap.add_argument("--start", type=int, default=0,
                    help="first input index (continue an earlier run of --inputs N with --start N)")
    ap.add_argument("--seconds", type=float, default=20.0, help="wall seconds per target and shard when --inputs is 0")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds one input may run before it counts as a hang")
    ap.add_argument("--memory", type=int, default=3 << 30, help="address-space cap of a worker, bytes (0: none)")
    ap.add_argument("--out", type=Path, default=None, help="where crashes and stats go (default: a temp dir)")
    ap.add_argument("--reproduce", type=Path, help="run one saved input of --target and show what happens")
    ap.add_argument("--index", type=int, help="run input number N of --target (regenerated from --seed)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line with the figures")
    a = ap.parse_args(argv)
    if a.reproduce or a.index is not None:
        return reproduce(a.target, a.reproduce, a.index, a.seed)
    targets = [t for t in a.targets.split(",") if t]
    out = a.out or Path(tempfile.mkdtemp(prefix="skewd-fuzz-"))
    t0 = time.time()
    res = fuzz(targets, inputs=a.inputs, seconds=0.0 if a.inputs else a.seconds, procs=a.procs, seed=a.seed,
               timeout=a.timeout, out=out, memory=a.memory, start=a.start,
               log=lambda s: print(s, file=sys.stderr, flush=True))
    wall = time.time() - t0
    print(_table(res))
    print(f"wall {wall:.0f}s with {a.procs} process(es); crashes and stats in {out}")
    if a.json:
        print(json.dumps({"benchmark": "fuzz", "wall_seconds": wall, "procs": a.procs, "seed": a.seed,
                          "timeout": a.timeout, "targets": res}, default=str))
    bad = sum(r["unhandled"] + r["hangs"] for r in res.values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
