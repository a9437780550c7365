import io
import sys

import pytest

from model import translate


def _run(monkeypatch, capsys, checkpoint, stdin: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = translate.main(["--checkpoint", str(checkpoint), "--beam-size", "2"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_one_output_line_per_input_line(monkeypatch, capsys, tiny_checkpoint) -> None:
    code, out, _ = _run(monkeypatch, capsys, tiny_checkpoint, "A dog.\n\nA cat\u2028sleeps.\n")
    assert code == 0
    lines = out.split("\n")
    assert len(lines) == 4 and lines[-1] == ""  # three lines, the empty one kept empty
    assert lines[1] == ""


def test_too_long_line_is_an_error_naming_it(monkeypatch, capsys, tiny_checkpoint) -> None:
    code, out, err = _run(monkeypatch, capsys, tiny_checkpoint, "A dog.\n" + "word " * 200 + "\n")
    assert code == 2 and out == ""
    assert "line 2" in err and "limit is 48" in err


@pytest.mark.parametrize("stdin", ["", "\n"])
def test_empty_input(monkeypatch, capsys, tiny_checkpoint, stdin: str) -> None:
    code, out, _ = _run(monkeypatch, capsys, tiny_checkpoint, stdin)
    assert code == 0 and out == stdin
