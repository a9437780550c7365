"""benchmarks.hostile_bench: every attack, briefly, against a server with one-second header and
body timeouts. Asserted is only what does not depend on timing: no 5xx to anyone, no victim
request lost, the trickled header's socket and every idle socket closed by the server. The
latency and memory goals are the benchmark's to print, never a test's to assert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.hostile_bench import (
    AFTER,
    BASELINE,
    BIG_TEXT,
    DURING,
    NESTING,
    bad_inputs,
    connections_to_open,
    main,
    phase_of,
)

CONNECTIONS = 50
QUICK = [
    "--duration", "2", "--baseline-s", "0.5", "--settle-s", "1", "--connections",
    str(CONNECTIONS), "--big-clients", "2", "--victim-timeout-s", "10",
]  # fmt: skip
SERVER_FLAGS = "--header-timeout-s 1 --body-timeout-s 1 --intra-op-threads 1"


@pytest.fixture(scope="module")
def report(eos_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """All four attacks once, on one server: the JSON report by attack letter."""
    out = tmp_path_factory.mktemp("hostile") / "hostile.json"
    try:
        main(["--bundle", str(eos_bundle), *QUICK, "--flags", SERVER_FLAGS, "--json", str(out)])
    except SystemExit as e:  # servers.service: the server did not start (an unknown flag?)
        pytest.fail(f"the benchmark did not run: {e}")
    return {result["attack"]: result for result in json.loads(out.read_text())}


def test_every_attack_ran_with_no_5xx_and_nothing_lost(report: dict[str, Any]) -> None:
    assert sorted(report) == ["a", "b", "c", "d"]
    for result in report.values():
        assert "error" not in result["outcome"], result["outcome"]
        assert result["server_exit"] is None
        assert (result["victim_5xx"], result["attack_5xx"], result["victim_lost"]) == (0, 0, 0)
        assert result["failures"] == []
        # The victim was measured in every phase.
        for phase in ("baseline", "during", "after"):
            assert sum(kind["requests"] for kind in result["victim"][phase].values()) > 0


def test_the_server_closes_the_endless_header(report: dict[str, Any]) -> None:
    assert report["a"]["outcome"]["closed_by_server"] is True


def test_the_server_closes_every_idle_connection(report: dict[str, Any]) -> None:
    outcome = report["b"]["outcome"]
    assert outcome["connections"] == CONNECTIONS
    for kind, k in outcome["kinds"].items():
        assert k["open_failed"] == {}, kind
        assert k["opened"] == (CONNECTIONS if kind == "idle" else CONNECTIONS // 3), kind
        assert (k["closed_by_server"], k["open_at_end"]) == (k["opened"], 0), kind


def test_every_bad_input_was_answered_without_a_5xx(report: dict[str, Any]) -> None:
    cases = report["c"]["outcome"]["cases"]
    assert set(cases) == {name for name, _, _ in bad_inputs(("en", "de"))}
    for name, case in cases.items():
        assert case["statuses"], name  # sent at least once
        assert all(s.isdigit() and not s.startswith("5") for s in case["statuses"]), (name, case)


def test_the_big_texts_were_answered_without_a_5xx(report: dict[str, Any]) -> None:
    statuses = report["d"]["outcome"]["statuses"]
    assert sum(statuses.values()) > 0
    assert not any(s.startswith("5") for s in statuses)


def test_the_hostile_bodies_are_what_the_attacker_sent() -> None:
    cases = {name: (path, body) for name, path, body in bad_inputs(("en", "de"))}
    # A lone surrogate goes as JSON's escape (valid JSON, no UTF-8 for it), or as raw bytes.
    assert b'"\\ud800 dog"' in cases["surrogate in text"][1]
    assert b'"source": "\\ud800"' in cases["surrogate as source"][1]
    assert b"\xed\xa0\x80" in cases["invalid UTF-8 in text"][1]
    path, nested = cases[f"q nested {NESTING:,} deep (LibreTranslate)"]
    assert path == "/libretranslate/translate"
    assert nested.count(b"[") == nested.count(b"]") == NESTING
    json.loads(cases["control characters only"][1])  # a well-formed body
    assert json.loads(cases['beam_size "8"'][1])["beam_size"] == "8"
    assert json.loads(cases["beam_size true"][1])["beam_size"] is True
    big = json.dumps({"text": BIG_TEXT, "source": "en", "target": "de"}).encode()
    assert 1_000_000 < len(big) < 1 << 20  # just under the default body limit


def test_a_victim_request_that_overlaps_the_attack_counts_as_during() -> None:
    assert phase_of(BASELINE, BASELINE) == BASELINE
    assert phase_of(BASELINE, DURING) == DURING
    assert phase_of(DURING, AFTER) == DURING
    assert phase_of(BASELINE, AFTER) == DURING
    assert phase_of(AFTER, AFTER) == AFTER


@pytest.mark.parametrize(("asked", "room", "expected"), [(3000, 20000, 3000), (3000, 1000, 600)])
def test_connections_fit_the_descriptor_limit(asked: int, room: int, expected: int) -> None:
    n = connections_to_open(asked, room)
    assert n == expected and n + 2 * (n // 3) <= room


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["--bundle", "b", "--attacks", "ax"])
    assert exit.value.code == 2
    assert "letters from abcd" in capsys.readouterr().err
