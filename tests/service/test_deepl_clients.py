"""DeepL's official clients, unchanged, against `python -m service` serving the shipped models
(en -> de, de -> en) with API keys: the Python package `deepl` (JSON bodies, strict readers:
`billed_characters` made an int, a GET with a form body for the target languages), and the Node
package `deepl-node` (form bodies), which runs when node finds it (NODE_PATH; see
docs/contributing.md). Request and answer shapes field by field: test_deepl.py."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deepl
import docx
import pytest
import srt
from deepl.api_data import MultilingualGlossaryDictionaryEntries

from service.keys.__main__ import main as keys_cli
from tests.service.helpers import ServerProcess, server_process

KEY, USAGE_KEY = "main-key", "usage-key"  # usage counted apart from the other tests' calls
NODE_CLIENT = Path(__file__).with_name("deepl_node_client.js")


# A key of the key store (service/keys/) with a month of 60 characters.
QUOTA_KEY, QUOTA = "quota-key", 60


@pytest.fixture(scope="module")
def server(
    shipped_bundle: Path, shipped_de_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("keys") / "keys.sqlite3"
    store = ["--store", "sqlite", "--db", str(db)]
    limit = ["--characters-per-month", str(QUOTA)]
    assert keys_cli([*store, "add", "quota", "--key", QUOTA_KEY, *limit]) == 0
    args = ["--bundle", str(shipped_bundle), "--bundle", str(shipped_de_en_bundle)]
    env = {
        "MT_API_KEYS": f"{KEY},{USAGE_KEY}",
        "MT_KEY_STORE": "sqlite",
        "MT_KEYS_DB": str(db),
        "MT_INTRA_OP_THREADS": "1",
    }
    with server_process(args, env) as running:
        yield running


@pytest.fixture(scope="module")
def translator(server: ServerProcess) -> deepl.Translator:
    return deepl.Translator(KEY, server_url=server.url)


def test_one_text_from_a_given_source(translator: deepl.Translator) -> None:
    text = "A man in a blue shirt is riding a bike."
    result = translator.translate_text(text, source_lang="EN", target_lang="DE")
    assert isinstance(result, deepl.TextResult)
    assert "Mann" in result.text and "Hemd" in result.text, result.text
    assert result.detected_source_lang == "EN"
    assert result.billed_characters == len(text)


def test_many_texts_each_from_its_detected_language(translator: deepl.Translator) -> None:
    texts = ["Two dogs are playing in the snow.", "Ein Mann fährt mit dem Fahrrad."]
    english, german = translator.translate_text(texts, target_lang="EN-US")
    assert (english.text, english.detected_source_lang) == (texts[0], "EN")  # already English
    assert german.detected_source_lang == "DE"
    assert "man" in german.text and "riding" in german.text, german.text


def test_html_and_xml_with_ignored_tags(translator: deepl.Translator) -> None:
    html = '<p>A man in a <b>blue</b> shirt. <span class="n">Keep this.</span></p>'
    result = translator.translate_text(
        html, source_lang="EN", target_lang="DE", tag_handling="html", ignore_tags="span"
    )
    assert isinstance(result, deepl.TextResult)
    translated = result.text
    assert translated.startswith("<p>") and translated.endswith("</p>"), translated
    assert '<span class="n">Keep this.</span>' in translated and "<b>" in translated
    assert "Mann" in translated
    xml = "<doc><p>A woman is singing.</p><code>x = 1</code></doc>"
    result = translator.translate_text(
        xml, source_lang="EN", target_lang="DE", tag_handling="xml", ignore_tags=["code"]
    )
    assert isinstance(result, deepl.TextResult)
    assert result.text.startswith("<doc><p>") and "<code>x = 1</code></doc>" in result.text
    assert "Frau" in result.text, result.text


def test_split_sentences(translator: deepl.Translator) -> None:
    text = "A dog runs.\nA cat sleeps."
    for split in ("0", "1", deepl.SplitSentences.NO_NEWLINES):
        result = translator.translate_text(
            text, source_lang="EN", target_lang="DE", split_sentences=split
        )
        assert isinstance(result, deepl.TextResult)
        assert result.text.count("\n") == 1, (split, result.text)  # the line break is kept
    with pytest.raises(deepl.DeepLException, match="split_sentences"):
        translator.translate_text(text, target_lang="DE", split_sentences="invalid")


def test_languages(translator: deepl.Translator) -> None:
    assert [lang.code for lang in translator.get_source_languages()] == ["DE", "EN"]
    targets = {lang.code: lang for lang in translator.get_target_languages()}
    assert sorted(targets) == ["DE", "EN", "EN-GB", "EN-US"]
    assert targets["EN-GB"].name == "English (British)"
    assert not any(lang.supports_formality for lang in targets.values())


def test_usage_counts_this_keys_characters(server: ServerProcess) -> None:
    translator = deepl.Translator(USAGE_KEY, server_url=server.url)
    assert translator.get_usage().character.count == 0
    translator.translate_text(["A dog.", "A cat sleeps."], source_lang="EN", target_lang="DE")
    usage = translator.get_usage()
    assert (usage.character.count, usage.character.limit) == (19, 1_000_000_000_000)
    assert not usage.any_limit_reached


def test_refusals_are_the_clients_exceptions(
    server: ServerProcess, translator: deepl.Translator
) -> None:
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("wrong-key", server_url=server.url).translate_text("A", target_lang="DE")
    with pytest.raises(deepl.DeepLException, match=r"target_lang.*not supported"):
        translator.translate_text("A dog.", target_lang="FR")
    with pytest.raises(deepl.DeepLException, match=r"Target language.*formality"):
        translator.translate_text("A dog.", target_lang="DE", formality="more")
    result = translator.translate_text("A dog.", target_lang="DE", formality="prefer_more")
    assert isinstance(result, deepl.TextResult) and result.text
    with pytest.raises(deepl.DeepLException, match="Not found"):
        translator.translate_text("A dog.", source_lang="EN", target_lang="DE", glossary="g-1")
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("wrong-key", server_url=server.url).list_glossaries()


def test_glossaries_made_read_used_and_deleted(
    server: ServerProcess, translator: deepl.Translator
) -> None:
    """v2's glossaries (Translator) and v3's (DeepLClient), one store: the glossary's target
    term is in the translation that names it, a text's or a document's."""
    made = translator.create_glossary("people", "EN", "DE", {"man": "Herr"})
    assert (made.source_lang, made.target_lang, made.entry_count, made.ready) == (
        "EN",
        "DE",
        1,
        True,
    )
    assert made.creation_time.tzinfo is not None  # parsed with its fractional seconds and zone
    assert [g.glossary_id for g in translator.list_glossaries()] == [made.glossary_id]
    assert translator.get_glossary(made.glossary_id).name == "people"
    assert translator.get_glossary_entries(made) == {"man": "Herr"}
    text = "A man is riding a bike."
    result = translator.translate_text(text, source_lang="EN", target_lang="DE", glossary=made)
    assert isinstance(result, deepl.TextResult) and "Herr" in result.text, result.text
    document = docx.Document()
    document.add_paragraph(text)
    sent, translated = io.BytesIO(), io.BytesIO()
    document.save(sent)
    sent.seek(0)
    sent.name = "note.docx"
    translator.translate_document(
        sent, translated, source_lang="EN", target_lang="DE", glossary=made
    )
    [paragraph] = docx.Document(io.BytesIO(translated.getvalue())).paragraphs
    assert "Herr" in paragraph.text, paragraph.text  # the glossary, in the document too
    pairs = [(p.source_lang, p.target_lang) for p in translator.get_glossary_languages()]
    assert pairs == [("de", "en"), ("en", "de")]
    client = deepl.DeepLClient(KEY, server_url=server.url)
    dictionary = MultilingualGlossaryDictionaryEntries("DE", "EN", {"Hund": "dog"})
    multilingual = client.create_multilingual_glossary("animals", [dictionary])
    [info] = multilingual.dictionaries
    assert (info.source_lang, info.target_lang, info.entry_count) == ("DE", "EN", 1)
    [entries] = client.get_multilingual_glossary_entries(multilingual, "DE", "EN").dictionaries
    assert entries.entries == "Hund\tdog"  # DeepL's TSV, as the client hands it on
    assert len(client.list_multilingual_glossaries()) == 2
    client.delete_multilingual_glossary(multilingual)
    translator.delete_glossary(made)
    with pytest.raises(deepl.GlossaryNotFoundException):
        translator.get_glossary(made.glossary_id)


def test_documents_docx_in_one_call_srt_uploaded_polled_downloaded(
    translator: deepl.Translator,
) -> None:
    document = docx.Document()
    document.add_paragraph("A man is riding a bike.")
    sent = io.BytesIO()
    document.save(sent)
    sent.seek(0)
    sent.name = "note.docx"  # as a file opened from a path (requests sends the name)
    translated = io.BytesIO()
    status = translator.translate_document(sent, translated, source_lang="EN", target_lang="DE")
    # Billed: the characters charged to the key, the text of the document's units (its
    # runs' markup included), as the native upload counts them.
    assert status.done and status.billed_characters >= len("A man is riding a bike.")
    [paragraph] = docx.Document(io.BytesIO(translated.getvalue())).paragraphs
    assert "Mann" in paragraph.text, paragraph.text
    subtitles = "1\n00:00:01,000 --> 00:00:03,000\nTwo dogs are playing in the snow.\n"
    handle = translator.translate_document_upload(
        subtitles.encode(), target_lang="DE", filename="talk.srt"
    )
    deadline = time.monotonic() + 60
    while not (polled := translator.translate_document_get_status(handle)).done:
        assert polled.ok and time.monotonic() < deadline, polled.error_message
        time.sleep(0.1)
    out = io.BytesIO()
    translator.translate_document_download(handle, out)
    [subtitle] = srt.parse(out.getvalue().decode())
    assert subtitle.start.total_seconds() == 1.0 and "Hunde" in subtitle.content, subtitle


def _node_client() -> list[str]:
    """node with deepl-node where it finds it, else the test is skipped."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    found = subprocess.run(
        [node, "-e", "require.resolve('deepl-node')"], capture_output=True, env=os.environ
    )
    if found.returncode != 0:
        pytest.skip("deepl-node is not installed where node finds it (NODE_PATH)")
    return [node, str(NODE_CLIENT)]


def test_the_node_client(server: ServerProcess) -> None:
    command = _node_client()
    done = subprocess.run(
        [*command, server.url, KEY], capture_output=True, text=True, timeout=120, check=True
    )
    results: dict[str, dict[str, Any]] = json.loads(done.stdout)
    [one] = [results["one"]["ok"]]
    assert "Mann" in one["text"] and one["detectedSourceLang"] == "en"
    assert one["billedCharacters"] == len("A man is riding a bike.")
    english, german = results["many"]["ok"]
    assert english["detectedSourceLang"] == "en" and german["detectedSourceLang"] == "de"
    assert "<span>Keep this.</span>" in results["html"]["ok"]["text"]
    assert [lang["code"] for lang in results["sources"]["ok"]] == ["de", "en"]
    assert "en-US" in [lang["code"] for lang in results["targets"]["ok"]]
    assert results["usage"]["ok"]["limit"] == 1_000_000_000_000
    assert results["wrongKey"]["error"] == "AuthorizationError"
    assert results["unsupported"]["error"] == "DeepLError"
    assert "target_lang" in results["unsupported"]["message"]
    glossary = results["glossary"]["ok"]
    made = glossary["made"]
    assert (made["sourceLang"], made["targetLang"], made["entryCount"]) == ("en", "de", 1)
    assert made["ready"] is True and made["creationTime"].endswith("Z")
    assert glossary["entries"] == {"man": "Herr"} and "Herr" in glossary["text"]
    assert glossary["listed"] == 0  # deleted


def test_a_spent_quota_is_the_clients_quota_exception(server: ServerProcess) -> None:
    """A key of the key store: its month's characters are DeepL's usage, and a request past
    them is DeepL's 456, which the client raises as QuotaExceededException, before any work."""
    translator = deepl.Translator(QUOTA_KEY, server_url=server.url)
    text = "Two dogs are playing in the snow."  # 33 characters: one fits in 60, two do not
    translator.translate_text(text, source_lang="EN", target_lang="DE")
    usage = translator.get_usage()
    assert (usage.character.count, usage.character.limit) == (len(text), QUOTA)
    with pytest.raises(deepl.QuotaExceededException):
        translator.translate_text(text, source_lang="EN", target_lang="DE")
    assert translator.get_usage().character.count == len(text)  # the refused one not charged
    with pytest.raises(deepl.QuotaExceededException):  # a document's characters too
        translator.translate_document_upload(text.encode(), target_lang="DE", filename="a.txt")
    assert translator.get_usage().character.count == len(text)
