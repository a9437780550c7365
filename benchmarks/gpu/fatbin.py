"""Keep one GPU architecture's kernels in a CUDA shared library, so that it travels smaller.

    python -m benchmarks.gpu.fatbin LIBRARY [--keep 90]

A CUDA library carries its kernels as fat binaries: a 16-byte header (magic 0xBA55ED50, version
1, header size 16, payload size) followed by entries, each a header (kind: 1 PTX, 2 cubin; its
size; the payload's padded size; the architecture at byte 28) and its payload. The driver loads,
for the device it runs on, the cubin of that architecture and reads no other entry's payload.
This zeroes, in place, the payload of every cubin of another architecture (PTX is kept), which
leaves every offset and header as it was and lets xz compress the zeros away:
onnxruntime-gpu 1.31.1's CUDA provider keeps 73 of its 208 MiB of cubins for sm_90 (an H100 or
H200), and its wheel goes from 244 MiB to 65 MiB as tar.xz (benchmarks/gpu/stage.sh). A library
stripped this way runs only on the architectures it kept: it is for sending to one known machine
(ran on an H100: tests/service/test_cuda.py passed), never for an image or a release.
"""

from __future__ import annotations

import argparse
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = struct.pack("<I", 0xBA55ED50)
HEADER = struct.Struct("<IHHQ")  # magic, version, header size, payload size
ENTRY = struct.Struct("<HHIQ")  # kind, version, header size, padded payload size
ARCH_OFFSET = 28  # in an entry's header: the architecture, 90 for sm_90
CUBIN = 2


@dataclass
class Stripped:
    fatbins: int = 0
    kept: int = 0  # payload bytes kept (PTX, and the kept architectures' cubins)
    zeroed: int = 0  # payload bytes zeroed

    def __str__(self) -> str:
        mib = 1 << 20
        return (
            f"{self.fatbins} fat binaries: {self.kept / mib:.1f} MiB kept, "
            f"{self.zeroed / mib:.1f} MiB of other architectures' cubins zeroed"
        )


def strip(data: bytearray | mmap.mmap, keep: frozenset[int]) -> Stripped:
    """Zero, in `data`, the payloads of cubins whose architecture is not in `keep`."""
    done = Stripped()
    at = data.find(MAGIC)
    while at >= 0:
        _, version, header_size, size = HEADER.unpack_from(data, at)
        end = at + header_size + size
        if version != 1 or header_size != HEADER.size or end > len(data):
            at = data.find(MAGIC, at + len(MAGIC))  # the magic's bytes by chance: not a fatbin
            continue
        done.fatbins += 1
        entry = at + header_size
        while entry + ENTRY.size <= end:
            kind, _, entry_header, padded = ENTRY.unpack_from(data, entry)
            if entry_header == 0:
                break
            payload = entry + entry_header
            (arch,) = struct.unpack_from("<I", data, entry + ARCH_OFFSET)
            if kind == CUBIN and arch not in keep:
                data[payload : payload + padded] = bytes(padded)
                done.zeroed += padded
            else:
                done.kept += padded
            entry = payload + padded
        at = data.find(MAGIC, end)
    return done


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.fatbin", description=__doc__)
    p.add_argument("library", type=Path)
    p.add_argument("--keep", type=int, nargs="+", default=[90], help="architectures (90: sm_90)")
    args = p.parse_args(argv)
    with args.library.open("r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        print(f"{args.library}: {strip(data, frozenset(args.keep))}")


if __name__ == "__main__":
    main()
