"""Every module of ours opens with a short docstring: what it is and why, in at most 25
lines. Longer explanations belong in docs/ (design, worker, audit, operations,
development), which the docstring points to; history belongs in commit messages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE_FOLDERS = ("contract", "operator", "worker", "spark", "local", "ctl")
MAX_LINES = 25


def our_modules() -> list[Path]:
    """Every Python module of the packages (tests, bench and scripts are not packages)."""
    return sorted(
        path
        for folder in PACKAGE_FOLDERS
        if (ROOT / folder).is_dir()
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def docstring_lines(path: Path) -> int | None:
    """The number of lines of the module's docstring as written, None without one."""
    docstring = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
    return None if docstring is None else len(docstring.splitlines())


def test_every_package_folder_holds_modules() -> None:
    found = {path.relative_to(ROOT).parts[0] for path in our_modules()}
    assert {"contract", "operator", "worker", "spark", "local"} <= found


@pytest.mark.parametrize("module", our_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_module_docstring_is_short(module: Path) -> None:
    lines = docstring_lines(module)
    assert lines is not None, f"{module.relative_to(ROOT)} has no module docstring"
    assert lines <= MAX_LINES, (
        f"{module.relative_to(ROOT)}: a module docstring of {lines} lines; keep what and why "
        f"in at most {MAX_LINES} and move the rest to docs/ with a pointer"
    )


def test_the_line_count_is_the_docstring_as_written(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""One.\n\n    Three, indented.\n"""\n\nX = 1\n')
    assert docstring_lines(module) == 3
    module.write_text("X = 1\n")
    assert docstring_lines(module) is None
