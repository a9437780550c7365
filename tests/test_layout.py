"""The house rules of the layout (docs/architecture.md), checked by importing for real.

Each check imports modules in a fresh interpreter and looks at what `sys.modules` holds after:
what a module drags in through any chain of imports counts, not only its own import lines.
- No service module loads torch or any of model/ and export/ (the serving image has no torch).
- The text, inference and scheduling rooms, and the modules under them, load no FastAPI or
  Starlette: only service/http/ speaks HTTP.
- The bundle contract (service/bundle/) loads nothing else of the project.
- model/ loads no service module but the bundle contract.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WEB = ("fastapi", "starlette")


def modules(package: str) -> list[str]:
    """`package` and every module under it, by walking the source tree (nothing is imported).
    model/import.py is left out: its name is a keyword, so it is only ever run (-m)."""
    path = ROOT / package.replace(".", "/")
    found = [package]
    for info in pkgutil.walk_packages([str(path)], prefix=package + "."):
        if info.name.rsplit(".", 1)[-1] != "import":
            found.append(info.name)
    return sorted(found)


def loaded_after_importing(names: list[str]) -> set[str]:
    """The top-level and project modules in sys.modules after importing `names`, in a fresh
    interpreter."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def project(loaded: set[str], package: str) -> set[str]:
    return {name for name in loaded if name == package or name.startswith(package + ".")}


def test_the_walk_finds_every_room() -> None:
    found = modules("service")
    for room in ("bundle", "text", "inference", "scheduling", "http"):
        assert f"service.{room}" in found
    assert "service.http.routes" in found and "service.inference.engine" in found


def test_no_service_module_loads_torch_model_or_export() -> None:
    loaded = loaded_after_importing(modules("service"))
    assert "torch" not in loaded
    assert not project(loaded, "model") and not project(loaded, "export")


def test_text_inference_and_scheduling_load_no_web_framework() -> None:
    below_http = [
        name
        for room in ("service.bundle", "service.text", "service.inference", "service.scheduling")
        for name in modules(room)
    ] + ["service.errors", "service.metrics", "service.settings", "service.translate"]
    loaded = loaded_after_importing(below_http)
    assert not {name for name in loaded if name.split(".")[0] in WEB}
    assert not project(loaded, "service.http")


def test_the_bundle_contract_loads_nothing_else_of_the_project() -> None:
    loaded = loaded_after_importing(modules("service.bundle"))
    ours = project(loaded, "service") | project(loaded, "model") | project(loaded, "export")
    assert ours == {"service"} | set(modules("service.bundle"))
    assert not {name for name in loaded if name.split(".")[0] in ("torch", "onnx", *WEB)}


def test_model_loads_no_service_module_but_the_contract() -> None:
    loaded = loaded_after_importing(modules("model"))
    assert project(loaded, "service") <= {"service"} | set(modules("service.bundle"))


@pytest.mark.parametrize("path", sorted((ROOT / "service").rglob("*.py")), ids=str)
def test_only_the_http_room_names_a_web_framework(path: Path) -> None:
    """The same rule, read from the source: an import hidden in a function counts too."""
    if (ROOT / "service" / "http") in path.parents:
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    named = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert not named & {*WEB, "torch", "model", "export"}
