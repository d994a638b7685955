"""Does the CRD only grow compatibly? The DedupPipeline CRD against a released one.

    python scripts/crd_compat.py                    # crds/ against every release in crds/released/
    python scripts/crd_compat.py OLD.yaml NEW.yaml  # two CRD files

An object the API server accepted under the released CRD must still be accepted, read and
updated under the new one, and a client of the released API must still find every field
it knew. So, for each version the released CRD serves, the new CRD must serve it with a
schema that accepts at least as much. A change is incompatible when it:

- stops serving a version;
- removes a field (a rename is a removal and an addition);
- changes a field's type, or drops `x-kubernetes-preserve-unknown-fields` or
  `x-kubernetes-int-or-string`;
- narrows an enum (removes a value, or adds an enum where there was none);
- tightens a bound (`minimum`, `maxLength`, ...: raised, lowered or added) or adds or
  changes a `pattern`;
- makes a field required that was not (a new required field, or an existing one);
- adds a CEL rule (`x-kubernetes-validations`) on a field that existed, unless the rule
  ratchets: it lets a value pass that is unchanged since the last write (`self ==
  oldSelf || ...`, or `!oldSelf.hasValue() || ...` with `optionalOldSelf: true`), so
  objects stored before it stay writable. A rule on a new field is free, and so is one
  that starts `!has(self.NEW) ||` for a field NEW the released schema did not have.

Fields, versions, looser bounds, wider enums and descriptions may be added; defaults may
change (they apply to new writes). Exit code 1 names every incompatible change, one line
each; 0 when there is none. tests/unit/project/test_crd_compat.py runs it on crds/ in the
unit tests, and shows it failing on a planted removal.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CRDS = REPO_ROOT / "crds"
RELEASED = CRDS / "released"
"""One directory per release (`released/0.1.0/`), holding that release's CRD files."""

Schema = Mapping[str, Any]

LOWER_BOUNDS = ("minimum", "minLength", "minItems", "minProperties")
UPPER_BOUNDS = ("maximum", "maxLength", "maxItems", "maxProperties")
KEPT_FLAGS = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")
RATCHETS = ("self == oldSelf ||", "oldSelf == self ||", "!oldSelf.hasValue() ||")


def served_schemas(crd: Mapping[str, Any]) -> dict[str, Schema]:
    """version name -> its openAPIV3Schema, for every served version."""
    return {
        v["name"]: v["schema"]["openAPIV3Schema"]
        for v in crd["spec"]["versions"]
        if v.get("served", False)
    }


def incompatible(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Every change from `old` to `new` that an object or client of `old` would feel."""
    found: list[str] = []
    kind = old["spec"]["names"]["kind"]
    new_schemas = served_schemas(new)
    for version, schema in served_schemas(old).items():
        if version not in new_schemas:
            found.append(f"{kind} {version}: no longer served")
            continue
        found.extend(
            f"{kind} {version}: {change}"
            for change in schema_changes(schema, new_schemas[version], "")
        )
    return found


def schema_changes(old: Schema, new: Schema, path: str) -> Iterator[str]:
    """The incompatible changes between two schemas of the field at `path`."""
    where = path or "the object"
    if old.get("type") != new.get("type"):
        yield f"{where}: type {old.get('type')} became {new.get('type')}"
    for flag in KEPT_FLAGS:
        if old.get(flag) and not new.get(flag):
            yield f"{where}: {flag} dropped"
    yield from _enum_changes(old, new, where)
    yield from _bound_changes(old, new, where)
    if "pattern" in new and new.get("pattern") != old.get("pattern"):
        yield f"{where}: pattern {old.get('pattern')!r} became {new['pattern']!r}"
    yield from _rule_changes(old, new, where)
    old_props: Schema = old.get("properties") or {}
    new_props: Schema = new.get("properties") or {}
    newly_required = set(new.get("required") or ()) - set(old.get("required") or ())
    for name in sorted(newly_required):
        what = "an existing field" if name in old_props else "a new field"
        yield f"{_join(path, name)}: now required ({what})"
    for name, child in old_props.items():
        if name not in new_props:
            yield f"{_join(path, name)}: removed"
        else:
            yield from schema_changes(child, new_props[name], _join(path, name))
    old_items, new_items = old.get("items"), new.get("items")
    if isinstance(old_items, Mapping) and isinstance(new_items, Mapping):
        yield from schema_changes(old_items, new_items, f"{path}[]")
    old_map, new_map = old.get("additionalProperties"), new.get("additionalProperties")
    if isinstance(old_map, Mapping):
        if not isinstance(new_map, Mapping):
            yield f"{where}: its map values are no longer accepted"
        else:
            yield from schema_changes(old_map, new_map, f"{path}{{}}")


def _enum_changes(old: Schema, new: Schema, where: str) -> Iterator[str]:
    if "enum" not in new:
        return
    if "enum" not in old:
        yield f"{where}: an enum was added ({new['enum']})"
        return
    dropped = [v for v in old["enum"] if v not in new["enum"]]
    if dropped:
        yield f"{where}: enum values removed: {dropped}"


def _bound_changes(old: Schema, new: Schema, where: str) -> Iterator[str]:
    for bound in (*LOWER_BOUNDS, *UPPER_BOUNDS):
        if bound not in new:
            continue
        before, after = old.get(bound), new[bound]
        if before is None:
            yield f"{where}: {bound} {after} added"
        elif (after > before) if bound in LOWER_BOUNDS else (after < before):
            yield f"{where}: {bound} {before} became {after}"


def _rule_changes(old: Schema, new: Schema, where: str) -> Iterator[str]:
    before = {_text(r) for r in old.get("x-kubernetes-validations") or ()}
    for rule in new.get("x-kubernetes-validations") or ():
        text = _text(rule)
        if text in before or _ratchets(rule) or _guards_a_new_field(text, old):
            continue
        yield f"{where}: a new rule without a ratchet: {text!r}"


def _ratchets(rule: Mapping[str, Any]) -> bool:
    """Written so that a value unchanged since the last write passes (see the module
    docstring): the rule text starts with one of `RATCHETS`."""
    text = _text(rule)
    if text.startswith("!oldSelf.hasValue() ||") and not rule.get("optionalOldSelf"):
        return False
    return text.startswith(RATCHETS)


def _guards_a_new_field(text: str, old: Schema) -> bool:
    """`!has(self.NAME) || ...` where NAME is a field the old schema did not have: every
    object stored before it passes."""
    match = re.match(r"!has\(self\.(\w+)\) \|\|", text)
    return match is not None and match.group(1) not in (old.get("properties") or {})


def _text(rule: Mapping[str, Any]) -> str:
    """A rule's text with its white space folded (YAML's folding is no change)."""
    return " ".join(str(rule["rule"]).split())


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def load(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise SystemExit(f"crd_compat: {path} is not a CustomResourceDefinition")
    return crd


def releases(directory: Path = RELEASED) -> list[Path]:
    """The released CRD files, oldest release first by directory name."""
    return sorted(directory.glob("*/*.yaml"))


def check_against_releases(crds: Path = CRDS, released: Path = RELEASED) -> list[str]:
    """Each released CRD file against the file of the same name in `crds`."""
    found: list[str] = []
    for old_path in releases(released):
        new_path = crds / old_path.name
        label = f"against release {old_path.parent.name}"
        if not new_path.is_file():
            found.append(f"{old_path.name} {label}: the CRD is gone")
            continue
        found.extend(
            f"{change} ({label})" for change in incompatible(load(old_path), load(new_path))
        )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, metavar="OLD NEW")
    args = parser.parse_args(argv)
    if args.files and len(args.files) != 2:
        parser.error("give two CRD files (OLD NEW), or none for crds/ against crds/released/")
    if args.files:
        changes = incompatible(load(args.files[0]), load(args.files[1]))
    else:
        changes = check_against_releases()
    for change in changes:
        print(f"incompatible: {change}")
    if not changes:
        print("crd_compat: the CRD only grew compatibly")
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main())
