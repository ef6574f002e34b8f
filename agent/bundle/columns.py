"""Arrow columns of a segment as numpy arrays, tolerant of what a hostile writer may put in them.

The reader hands replay numpy columns; the conversion lives apart from the segment logic
because it is where replay spends its decoding time and where nulls, floats in integer columns
and dictionary-encoded names are normalised (a missing value never becomes a batch number).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass
class NameColumn:
    """A node, entity or signal column not yet decoded: ``codes`` (the dictionary index per row,
    a null as the last index; None for a column stored as plain strings) into ``names`` (the
    dictionary's strings plus ""), or ``plain`` (the strings, for a plain column). Replay decodes
    only the rows it needs (one collection per layout), and compares ``dictionary`` with the
    previous chunk's to keep its decoded layouts."""

    codes: np.ndarray | None
    names: np.ndarray | None
    dictionary: pa.Array | None
    plain: np.ndarray | None = None

    @property
    def size(self) -> int:
        """Distinct codes (the dictionary's size plus one for null); 0 for a plain column."""
        return 0 if self.names is None else len(self.names)

    def strings(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        if self.plain is not None:
            return self.plain[rows]
        assert self.names is not None and self.codes is not None
        return self.names[self.codes[rows]]


def name_column(arr: pa.Array, previous: NameColumn | None = None) -> NameColumn:
    """An Arrow name column as a :class:`NameColumn` (the dictionary decoded, the rows not).
    ``previous``: the same column of the chunk before; its decoded dictionary is reused when the
    dictionaries are equal (the recorder writes one per chunk, usually the same)."""
    if pa.types.is_dictionary(arr.type):
        dic = arr.dictionary
        n = len(dic)
        if previous is not None and previous.dictionary is not None and previous.dictionary.equals(dic):
            d, dic = previous.names, previous.dictionary
        else:
            d = np.array([("" if v is None else v) for v in dic.to_pylist()] + [""], dtype=object)
        idx = arr.indices
        if idx.null_count:
            idx = idx.fill_null(n)
        return NameColumn(idx.to_numpy(zero_copy_only=False), d, dic)
    out = np.empty(len(arr), dtype=object)
    out[:] = [("" if v is None else v) for v in arr.to_pylist()]
    return NameColumn(None, None, None, out)


def str_codes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(strings, dictionary index per row or None, dictionary size + 1). Equal indices within
    one column are equal strings, and the decoded strings are then the same objects."""
    c = name_column(arr)
    return c.strings(), c.codes, c.size


def int_column(arr: pa.Array) -> np.ndarray:
    """An integer column as int64 (a missing or non-integer value reads as -1: never a batch)."""
    if pa.types.is_floating(arr.type) or arr.null_count:
        x = num_column(arr)
        ok = np.isfinite(x) & (np.abs(x) < 2.0 ** 62)
        return np.where(ok, x, -1).astype(np.int64)
    return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)  # (read-only when not copied)


def num_column(arr: pa.Array) -> np.ndarray:
    if arr.null_count:  # fill_null costs a pass and a copy even when there is nothing to fill
        arr = arr.fill_null(np.nan)
    return arr.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def same_indices(a: pa.Array, b: pa.Array) -> bool:
    """Whether two integer arrays without nulls hold the same values, by comparing their bytes
    (one memcmp; Arrow's ``equals`` costs ten times as much). Safe on arrays that passed
    ``validate()``: their buffers are long enough for their lengths."""
    if a.type != b.type or len(a) != len(b) or a.null_count or b.null_count:
        return False
    w = a.type.bit_width // 8
    return a.buffers()[1].slice(a.offset * w, len(a) * w).equals(b.buffers()[1].slice(b.offset * w, len(b) * w))
