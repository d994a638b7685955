"""The README is a front door, and the docs' links hold: README.md is at most 200 lines,
every repository path it names (in backticks or links) exists, its DedupPipeline is taken
from examples/ and fits the CRD's schema, its sample output has the columns the code
prints, and every relative link of README.md, docs/ and bench/ resolves, down to the
heading it points at."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
MAX_LINES = 200
PAGES = sorted([README, *(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").glob("*.md")])
FILE_SUFFIXES = (".md", ".yaml", ".yml", ".py", ".json", ".toml", ".sh", ".env", ".png", ".c")
ROOT_FILES = frozenset({"Makefile", "Dockerfile"})
NOT_IN_A_PATH = re.compile(r"[\s<>$~*{}=:()%,'\"|\\]")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", flags=re.M | re.S)


def prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", text)


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(text))


def links(text: str) -> list[str]:
    """Link targets, outside code (a pattern such as `a]([b])` is not a link)."""
    return re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`\n]+`", "", prose(text)))


def names_a_path(span: str) -> bool:
    """A code span that names a file or folder of the repository: `docs/design.md`,
    `crds/`, `install.yaml`, `Dockerfile`; not `dedup.io/v1alpha1` or `retention.ms`."""
    if NOT_IN_A_PATH.search(span) or "://" in span:
        return False
    if "/" in span:
        return re.fullmatch(r"[A-Za-z0-9_-]+", span.split("/")[0]) is not None
    return span in ROOT_FILES or span.endswith(FILE_SUFFIXES)


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_every_path_the_readme_names_exists() -> None:
    text = README.read_text()
    named = {s for s in code_spans(text) if names_a_path(s)}
    named |= {t.split("#")[0] for t in links(text) if "://" not in t and not t.startswith("#")}
    assert {"docs/design.md", "examples/events-pipeline.yaml", "install.yaml"} <= named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == [], f"README.md names paths that do not exist: {missing}"


def test_the_path_rule() -> None:
    assert names_a_path("docs/design.md") and names_a_path("crds/") and names_a_path("Makefile")
    assert names_a_path("install.yaml") and names_a_path("contract/dedup_contract/")
    for other in ("dedup.io/v1alpha1", "retention.ms", "kubectl get dp", "~/.cache/x", "-o wide"):
        assert not names_a_path(other), other


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(page.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = sum(1 for a in found if a == base or re.fullmatch(rf"{re.escape(base)}-\d+", a))
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(page: Path) -> Iterator[tuple[str, Path, str]]:
    for target in links(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, fragment = target.partition("#")
        yield target, (page.parent / path).resolve() if path else page, fragment


def test_the_slug_rule() -> None:
    assert slug("Draining a node (`kubectl drain`)") == "draining-a-node-kubectl-drain"
    assert slug("Forwarding: what it costs") == "forwarding-what-it-costs"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target, path, fragment in relative_links(page):
        heading = bool(fragment) and path.suffix == ".md"
        if not path.exists() or (heading and fragment not in anchors(path)):
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)}: links that do not resolve: {broken}"


def pipelines(text: str) -> list[dict[str, Any]]:
    docs = [
        yaml.safe_load(block) for block in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S)
    ]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "DedupPipeline"]


def schema_errors(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """What the API server's structural schema would refuse (types, required and unknown
    fields, bounds, patterns, enums). CEL rules are the API server's and are not run."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} not in {schema['enum']}"]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        errors = [f"{path}.{r}: required" for r in schema.get("required", ()) if r not in value]
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, child in value.items():
            if props is not None and key in props:
                errors += schema_errors(child, props[key], f"{path}.{key}")
            elif isinstance(extra, Mapping):
                errors += schema_errors(child, extra, f"{path}.{key}")
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
        return errors
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        items = schema.get("items") or {}
        return [e for i, v in enumerate(value) for e in schema_errors(v, items, f"{path}[{i}]")]
    if kind == "string":
        if not isinstance(value, str):
            return [f"{path}: not a string"]
        too_short = len(value) < schema.get("minLength", 0)
        too_long = len(value) > schema.get("maxLength", len(value))
        mismatch = "pattern" in schema and not re.search(schema["pattern"], value)
        return [f"{path}: {value!r} out of bounds"] if too_short or too_long or mismatch else []
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: not an integer"]
        low, high = schema.get("minimum", value), schema.get("maximum", value)
        return [] if low <= value <= high else [f"{path}: {value} out of bounds"]
    if kind == "boolean" and not isinstance(value, bool):
        return [f"{path}: not a boolean"]
    return []


def crd_schema() -> Mapping[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "dedup.io_dedupPipelines.yaml").read_text())
    schema: Mapping[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def within(part: Any, whole: Any) -> bool:
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and within(v, whole[k]) for k, v in part.items()
        )
    return bool(part == whole)


def test_the_readme_pipeline_fits_the_crd_and_comes_from_an_example() -> None:
    (pipeline,) = pipelines(README.read_text())
    assert schema_errors(pipeline, crd_schema(), "") == []
    examples = [
        doc
        for path in sorted((ROOT / "examples").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]
    assert any(within(pipeline, e) for e in examples if e.get("kind") == "DedupPipeline")


def test_the_schema_check_catches_what_the_api_server_refuses() -> None:
    (pipeline,) = pipelines(README.read_text())
    bad = {**pipeline, "spec": {**pipeline["spec"], "partitions": 0, "snapshots": {}}}
    del bad["spec"]["kafka"]
    errors = schema_errors(bad, crd_schema(), "")
    assert errors == [
        ".spec.kafka: required",
        ".spec.partitions: 0 out of bounds",
        ".spec.snapshots: unknown field",
    ]


def sample_header(text: str, command: str) -> list[str]:
    """The column names of the first line after `$ <command>` in the README's samples."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"$ {command}"))
    return lines[start + 1].split()


def test_the_kubectl_sample_has_the_crds_printer_columns() -> None:
    columns = crd_schema_columns()
    assert sample_header(README.read_text(), "kubectl get dp") == ["NAME", *columns]


def crd_schema_columns() -> list[str]:
    crd = yaml.safe_load((ROOT / "crds" / "dedup.io_dedupPipelines.yaml").read_text())
    return [str(c["name"]).upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]


def test_the_dedupctl_sample_has_the_columns_dedupctl_prints() -> None:
    from datetime import UTC, datetime

    from dedupctl import view as ctl_view

    body = {
        "metadata": {"namespace": "default", "name": "events"},
        "spec": {"partitions": 1},
        "status": {"partitions": [{"partition": 0}]},
    }
    doc = ctl_view.status_doc([ctl_view.pipeline_doc(body)])
    printed = ctl_view.render_status(doc, datetime.now(UTC)).splitlines()
    text = README.read_text()
    assert sample_header(text, "dedupctl status") == printed[0].split()
    ours = text.splitlines()
    heading = "default/events: partitions"
    assert ours[ours.index(heading) + 1].split() == printed[printed.index(heading) + 1].split()
