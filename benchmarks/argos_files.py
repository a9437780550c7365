"""argos-translate-files (the document engine LibreTranslate uses) translating files with this
service's translations: its translation object answers every text it is asked for with
`POST /translate` of a running service, so what is measured is argos's own way with documents
(which texts it sends, and how it puts their translations back), not another model.

    /work/venv-argos/bin/python benchmarks/argos_files.py --url http://127.0.0.1:PORT \\
        --source en --target de [--beam-size 4] FILE...

Each FILE's translation is written beside it as argos names it (`name_de.docx`); the last line
printed is a JSON object: the texts argos sent and the seconds each file took. Runs in its own
virtual environment, not the project's (benchmarks/document_placement.py says how it is made):
it imports argos and the standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from types import SimpleNamespace

from argostranslate.translate import ITranslation
from argostranslatefiles import argostranslatefiles


class ServiceTranslation(ITranslation):
    """argos's translation object over `POST /translate`: one request per text argos sends
    (a whitespace-only text is its own translation, as the service answers it)."""

    def __init__(self, url: str, source: str, target: str, beam_size: int) -> None:
        self.url, self.beam_size = url.rstrip("/"), beam_size
        self.from_lang = SimpleNamespace(code=source)
        self.to_lang = SimpleNamespace(code=target)
        self.texts: list[str] = []

    def translate(self, input_text: str) -> str:
        self.texts.append(input_text)
        if not input_text.strip():
            return input_text
        body = {
            "text": input_text,
            "source": self.from_lang.code,
            "target": self.to_lang.code,
            "beam_size": self.beam_size,
        }
        request = urllib.request.Request(
            f"{self.url}/translate",
            data=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["translations"][0]["text"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="argos_files.py", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="a running service (loopback)")
    p.add_argument("--source", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    translation = ServiceTranslation(args.url, args.source, args.target, args.beam_size)
    report: dict[str, dict[str, object]] = {}
    for path in args.files:
        start, sent = time.perf_counter(), len(translation.texts)
        out = argostranslatefiles.translate_file(translation, path)
        if not out:
            raise SystemExit(f"argos-translate-files has no translator for {path}")
        report[path] = {
            "output": out,
            "texts_sent": len(translation.texts) - sent,
            "seconds": round(time.perf_counter() - start, 2),
        }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
