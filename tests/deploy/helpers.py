"""Helpers for the deployment-file tests (their fixtures: conftest.py): the repository's paths,
YAML loading, a small Dockerfile reader (stages, COPY, ENV), a small nginx configuration reader
and the serving requirements list.

The images themselves are built and run by .ci/images and test_image.py."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.paths import REPO

DEPLOY = REPO / "deploy"
DOCKERFILE = REPO / "Dockerfile"
K8S = DEPLOY / "k8s"


def load_yaml(path: Path) -> list[Any]:
    """Every document of a YAML file (empty documents dropped)."""
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def k8s_objects(directory: Path = K8S) -> dict[str, dict[str, Any]]:
    """The service's manifests under deploy/k8s (monitoring/ included; Redis's, redis/, apart:
    `k8s_objects(K8S / "redis")`), keyed by kind."""
    objects: dict[str, dict[str, Any]] = {}
    paths = directory.rglob("*.yaml")
    for path in sorted(p for p in paths if directory != K8S or "redis" not in p.parts):
        for doc in load_yaml(path):
            assert doc["kind"] not in objects, f"two {doc['kind']} objects"
            objects[doc["kind"]] = doc
    return objects


# --- Dockerfile ---------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str  # upper case
    args: str  # the rest of the logical line, continuations joined


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """ENV key=value pairs of the stage, in order (later wins)."""
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for token in shlex.split(instruction.args):
                key, sep, value = token.partition("=")
                assert sep, f"ENV {instruction.args!r}: use the key=value form"
                values[key] = value
        return values

    def copies(self) -> list[tuple[str | None, str, str]]:
        """COPY lines as (--from stage or None, source, destination); one source per line."""
        result = []
        for instruction in self.all("COPY"):
            tokens = shlex.split(instruction.args)
            flags = {t.split("=", 1)[0]: t.split("=", 1)[-1] for t in tokens if t.startswith("--")}
            paths = [t for t in tokens if not t.startswith("--")]
            assert len(paths) == 2, f"COPY {instruction.args!r}: one source, one destination"
            result.append((flags.get("--from"), paths[0], paths[1]))
        return result


def parse_dockerfile(path: Path = DOCKERFILE) -> list[Stage]:
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest)
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", base, flags=re.IGNORECASE)
            assert match, f"FROM {rest!r}"
            stages.append(Stage(match.group(1), match.group(2)))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append(Instruction(keyword, rest))
    return stages


# --- nginx configuration -----------------------------------------------------------------------

# directive name -> list of argument lists; "{name}" -> child blocks, each with its own
# arguments under "" (a location's modifier and path)
NginxBlock = dict[str, Any]


def parse_nginx(text: str) -> NginxBlock:
    """nginx's configuration syntax, enough for deploy/nginx: directives and nested blocks."""
    tokens = re.findall(r'"[^"]*"|[{};]|[^\s{};]+', re.sub(r"#.*", "", text))
    stack: list[NginxBlock] = [{}]
    words: list[str] = []
    for token in tokens:
        if token == ";":
            stack[-1].setdefault(words[0], []).append(words[1:])
            words = []
        elif token == "{":
            child: NginxBlock = {"": words[1:]}
            stack[-1].setdefault("{" + words[0] + "}", []).append(child)
            stack.append(child)
            words = []
        elif token == "}":
            stack.pop()
        else:
            words.append(token)
    assert len(stack) == 1 and not words, "unbalanced braces or a missing ';'"
    return stack[0]


# --- requirements ------------------------------------------------------------------------------


def requirement_name(line: str) -> str:
    """The normalised project name of a requirement line ("uvicorn[standard]==1" -> uvicorn)."""
    name = re.split(r"[\[=<>!~; ]", line, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(name: str = "serve") -> list[str]:
    """deploy/requirements-`name`.txt's requirement lines."""
    path = DEPLOY / f"requirements-{name}.txt"
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line]


# --- the running service's metrics --------------------------------------------------------------


@dataclass
class Exported:
    families: dict[str, str]  # family name -> type
    samples: set[str]  # sample names seen

    def names(self) -> set[str]:
        """Every series name a query can use: families plus their type's suffixes."""
        names = set(self.samples)
        for family, kind in self.families.items():
            names.add(family)
            if kind == "counter":
                names |= {f"{family}_total", f"{family}_created"}
            elif kind == "histogram":
                names |= {f"{family}_{s}" for s in ("bucket", "count", "sum", "created")}
            elif kind == "summary":
                names |= {f"{family}_{s}" for s in ("count", "sum", "created")}
        return names
