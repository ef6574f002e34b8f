"""What the window tests share: a bare per-tick evaluation context over a store (no rule's
entities: the tests read the kernels' values per block row from its memo) and a bitwise view of
a value array (NaN payloads and the sign of zero included)."""
from __future__ import annotations

from typing import Any

import numpy as np

from skewd.rules.windows import EvalContext


def window_ctx(store: Any, now: float, **fields: Any) -> EvalContext:
    """A context at ``now`` with an empty frame and a fresh memo; ``fields``: EvalContext's
    optional ones (``batches``, ``slabs``)."""
    empty = np.empty(0, dtype=np.int64)
    names = np.empty(0, dtype=object)
    return EvalContext(store, now, empty, empty, empty, names, names, 60.0, {}, [], None, **fields)


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=float).tobytes()
