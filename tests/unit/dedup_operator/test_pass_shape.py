"""The reconcile pass's shape, checked on its source with `ast`: every function of the
pass's modules fits on a screen (at most 60 lines), and reconcile.py keeps no state at
module level (per-pipeline memory is the caller's, passed in)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dedup_operator

OPERATOR = Path(dedup_operator.__file__).parent
PASS_MODULES = ("reconcile.py", "plan.py", "executor.py", "observe.py")
MAX_LINES = 60


def functions(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of every function, nested ones and methods included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


@pytest.mark.parametrize("module", PASS_MODULES)
def test_every_function_of_the_pass_is_at_most_60_lines(module: str) -> None:
    found = functions(OPERATOR / module)
    assert found, f"no functions found in {module}"
    too_long = [(name, lines) for name, lines in found if lines > MAX_LINES]
    assert too_long == [], f"{module}: functions over {MAX_LINES} lines: {too_long}"


def test_the_check_counts_what_it_should(tmp_path: Path) -> None:
    long = "def f() -> None:\n" + "    x = 1\n" * 60 + "\n\ndef g() -> None:\n    pass\n"
    (tmp_path / "m.py").write_text(long)
    assert functions(tmp_path / "m.py") == [("f", 61), ("g", 2)]


def test_reconcile_keeps_no_state_at_module_level() -> None:
    """Only constants (names, frozensets, the logger) are assigned at module level: no
    dict, list, Lease clock or other object a pass would write."""
    tree = ast.parse((OPERATOR / "reconcile.py").read_text())
    for node in tree.body:
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        value = node.value
        assert value is not None
        allowed = isinstance(value, ast.Constant) or (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute | ast.Name)
            and ast.unparse(value.func) in ("frozenset", "logging.getLogger")
        )
        assert allowed, f"module-level state in reconcile.py: {ast.unparse(node)}"
