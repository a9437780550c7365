"""What installed distributions pull in, from this environment's metadata (no imports of the
packages themselves: benchmarks.detect_bench measures processes that import only this)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Collection, Iterable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def with_requirements(names: Iterable[str], without: Collection[str] = ()) -> set[str]:
    """`names` and every distribution they require, as installed here (extras left out), by
    canonical name; the walk enters neither `without`'s names (canonical) nor one not
    installed (named, not walked)."""
    found: set[str] = set()
    pending = list(names)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in found or name in without:
            continue
        found.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return found
