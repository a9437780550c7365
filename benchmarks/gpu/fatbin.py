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
PTX, CUBIN = 1, 2
KINDS = (PTX, CUBIN)


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
    """Zero, in `data`, the payloads of cubins whose architecture is not in `keep`. A fat
    binary is taken only when its entries tile it exactly (each a known kind, its header long
    enough to hold the architecture, its payload inside the fat binary); anything else is the
    magic's bytes by chance and left as it is."""
    done = Stripped()
    at = data.find(MAGIC)
    while at >= 0:
        entries = _entries(data, at)
        if entries is None:
            at = data.find(MAGIC, at + len(MAGIC))
            continue
        done.fatbins += 1
        for kind, arch, payload, padded in entries:
            if kind == CUBIN and arch not in keep:
                data[payload : payload + padded] = bytes(padded)
                done.zeroed += padded
            else:
                done.kept += padded
        _, _, header_size, size = HEADER.unpack_from(data, at)
        at = data.find(MAGIC, at + header_size + size)
    return done


def _entries(data: bytearray | mmap.mmap, at: int) -> list[tuple[int, int, int, int]] | None:
    """(kind, architecture, payload offset, payload size) of each entry of the fat binary at
    `at`, or None where the bytes there are no fat binary."""
    if at + HEADER.size > len(data):
        return None
    _, version, header_size, size = HEADER.unpack_from(data, at)
    end = at + header_size + size
    if version != 1 or header_size != HEADER.size or end > len(data):
        return None
    entries = []
    entry = at + header_size
    while entry < end:
        if entry + ENTRY.size > end:
            return None
        kind, _, entry_header, padded = ENTRY.unpack_from(data, entry)
        payload = entry + entry_header
        if kind not in KINDS or entry_header < ARCH_OFFSET + 4 or payload + padded > end:
            return None
        (arch,) = struct.unpack_from("<I", data, entry + ARCH_OFFSET)
        entries.append((kind, arch, payload, padded))
        entry = payload + padded
    return entries


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.fatbin", description=__doc__)
    p.add_argument("library", type=Path)
    p.add_argument("--keep", type=int, nargs="+", default=[90], help="architectures (90: sm_90)")
    args = p.parse_args(argv)
    with args.library.open("r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        print(f"{args.library}: {strip(data, frozenset(args.keep))}")


if __name__ == "__main__":
    main()
