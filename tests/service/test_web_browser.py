"""The web page at / in a real browser: Debian's chromium, driven through its chromedriver by
selenium, against `python -m service` serving the shipped model (one start for the module, and
one with API keys required). What a person does: type a sentence and get the API's translation,
switch to beam search and read the n-best list, see the alignment heatmap, go over the length
limit and read the API's error, use the keyboard alone, use a phone-width window, and give the
key a keyed service asks for. No test sees a Content-Security-Policy violation or a script error.

Skipped without chromium and chromium-driver (`apt-get install chromium chromium-driver`;
.ci/run installs them). Selenium is given both paths, so Selenium Manager never downloads a
browser. The page's screenshots go to a temporary directory, or to $WEB_SCREENSHOT_DIR
(`WEB_SCREENSHOT_DIR=docs/img` refreshes the README's: docs/contributing.md).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docx
import httpx
import pytest

from tests.service.helpers import REPO, ServerProcess, server_process

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
    "chromium-driver; .ci/run installs them)",
)
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the dev extra)")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SCREENSHOT_DIR = "WEB_SCREENSHOT_DIR"
MAX_CHARACTERS = 300  # the service's limit here: a text over it is quick to type
KEY = "browser-test-key"
SENTENCE = "A man in a blue shirt is riding a bike."
DESKTOP = (1280, 900)
PHONE = (375, 812)
WAIT_S = 20
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def start_service(bundle: Path, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    args = ["--bundle", str(bundle), "--intra-op-threads", "1"]
    args += ["--max-characters", str(MAX_CHARACTERS)]
    with server_process(args, env) as server:
        yield server


@pytest.fixture(scope="module")
def service(shipped_bundle: Path) -> Iterator[ServerProcess]:
    yield from start_service(shipped_bundle)


@pytest.fixture(scope="module")
def keyed_service(shipped_bundle: Path) -> Iterator[ServerProcess]:
    yield from start_service(shipped_bundle, {"MT_API_KEYS": KEY})


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(
        service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)), options=options
    )
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(autouse=True)
def no_script_errors(browser: WebDriver) -> Iterator[None]:
    """After each test: the console holds no CSP or Trusted Types violation and no uncaught
    error (refused requests are logged too, and are expected)."""
    browser.get_log("browser")  # what an earlier test left
    yield
    bad = re.compile(r"Content Security Policy|Trusted Type|Uncaught", re.IGNORECASE)
    problems = [e["message"] for e in browser.get_log("browser") if bad.search(e["message"])]
    assert not problems


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get(SCREENSHOT_DIR)
    if not chosen:
        return tmp_path_factory.mktemp("screenshots")
    directory = REPO / chosen
    directory.mkdir(parents=True, exist_ok=True)
    return directory


# --- Helpers -----------------------------------------------------------------------------------


def api_translate(server: ServerProcess, text: str, **options: Any) -> httpx.Response:
    body = {"text": text, "source": "en", "target": "de", "return_scores": True, **options}
    return httpx.post(f"{server.url}/translate", json=body, headers={"X-API-Key": KEY}, timeout=60)


def wait(browser: WebDriver, condition: Any, what: str) -> Any:
    try:
        return WebDriverWait(browser, WAIT_S).until(lambda _: condition())
    except TimeoutException:
        error = browser.find_element(By.ID, "error").text
        pytest.fail(f"timed out waiting for {what}; the page's error: {error!r}")


def open_page(browser: WebDriver, server: ServerProcess, size: tuple[int, int] = DESKTOP) -> None:
    """The page loaded at `size`, its languages and the service's status in."""
    browser.set_window_size(*size)
    browser.get(f"{server.url}/")
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#source option"), "languages")
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#status-summary dd"), "status")
    Select(browser.find_element(By.ID, "source")).select_by_value("en")
    Select(browser.find_element(By.ID, "target")).select_by_value("de")


def text_of(browser: WebDriver, element_id: str) -> str:
    text: str = browser.find_element(By.ID, element_id).text
    return text


def wait_for_translation(browser: WebDriver, expected: str) -> None:
    wait(
        browser,
        lambda: text_of(browser, "translation") == expected,
        f"the translation {expected!r}",
    )


def set_number(browser: WebDriver, element_id: str, value: int) -> None:
    """Replace a number field's value as a person does: select it all, type, leave the field."""
    field = browser.find_element(By.ID, element_id)
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(str(value), Keys.TAB)


def save_page(browser: WebDriver, path: Path) -> None:
    """A screenshot of the whole page, unfocused: the window made as tall as the page first."""
    browser.execute_script("document.activeElement.blur()")
    height = browser.execute_script(
        "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight"
    )
    browser.set_window_size(browser.get_window_size()["width"], height)
    browser.save_screenshot(str(path))


# --- Tests -------------------------------------------------------------------------------------


def test_typing_gives_the_apis_translation_and_its_alignment(
    browser: WebDriver, service: ServerProcess
) -> None:
    answer = api_translate(service, SENTENCE, beam_size=1, return_alignments=True).json()
    (translation,) = answer["translations"]
    (alignment,) = translation["alignments"]
    open_page(browser, service)
    browser.find_element(By.ID, "text").send_keys(SENTENCE)  # greedy, translated as typed
    wait_for_translation(browser, translation["text"])
    assert re.fullmatch(r"\d+ ms · multi30k-en-de", text_of(browser, "timing"))
    assert text_of(browser, "count") == f"{len(SENTENCE)} / {MAX_CHARACTERS} characters"
    browser.find_element(By.ID, "copy").click()
    wait(browser, lambda: text_of(browser, "copied") == "Copied", "the copy to be confirmed")
    swap = browser.find_element(By.ID, "swap")  # no model translates de -> en here
    assert not swap.is_enabled() and swap.get_attribute("title") == "No model translates de → en"

    # The heatmap: a row per source token, a column per target token, the API's links dotted.
    heatmap = browser.find_element(By.ID, "heatmap")
    assert heatmap.is_displayed()
    assert not browser.find_element(By.ID, "sentence").is_displayed()  # one sentence: no choice
    rows = [th.text for th in heatmap.find_elements(By.CSS_SELECTOR, "tbody th")]
    columns = heatmap.find_elements(By.CSS_SELECTOR, "thead th")
    assert rows == [token["text"] for token in alignment["source_tokens"]]
    assert len(columns) == len(alignment["target_tokens"])
    linked = {
        (int(td.get_attribute("data-s") or -1), int(td.get_attribute("data-t") or -1))
        for td in heatmap.find_elements(By.CSS_SELECTOR, "td.linked")
    }
    assert linked == {tuple(pair) for pair in alignment["pairs"]}

    # The status panel: the model, its device, and this translation in the request rate.
    status = text_of(browser, "status")
    assert "multi30k-en-de" in status and "CPU" in status
    rate = "//dt[starts-with(., 'Requests per second')]/following-sibling::dd[1]"
    wait(browser, lambda: browser.find_element(By.XPATH, rate).text != "0.00", "a request rate")
    browser.find_element(By.CSS_SELECTOR, ".model summary").click()  # the card, on demand
    card = browser.find_element(By.CSS_SELECTOR, ".model pre.card")
    wait(browser, lambda: card.text.startswith("# multi30k-en-de"), "the model card")


def test_auto_shows_the_detected_language_and_keeps_the_heatmap(
    browser: WebDriver, service: ServerProcess
) -> None:
    body = {"text": SENTENCE, "source": "auto", "target": "de"}
    answer = httpx.post(f"{service.url}/translate", json=body, timeout=60).json()
    (translation,) = answer["translations"]
    detected = translation["detected_language"]
    assert detected["language"] == "en"
    open_page(browser, service)
    Select(browser.find_element(By.ID, "source")).select_by_value("auto")
    browser.find_element(By.ID, "text").send_keys(SENTENCE)
    wait_for_translation(browser, translation["text"])
    percent = math.floor(100 * detected["confidence"] + 0.5)  # JavaScript's Math.round
    assert text_of(browser, "detected") == f"Detected: English (en) ({percent}%)"
    assert browser.find_element(By.ID, "heatmap").is_displayed()  # the only model aligns


def test_ctrl_enter_translates_when_typing_does_not_and_each_sentence_has_its_heatmap(
    browser: WebDriver, service: ServerProcess
) -> None:
    text = "Two dogs play in the snow. A woman sings."
    answer = api_translate(service, text, beam_size=1, return_alignments=True).json()
    (translation,) = answer["translations"]
    open_page(browser, service)
    browser.find_element(By.ID, "live").click()  # off
    field = browser.find_element(By.ID, "text")
    field.send_keys(text)
    with pytest.raises(TimeoutException):
        WebDriverWait(browser, 1).until(lambda _: text_of(browser, "translation"))
    field.send_keys(Keys.CONTROL, Keys.ENTER)
    wait_for_translation(browser, translation["text"])

    sentence = Select(browser.find_element(By.ID, "sentence"))
    assert [o.text for o in sentence.options] == [
        f"{i + 1}: {a['source']}" for i, a in enumerate(translation["alignments"])
    ]
    sentence.select_by_index(1)
    second = [token["text"] for token in translation["alignments"][1]["source_tokens"]]
    rows = "#heatmap tbody th"
    wait(
        browser,
        lambda: [th.text for th in browser.find_elements(By.CSS_SELECTOR, rows)] == second,
        "the second sentence's heatmap",
    )


def test_beam_search_shows_the_n_best_list_with_scores(
    browser: WebDriver, service: ServerProcess, screenshots: Path
) -> None:
    answer = api_translate(service, SENTENCE, beam_size=4, num_hypotheses=3).json()
    (translation,) = answer["translations"]
    hypotheses = [translation, *translation["alternatives"]]
    open_page(browser, service)
    browser.find_element(By.ID, "text").send_keys(SENTENCE)
    browser.find_element(By.ID, "beam").click()
    set_number(browser, "beam-size", 4)
    set_number(browser, "nbest", 3)
    items = "#nbest-list li"
    wait(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, items)) == 3, "3 hypotheses")
    shown = [li.text for li in browser.find_elements(By.CSS_SELECTOR, items)]
    assert shown == [f"{h['text']} score {h['score']:.3f}" for h in hypotheses]
    assert text_of(browser, "translation") == translation["text"]
    assert browser.find_element(By.ID, "heatmap").is_displayed()
    save_page(browser, screenshots / "web-page.png")
    assert (screenshots / "web-page.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_a_text_over_the_limit_shows_the_apis_error(
    browser: WebDriver, service: ServerProcess
) -> None:
    text = "A dog runs. " * (MAX_CHARACTERS // 12) + "A cat sleeps."
    refused = api_translate(service, text, beam_size=1)
    assert refused.status_code == 422
    error = refused.json()["error"]
    open_page(browser, service)
    browser.find_element(By.ID, "text").send_keys(text)
    expected = f"422 {error['type']}: {error['message']}"
    wait(browser, lambda: text_of(browser, "error") == expected, expected)
    count = browser.find_element(By.ID, "count")
    assert count.text == f"{len(text)} / {MAX_CHARACTERS} characters: over the limit"
    assert browser.find_element(By.ID, "text").get_attribute("aria-invalid") == "true"
    assert text_of(browser, "translation") == ""


def test_every_control_is_named_and_reached_by_the_keyboard(
    browser: WebDriver, service: ServerProcess
) -> None:
    open_page(browser, service)
    controls = browser.find_elements(By.CSS_SELECTOR, "input, select, textarea, button")
    unnamed = [
        c.get_attribute("id") for c in controls if c.is_displayed() and not c.accessible_name
    ]
    assert not unnamed
    browser.execute_script("document.querySelector('nav a').focus()")  # the first stop
    reached = []
    for _ in range(20):
        # The keyboard's Tab, not typed into the focused element (a file input reads typed
        # keys as a file name).
        ActionChains(browser).send_keys(Keys.TAB).perform()
        reached.append(browser.switch_to.active_element.get_attribute("id"))
    # Disabled controls are skipped (beam size and n-best while greedy, copy with nothing to
    # copy, swap without a model for the other direction); a radio group is one stop.
    expected = ["source", "target", "greedy", "format", "live", "text", "translation", "translate"]
    assert [i for i in reached if i in expected][: len(expected)] == expected


def test_the_page_fits_a_phone(
    browser: WebDriver, service: ServerProcess, screenshots: Path
) -> None:
    expected = api_translate(service, SENTENCE, beam_size=1).json()["translations"][0]["text"]
    open_page(browser, service, PHONE)
    browser.find_element(By.ID, "text").send_keys(SENTENCE)
    wait_for_translation(browser, expected)
    width, viewport = browser.execute_script(
        "return [document.documentElement.scrollWidth, window.innerWidth]"
    )
    assert width <= viewport, "the page scrolls sideways at phone width"
    source = browser.find_element(By.ID, "text").rect
    target = browser.find_element(By.ID, "translation").rect
    assert target["y"] > source["y"] + source["height"], "the text boxes are stacked"
    save_page(browser, screenshots / "web-page-phone.png")


def test_a_keyed_service_refuses_without_the_key_and_serves_with_it(
    browser: WebDriver, keyed_service: ServerProcess
) -> None:
    expected = api_translate(keyed_service, SENTENCE, beam_size=1).json()["translations"][0]["text"]
    open_page(browser, keyed_service)
    wait(browser, lambda: browser.find_element(By.ID, "key-panel").is_displayed(), "the key panel")
    field = browser.find_element(By.ID, "text")
    field.send_keys(SENTENCE)
    no_key = "401 unauthorized: an API key is required"
    wait(browser, lambda: text_of(browser, "error") == no_key, no_key)

    key = browser.find_element(By.ID, "api-key")
    key.send_keys("not-the-key", Keys.ENTER)
    wrong = "401 unauthorized: invalid API key"
    wait(browser, lambda: text_of(browser, "error") == wrong, wrong)

    key.send_keys(KEY, Keys.ENTER)
    wait_for_translation(browser, expected)
    assert not browser.find_element(By.ID, "error").is_displayed()
    stored = browser.execute_script("return localStorage.getItem('transformer-mt.api-key')")
    assert stored == KEY

    open_page(browser, keyed_service)  # kept in the browser: the next visit needs no typing
    browser.find_element(By.ID, "text").send_keys(SENTENCE)
    wait_for_translation(browser, expected)


def test_a_document_is_sent_followed_and_offered_for_download(
    browser: WebDriver, service: ServerProcess, tmp_path: Path
) -> None:
    """The document panel: a docx sent with the languages chosen above, its status followed,
    a link to the translated file named with the target language; a PDF gets the API's 415."""
    document = docx.Document()
    document.add_paragraph(SENTENCE)
    path = tmp_path / "story.docx"
    document.save(str(path))
    open_page(browser, service)
    browser.find_element(By.ID, "document-file").send_keys(str(path))
    browser.find_element(By.ID, "document-translate").click()
    result = browser.find_element(By.ID, "document-result")
    wait(browser, result.is_displayed, "the document's download link")
    assert result.get_attribute("download") == "story.de.docx"
    assert result.get_attribute("href").startswith("blob:")
    assert text_of(browser, "document-state") == "story.docx: done, 1 sentence"
    pdf = tmp_path / "paper.pdf"
    pdf.write_bytes(b"%PDF-1.4\n")
    browser.find_element(By.ID, "document-file").send_keys(str(pdf))
    browser.find_element(By.ID, "document-translate").click()
    wait(browser, lambda: "415" in text_of(browser, "document-state"), "the API's refusal")
    assert "PDF files are not translated" in text_of(browser, "document-state")
    assert not result.is_displayed()
