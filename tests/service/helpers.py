"""Service test helpers: a fake engine (the HTTP and batching rooms without ONNX Runtime), app
builders, an in-process client that runs the lifespan, and a uvicorn server on 127.0.0.1.

Imported by module path (`tests.service.helpers`): a bare `from conftest import` is ambiguous
once several test folders have a conftest."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fastapi import FastAPI

from benchmarks.servers import free_port, wait_until_ready
from export.onnx_export import save_graph
from service.bundle.decoding import Constraints, Deadline, DecodingOptions, Hypothesis
from service.bundle.manifest import (
    ALIGNMENT,
    ALIGNMENT_WANTED,
    DECODER_STEP_FILE,
    MANIFEST_FILE,
    external_data_file,
    file_entry,
)
from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]
EOS = 2


def without_alignment(bundle: Path, out: Path) -> Path:
    """A copy of the bundle as exported before the decoder step had an alignment output: no
    such output (nor its `alignment_wanted` input and the If that reads it; ONNX Runtime drops
    the nodes that fed only that output) and no alignment in the manifest."""
    shutil.copytree(bundle, out)
    graph = onnx.load(str(out / DECODER_STEP_FILE))
    for kind in (graph.graph.output, graph.graph.input):
        for value in [v for v in kind if v.name in (ALIGNMENT, ALIGNMENT_WANTED)]:
            kind.remove(value)
    for node in [n for n in graph.graph.node if ALIGNMENT in n.output]:
        graph.graph.node.remove(node)
    written = save_graph(graph, out / DECODER_STEP_FILE)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    del manifest["alignment"]
    spec = manifest["decoder_step"]
    for kind in ("inputs", "outputs"):
        spec[kind] = [v for v in spec[kind] if v["name"] not in (ALIGNMENT, ALIGNMENT_WANTED)]
    for name in written:
        manifest["files"][name] = file_entry(out / name).model_dump()
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    return out


def with_inline_weights(bundle: Path, out: Path) -> Path:
    """A copy of the bundle whose graphs hold their weights themselves, one file each (as the
    export wrote graphs under 256 MiB before 2026-11-27), its manifest listing those files."""
    out.mkdir(parents=True)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    graphs = (manifest["encoder"]["file"], manifest["decoder_step"]["file"])
    for name in list(manifest["files"]):
        if name in map(external_data_file, graphs):
            del manifest["files"][name]
        elif name in graphs:
            onnx.save(onnx.load(str(bundle / name)), str(out / name))
            manifest["files"][name] = file_entry(out / name).model_dump()
        else:
            shutil.copy(bundle / name, out / name)
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    return out


class FakeModel:
    """A 'translation' that upper-cases: ids are code points (+ </s>); hypothesis k appends k
    tildes and scores -k; every character aligns to itself (a tilde to the source's last).
    Records each generate call; `gate` (when set up) holds the engine thread until released;
    a source containing "FAIL" makes the whole call raise."""

    def __init__(
        self,
        source: str = "en",
        target: str = "de",
        *,
        more_targets: tuple[str, ...] = (),
        max_input_tokens: int = 200,
    ) -> None:
        self.name = f"fake-{source}-{target}"
        self.fingerprint = self.name
        self.source_language = source
        self.source_languages = (source,)
        self.target_languages = (target, *more_targets)
        self.encoded_for: list[str | None] = []  # the target of each encode call
        self.max_input_tokens = max_input_tokens
        self.provider = "FakeProvider"
        self.device = "cpu"
        self.dtype = "fp32"
        self.card: str | None = f"# {self.name}\n\nUpper-cases its input (tests).\n"
        self.license: str | None = "Apache-2.0"
        self.cuda_graphs_captured = 0
        self.aligns = True
        self.calls: list[tuple[list[list[int]], DecodingOptions]] = []
        self.constraints: list[list[Constraints]] = []  # each generate call's
        self.gate: threading.Event | None = None
        self.entered = threading.Event()  # set when a generate call starts

    def encode(
        self, texts: Sequence[str], target: str | None = None, source: str | None = None
    ) -> list[list[int]]:
        assert target in (None, *self.target_languages)
        assert source in (None, *self.source_languages)
        self.encoded_for.append(target)
        return [[ord(c) for c in text] + [EOS] if text.strip() else [] for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids).upper()

    def source_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        return [[(i, i + 1) for i in range(len(text))] if text.strip() else [] for text in texts]

    def target_spans(self, ids: Sequence[int]) -> list[tuple[int, int]]:
        return [(i, i + 1) for i in range(len(ids))]

    word_pieces: frozenset[int] = frozenset()  # a character is a word

    def spellings(self, ids: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        return ()  # one id a character: one spelling

    def target_ids(self, terms: Sequence[str]) -> list[list[int] | None]:
        """Code points; a term with a "☃" is one the fake cannot spell."""
        return [None if "☃" in t else [ord(c) for c in t] for t in terms]

    def generate(
        self,
        sources: Sequence[Sequence[int]],
        options: DecodingOptions,
        deadline: Deadline | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
        constraints: Sequence[Constraints] | None = None,
    ) -> list[list[Hypothesis]]:
        """Upper-cased sources (n-best: with k tildes), after the gate opens; the deadlines
        are read then, as the engine reads them between steps: a source past its own gets one
        "deadline" hypothesis."""
        self.calls.append(([list(s) for s in sources], options))
        self.constraints.append(list(constraints or []))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if any("FAIL" in self.decode(s) for s in sources):
            raise RuntimeError("engine exploded (test)")
        now = time.monotonic()
        return [
            [Hypothesis([], 0.0, "deadline")]
            if deadline is not None and deadline(i) <= now
            else [
                Hypothesis([*s[:-1], *[ord("~")] * k], -float(k), "eos", _diagonal(len(s), k))
                for k in range(options.num_hypotheses)
            ]
            for i, s in enumerate(sources)
        ]

    def decoder_prefix(self, target: str | None = None) -> list[int]:
        return []

    def stepper(self, slots: int) -> None:
        """A fake runs whole batches (`generate`)."""
        return None

    @property
    def batch_sizes(self) -> list[int]:
        return [len(sources) for sources, _ in self.calls]


class GarblingModel(FakeModel):
    """FakeModel that garbles every character it reads, not only letters: digits and the
    characters of placeholders (% $ { } < > / ` @ :) come back as capital letters, one for one
    (the alignment stays each character's own). A placeholder that reached the model would not
    come back as sent, whatever it is made of ("{0}" and "<1/>" too)."""

    GARBLED = str.maketrans("0123456789%${}<>/`@:", "ABCDEFGHIJPSXYVWKQMN")

    def decode(self, ids: Sequence[int]) -> str:
        return super().decode(ids).translate(self.GARBLED)


def _diagonal(source_length: int, extra: int) -> np.ndarray:
    """The fake's alignment: target token i on source token i, the k tildes on the last."""
    rows = [min(i, source_length - 2) for i in range(source_length - 1 + extra)]
    weights = np.zeros((len(rows), source_length), np.float32)
    weights[np.arange(len(rows)), rows] = 1.0
    return weights


def model_translate(
    engine: Any, texts: Sequence[str], options: DecodingOptions, target: str | None = None
) -> list[list[tuple[str, Hypothesis]]]:
    """encode -> generate -> decode, each text as one source (no sentence splitting): what the
    model alone gives, the expectation the doors (HTTP, the CLI) are checked against."""
    nbest = engine.generate(engine.encode(texts, target), options)
    return [[(engine.decode(h.ids), h) for h in hyps] for hyps in nbest]


def fast_settings(**overrides: Any) -> Settings:
    """Settings for tests: greedy by default, a short batching window, no env influence."""
    values: dict[str, Any] = {
        "default_beam_size": 1,
        "max_wait_ms": 2.0,
        "drain_timeout_s": 5.0,
        "retry_after_s": 2,
    }
    values.update(overrides)
    return Settings(**values)


@contextlib.asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the app in this event loop, with the app's lifespan around it."""
    async with app.router.lifespan_context(app):
        # Server errors come back as responses (500), as a real server sends them.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@contextlib.contextmanager
def uvicorn_thread(app: Any, config: Any = None) -> Iterator[str]:
    """`app` (any ASGI app) served by uvicorn in a thread of this process on 127.0.0.1, with
    `config`'s settings (a uvicorn.Config on 127.0.0.1, its app replaced by `app`) or uvicorn's
    defaults: its URL."""
    import uvicorn

    if config is None:
        config = uvicorn.Config(app, port=free_port(), log_level="warning")
    config.app = app
    port = config.port
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    started = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - started > 60:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        if thread.is_alive():  # connections still open: closed at once
            server.force_exit = True
            thread.join(10)
        assert not thread.is_alive(), "uvicorn did not stop"


class ServerProcess:
    """`python -m service` in a subprocess on 127.0.0.1; always stopped by its context."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
        full_env.update(env or {})
        command = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(self.port)]
        # A file, not a pipe: a pipe nobody reads fills up with the access log (64 KiB, a few
        # hundred requests) and then blocks the server. Read and closed by stop().
        self._log = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
        self._output: str | None = None
        self.process = subprocess.Popen(
            [*command, *args], cwd=REPO, env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def wait_ready(self, timeout: float = 90.0) -> None:
        try:
            wait_until_ready(self.url, self.process, timeout)
        except RuntimeError as e:
            raise RuntimeError(f"{e}{self.output()}") from None

    def written(self) -> str:
        """What the server has written so far, while it runs."""
        if self._output is not None:
            return self._output
        self._log.seek(0)
        return self._log.read()

    def output(self) -> str:
        """Everything the server wrote, once it has exited."""
        if self.process.poll() is None:
            return "(running)"
        if self._output is None:
            self._output = self.written()
            self._log.close()
        return self._output

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self.output()


@contextlib.contextmanager
def server_process(
    args: Sequence[str], env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    with server_processes(1, args, env) as (server,):
        yield server


@contextlib.contextmanager
def server_processes(
    count: int, args: Sequence[str], env: dict[str, str] | None = None
) -> Iterator[list[ServerProcess]]:
    """`count` replicas of one server, started at once (their models load side by side),
    every one ready when yielded."""
    servers: list[ServerProcess] = []
    try:
        for _ in range(count):
            servers.append(ServerProcess(args, env))
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


async def async_wait_for(predicate: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.005)


class _UrlCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def referenced_urls(html: str) -> list[str]:
    """Every src= and href= value in a page, in order (what a browser would fetch or follow)."""
    collector = _UrlCollector()
    collector.feed(html)
    collector.close()
    return collector.urls


def step_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[ort.InferenceSession, int]]:
    """Every decoder-step run through an IO binding from now on (the monkeypatch's scope): the
    session that ran it and its rows (every output of the step is (R, ...))."""
    runs: list[tuple[ort.InferenceSession, int]] = []
    original = ort.InferenceSession.run_with_iobinding

    def spy(session: ort.InferenceSession, binding: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(session, binding, *args, **kwargs)
        runs.append((session, binding.get_outputs()[0].shape()[0]))
        return result

    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", spy)
    return runs


def alignment_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool | None, int]]:
    """Every decoder-step run through an IO binding from now on: its `alignment_wanted` as the
    step read it (None: not an input of its graph) and how many outputs it had bound (the
    alignment is one of them or not)."""
    runs: list[tuple[bool | None, int]] = []
    gates: dict[Any, Any] = {}  # binding -> the OrtValue bound as its alignment_wanted
    bind, run = ort.IOBinding.bind_ortvalue_input, ort.InferenceSession.run_with_iobinding

    def bind_spy(binding: Any, name: str, value: Any) -> None:
        if name == ALIGNMENT_WANTED:
            gates[binding] = value
        bind(binding, name, value)

    def run_spy(session: ort.InferenceSession, binding: Any, *args: Any, **kwargs: Any) -> Any:
        gate = gates.get(binding)
        runs.append((None if gate is None else bool(gate.numpy()[0]), len(binding.get_outputs())))
        return run(session, binding, *args, **kwargs)

    monkeypatch.setattr(ort.IOBinding, "bind_ortvalue_input", bind_spy)
    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", run_spy)
    return runs
