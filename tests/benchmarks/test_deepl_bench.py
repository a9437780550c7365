"""benchmarks.deepl_bench on the tiny eos bundle: every kind of request is answered and timed,
and DeepL's two are set against the native one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_each_kind_is_timed_against_the_native_one(eos_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "deepl.json"
    argv = [
        sys.executable, "-m", "benchmarks.deepl_bench", "--bundle", str(eos_bundle),
        "--requests", "3", "--json", str(out),
    ]  # fmt: skip
    subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True, timeout=300)
    result = json.loads(out.read_text())
    assert list(result) == ["native", "deepl_json", "deepl_form"]
    for kind in result.values():
        assert 0 < kind["p50_ms"] <= kind["p90_ms"]
    for kind in ("deepl_json", "deepl_form"):
        ratio = result[kind]["p50_ms"] / result["native"]["p50_ms"]
        assert result[kind]["p50_over_native"] == round(ratio, 3)
