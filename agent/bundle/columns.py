"""Arrow columns of a segment as numpy arrays, tolerant of what a hostile writer may put in them.

The reader hands replay numpy columns; the conversion lives apart from the segment logic
because it is where replay spends its decoding time and where nulls, floats in integer columns
and dictionary-encoded names are normalised (a missing value never becomes a batch number).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

def str_codes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(strings, dictionary index per row or None, dictionary size + 1). Equal indices within
    one column are equal strings, and the decoded strings are then the same objects."""
    if pa.types.is_dictionary(arr.type):
        n = len(arr.dictionary)
        d = np.array([("" if v is None else v) for v in arr.dictionary.to_pylist()] + [""], dtype=object)
        idx = arr.indices
        if idx.null_count:
            idx = idx.fill_null(n)
        idx = idx.to_numpy(zero_copy_only=False)
        return d[idx], idx, n + 1
    out = np.empty(len(arr), dtype=object)
    out[:] = [("" if v is None else v) for v in arr.to_pylist()]
    return out, None, 0


def int_column(arr: pa.Array) -> np.ndarray:
    """An integer column as int64 (a missing or non-integer value reads as -1: never a batch)."""
    if pa.types.is_floating(arr.type) or arr.null_count:
        x = num_column(arr)
        ok = np.isfinite(x) & (np.abs(x) < 2.0 ** 62)
        return np.where(ok, x, -1).astype(np.int64)
    return arr.to_numpy(zero_copy_only=False).astype(np.int64)


def num_column(arr: pa.Array) -> np.ndarray:
    if arr.null_count:  # fill_null costs a pass and a copy even when there is nothing to fill
        arr = arr.fill_null(np.nan)
    return arr.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
