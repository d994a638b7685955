"""A runbook for every alert: each alert of the chart's PrometheusRule links
docs/runbooks/<alert>.md, the page exists with its four sections (Meaning, Confirm,
Causes, Fix), and every `dedupctl` subcommand it names exists (`dedupctl <sub> --help`
exits 0). The severities follow one rule, pinned here. The rendered rule, with the
chart's default base URL, is checked in tests/integration/test_chart.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from dedup_contract.store_format import STORE_TOO_NEW
from dedupctl import cli as ctl

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "dedup-operator"
RULE = CHART / "templates" / "prometheusrule.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks"
SECTIONS = ("Meaning", "Confirm", "Causes", "Fix")

# Critical when the pipeline is not processing, or its output is proven wrong; warning
# otherwise (the rule's comment says the same).
CRITICAL = {
    "DedupPartitionNotReady": "a partition without a Ready worker processes nothing",
    "DedupHandoverStuck": "the partition being handed over processes nothing",
    "DedupAuditFailed": "the output is proven wrong",
}


def alerts() -> dict[str, str]:
    """Each alert of the template and its rule's text (up to the next alert)."""
    parts = re.split(r"^\s*- alert: ", RULE.read_text(), flags=re.M)[1:]
    return {part.split()[0]: part for part in parts}


def page(alert: str) -> Path:
    return RUNBOOKS / f"{alert}.md"


def sections(text: str) -> dict[str, str]:
    """The page's `## ` sections and their text, in order."""
    found: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            found[current] = ""
        elif current is not None:
            found[current] += line + "\n"
    return found


def blocks(text: str) -> str:
    """The page's fenced code blocks."""
    return "\n".join(re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S))


def code(text: str) -> str:
    """What the page shows as code: fenced blocks and inline spans."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
    return "\n".join([blocks(text), *spans])


def dedupctl_subcommands(text: str) -> set[str]:
    return {
        word
        for word in re.findall(r"(?:\bdedupctl|\bkubectl dedup)[ \t]+([^\s`'\"|;]+)", code(text))
        if not word.startswith("-")
    }


def dedupctl() -> list[str]:
    """The venv's `dedupctl`, else the same module through this interpreter."""
    script = Path(sys.executable).with_name("dedupctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dedupctl.cli"]


@cache
def help_exit_code(subcommand: str) -> int:
    run = subprocess.run(
        [*dedupctl(), subcommand, "--help"], capture_output=True, text=True, timeout=60
    )
    return run.returncode


def test_the_rule_has_the_alerts() -> None:
    found = alerts()
    assert len(found) >= 8 and set(CRITICAL) <= set(found)


@pytest.mark.parametrize("alert", sorted(alerts()))
def test_severity_follows_the_rule(alert: str) -> None:
    severity = re.findall(r"^\s*severity: (\S+)\s*$", alerts()[alert], flags=re.M)
    assert severity == ["critical" if alert in CRITICAL else "warning"], alert


@pytest.mark.parametrize("alert", sorted(alerts()))
def test_each_alert_links_its_runbook(alert: str) -> None:
    urls = re.findall(r"^\s*runbook_url: (.+?)\s*$", alerts()[alert], flags=re.M)
    assert urls == [f"{{{{ $runbooks }}}}/{alert}.md"], f"{alert}: runbook_url {urls}"
    assert '$runbooks := trimSuffix "/" $r.runbookBaseURL' in RULE.read_text()


def test_the_base_url_is_a_value_pointing_at_the_repositorys_docs() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    base = values["metrics"]["prometheusRule"]["runbookBaseURL"]
    home = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]
    assert base == f"{home}/blob/main/docs/runbooks"


@pytest.mark.parametrize("alert", sorted(alerts()))
def test_each_alert_has_a_page_with_the_four_sections(alert: str) -> None:
    path = page(alert)
    assert path.is_file(), f"no runbook for {alert}: write {path.relative_to(ROOT)}"
    text = path.read_text()
    assert text.startswith(f"# {alert}\n"), f"{path.name}: the title is the alert's name"
    found = sections(text)
    missing = [s for s in SECTIONS if s not in found]
    assert missing == [], f"{path.name} lacks the sections {missing}"
    assert [s for s in found if s in SECTIONS] == list(SECTIONS), f"{path.name}: order"
    empty = [s for s in SECTIONS if not found[s].strip()]
    assert empty == [], f"{path.name}: empty sections {empty}"
    confirm = code(found["Confirm"])
    assert re.search(r"^\s*dedupctl \w", confirm, flags=re.M), f"{path.name}: no dedupctl"
    assert re.search(r"^\s*kubectl \w", confirm, flags=re.M), f"{path.name}: no kubectl"
    severity = "critical" if alert in CRITICAL else "warning"
    assert f"**Severity: {severity}.**" in text, f"{path.name}: say its severity"


# Pages of a pipeline condition rather than an alert: the condition's name, as the
# operator sets it (dedup_contract.store_format names StoreTooNew).
CONDITION_PAGES = {STORE_TOO_NEW}


def test_every_page_is_an_alerts_or_a_conditions() -> None:
    pages = {p.stem for p in RUNBOOKS.glob("*.md")}
    assert pages == set(alerts()) | CONDITION_PAGES, (
        f"pages without an alert or a condition: {sorted(pages - set(alerts()) - CONDITION_PAGES)}"
    )


def test_a_conditions_page_has_the_four_sections() -> None:
    for name in CONDITION_PAGES:
        assert list(sections(page(name).read_text())) == list(SECTIONS), name


def test_links_between_pages_resolve() -> None:
    for path in sorted(RUNBOOKS.glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)\)", path.read_text()):
            if "://" not in target:
                assert (path.parent / target).is_file(), f"{path.name} links {target}"


def test_pages_name_only_dedupctl_subcommands_that_exist() -> None:
    named: dict[str, set[str]] = {}
    for path in sorted(RUNBOOKS.glob("*.md")):
        for sub in dedupctl_subcommands(path.read_text()):
            named.setdefault(sub, set()).add(path.name)
    assert {"status", "failovers", "audit"} <= set(named)  # the pages use them all
    unknown = {sub: sorted(pages) for sub, pages in named.items() if help_exit_code(sub) != 0}
    assert unknown == {}, f"dedupctl has no such subcommands: {unknown}"


def test_the_subcommand_check_catches_one_that_does_not_exist() -> None:
    assert dedupctl_subcommands("run `dedupctl drain P -n NS`, then `dedupctl --help`") == {"drain"}
    assert help_exit_code("drain") != 0


def test_every_dedupctl_command_line_parses() -> None:
    """Flags too: each `dedupctl ...` command of a page's code blocks is one dedupctl
    accepts (inline mentions such as `dedupctl failovers` may leave arguments out)."""
    for path in sorted(RUNBOOKS.glob("*.md")):
        for line in blocks(path.read_text()).splitlines():
            line = re.split(r" #|\s(?:\||&&|;)\s", line, maxsplit=1)[0].strip()  # its own part
            if not line.startswith("dedupctl ") or line.endswith("--help"):
                continue
            try:
                ctl.parser().parse_args(shlex.split(line)[1:])
            except SystemExit:
                pytest.fail(f"{path.name}: dedupctl refuses {line!r}")
