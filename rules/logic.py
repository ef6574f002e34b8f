"""Three-valued (Kleene) logic over per-entity values, and the true/false masks that settle it.

A rule's value per entity is 1 (true), 0 (false) or NaN (unknown: a missing sample). ``and``,
``or`` and ``not`` follow Kleene logic, and a comparison with a missing value is unknown, so
missing data never fires a rule through a negation. Computing those values in full costs a few
numpy calls per operator; a rule only needs to know where it is exactly true. So each condition
also has two boolean masks - where it is exactly true and where exactly false (unknown is
neither) - which encode the three-valued result exactly and let ``and``/``or`` stop as soon as
the outcome is settled for every entity. The compiler (``expr``) builds closures out of these;
this module is the semantics they compute, apart from how an expression is parsed or checked.
"""
from __future__ import annotations

import ast
from typing import Any, Callable

import numpy as np

from . import functions


def truth(x: Any) -> Any:
    """Kleene truth of a value: 1.0 true, 0.0 false, NaN unknown."""
    if isinstance(x, np.ndarray):
        return np.where(np.isnan(x), np.nan, (x != 0).astype(float))
    if x != x:
        return np.nan
    return 1.0 if x else 0.0


def kleene_and(a: Any, b: Any) -> Any:
    a, b = truth(a), truth(b)
    false = (a == 0) | (b == 0)
    unknown = np.isnan(a) | np.isnan(b)
    return np.where(false, 0.0, np.where(unknown, np.nan, 1.0))


def kleene_or(a: Any, b: Any) -> Any:
    a, b = truth(a), truth(b)
    true = (a == 1) | (b == 1)
    unknown = np.isnan(a) | np.isnan(b)
    return np.where(true, 1.0, np.where(unknown, np.nan, 0.0))


def kleene_not(a: Any) -> Any:
    a = truth(a)
    return np.where(np.isnan(a), np.nan, 1.0 - a)


#: comparison operator → its numpy ufunc (a comparison's exact value is ``num_cmp`` of it)
CMP = {
    ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater, ast.GtE: np.greater_equal,
    ast.Eq: np.equal, ast.NotEq: np.not_equal,
}
#: arithmetic operator → its numpy ufunc
BIN = {
    ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
    ast.Mod: np.mod, ast.Pow: np.power,
}


def num_cmp(op: Callable, a: Any, b: Any) -> Any:
    """Comparison with NaN = unknown. (The engine runs inside functions.quiet(): no warnings.)"""
    r = op(a, b)
    unknown = np.isnan(a) | np.isnan(b)
    return np.where(unknown, np.nan, r.astype(float) if isinstance(r, np.ndarray) else float(r))


def any_true(m: Any) -> bool:
    return functions.count_nonzero(m) > 0  # (ndarray.any and np.count_nonzero are Python wrappers, several times slower)


def all_true(m: Any) -> bool:
    return functions.count_nonzero(m) == (m.size if isinstance(m, np.ndarray) else 1)


def mask_and(fns: list[Callable]) -> Callable:
    """Conjunction of masks, stopping as soon as no entity is left true."""
    if len(fns) == 1:
        return fns[0]

    def mand(ctx, fns=fns):
        acc = fns[0](ctx)
        for f in fns[1:]:
            if not any_true(acc):
                return acc
            acc = acc & f(ctx)
        return acc

    return mand


def mask_or(fns: list[Callable]) -> Callable:
    """Disjunction of masks, stopping as soon as every entity is true."""
    if len(fns) == 1:
        return fns[0]

    def mor(ctx, fns=fns):
        acc = fns[0](ctx)
        for f in fns[1:]:
            if all_true(acc):
                return acc
            acc = acc | f(ctx)
        return acc

    return mor


def both_known(a: Any, b: Any) -> Any:
    return ~(np.isnan(a) | np.isnan(b))


# comparison → (mask where exactly true, mask where exactly false); a comparison with NaN
# is false in numpy for every operator but !=, which is the one that needs the explicit check
CMP_MASKS: dict[type, tuple[Callable, Callable]] = {
    ast.Lt: (np.less, np.greater_equal),
    ast.LtE: (np.less_equal, np.greater),
    ast.Gt: (np.greater, np.less_equal),
    ast.GtE: (np.greater_equal, np.less),
    ast.Eq: (np.equal, lambda a, b: np.not_equal(a, b) & both_known(a, b)),
    ast.NotEq: (lambda a, b: np.not_equal(a, b) & both_known(a, b), np.equal),
}
