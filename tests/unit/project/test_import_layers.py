"""The packages' layering, and each shared rule kept in its one owner, read from the source.

`dedup_contract` (the rules the parts share) imports nothing of ours; `dedup_worker`,
`dedup_operator`, `dedup_spark` and `dedupctl` import only `dedup_contract` and
themselves, never each other; `dedup_local` (the local cluster harness and the demo) is tooling above everything
and not in the wheel; only it, the tests and the benches import it. Every import counts:
at module level, inside functions, under TYPE_CHECKING, relative, and `importlib` calls
with a literal name.

Then the patterns of the rules that have one owner, searched outside it in the code that
runs (the packages, bench/, scripts/, tests/support/; not the test modules, which may
state a format or build a client as an oracle of their own).
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {
    "dedup_contract": ROOT / "contract" / "dedup_contract",
    "dedup_worker": ROOT / "worker" / "dedup_worker",
    "dedup_operator": ROOT / "operator" / "dedup_operator",
    "dedup_spark": ROOT / "spark" / "dedup_spark",
    "dedupctl": ROOT / "ctl" / "dedupctl",
    "dedup_local": ROOT / "local" / "dedup_local",
}
OURS = frozenset(PACKAGES)
ALLOWED: dict[str, frozenset[str]] = {
    "dedup_contract": frozenset({"dedup_contract"}),
    "dedup_worker": frozenset({"dedup_contract", "dedup_worker"}),
    "dedup_operator": frozenset({"dedup_contract", "dedup_operator"}),
    "dedup_spark": frozenset({"dedup_contract", "dedup_spark"}),
    "dedupctl": frozenset({"dedup_contract", "dedupctl"}),
    "dedup_local": OURS,
}
"""Which of our packages each package may import."""


def modules(package: str) -> Iterator[tuple[str, Path]]:
    """(dotted module name, path) of every module of one package."""
    base = PACKAGES[package].parent
    for path in sorted(PACKAGES[package].rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imported(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything `path` (module `module`) imports."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, `level - 1` up
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            yield node.lineno, name
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            yield node.lineno, node.args[0].value


def edges(package: str) -> Iterator[tuple[str, int, str]]:
    """(file, line, our package imported) for every import of one of our packages."""
    for module, path in modules(package):
        for line, name in imported(module, path):
            top = name.split(".")[0]
            if top in OURS:
                yield str(path.relative_to(ROOT)), line, top


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_imports_only_the_layers_below_it(package: str) -> None:
    assert any(True for _ in modules(package)), f"no modules found for {package}"
    wrong = [
        f"{file}:{line} imports {top}"
        for file, line, top in edges(package)
        if top not in ALLOWED[package]
    ]
    assert wrong == [], f"{package} may import only {sorted(ALLOWED[package])}:\n" + "\n".join(
        wrong
    )


def test_the_walk_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "from . import sibling\n"
        "from ..up import thing\n"
        "def later():\n"
        "    from dedup_worker.loop import DedupWorker\n"
        "    importlib.import_module('dedup_local.demo')\n"
    )
    names = [name for _, name in imported("dedup_spark.sub.probe", source)]
    assert names == [
        "importlib",
        "dedup_spark.sub",
        "dedup_spark.up",
        "dedup_worker.loop",
        "dedup_local.demo",
    ]


def test_the_wheel_holds_no_test_harness() -> None:
    """What `pip install .` packages: setuptools' find over the configured directories."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = setuptools["packages"]["find"]
    wheel = {
        package
        for where in find["where"]
        for package in find_packages(
            where=str(ROOT / where),
            include=find.get("include", ("*",)),
            exclude=find.get("exclude", ()),
        )
    }
    assert not any(p.split(".")[0] == "dedup_local" for p in wheel), sorted(wheel)
    assert {"dedup_contract", "dedup_worker", "dedup_operator", "dedup_spark", "dedupctl"} <= wheel
    for extension in setuptools.get("ext-modules", []):
        assert extension["name"].rpartition(".")[0] in wheel, extension


SHARED_BASENAMES = frozenset({"__init__.py", "__main__.py", "cli.py"})
"""File names several packages may use: a package's own, its `python -m`, its command."""


def test_no_two_modules_share_a_name() -> None:
    """One name, one module: `kube.py`, `audit.py` or `reconcile.py` in two places makes
    every mention of one (a log line, a doc, a grep) ambiguous."""
    by_name: dict[str, list[str]] = {}
    for package in PACKAGES:
        for _, path in modules(package):
            by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {
        name: paths
        for name, paths in sorted(by_name.items())
        if len(paths) > 1 and name not in SHARED_BASENAMES
    }
    assert shared == {}, f"modules sharing a file name: {shared}"


# ----------------------------------------------------------- one owner per rule's pattern
RUNNING_CODE = (
    *PACKAGES.values(),
    ROOT / "bench",
    ROOT / "scripts",
    ROOT / "tests" / "support",
    ROOT / "tests" / "conftest.py",
)
Q = "[\"']"
OWNED_PATTERNS = {
    "kafka settings (key=value)": (
        re.compile(rf"\.partition\(\s*{Q}={Q}\s*\)"),
        "contract/dedup_contract/kafka_settings.py",
        {
            # not Kafka settings: a test's fault points (`name=probability`)
            "contract/dedup_contract/faults.py",
            # not Kafka settings: the pins of versions.env (`KEY=VALUE` lines)
            "local/dedup_local/paths.py",
        },
    ),
    "Kubernetes time formats": (
        re.compile(
            rf"strftime\(\s*{Q}%Y-%m-%dT"
            rf"|\.isoformat\(\)\.replace\(\s*{Q}\+00:00"
            rf"|\.replace\(\s*{Q}Z{Q}\s*,\s*{Q}\+00:00"
        ),
        "contract/dedup_contract/timefmt.py",
        set(),
    ),
    "the operator's Events (type, reason, message)": (
        re.compile(rf"{Q}(Normal|Warning){Q}\s*,"),
        "operator/dedup_operator/events.py",
        {
            # a handover's Event names, which dedupctl reads back as well
            "contract/dedup_contract/handover.py",
        },
    ),
    "the API-client builder": (
        re.compile(r"\bApiClient\(|new_client_from_config|load_kube_config|load_incluster_config"),
        "contract/dedup_contract/kube_client.py",
        set(),
    ),
}


def python_files() -> Iterator[Path]:
    for place in RUNNING_CODE:
        yield from [place] if place.is_file() else sorted(place.rglob("*.py"))


@pytest.mark.parametrize("rule", sorted(OWNED_PATTERNS))
def test_each_rule_is_written_only_by_its_owner(rule: str) -> None:
    pattern, owner, elsewhere = OWNED_PATTERNS[rule]
    found = {
        f"{path.relative_to(ROOT)}:{n}"
        for path in python_files()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    }
    assert any(hit.startswith(owner + ":") for hit in found), f"{owner} no longer has it"
    strays = sorted(h for h in found if h.split(":")[0] not in {owner, *elsewhere})
    assert strays == [], f"{rule}: only {owner} may do this; use it instead:\n" + "\n".join(strays)


# ------------------------------------------------------- the worker's metric names
WORKER_METRICS = "contract/dedup_contract/worker_metrics.py"
COUNTER_SAMPLE = re.compile(r"[\"']dedup_[a-z0-9_]+_total[\"']")
"""A counter's sample name as a string literal (`"dedup_records_in_total"`)."""


def test_worker_metric_names_are_written_only_by_their_owner() -> None:
    """The worker exports them, the operator and dedupctl read them: each name is written
    once, in the contract. Searched in the packages, bench/ and scripts/ (the tests,
    the chart and the docs state them as what they check or show)."""
    places = [*PACKAGES.values(), ROOT / "bench", ROOT / "scripts"]
    found = {
        f"{path.relative_to(ROOT)}:{n}"
        for place in places
        for path in sorted(place.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if COUNTER_SAMPLE.search(line)
    }
    assert any(hit.startswith(WORKER_METRICS + ":") for hit in found), "the owner lost them"
    strays = sorted(h for h in found if h.split(":")[0] != WORKER_METRICS)
    assert strays == [], f"use {WORKER_METRICS}'s names instead:\n" + "\n".join(strays)
