"""benchmarks.rolling_restart: three replicas behind the committed nginx configuration, each
restarted in turn (SIGTERM, drain, start again) while clients keep sending: nothing is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import rolling_restart
from benchmarks.servers import nginx_binary

pytestmark = pytest.mark.skipif(nginx_binary() is None, reason="needs nginx")


def test_no_request_is_lost_while_the_replicas_restart(fp32_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    argv = ["--bundle", str(fp32_bundle), "--replicas", "3", "--clients", "4", "--pause", "0.5"]
    assert rolling_restart.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["restarts"] == 3 and result["exit_codes"] == [0, 0, 0]  # drained, then exited
    assert result["sent"] > 0 and result["lost"] == 0 and result["failures"] == {}
    assert result["answered"] == result["sent"]
