"""benchmarks/gpu/stage.sh sends the GPU machine the wheels its python lacks for the service, the
CUDA tests and the benchmarks run.sh runs, named by hand in its `names` list, beside what that
python has (a comment there). A dependency the service gained without a line there would stop
every stage on the card; this test catches it here, on the CPU."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys

from packaging.utils import canonicalize_name

from benchmarks.packages import with_requirements
from benchmarks.paths import REPO

STAGE = REPO / "benchmarks" / "gpu" / "stage.sh"
# What run.sh imports there: the service, the CUDA tests, and its benchmarks.
MODULES = (
    "service.__main__",
    "service.http.app",
    "tests.service.test_cuda",
    "benchmarks.load_bench",
    "benchmarks.document_bench",
    "benchmarks.soak",
    "benchmarks.step_profile",
    "benchmarks.gpu_bench",
)
# Sent on their own (onnxruntime-gpu), the project itself, and imports tried and let go where
# missing (pydantic.v1 takes Cython's helpers, joblib's process pool cloudpickle, if present).
ELSEWHERE = {"onnxruntime", "onnxruntime-gpu", "transformer-mt", "cython", "cloudpickle"}


def staged() -> set[str]:
    names = re.search(r'names = """(.*?)"""', STAGE.read_text(), re.S)
    assert names, "stage.sh's list of wheels not found"
    return {canonicalize_name(name) for name in names.group(1).split()}


def on_the_machine() -> tuple[str, ...]:
    """What stage.sh says the GPU machine's python has."""
    has = re.search(r"^# That python has.*\n#\s+(.+)$", STAGE.read_text(), re.M)
    assert has, "stage.sh's list of what the machine has not found"
    return tuple(has.group(1).split())


def imported() -> set[str]:
    """The distributions whose modules importing MODULES loads, in a fresh interpreter."""
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]: importlib.import_module(name)\n"
        "print(' '.join(sorted({m.partition('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *MODULES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    by_module = md.packages_distributions()
    return {
        canonicalize_name(distribution)
        for module in done.stdout.split()
        for distribution in by_module.get(module, [])
    }


def test_stage_sh_sends_every_distribution_the_gpu_run_imports_that_the_machine_lacks() -> None:
    needed = imported()
    assert {"fastapi", "redis", "python-docx"} <= needed  # the import walk saw the service
    missing = needed - with_requirements(on_the_machine()) - staged() - ELSEWHERE
    assert not missing, f"add to stage.sh's names: {' '.join(sorted(missing))}"
