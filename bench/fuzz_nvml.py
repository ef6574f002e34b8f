"""Fuzz target ``nvml``: NVML answers through the pynvml double (tests/nvml_double.py).

Unlike the file parsers, the NVML backend reads a library's answers, so a mutant here is a
mutated *device spec* (the recorded GPU dumps in tests/fixtures/gpu) served by the double:
integers at type limits, NaN/inf doubles, field values of another type, NVML error codes where
a value or struct was expected, mangled bus ids.
"""
from __future__ import annotations

import json
import random
from typing import Any

from fuzz_mutate import Mutator
from fuzz_seeds import FIX


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
