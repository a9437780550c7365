"""Whether a subtitle library can write a file back as it was (why
service/documents/formats/subtitles.py writes cue text into the file's own bytes instead):
each file below parsed and composed again, unchanged, by srt, pysubs2 and webvtt-py, and by this
project's reader with the identity translation.

    python -m benchmarks.subtitle_libraries

The files hold what real subtitles hold: CRLF line ends, SubRip positions after the timing,
cue numbers that do not count 1, 2, 3, a short timestamp, a byte order mark, <font>, WebVTT
NOTE and STYLE blocks, cue identifiers and settings, voices and classes, a character reference.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Callable

SRT = [
    "1\n00:00:01,000 --> 00:00:02,500\nHello <i>there</i>,\nmy friend.\n\n"
    "2\n00:00:03,000 --> 00:00:04,000\nHow are you?\n\n",
    "1\r\n00:00:01,000 --> 00:00:02,500\r\nCRLF line\r\n\r\n"
    "2\r\n00:00:03,000 --> 00:00:04,000\r\nsecond\r\n\r\n",
    "5\n00:00:01,000 --> 00:00:02,500 X1:100 X2:200 Y1:10 Y2:20\n"
    '<font color="#ff0000">Red</font> text\n\n9\n00:00:03,000 --> 00:00:04,000\nnumbers\n',
    "\ufeff1\n0:00:01,5 --> 0:00:02,500\nshort timestamps\n\n",
]
VTT = [
    "WEBVTT\n\nNOTE a comment\n\nSTYLE\n::cue { color: red }\n\nintro\n"
    "00:01.000 --> 00:02.500 align:start position:10%\n<v Bob>Hello <c.loud>there</c></v>\n\n"
    "00:03.000 --> 00:04.000\nsecond &amp; third\n",
    "WEBVTT - title\nKind: captions\n\n00:00:01.000 --> 00:00:02.000 line:0\n<i>Hi</i>\n\n",
]


def _srt(text: str) -> str:
    import srt

    return str(srt.compose(list(srt.parse(text)), reindex=False))


def _pysubs2(kind: str) -> Callable[[str], str]:
    def compose(text: str) -> str:
        import pysubs2

        return str(pysubs2.SSAFile.from_string(text).to_string(kind))

    return compose


def _webvtt(text: str) -> str:
    import webvtt

    return str(webvtt.from_buffer(io.StringIO(text)).content)


def _ours(vtt: bool) -> Callable[[str], str]:
    from service.documents.base import Limits
    from service.documents.formats.subtitles import SrtFormat, VttFormat

    format = VttFormat() if vtt else SrtFormat()

    def compose(text: str) -> str:
        extracted = format.read(text.encode("utf-8"), Limits())
        return extracted.write([unit.text for unit in extracted.units]).decode("utf-8")

    return compose


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print("| library | SubRip files as they were | WebVTT files as they were |")
    print("|---|---|---|")
    rows: list[tuple[str, Callable[[str], str] | None, Callable[[str], str] | None]] = [
        ("srt", _srt, None),
        ("pysubs2", _pysubs2("srt"), _pysubs2("vtt")),
        ("webvtt-py", None, _webvtt),
        ("this project", _ours(False), _ours(True)),
    ]
    for name, srt_compose, vtt_compose in rows:
        cells = []
        for compose, files in ((srt_compose, SRT), (vtt_compose, VTT)):
            if compose is None:
                cells.append("-")
                continue
            same = 0
            for text in files:
                # A library that cannot read the file does not give it back as it was.
                with contextlib.suppress(Exception):
                    same += compose(text) == text
            cells.append(f"{same} of {len(files)}")
        print(f"| {name} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
