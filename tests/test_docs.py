"""The documentation against the code: the README stays a short page for users, the settings
table lists every setting once, every documented `python -m` command of this project accepts the
flags written after it, and every relative link leads to a file."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
CONFIGURATION = ROOT / "docs" / "configuration.md"

README_MAX_BYTES = 15 * 1024
PROJECT_PACKAGES = ("service", "model", "export", "benchmarks")
HELP_TIMEOUT_S = 120

_FENCE = re.compile(r"^\s*(```|~~~)")
_COMMAND = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
# Where a command's own arguments end on a line: inline code closing, a shell operator or
# redirection, a comment. A `|` between words (`--dtype fp32|fp16|int8`) lists choices.
_COMMAND_END = re.compile(r"`|&&|\|\||;|\s[|<>]|\s#")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"`[^`]*`")


def _lines(page: Path) -> list[str]:
    """The page's lines, with a code block's backslash-continued lines joined into one."""
    lines: list[str] = []
    in_code = False
    pending = ""
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            if pending:
                lines.append(pending)
                pending = ""
            in_code = not in_code
            lines.append(line)
            continue
        if in_code and line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def _project_module(module: str) -> bool:
    return module.split(".")[0] in PROJECT_PACKAGES


def _documented_commands() -> dict[str, set[str]]:
    """Each project module run as `python -m MODULE` in the docs -> the flags written after it."""
    commands: dict[str, set[str]] = {}
    for page in PAGES:
        for line in _lines(page):
            matches = list(_COMMAND.finditer(line))
            for i, match in enumerate(matches):
                module = match.group(1).rstrip(".")
                if not _project_module(module):
                    continue
                end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
                rest = line[match.end() : end]
                stop = _COMMAND_END.search(rest)
                if stop is not None:
                    rest = rest[: stop.start()]
                commands.setdefault(module, set()).update(_FLAG.findall(rest))
    return commands


COMMANDS = _documented_commands()


def test_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, over {README_MAX_BYTES}: move details to docs/"
    )


def _settings_table_names() -> list[str]:
    """The `MT_*` names in the first column of the first table of docs/configuration.md."""
    rows: list[str] = []
    in_table = False
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("|"):
            in_table = True
            rows.append(line)
        elif in_table:
            break
    assert len(rows) > 2, "docs/configuration.md has no settings table"
    names: list[str] = []
    for row in rows[2:]:  # the header and the |---| line
        first = row.strip().strip("|").split("|")[0]
        names.extend(re.findall(r"\bMT_[A-Z0-9_]+\b", first))
    return names


def test_configuration_lists_every_setting_once() -> None:
    from service.settings import Settings

    prefix = str(Settings.model_config.get("env_prefix", "")).upper()
    expected = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        expected.add(alias.upper() if isinstance(alias, str) else prefix + name.upper())
    names = _settings_table_names()
    duplicates = sorted({name for name in names if names.count(name) > 1})
    assert not duplicates, f"listed more than once in docs/configuration.md: {duplicates}"
    assert set(names) == expected, (
        f"missing from docs/configuration.md: {sorted(expected - set(names))}; "
        f"not settings: {sorted(set(names) - expected)}"
    )


def test_the_docs_name_commands() -> None:
    assert "service" in COMMANDS, "no `python -m service` found in README.md and docs/"


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_documented_command_accepts_its_flags(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"python -m {module} --help exited {result.returncode}:\n{output}"
    )
    unknown = sorted(
        flag
        for flag in COMMANDS[module]
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", output)
    )
    assert not unknown, f"python -m {module} --help does not list {unknown}"


def _prose(page: Path) -> Iterator[str]:
    """A page's lines outside its code blocks."""
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            yield line


def _relative_links(page: Path) -> list[str]:
    """Its links that are not URLs: files, files with anchors, and anchors on the page."""
    return [
        target
        for line in _prose(page)
        for target in _LINK.findall(_INLINE_CODE.sub("", line))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)
    ]


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: in lower case, without the punctuation
    but "-" and "_", spaces as "-"; a repeated heading's with "-1", "-2"..."""
    anchors: set[str] = set()
    seen: Counter[str] = Counter()
    for line in _prose(page):
        heading = re.match(r"#{1,6}\s+(.*?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading[1].lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
            seen[slug] += 1
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_lead_to_files_and_headings(page: Path) -> None:
    missing, unanchored = [], []
    for target in _relative_links(page):
        path, _, anchor = target.partition("#")
        linked = page.parent / path if path else page
        if not linked.exists():
            missing.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            unanchored.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"
    assert not unanchored, f"{page.relative_to(ROOT)} links to no heading: {unanchored}"
