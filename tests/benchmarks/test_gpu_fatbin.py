"""benchmarks.gpu.fatbin on a fat binary built here: only the cubins of other architectures lose
their payload; PTX, the kept architecture, every header and every offset stay as they were."""

from __future__ import annotations

import struct

from benchmarks.gpu.fatbin import ARCH_OFFSET, ENTRY, HEADER, MAGIC, strip

PTX, CUBIN = 1, 2


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = bytearray(64)
    ENTRY.pack_into(header, 0, kind, 0x0101, len(header), len(payload))
    struct.pack_into("<I", header, ARCH_OFFSET, arch)
    return bytes(header) + payload


def _fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return HEADER.pack(struct.unpack("<I", MAGIC)[0], 1, HEADER.size, len(body)) + body


def test_other_architectures_cubins_are_zeroed_in_place() -> None:
    ptx, sm80, sm90 = b"P" * 24, b"\x80" * 40, b"\x90" * 32
    entries = [_entry(PTX, 80, ptx), _entry(CUBIN, 80, sm80), _entry(CUBIN, 90, sm90)]
    # Code around it, the magic's bytes by chance (version 7: no fatbin), then a second fatbin.
    decoy = MAGIC + struct.pack("<HHQ", 7, 16, 5)
    blob = b"\x7fELF" + b"x" * 13 + decoy + _fatbin(*entries) + b"y" * 9 + _fatbin(entries[1])
    data = bytearray(blob)

    done = strip(data, frozenset({90}))

    assert len(data) == len(blob) and done.fatbins == 2
    assert done.zeroed == 2 * len(sm80) and done.kept == len(ptx) + len(sm90)
    assert data.count(sm80) == 0 and data.count(b"\x80") == 0
    assert data.count(ptx) == 1 and data.count(sm90) == 1 and data.count(decoy) == 1
    # Only the zeroed payloads changed: every other byte (headers, code, decoy) is the same.
    changed = [i for i, (a, b) in enumerate(zip(blob, data, strict=True)) if a != b]
    assert len(changed) == 2 * len(sm80)
    assert all(blob[i] == 0x80 for i in changed)


def test_keeping_every_architecture_changes_nothing() -> None:
    blob = _fatbin(_entry(CUBIN, 75, b"a" * 8), _entry(CUBIN, 90, b"b" * 8))
    data = bytearray(blob)
    done = strip(data, frozenset({75, 90}))
    assert bytes(data) == blob and done.zeroed == 0 and done.kept == 16


def test_bytes_that_only_look_like_a_fatbin_are_left_alone() -> None:
    """An entry that claims more payload than its fat binary holds, an unknown kind, a header
    too short for the architecture, the magic at the very end: none is parsed, nothing written."""
    cubin = _entry(CUBIN, 80, b"\x80" * 16)
    overlong = bytearray(cubin)
    ENTRY.pack_into(overlong, 0, CUBIN, 0x0101, 64, 1000)  # 1000 payload bytes, 16 there
    unknown = bytearray(cubin)
    ENTRY.pack_into(unknown, 0, 9, 0x0101, 64, 16)
    short = bytearray(cubin)
    ENTRY.pack_into(short, 0, CUBIN, 0x0101, 16, 16)  # ends before the architecture
    for entry in (overlong, unknown, short):
        blob = _fatbin(bytes(entry)) + b"z" * 8 + MAGIC + b"\x01\x00"
        data = bytearray(blob)
        done = strip(data, frozenset({90}))
        assert bytes(data) == blob and done.fatbins == 0 and done.zeroed == 0
