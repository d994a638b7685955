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
from collections.abc import Collection, Iterator, Mapping
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


# ------------------------------------------- no import cycle, no other module's private name
def known_modules() -> dict[str, Path]:
    """Every module of ours by dotted name, packages (their `__init__.py`) included."""
    return {module: path for package in PACKAGES for module, path in modules(package)}


def extension_modules() -> frozenset[str]:
    """The compiled modules of ours (pyproject's ext-modules), e.g. dedup_contract._murmur2."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return frozenset(str(e["name"]) for e in setuptools.get("ext-modules", []))


def from_module(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The dotted module a `from ... import` names (relative ones resolved as `imported`)."""
    if not node.level:
        return node.module or ""
    base = (module if path.name == "__init__.py" else module.rpartition(".")[0]).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_modules(module: str, path: Path, known: Collection[str]) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in `path` of a module in `known`: every import
    counts, as in `imported`, and `from package import name` names the submodule
    package.name where there is one (else package)."""
    told: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            name = from_module(node, module, path)
            told.add((node.lineno, name))
            targets = {
                f"{name}.{a.name}" if f"{name}.{a.name}" in known else name for a in node.names
            }
            for target in sorted(targets & set(known)):
                yield node.lineno, target
    for line, name in imported(module, path):  # `import x`, importlib calls
        if name in known and (line, name) not in told:
            yield line, name


def import_cycles(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_among_the_modules_of_a_package(package: str) -> None:
    """A cycle is kept from failing only by the order of imports (or an import moved into
    a function): what two modules share belongs in a third that both import."""
    own = dict(modules(package))
    lines: dict[tuple[str, str], int] = {}
    for module, path in own.items():
        for line, target in imported_modules(module, path, own):
            if target != module:
                lines.setdefault((module, target), line)
    graph: dict[str, set[str]] = {m: set() for m in own}
    for module, target in lines:
        graph[module].add(target)
    cycles = import_cycles(graph)
    told = [
        f"{own[a].relative_to(ROOT)}:{lines[a, b]} imports {b}"
        for cycle in cycles
        for a in cycle
        for b in sorted(graph[a] & set(cycle))
    ]
    assert cycles == [], f"import cycles in {package}: {cycles}\n" + "\n".join(told)


WORKER_PARTS = ("dedup_worker.transaction", "dedup_worker.internal_topic", "dedup_worker.sources")
"""The worker's parts under its loop (docs/design.md, "The worker in parts"): the commit
protocol, the internal topic, what it reads."""


@pytest.mark.parametrize("part", WORKER_PARTS)
def test_the_worker_parts_never_import_its_loop_or_the_cli(part: str) -> None:
    """loop.py composes the parts; a part that imported it (or the CLI above it) would
    tie the commit protocol to the loop it serves, and a change of sources or stores
    (the reshard, snapshots) would reach into it."""
    own = dict(modules("dedup_worker"))
    above = {"dedup_worker.loop", "dedup_worker.cli"}
    found = sorted(
        f"line {line}: {target}"
        for line, target in imported_modules(part, own[part], own)
        if target in above
    )
    assert found == [], f"{part} imports what is above it: {found}"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names_used(
    module: str, path: Path, known: Collection[str], compiled: Collection[str]
) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every private name of another module that `path` imports
    (`from x import _name`, `import x._name`) or reads (`x._name`, `a.x._name`). A private
    *module* (`_murmur2`, a `_name.py`) is private to its package: its package's own
    modules may import it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    ours = {*known, *compiled}

    def allowed(dotted: str) -> bool:
        """`dotted` is a private module of the importer's own package (or below it)."""
        parent = dotted.rpartition(".")[0]
        return dotted in ours and (package == parent or package.startswith(parent + "."))

    bound: dict[str, str] = {}  # local name -> the module of ours it is bound to
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            name = from_module(node, module, path)
            if name.split(".")[0] not in OURS:
                continue
            for alias in node.names:
                dotted = f"{name}.{alias.name}"
                if dotted in ours:
                    bound[alias.asname or alias.name] = dotted
                if is_private(alias.name) and not allowed(dotted):
                    yield node.lineno, dotted
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] not in OURS:
                    continue
                bound[alias.asname or parts[0]] = alias.name if alias.asname else parts[0]
                for i, part in enumerate(parts):
                    if is_private(part) and not allowed(".".join(parts[: i + 1])):
                        yield node.lineno, ".".join(parts[: i + 1])

    def resolved(node: ast.expr) -> str | None:
        """The module of ours an expression (`x`, `a.x`) names, if it names one."""
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = resolved(node.value)
            dotted = f"{base}.{node.attr}" if base else None
            return dotted if dotted in ours else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            base = resolved(node.value)
            dotted = f"{base}.{node.attr}"
            if base is not None and base != module and not allowed(dotted):
                yield node.lineno, dotted


def test_no_module_uses_another_modules_private_name() -> None:
    """A leading underscore says "this module's own": a name two modules share is public
    (and lives where both may import it), so renaming a private one can break nothing
    elsewhere."""
    known = known_modules()
    compiled = extension_modules()
    used = [
        f"{path.relative_to(ROOT)}:{line} uses {name}"
        for module, path in known.items()
        for line, name in private_names_used(module, path, known, compiled)
    ]
    assert used == [], "private names of other modules:\n" + "\n".join(used)


def test_the_cycle_and_private_name_walks_see_what_they_must(tmp_path: Path) -> None:
    pkg = tmp_path / "dedup_local"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\nfrom .b import _hidden\n")
    (pkg / "b.py").write_text("def later():\n    from dedup_local.a import thing\n")
    (pkg / "c.py").write_text(
        "import dedup_local.b\nfrom dedup_local import b as bee\nfrom . import _ext\n"
        "bee._x\ndedup_local.b._y\nbee.public\n"
    )
    known = {
        "dedup_local": pkg / "__init__.py",
        **{f"dedup_local.{m}": pkg / f"{m}.py" for m in "abc"},
    }
    graph = {m: {t for _, t in imported_modules(m, p, known) if t != m} for m, p in known.items()}
    assert graph["dedup_local.a"] == {"dedup_local.b"}
    assert import_cycles(graph) == [["dedup_local.a", "dedup_local.b"]]
    used = {
        m: [name for _, name in private_names_used(m, p, known, {"dedup_local._ext"})]
        for m, p in known.items()
    }
    assert used["dedup_local.a"] == ["dedup_local.b._hidden"]
    assert sorted(used["dedup_local.c"]) == ["dedup_local.b._x", "dedup_local.b._y"]
    elsewhere = tmp_path / "probe.py"
    elsewhere.write_text("from dedup_local import _ext\n")
    assert [
        n
        for _, n in private_names_used("dedup_spark.probe", elsewhere, known, {"dedup_local._ext"})
    ] == ["dedup_local._ext"]


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
