"""The served models: the bundles `--bundle` names and the transformers checkpoints `--model`
names (imported and exported into a cache on first start), loaded as engines; without either,
the shipped model's bundle, exported from its checkpoint on first start and whenever it is
stale."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.bundle.manifest import (
    CARD_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    BundleError,
    external_data_file,
    replace_directory,
    sha256_file,
)
from service.inference.cpus import cpu_quota, default_intra_op_threads
from service.settings import Settings

if TYPE_CHECKING:
    from service.inference.engine import Engine

log = logging.getLogger(__name__)

# model/transformer.py's WEIGHTS_FILE, which the manifest's provenance hashes (the service does
# not import the model package: it needs torch).
CHECKPOINT_WEIGHTS = "model.safetensors"
# Why a bundle an older release exported is made again, where torch is at hand: its weights
# would be copied into the process instead of mapped from data files (more memory). Where torch
# is not, it is served as it is.
INLINE_WEIGHTS = "its graphs hold their weights themselves (exported before they had data files)"


def load_models(settings: Settings) -> list[Engine]:
    # Imported here: the engine pulls in ONNX Runtime, which `python -m service --help`, the
    # shipped bundle's export and apps built on fakes never need.
    from service.inference.engine import Engine

    directories = bundle_directories(settings)
    threads, spinning = step_threads(settings, len(directories), settings.workers)
    return [
        Engine.load(
            directory,
            device=settings.device,
            device_id=settings.device_id,
            intra_op_threads=threads,
            intra_op_spinning=spinning,
            cuda_graphs=settings.cuda_graphs,
            max_cuda_graphs=settings.max_cuda_graphs,
            max_batch_size=settings.max_batch_size,
        )
        for directory in directories
    ]


def bundle_directories(settings: Settings) -> list[Path]:
    """The bundles the settings serve: every `bundle`, then every `--model` directory's
    (`model_bundle`), or, with neither, the shipped checkpoints' (`shipped_bundles`); made on
    first start. A `bundle` that is not a directory is a BundleError."""
    for bundle in settings.bundle:
        if not bundle.is_dir():
            raise BundleError(f"--bundle {bundle}: no such directory")
    return [
        *settings.bundle,
        *(model_bundle(directory, settings.model_cache) for directory in settings.model),
    ] or shipped_bundles(settings)


def step_threads(settings: Settings, models: int, processes: int) -> tuple[int, bool]:
    """The decoder steps' intra-op threads in a process of `models` models, one of `processes`
    alike (a server's workers), and whether they spin (`step_threads_spin`): as the settings
    say, else the default for that (cpus.default_intra_op_threads, the cores shared out among
    the processes)."""
    spinning = step_threads_spin(settings, models * processes, cpu_quota())
    threads = settings.intra_op_threads
    if threads is None:
        threads = default_intra_op_threads(spinning=spinning, processes=processes)
        log.info(
            "intra-op threads: %d, %s (MT_INTRA_OP_THREADS and MT_INTRA_OP_SPINNING set others)",
            threads,
            "spinning" if spinning else "sleeping between kernels",
        )
    return threads, spinning


def step_threads_spin(settings: Settings, models: int, quota: float | None) -> bool:
    """Whether the decoder steps' intra-op threads spin: as the settings say where they name
    it, else only where one model decodes on the machine's share (`models`: the models of
    every worker process) under no cgroup CPU quota (`quota`, cpus.py). A
    spinning thread is ready the moment a kernel has work for it (on 2 cores the engine
    decoded 1.04-1.43x the tokens/s of its one-thread steps); but each engine has its own
    threads, and two models decoding at once had their spinning threads take the cores from
    each other's steps (half the tokens/s of sleeping ones), and a quota would be spent on
    spinning and then throttle the whole process (benchmarks/RESULTS.md, issue 35, fifth
    part)."""
    if "intra_op_spinning" in settings.model_fields_set:
        return settings.intra_op_spinning
    return models == 1 and quota is None


def shipped_bundles(settings: Settings) -> list[Path]:
    """Every shipped checkpoint's bundle (`shipped_bundle`), under `shipped_bundles`."""
    return [
        shipped_bundle(checkpoint, settings.shipped_bundles / checkpoint.name)
        for checkpoint in settings.checkpoint
    ]


def shipped_bundle(checkpoint: Path, bundle: Path) -> Path:
    """The shipped model's bundle, exported from its checkpoint on first start, and again when
    the checkpoint's weights no longer match the ones the bundle was exported from, or the
    bundle is of another format version or layout (left by an older release: `stale_reason`).

    The export runs `python -m export` in a subprocess: it needs torch, which the service never
    imports, so a serving image without it gets a clear error instead of an ImportError.
    """
    if (bundle / MANIFEST_FILE).is_file():
        stale = stale_reason(checkpoint, bundle)
        if stale is None:
            return bundle
        if stale == INLINE_WEIGHTS and not _can_export("export"):
            return _served_inline(bundle)
        log.warning("%s is stale (%s): exporting %s again", bundle, stale, checkpoint)
        why = f"{bundle} is stale ({stale})"
    elif not checkpoint.is_dir():
        raise BundleError(f"no bundle given (--bundle DIR) and no checkpoint at {checkpoint}")
    else:
        log.info("exporting %s to %s (first start)", checkpoint, bundle)
        why = f"{bundle} does not exist"
    if not _can_export("export"):
        raise BundleError(
            f"{why} and building it from {checkpoint} needs the export "
            "package with torch (pip install -e '.[train]'); or pass --bundle DIR"
        )
    _export(checkpoint, bundle)
    return bundle


def model_bundle(directory: Path, cache: Path) -> Path:
    """The bundle of a transformers checkpoint directory (`--model`): `cache`/NAME-HASH, HASH
    from the directory's files, made on first start by `python -m model.import` (the family
    from config.json's model_type) and `python -m export`, each in a subprocess (they need
    torch), then kept: a changed checkpoint gets a new bundle, the same one is imported again
    only when an older release left its bundle (`_older_format`, `INLINE_WEIGHTS`: the latter
    is served as it is where torch is missing). A directory that is no supported checkpoint
    fails with the importer's message."""
    if not directory.is_dir():
        raise BundleError(f"--model {directory}: no such directory")
    # Hashing a large checkpoint's contents takes a while (NLLB-3.3B: 17 GB): its files' names,
    # sizes and modification times find the content hash of a start before.
    index_file = cache / "index.json"
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = {}
    index = index if isinstance(index, dict) else {}
    signature = _stat_signature(directory)
    content = index.get(signature)
    if not isinstance(content, str):
        content = _content_hash(directory)
    bundle = cache / f"{directory.resolve().name}-{content[:16]}"
    if (bundle / MANIFEST_FILE).is_file():
        raw = _manifest(bundle)
        older = _older_format(raw) or _inline_weights(raw)
        if older is None or (older == INLINE_WEIGHTS and not _can_export("model")):
            _remember(index_file, index, signature, content)
            return bundle if older is None else _served_inline(bundle)
        # Left by an older release: made again (the export replaces it in one rename).
        log.warning("%s is stale (%s): importing %s again", bundle, older, directory)
    if not _can_export("model"):
        raise BundleError(
            f"--model {directory}: importing a checkpoint needs the model and export packages "
            "with torch (pip install -e '.[train]'); or import and export it elsewhere and pass "
            "--bundle DIR"
        )
    log.info("importing %s into %s (first start)", directory, bundle)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".import-", dir=cache) as tmp:
        checkpoint = Path(tmp) / directory.resolve().name
        _run([sys.executable, "-m", "model.import", "--from", str(directory), "--out",
              str(checkpoint)])  # fmt: skip
        _export(checkpoint, bundle)
    _remember(index_file, index, signature, content)
    return bundle


def _remember(index_file: Path, index: dict[str, Any], signature: str, content: str) -> None:
    if index.get(signature) != content:
        index_file.write_text(json.dumps({**index, signature: content}, indent=1), "utf-8")


def _stat_signature(directory: Path) -> str:
    """sha256 over a directory's files' names, sizes and modification times."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.resolve().iterdir() if p.is_file()):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def _content_hash(directory: Path) -> str:
    """sha256 over a checkpoint directory's files (names and contents), subdirectories out."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + sha256_file(path).encode() + b"\0")
    return digest.hexdigest()


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BundleError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")


def stale_reason(checkpoint: Path, bundle: Path) -> str | None:
    """Why the bundle does not come from the checkpoint's weights; None when it does, or when
    there is no checkpoint to compare with (an image that ships only the bundle)."""
    weights = checkpoint / CHECKPOINT_WEIGHTS
    if not weights.is_file():
        return None
    raw = _manifest(bundle)
    provenance = raw.get("provenance")
    recorded = provenance.get("checkpoint_sha256") if isinstance(provenance, dict) else None
    if recorded is None:
        return f"its {MANIFEST_FILE} records no checkpoint sha256"
    older = _older_format(raw)
    if older is not None:
        return older
    if "alignment" not in raw:
        return "exported before the decoder step had an alignment output (markup needs it)"
    actual = sha256_file(weights)
    if recorded != actual:
        return f"exported from weights with sha256 {recorded}; {weights} has {actual}"
    card = checkpoint / CARD_FILE
    if card.is_file() and _card_sha256(raw) != sha256_file(card):
        # The card is what /status shows: an edited (or, from before bundles carried one,
        # missing) card is worth the few seconds an export of the shipped model takes.
        return f"its model card is not {card}"
    return _inline_weights(raw)


def _manifest(bundle: Path) -> dict[str, Any]:
    """A bundle's manifest as read ({} when unreadable or not an object)."""
    try:
        raw = json.loads((bundle / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _older_format(raw: dict[str, Any]) -> str | None:
    """Why a bundle's raw manifest is of a format this service cannot read; None if it can."""
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        return f"bundle format version {version!r}, this service reads {FORMAT_VERSION}"
    return None


def _inline_weights(raw: dict[str, Any]) -> str | None:
    """INLINE_WEIGHTS when a graph of the bundle holds its weights itself (no data file listed:
    an export before 2026-11-27), whose weights are then copied into the process instead of
    mapped (more memory); None when every graph's are in a data file."""
    files = raw.get("files")
    entries = [raw.get(graph) for graph in ("encoder", "decoder_step")]
    graphs = [entry.get("file") if isinstance(entry, dict) else None for entry in entries]
    if isinstance(files, dict) and all(
        isinstance(graph, str) and external_data_file(graph) in files for graph in graphs
    ):
        return None
    return INLINE_WEIGHTS


def _can_export(package: str) -> bool:
    """Whether this install can import (`model`) or export (`export`) a checkpoint: it needs
    that package and torch."""
    return all(importlib.util.find_spec(name) is not None for name in (package, "torch"))


def _served_inline(bundle: Path) -> Path:
    """A bundle with INLINE_WEIGHTS that this install cannot make again: served as it is."""
    log.warning(
        "%s: %s; serving it as it is (its weights copied into memory): making it again "
        "needs the export package with torch (pip install -e '.[train]')",
        bundle,
        INLINE_WEIGHTS,
    )
    return bundle


def _card_sha256(manifest: dict[str, Any]) -> str | None:
    """The sha256 a raw manifest lists for its model card; None without one."""
    files, name = manifest.get("files"), manifest.get("card")
    entry = files.get(name) if isinstance(files, dict) and isinstance(name, str) else None
    sha256 = entry.get("sha256") if isinstance(entry, dict) else None
    return sha256 if isinstance(sha256, str) else None


def _export(checkpoint: Path, bundle: Path) -> None:
    """Export into a fresh directory beside `bundle`, then put it in place: a failed or
    interrupted export never leaves a half-written bundle where a complete one is expected."""
    bundle.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{bundle.name}.export-", dir=bundle.parent))
    command = [
        sys.executable,
        "-m",
        "export",
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(fresh),
    ]
    try:
        _run(command)
        replace_directory(fresh, bundle)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)  # gone already unless the export failed
    log.info("exported %s to %s", checkpoint, bundle)
