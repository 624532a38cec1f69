"""The package's shape that issue 42 asks to keep: no module in ``resnet8ptq/`` over 450 lines, and no
function with more than 6 parameters where a record would do (``self``/``cls`` not counted; the exceptions
below say why a record would not)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "resnet8ptq"
MAX_LINES = 450
MAX_PARAMETERS = 6
WIDER = {
    "backends/torch/observers.py:__init__": "a torch observer's constructor: torch's own observer arguments",
    "calibration.py:_least_error": "the inner search over one histogram: its arrays and the integer grid",
    "device/executor.py:requantize_exact": "TFLite/gemmlowp's requantization: multiplier, shift, zero point, "
    "clamp and rounding, as the kernels take them",
    "device/executor.py:execute": "the executor's entry point: model and images, then optional knobs",
    "device/graph.py:integer_add": "builds one Add node from its parsed fields",
    "batchnorm_fold.py:batch_normalization": "stands in for tf.nn.batch_normalization: its signature",
    "execution.py:judge": "a pure function of two accuracies and what ran them (unit-tested case by case)",
}
"""Functions allowed more than :data:`MAX_PARAMETERS` parameters, with why."""


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    names = [arg.arg for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return names[1:] if names and names[0] in ("self", "cls") else names


def test_no_module_is_longer_than_450_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in modules()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}; split by responsibility"


def test_no_function_takes_more_than_6_parameters_where_a_record_would_do() -> None:
    wide = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and len(parameters(node)) > MAX_PARAMETERS
            ):
                wide[f"{path.relative_to(PACKAGE)}:{node.name}"] = len(parameters(node))
    assert set(wide) - set(WIDER) == set(), f"pass a record instead: {wide}"
    assert set(WIDER) - set(wide) == set(), "no longer wider than 6 parameters: drop it from WIDER"


def test_parameters_are_counted_without_self_or_cls() -> None:
    """A method of 7 parameters besides ``self`` counts 7; a classmethod of 6 and ``cls``, 6."""
    source = "class A:\n    def f(self, a, b, c, d, e, f, g): ...\n"
    source += "    @classmethod\n    def g(cls, a, b, c, d, e, f): ...\n"
    counts = [
        len(parameters(node)) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)
    ]
    assert counts == [7, 6]
