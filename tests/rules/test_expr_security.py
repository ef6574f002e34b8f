"""The expression language is closed: fuzzed input only ever raises ExprError, and nothing can
reach attributes, dunder names, imports, subscripts or calls outside the whitelist."""
from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skewd.model import Scope
from skewd.rules.codes import Code, ExprError
from skewd.rules.expr import CompileEnv, compile_expr
from skewd.rules.vocabulary import FUNCTIONS

from .conftest import make_catalogue

ENV = CompileEnv(make_catalogue(), Scope.GPU, params={"thr": 0.5, "win": "30s"}, macros={"m": "gpu_util_ratio > thr"},
                 lists={"codes": [1, 2]})

TOKENS = ["gpu_util_ratio", "pcie_rx_bytes_total", "thr", "win", "m", "codes", "entity", "node", "30s", "1m", "0.5",
          "(", ")", ",", " and ", " or ", " not ", "+", "-", "*", "/", "%", "**", "<", ">", "==", "!=", " in ",
          ".", "[", "]", "__class__", "__import__", "lambda", ":", "'x'", "\"", "#", "os", "eval", "open", "getattr",
          "{", "}", "@", "=", ":=", "if", "else", "yield", "await", "\\", "\n", "1e999", "9" * 50] + FUNCTIONS


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TOKENS), max_size=25))
def test_token_soup_only_raises_expr_error(tokens):
    try:
        compile_expr("".join(tokens), ENV)
    except ExprError as e:
        assert isinstance(e.code, Code) and 0 <= e.offset <= len("".join(tokens))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=string.printable + "é☃\x00", max_size=120))
def test_arbitrary_text_only_raises_expr_error(text):
    try:
        compile_expr(text, ENV)
    except ExprError:
        pass


def test_deep_nesting_is_refused_cleanly():
    for text in ["(" * 500 + "gpu_util_ratio" + ")" * 500, "not " * 400 + "gpu_util_ratio > 1",
                 "+".join(["gpu_util_ratio"] * 3000), "-" * 5000 + "1 > gpu_util_ratio"]:
        with pytest.raises(ExprError):
            compile_expr(text, ENV)


@pytest.mark.parametrize("text", [
    "gpu_util_ratio.__class__ > 0",
    "().__class__.__bases__[0].__subclasses__()",
    "__import__('os').system('true')",
    "eval('1') > 0",
    "open('/etc/passwd') > 0",
    "getattr(gpu_util_ratio, 'x') > 0",
    "[x for x in codes] > 0",
    "(lambda: 1)() > 0",
    "codes[0] > 0",
    "avg(gpu_util_ratio, window=30s) > 0",
    "avg(*codes) > 0",
    "f'{gpu_util_ratio}' > 0",
    "__builtins__ > 0",
    "_d0_ > 0",
    "(y := 1) > 0",
    "gpu_util_ratio if 1 else 0",
    "{'a': 1} > 0",
    "True > 0",
    "None > 0",
])
def test_escape_attempts_are_compile_errors(text):
    with pytest.raises(ExprError) as ei:
        compile_expr(text, ENV)
    assert ei.value.code in (Code.FORBIDDEN_SYNTAX, Code.UNKNOWN_FUNCTION, Code.EXPR_SYNTAX, Code.UNKNOWN_PARAM,
                             Code.WRONG_TYPE)


def test_compiled_closures_hold_no_code_objects_from_the_text(tmp_path):
    """A string literal in an expression stays data: comparing names never executes it."""
    marker = tmp_path / "pwned"
    comp = compile_expr(f"entity == \"__import__('pathlib').Path('{marker}').touch()\" and gpu_util_ratio > 0", ENV)
    assert comp.signals == {"gpu_util_ratio"}
    assert not marker.exists()


def test_durations_inside_strings_are_not_rewritten():
    comp = compile_expr("entity in ('30s', 'gpu1') and avg(gpu_util_ratio, 30s) > 0", ENV)
    assert comp.max_window == 30.0
    assert comp.signals == {"gpu_util_ratio"}


def test_macro_cycle_is_reported():
    env = CompileEnv(make_catalogue(), Scope.GPU, macros={"a": "b and gpu_util_ratio > 0", "b": "a"})
    with pytest.raises(ExprError) as ei:
        compile_expr("a", env)
    assert ei.value.code is Code.MACRO_CYCLE


def test_constant_folding_overflow_is_harmless():
    comp = compile_expr("gpu_util_ratio > 10 ** 10 ** 10", ENV)
    assert comp.signals == {"gpu_util_ratio"}
