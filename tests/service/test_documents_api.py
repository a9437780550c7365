"""The document API over the fake engine (it upper-cases and aligns each character to itself):
POST /documents -> 202, status, result, delete, expiry, a restart that resumes a job, the bad
inputs each a 4xx that names the problem, and LibreTranslate's /translate_file."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path
from typing import Any

import docx
import httpx
import pytest
from fastapi import FastAPI, UploadFile

from service.documents.safe import OLE_MAGIC
from service.http.app import create_app, file_uploads
from tests.service.document_helpers import replace_entry
from tests.service.helpers import FakeModel, async_wait_for, fast_settings, running

pytestmark = pytest.mark.anyio

EN_DE = {"source": "en", "target": "de"}
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def make_docx(*paragraphs: str, bold: str = "") -> bytes:
    document = docx.Document()
    for text in paragraphs:
        paragraph = document.add_paragraph(text)
        if bold:
            paragraph.add_run(bold).bold = True
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


async def post(client: httpx.AsyncClient, name: str, data: bytes, **fields: Any) -> httpx.Response:
    return await client.post("/documents", files={"file": (name, data)}, data={**EN_DE, **fields})


async def finished(client: httpx.AsyncClient, id: str) -> dict[str, Any]:
    for _ in range(200):
        status: dict[str, Any] = (await client.get(f"/documents/{id}")).json()
        if status["status"] in ("done", "error"):
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"document {id} not finished: {status}")


async def test_a_docx_is_queued_translated_downloaded_and_deleted(tmp_path: Path) -> None:
    settings = fast_settings(documents_dir=tmp_path)
    async with running(create_app(settings, models=[FakeModel()])) as client:
        sent = make_docx("A man pulling ", bold="some luggage")
        response = await post(client, "report.docx", sent)
        assert response.status_code == 202, response.text
        id = response.json()["id"]
        assert response.headers["location"] == f"/documents/{id}"
        assert response.json()["status"] == "queued"
        status = await finished(client, id)
        assert status["status"] == "done"
        assert status["progress"] == {"done": 1, "total": 1}
        assert 0 < status["expires_in_s"] <= 3600
        result = await client.get(f"/documents/{id}/result")
        assert result.status_code == 200
        assert result.headers["content-type"] == DOCX_TYPE
        assert 'filename="report.de.docx"' in result.headers["content-disposition"]
        runs = docx.Document(io.BytesIO(result.content)).paragraphs[0].runs
        assert [(r.text, r.bold) for r in runs] == [
            ("A MAN PULLING ", None),
            ("SOME LUGGAGE", True),
        ]
        assert (await client.delete(f"/documents/{id}")).status_code == 204
        assert (await client.get(f"/documents/{id}")).status_code == 404
        assert (await client.get(f"/documents/{id}/result")).status_code == 404
        assert not (tmp_path / id).exists()


async def test_a_paragraph_of_one_run_is_sent_as_its_text(tmp_path: Path) -> None:
    """A paragraph without inline formatting is translated as the plain text it is (no markup
    path, no alignment asked of the engine), its characters escaped back; one with a bold run
    goes through the markup path."""
    fake = FakeModel()
    async with running(create_app(fast_settings(documents_dir=tmp_path), models=[fake])) as client:
        document = docx.Document()
        document.add_paragraph("Tom & Jerry <3 cats.")
        document.add_paragraph("A man pulling ").add_run("some luggage").bold = True
        out = io.BytesIO()
        document.save(out)
        id = (await post(client, "report.docx", out.getvalue())).json()["id"]
        assert (await finished(client, id))["status"] == "done"
        result = await client.get(f"/documents/{id}/result")
    paragraphs = docx.Document(io.BytesIO(result.content)).paragraphs
    assert paragraphs[0].text == "TOM & JERRY <3 CATS."
    assert [(r.text, r.bold) for r in paragraphs[1].runs][-1] == ("SOME LUGGAGE", True)
    aligned = {
        "".join(map(chr, source[:-1])): options.alignments
        for sources, options in fake.calls
        for source in sources
    }
    assert aligned["Tom & Jerry <3 cats."] is False
    assert aligned["A man pulling some luggage"] is True


@pytest.mark.parametrize(
    ("name", "media_type", "sent", "translated"),
    [
        (
            "talk.srt",
            "text/plain",  # what httpx and browsers send for a .srt
            b"1\n00:00:01,000 --> 00:00:02,000\nA dog runs.\n",
            b"1\n00:00:01,000 --> 00:00:02,000\nA DOG RUNS.\n",
        ),
        (
            "notes.md",
            "text/markdown",
            b"# Title\n\nA **dog** runs.\n",
            b"# TITLE\n\nA **DOG** RUNS.\n",
        ),
        (
            "page.xhtml",
            "application/xhtml+xml",
            b'<?xml version="1.0" encoding="UTF-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml">'
            b"<body><p>A dog runs.</p></body></html>",
            b"<p>A DOG RUNS.</p>",
        ),
    ],
)
async def test_every_family_goes_through_the_api(
    tmp_path: Path, name: str, media_type: str, sent: bytes, translated: bytes
) -> None:
    """The formats of every module are registered, chosen by name against a text/* media type,
    and translated as jobs (an XHTML file starts with its XML declaration)."""
    settings = fast_settings(documents_dir=tmp_path)
    async with running(create_app(settings, models=[FakeModel()])) as client:
        files = {"file": (name, sent, media_type)}
        response = await client.post("/documents", data=EN_DE, files=files)
        assert response.status_code == 202, response.text
        status = await finished(client, response.json()["id"])
        assert status["status"] == "done", status
        result = await client.get(f"/documents/{status['id']}/result")
        assert translated in result.content, result.content


async def test_results_expire(tmp_path: Path) -> None:
    settings = fast_settings(documents_dir=tmp_path, document_ttl_s=0.2)
    async with running(create_app(settings, models=[FakeModel()])) as client:
        id = (await post(client, "a.docx", make_docx("Two dogs."))).json()["id"]
        assert (await finished(client, id))["status"] == "done"
        await asyncio.sleep(0.3)
        assert (await client.get(f"/documents/{id}")).status_code == 404


async def test_a_job_left_unfinished_is_resumed_and_a_lost_one_is_reported(
    tmp_path: Path,
) -> None:
    """A process that died mid-translation leaves its job 'translating' with no lock held: the
    next process translates it; a state that cannot be read is a failed job, not a vanished
    one."""
    settings = fast_settings(documents_dir=tmp_path)
    async with running(create_app(settings, models=[FakeModel()])) as client:
        id = (await post(client, "a.docx", make_docx("Two dogs."))).json()["id"]
        await finished(client, id)
    state = json.loads((tmp_path / id / "job.json").read_text())
    state.update(status="translating", finished=None, done=0, attempts=2)
    (tmp_path / id / "job.json").write_text(json.dumps(state))
    (tmp_path / id / "result").unlink()
    broken = "f" * 32
    (tmp_path / broken).mkdir()
    (tmp_path / broken / "job.json").write_text("{not json")
    async with running(create_app(settings, models=[FakeModel()])) as client:
        status = await finished(client, id)
        assert status["status"] == "done"
        result = await client.get(f"/documents/{id}/result")
        assert docx.Document(io.BytesIO(result.content)).paragraphs[0].text == "TWO DOGS."
        lost = (await client.get(f"/documents/{broken}")).json()
        assert lost["status"] == "error" and "lost" in lost["error"]["message"]
    # Started three times and never finished (each start's process died): failed, not retried.
    state = json.loads((tmp_path / id / "job.json").read_text())
    assert state["attempts"] == 3
    state.update(status="translating", finished=None)
    (tmp_path / id / "job.json").write_text(json.dumps(state))
    async with running(create_app(settings, models=[FakeModel()])) as client:
        failed = await finished(client, id)
        assert failed["status"] == "error" and "never finished" in failed["error"]["message"]


async def test_a_document_cut_off_by_the_drain_is_kept_for_the_next_start(tmp_path: Path) -> None:
    """The drain's time runs out while a document is decoded (its sentences fail with 503):
    the job is not failed but left as it was, and the next start translates it."""
    fake = FakeModel()
    settings = fast_settings(documents_dir=tmp_path)
    app = create_app(settings, models=[fake])
    async with running(app) as client:
        fake.gate = threading.Event()
        id = (await post(client, "a.docx", make_docx("Two dogs."))).json()["id"]
        await async_wait_for(fake.entered.is_set)
        runtime = app.state.runtime
        await runtime.finish_requests(0)
        for batcher in runtime.batchers.values():
            batcher.give_up("the service shut down (test)")
        fake.gate.set()

        def state() -> dict[str, Any]:
            loaded: dict[str, Any] = json.loads((tmp_path / id / "job.json").read_text())
            return loaded

        await async_wait_for(lambda: state()["status"] == "queued")
    assert json.loads((tmp_path / id / "job.json").read_text())["attempts"] == 0
    async with running(create_app(settings, models=[FakeModel()])) as client:
        assert (await finished(client, id))["status"] == "done"


async def test_a_document_that_fails_says_why(tmp_path: Path) -> None:
    settings = fast_settings(documents_dir=tmp_path)
    async with running(create_app(settings, models=[FakeModel(max_input_tokens=50)])) as client:
        id = (await post(client, "a.docx", make_docx("Two dogs.", "Long" + "o" * 80))).json()["id"]
        status = await finished(client, id)
        assert status["status"] == "error"
        assert status["error"]["type"] == "input_too_long"
        assert (
            "paragraph" not in status["error"]["message"] or "limit" in status["error"]["message"]
        )
        result = await client.get(f"/documents/{id}/result")
        assert result.status_code == 422 and "failed" in result.json()["error"]["message"]


async def test_the_result_is_409_until_done_and_the_jobs_are_bounded(tmp_path: Path) -> None:
    fake = FakeModel()
    settings = fast_settings(documents_dir=tmp_path, max_documents=1)
    async with running(create_app(settings, models=[fake])) as client:
        fake.gate = threading.Event()
        id = (await post(client, "a.docx", make_docx("Two dogs."))).json()["id"]
        early = await client.get(f"/documents/{id}/result")
        assert early.status_code == 409 and "retry-after" in early.headers
        second = await post(client, "b.docx", make_docx("Two cats."))
        assert second.status_code == 429 and "max_documents" in second.text
        fake.gate.set()
        assert (await finished(client, id))["status"] == "done"


async def test_deleting_a_document_in_translation_stops_it(tmp_path: Path) -> None:
    fake = FakeModel()
    settings = fast_settings(documents_dir=tmp_path)
    async with running(create_app(settings, models=[fake])) as client:
        fake.gate = threading.Event()
        id = (await post(client, "a.docx", make_docx("Two dogs."))).json()["id"]
        for _ in range(200):
            if (await client.get(f"/documents/{id}")).json()["status"] == "translating":
                break
            await asyncio.sleep(0.02)
        assert (await client.delete(f"/documents/{id}")).status_code == 204
        fake.gate.set()
        assert not (tmp_path / id).exists()
        again = await post(client, "b.docx", make_docx("Two cats."))  # the worker goes on
        assert (await finished(client, again.json()["id"]))["status"] == "done"
        assert not (tmp_path / id).exists()


def bomb() -> bytes:
    return replace_entry(make_docx("x"), "word/document.xml", b"<a>" + b" " * (40 << 20) + b"</a>")


XXE = (
    b'<?xml version="1.0"?><!DOCTYPE w [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
    b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
    b"<w:body><w:p><w:r><w:t>&x;</w:t></w:r></w:p></w:body></w:document>"
)


@pytest.mark.parametrize(
    ("name", "data", "status", "words"),
    [
        ("a.docx", b"", 422, "empty"),
        ("a.pdf", b"%PDF-1.7\n", 415, "PDF"),
        ("a.exe", b"MZ\x90\x00", 415, "*.exe"),
        ("a.docx", OLE_MAGIC + bytes(504), 422, "password"),
        ("a.docx", b"PK\x03\x04 not really", 415, "not a docx"),
        ("a.pptx", make_docx("Two dogs."), 415, "its content is docx"),
        ("a.docx", bomb(), 413, "zip bomb"),
        ("a.docx", replace_entry(make_docx("x"), "word/document.xml", XXE), 422, "entities"),
        ("a.docx", replace_entry(make_docx("x"), "", b"", {"../../evil": b"x"}), 422, "outside"),
    ],
)
async def test_bad_files_get_a_4xx_that_names_the_problem(
    tmp_path: Path, name: str, data: bytes, status: int, words: str
) -> None:
    settings = fast_settings(documents_dir=tmp_path)
    async with running(create_app(settings, models=[FakeModel()])) as client:
        response = await post(client, name, data)
        assert response.status_code == status, response.text
        assert words in response.json()["error"]["message"]
        assert not any(tmp_path.iterdir())  # nothing was kept


async def test_too_large_is_413_before_the_body_is_read_and_pairs_are_checked(
    tmp_path: Path,
) -> None:
    settings = fast_settings(documents_dir=tmp_path, max_document_bytes=50_000)
    sent = make_docx("Two dogs.")
    async with running(create_app(settings, models=[FakeModel()])) as client:
        # Over the body's limit (the file's and 64 KiB): refused by its Content-Length.
        big = await post(client, "a.docx", sent + b"\0" * 100_000)
        assert big.status_code == 413
        assert "request body is larger" in big.json()["error"]["message"]
        # Within the body's limit, over the file's.
        large = await post(client, "a.docx", sent + b"\0" * 30_000)
        assert large.status_code == 413 and "max_document_bytes" in large.text
        assert (await post(client, "a.docx", sent, source="fr")).status_code == 422
        assert (await post(client, "a.docx", sent, target="fr", source="auto")).status_code == 422
        assert not any(tmp_path.iterdir())


async def test_each_apis_upload_takes_a_file_over_the_body_limit_up_to_the_documents(
    tmp_path: Path,
) -> None:
    """The native, LibreTranslate and DeepL upload paths bound a file by max_document_bytes
    (and the multipart's 64 KiB), not by the max_body_bytes of every other body."""
    settings = fast_settings(
        documents_dir=tmp_path,
        max_body_bytes=10_000,
        max_document_bytes=50_000,
        libretranslate_prefix="/lt",
        deepl_prefix="/deepl",
    )
    text = b"A dog runs in the park near the river.\n" * 600  # 23,400 bytes
    uploads = {
        "/documents": (202, EN_DE),
        "/lt/translate_file": (200, EN_DE),
        "/deepl/v2/document": (200, {"source_lang": "EN", "target_lang": "DE"}),
    }
    async with running(create_app(settings, models=[FakeModel()])) as client:
        for path, (status, fields) in uploads.items():
            sent = await client.post(path, files={"file": ("a.txt", text)}, data=fields)
            assert sent.status_code == status, (path, sent.text)
            over = await client.post(path, files={"file": ("a.txt", text * 5)}, data=fields)
            assert over.status_code == 413, (path, over.text)  # 117,000 > 50,000 + 65,536
        response = await client.post("/translate", json={"text": "a" * 10_000, **EN_DE})
        assert response.status_code == 413  # elsewhere, the body's limit


def test_a_route_that_takes_a_file_is_an_upload_however_its_body_is_written() -> None:
    """Inline in the route's OpenAPI (the service's routes: `format: binary`) or, as FastAPI
    writes an `UploadFile` parameter, a reference to a component (`contentMediaType`)."""
    app = FastAPI()

    @app.post("/upload")
    async def upload(file: UploadFile) -> dict[str, str]:
        return {}

    @app.post("/json")
    async def take(body: dict[str, str]) -> dict[str, str]:
        return body

    assert file_uploads(app.openapi()) == {"/upload"}
    service = create_app(fast_settings(), models=[FakeModel()])
    assert file_uploads(service.openapi()) == {
        "/documents", "/libretranslate/translate_file", "/v2/document"
    }  # fmt: skip


async def test_a_document_with_nothing_to_translate_comes_back_as_sent(tmp_path: Path) -> None:
    settings = fast_settings(documents_dir=tmp_path)
    sent = make_docx("2024", "", "42 %")
    async with running(create_app(settings, models=[FakeModel()])) as client:
        id = (await post(client, "n.docx", sent)).json()["id"]
        assert (await finished(client, id))["status"] == "done"
        assert (await client.get(f"/documents/{id}/result")).content != b""
        unchanged = docx.Document(io.BytesIO((await client.get(f"/documents/{id}/result")).content))
        assert [p.text for p in unchanged.paragraphs] == ["2024", "", "42 %"]
        empty = make_docx()
        id = (await post(client, "e.docx", empty)).json()["id"]
        await finished(client, id)
        assert (await client.get(f"/documents/{id}/result")).content == empty


async def test_libretranslate_translate_file_download_and_frontend_settings(
    tmp_path: Path,
) -> None:
    settings = fast_settings(documents_dir=tmp_path, libretranslate_prefix="/lt")
    async with running(create_app(settings, models=[FakeModel()])) as client:
        response = await client.post(
            "/lt/translate_file",
            files={"file": ("My report.docx", make_docx("Two dogs."))},
            data=EN_DE,
        )
        assert response.status_code == 200, response.text
        url = response.json()["translatedFileUrl"]
        assert url.startswith("http://test/lt/download_file/") and url.endswith(".de.docx")
        download = await client.get(url)
        assert download.status_code == 200
        assert "filename*=utf-8''My%20report.de.docx" in download.headers["content-disposition"]
        assert docx.Document(io.BytesIO(download.content)).paragraphs[0].text == "TWO DOGS."
        pdf = await client.post(
            "/lt/translate_file", files={"file": ("a.pdf", b"%PDF-1.4")}, data=EN_DE
        )
        assert pdf.status_code == 400 and "PDF" in pdf.json()["error"]
        missing = await client.post(
            "/lt/translate_file", files={"file": ("a.docx", b"x")}, data={"source": "en"}
        )
        assert missing.json() == {"error": "Invalid request: missing target parameter"}
        front = (await client.get("/lt/frontend/settings")).json()
        assert front["filesTranslation"] is True
        assert {".docx", ".pptx", ".xlsx"} <= set(front["supportedFilesFormat"])
