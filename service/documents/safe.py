"""Reading what a client sent without letting it harm the service: zip archives within `Limits`
(entry count, unpacked sizes, compression ratio), no names that climb out of the archive, no
encrypted entries; Office files that are password protected (an OLE compound file, not a zip)
named as such; XML parsed without entities, DTDs or network. Every refusal is a
`DocumentError`, a 4xx through the one error table (service/http/errors.py).

Writing back: `rewrite_zip` copies the archive entry by entry in its order, each with its own
compression method, time and attributes, and replaces only the entries a format changed, so
everything a format did not touch unpacks to the same bytes.
"""

from __future__ import annotations

import io
import posixpath
import zipfile
from collections.abc import Mapping

from lxml import etree

from service.documents.base import Limits
from service.errors import ErrorType, ServiceError

# The first bytes of an OLE compound file: what Office writes for an encrypted or password
# protected docx/xlsx/pptx (and for the binary .doc/.xls/.ppt of before 2007).
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
ZIP_MAGIC = b"PK\x03\x04"
# Entries smaller than this unpacked are not held to max_ratio: a short run of repeated
# characters (an empty sheet's XML) compresses far better than any limit meant for bombs.
RATIO_FLOOR_BYTES = 1 << 20
_CHUNK = 1 << 16


class DocumentError(ServiceError):
    """A file the service refuses to read, and why (default: 422 invalid_document)."""

    def __init__(self, message: str, type: ErrorType = ErrorType.INVALID_DOCUMENT) -> None:
        super().__init__(type, message)


def too_large(message: str) -> DocumentError:
    return DocumentError(message, ErrorType.PAYLOAD_TOO_LARGE)


def encrypted_office(kind: str) -> DocumentError:
    return DocumentError(
        f"the {kind} file is encrypted or password protected (or a binary Office file of before "
        "2007): save it without a password, in the Office Open XML format, and send it again"
    )


class Archive:
    """A zip archive checked against `Limits`; its entries are read back within them."""

    def __init__(self, data: bytes, limits: Limits, kind: str) -> None:
        if data.startswith(OLE_MAGIC):
            raise encrypted_office(kind)
        try:
            self._zip = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, ValueError, OSError) as e:
            raise DocumentError(f"the {kind} file is not a readable zip archive: {e}") from None
        self.kind = kind
        self.infos = self._zip.infolist()
        if len(self.infos) > limits.max_entries:
            raise too_large(
                f"the {kind} file holds {len(self.infos)} entries; the limit is "
                f"{limits.max_entries}"
            )
        self._by_name: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in self.infos:
            name = info.filename
            if _escapes(name):
                raise DocumentError(f"the {kind} file has an entry named {name!r} outside itself")
            if name in self._by_name:
                raise DocumentError(f"the {kind} file has two entries named {name!r}")
            self._by_name[name] = info
            if info.flag_bits & 0x1:
                raise DocumentError(
                    f"the {kind} file's entry {name!r} is encrypted; send it without a password"
                )
            if info.file_size > limits.max_entry_bytes:
                raise too_large(
                    f"the {kind} file's entry {name!r} unpacks to {info.file_size} bytes; the "
                    f"limit is {limits.max_entry_bytes}"
                )
            ratio = info.file_size / max(1, info.compress_size)
            if info.file_size > RATIO_FLOOR_BYTES and ratio > limits.max_ratio:
                raise too_large(
                    f"the {kind} file's entry {name!r} is compressed {ratio:.0f} to 1; the limit "
                    f"is {limits.max_ratio:.0f} (a zip bomb?)"
                )
            total += info.file_size
        if total > limits.max_total_bytes:
            raise too_large(
                f"the {kind} file unpacks to {total} bytes; the limit is {limits.max_total_bytes}"
            )
        self.data = data

    @property
    def names(self) -> list[str]:
        return [info.filename for info in self.infos]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def read(self, name: str) -> bytes:
        """The entry's bytes: never more than it declared (zipfile stops there and checks its
        CRC), which the limits have already allowed."""
        info = self._by_name.get(name)
        if info is None:
            raise DocumentError(f"the {self.kind} file has no entry {name!r}")
        try:
            with self._zip.open(info) as entry:
                chunks = []
                while chunk := entry.read(_CHUNK):
                    chunks.append(chunk)
        except (zipfile.BadZipFile, NotImplementedError, ValueError, OSError, EOFError) as e:
            raise DocumentError(f"the {self.kind} file's entry {name!r} cannot be read: {e}") from e
        return b"".join(chunks)

    def xml(self, name: str) -> etree._Element:
        return parse_xml(self.read(name), f"the {self.kind} file's entry {name!r}")

    def rewrite(self, replaced: Mapping[str, bytes]) -> bytes:
        return rewrite_zip(self._zip, replaced)


def peek(data: bytes, name: str, max_bytes: int = 1 << 20) -> bytes | None:
    """One small entry of a zip archive, for a format's `sniff` (an ODF or EPUB `mimetype`,
    OOXML's `[Content_Types].xml`), whatever the rest of the archive holds; None when the
    data is no zip, lacks the entry, or it is larger than `max_bytes` unpacked. The archive's
    limits are `Archive`'s, when the file is read."""
    if not data.startswith(ZIP_MAGIC):
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            info = archive.getinfo(name)
            if info.file_size > max_bytes or info.flag_bits & 0x1:
                return None
            return archive.read(info)
    except (KeyError, zipfile.BadZipFile, NotImplementedError, ValueError, OSError, EOFError):
        return None


def _escapes(name: str) -> bool:
    """Whether an entry's name is absolute or climbs out of the archive (zip slip)."""
    if "\\" in name or "\x00" in name:
        return True
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return True
    return ".." in posixpath.normpath(name).split("/")


def rewrite_zip(source: zipfile.ZipFile, replaced: Mapping[str, bytes]) -> bytes:
    """The archive again, entry by entry in its order, with the same compression method, time,
    comment and attributes; `replaced[name]` in place of those entries' bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        target.comment = source.comment
        for info in source.infolist():
            data = replaced.get(info.filename)
            if data is None:
                data = source.read(info)
            target.writestr(_copy(info), data)
    return out.getvalue()


def _copy(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    copy = zipfile.ZipInfo(info.filename, info.date_time)
    copy.compress_type = info.compress_type
    copy.comment = info.comment
    copy.extra = info.extra
    copy.create_system = info.create_system
    copy.external_attr = info.external_attr
    copy.internal_attr = info.internal_attr
    return copy


def _parser() -> etree.XMLParser:
    # No entity is replaced by its text (billion laughs), no DTD or external entity is loaded
    # (XXE), nothing is fetched, and libxml2's own limits on depth and text sizes stay on.
    return etree.XMLParser(
        resolve_entities=False,
        load_dtd=False,
        no_network=True,
        dtd_validation=False,
        huge_tree=False,
        remove_blank_text=False,
    )


def parse_xml(data: bytes, what: str) -> etree._Element:
    """`data` as an XML tree, or a DocumentError naming `what`. A document that declares
    entities is refused whole: no format this service reads needs one, and an entity's
    expansion is how XML bombs and external entities work."""
    try:
        root = etree.fromstring(data, parser=_parser())
    except etree.XMLSyntaxError as e:
        raise DocumentError(f"{what} is not well-formed XML: {e}") from None
    dtd = root.getroottree().docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        raise DocumentError(f"{what} declares XML entities, which are not accepted")
    return root


def serialize_xml(root: etree._Element) -> bytes:
    """A part written back as Office and ODF write theirs: UTF-8 with an XML declaration,
    `standalone` only where the part said it (lxml reads an undeclared one as False)."""
    standalone = root.getroottree().docinfo.standalone or None
    data: bytes = etree.tostring(
        root, xml_declaration=True, encoding="UTF-8", standalone=standalone
    )
    return data
