"""docs/crd.md, the DedupPipeline reference, generated from the CRD's openAPIV3Schema.

    python scripts/crd_reference.py                      # print the page
    python scripts/crd_reference.py --write docs/crd.md  # refresh the page
    python scripts/crd_reference.py --check docs/crd.md  # exit 1 if the page is stale

The CRD in crds/ is what the API server enforces, so the reference is rendered from it
and never edited by hand: one row per field (its path, type, default, validation and
description), the printer columns of `kubectl get dp`, and the rules on the whole object.
tests/unit/project/test_crd_reference.py renders the page in memory and fails while docs/crd.md
differs from it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CRDS = REPO_ROOT / "crds"
PAGE = REPO_ROOT / "docs" / "crd.md"
REFRESH = "python scripts/crd_reference.py --write docs/crd.md"

Schema = Mapping[str, Any]

ESCAPES = {"<": "&lt;", ">": "&gt;", "*": "\\*"}
PLAIN = re.compile("[<>*]")

BOUNDS = (
    ("minLength", "min length {}"),
    ("maxLength", "max length {}"),
    ("minimum", "minimum {}"),
    ("maximum", "maximum {}"),
    ("minItems", "min items {}"),
    ("maxItems", "max items {}"),
    ("minProperties", "min keys {}"),
    ("maxProperties", "max keys {}"),
)


@dataclass(frozen=True)
class Field:
    """One row of the reference: a field of the schema and what the API server checks."""

    path: str
    type: str
    default: str
    validation: tuple[str, ...]
    description: str


def load_crds(directory: Path = CRDS) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in the directory's YAML files, in file order."""
    found: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                found.append(doc)
    return found


def cell(text: str) -> str:
    """Text fit for one Markdown table cell: one line, pipes escaped; outside code spans
    angle brackets as entities (`<name>` would be taken for HTML) and asterisks escaped."""
    parts = re.split(r"(`+[^`]*`+)", " ".join(text.split()))
    return "".join(
        part if part.startswith("`") else PLAIN.sub(lambda m: ESCAPES[m.group()], part)
        for part in parts
    ).replace("|", "\\|")


def code(value: str) -> str:
    """An inline code span that holds any backticks in the value."""
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def literal(value: Any) -> str:
    """A default or enum value as YAML would spell it, compact."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(", ", ": "))


def type_of(schema: Schema) -> str:
    kind = str(schema.get("type", "any"))
    if schema.get("format"):
        kind += f" ({schema['format']})"
    if kind == "array":
        return f"array of {type_of(schema.get('items') or {})}"
    if kind == "object" and "properties" not in schema:
        if isinstance(schema.get("additionalProperties"), Mapping):
            return f"map of {type_of(schema['additionalProperties'])}"
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return "object (any fields)"
    return kind


def rules(schema: Schema) -> list[str]:
    """The CEL rules on this node: their message, then the rule."""
    return [
        f"{' '.join(str(r.get('message', '')).split())}: {code(' '.join(str(r['rule']).split()))}"
        for r in schema.get("x-kubernetes-validations") or []
    ]


def validation(schema: Schema, required: bool) -> tuple[str, ...]:
    checks = ["required"] if required else []
    checks += [form.format(schema[key]) for key, form in BOUNDS if key in schema]
    if "pattern" in schema:
        checks.append(f"pattern {code(str(schema['pattern']))}")
    if "enum" in schema:
        checks.append("one of " + ", ".join(code(literal(v)) for v in schema["enum"]))
    if schema.get("x-kubernetes-list-type"):
        keys = schema.get("x-kubernetes-list-map-keys")
        keyed = f" keyed by {', '.join(keys)}" if keys else ""
        checks.append(f"list type {schema['x-kubernetes-list-type']}{keyed}")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        checks.append("unknown fields kept")
    return (*checks, *(f"CEL: {r}" for r in rules(schema)))


def walk(schema: Schema, path: str, required: bool = False) -> Iterator[Field]:
    """This field and every field below it, depth first in the schema's order."""
    yield Field(
        path=path,
        type=type_of(schema),
        default="" if "default" not in schema else code(literal(schema["default"])),
        validation=validation(schema, required),
        description=" ".join(str(schema.get("description", "")).split()),
    )
    needed = set(schema.get("required") or ())
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}", name in needed)
    values = schema.get("additionalProperties")
    if isinstance(values, Mapping) and (values.get("x-kubernetes-validations") or len(values) > 1):
        yield from walk(values, f"{path}.<key>")
    items = schema.get("items")
    if isinstance(items, Mapping) and "properties" in items:
        yield from walk(items, f"{path}[]")


def field_table(fields: Sequence[Field]) -> list[str]:
    lines = ["| field | type | default | validation | description |", "|---|---|---|---|---|"]
    for f in fields:
        checks = "; ".join(f.validation)
        lines.append(
            f"| {code(f.path)} | {cell(f.type)} | {cell(f.default)} | {cell(checks)} "
            f"| {cell(f.description)} |"
        )
    return lines


def columns_table(columns: Sequence[Schema]) -> list[str]:
    lines = ["| column | JSONPath | type | shown | description |", "|---|---|---|---|---|"]
    for c in columns:
        shown = "`-o wide`" if c.get("priority", 0) else "always"
        lines.append(
            f"| {cell(str(c['name']).upper())} | {code(str(c['jsonPath']))} "
            f"| {cell(type_of(c))} | {shown} | {cell(str(c.get('description', '')))} |"
        )
    return lines


def version_section(crd: Schema, version: Schema) -> list[str]:
    names = crd["spec"]["names"]
    kind, group = names["kind"], crd["spec"]["group"]
    root = version["schema"]["openAPIV3Schema"]
    top = root.get("properties") or {}
    needed = set(root.get("required") or ())
    lines = [
        f"## {kind} {group}/{version['name']}",
        "",
        " ".join(str(root.get("description", "")).split()),
        "",
        f"Served: {'yes' if version.get('served') else 'no'}; "
        f"stored: {'yes' if version.get('storage') else 'no'}; "
        f"subresources: {', '.join(sorted(version.get('subresources') or {})) or 'none'}.",
        "",
    ]
    if root.get("x-kubernetes-validations"):
        lines += ["Rules on the whole object:", ""]
        lines += [f"- {cell(r)}" for r in rules(root)]
        lines.append("")
    if version.get("additionalPrinterColumns"):
        lines += [f"### Columns of `kubectl get {names.get('shortNames', [names['plural']])[0]}`"]
        lines += ["", "NAME comes first, as for every kind.", ""]
        lines += [*columns_table(version["additionalPrinterColumns"]), ""]
    for part in ("spec", "status"):
        if part in top:
            lines += [f"### {part}", ""]
            lines += [*field_table(list(walk(top[part], part, part in needed))), ""]
    return lines


def render(crds: Sequence[Schema]) -> str:
    lines = [
        "# DedupPipeline reference",
        "",
        "<!-- generated by scripts/crd_reference.py from crds/*.yaml; do not edit -->",
        "",
        "Generated from the CustomResourceDefinition in `crds/`, which the API server",
        "enforces at `kubectl apply` time: types, defaults, bounds, patterns and the CEL",
        "rules (`self` is the field, `oldSelf` its value before an update). Refresh with",
        f"`{REFRESH}`. What the operator checks at run time (the topics) is in",
        "[design.md](design.md#the-guarantee-and-what-it-assumes).",
        "",
    ]
    for crd in crds:
        names = crd["spec"]["names"]
        lines += [
            f"`{crd['metadata']['name']}`: kind `{names['kind']}`, "
            f"{crd['spec']['scope'].lower()}, short names "
            f"{', '.join(code(n) for n in names.get('shortNames') or []) or 'none'}, "
            f"categories {', '.join(code(c) for c in names.get('categories') or []) or 'none'}.",
            "",
        ]
        rendered: list[Schema] = []
        for version in crd["spec"]["versions"]:
            same = next((r for r in rendered if r["schema"] == version["schema"]), None)
            if same is None:
                lines += version_section(crd, version)
                rendered.append(version)
                continue
            lines += [
                f"## {names['kind']} {crd['spec']['group']}/{version['name']}",
                "",
                f"Served: {'yes' if version.get('served') else 'no'}; "
                f"stored: {'yes' if version.get('storage') else 'no'}; the same schema as "
                f"`{crd['spec']['group']}/{same['name']}` above (no conversion: an object "
                "reads the same at either version).",
                "",
            ]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, help="write the page to this file")
    group.add_argument("--check", type=Path, help="exit 1 if this file differs from the page")
    args = parser.parse_args(argv)
    page = render(load_crds())
    if args.write:
        args.write.write_text(page)
    elif args.check:
        if not args.check.is_file() or args.check.read_text() != page:
            print(f"crd_reference: {args.check} is stale; run {REFRESH}")
            return 1
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
