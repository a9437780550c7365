// The page at /: translate with the native API (POST /translate), show the n-best list, the
// word alignment and the request's time, and the service's status. No framework, no build.

import { ApiError, callApi, forgetKey, storedKey, storeKey } from "./api.js";
import { setUpDocuments } from "./documents.js";
import { element } from "./dom.js";
import { renderHeatmap } from "./heatmap.js";
import { watchStatus } from "./status.js";

const TYPING_PAUSE_MS = 400; // translate-as-you-type waits for this pause in typing

const $ = (id) => document.getElementById(id);
const ui = {
  source: $("source"),
  target: $("target"),
  swap: $("swap"),
  beam: $("beam"),
  beamSize: $("beam-size"),
  nbest: $("nbest"),
  format: $("format"),
  live: $("live"),
  text: $("text"),
  count: $("count"),
  translation: $("translation"),
  timing: $("timing"),
  detected: $("detected"),
  copy: $("copy"),
  copied: $("copied"),
  error: $("error"),
  details: $("details"),
  nbestList: $("nbest-list"),
  alignmentBox: $("alignment-box"),
  sentenceField: $("sentence-field"),
  sentence: $("sentence"),
  heatmap: $("heatmap"),
  keyPanel: $("key-panel"),
  apiKey: $("api-key"),
  keyState: $("key-state"),
};

const state = {
  pairs: [], // [{source, target, model}] from /languages
  status: null, // the last /status answer
  alignments: [], // the last translation's, one per sentence
  request: null, // the AbortController of the translation under way
  typingTimer: null,
  refreshStatus: async () => {}, // status.js's, once it runs
};

const languageNames = new Intl.DisplayNames(["en"], { type: "language" });

function languageLabel(code) {
  if (code === "auto") {
    return "Detect language";
  }
  let name = code;
  try {
    name = languageNames.of(code) ?? code;
  } catch {
    // not a BCP 47 code: its code is its name
  }
  return name === code ? code : `${name} (${code})`;
}

function fillSelect(select, codes, keep) {
  const options = codes.map((code) => element("option", { value: code }, languageLabel(code)));
  select.replaceChildren(...options);
  if (codes.includes(keep)) {
    select.value = keep;
  }
}

// --- Languages --------------------------------------------------------------------------------

function showSources() {
  const sources = [...new Set(state.pairs.map((p) => p.source))];
  if (state.status?.language_detection) {
    sources.unshift("auto");
  }
  fillSelect(ui.source, sources, ui.source.value);
  showTargets();
}

function showTargets() {
  const source = ui.source.value;
  const targets = state.pairs
    .filter((p) => source === "auto" || p.source === source)
    .map((p) => p.target);
  fillSelect(ui.target, [...new Set(targets)], ui.target.value);
  showSwap();
}

// Swapping needs a model for the other direction.
function showSwap() {
  const [source, target] = [ui.source.value, ui.target.value];
  const reverse = state.pairs.some((p) => p.source === target && p.target === source);
  ui.swap.disabled = !reverse;
  ui.swap.title = reverse ? "Swap languages" : `No model translates ${target} → ${source}`;
}

function swapLanguages() {
  const [source, target] = [ui.source.value, ui.target.value];
  const translated = ui.translation.textContent;
  ui.source.value = target;
  showTargets();
  ui.target.value = source;
  showSwap();
  if (translated) {
    ui.text.value = translated;
    countCharacters();
  }
  translateSoon(0);
}

// --- Options and limits -----------------------------------------------------------------------

function syncOptions() {
  const beam = ui.beam.checked;
  ui.beamSize.disabled = !beam;
  ui.nbest.disabled = !beam;
  const beamSize = clamp(ui.beamSize, 1, Number(ui.beamSize.max));
  ui.nbest.max = String(beamSize);
  clamp(ui.nbest, 1, beamSize);
}

function clamp(input, low, high) {
  const value = Math.min(high, Math.max(low, Math.round(Number(input.value) || low)));
  input.value = String(value);
  return value;
}

function applyLimits(limits) {
  ui.beamSize.max = String(limits.max_beam_size);
  ui.beamSize.value = String(limits.default_beam_size);
  syncOptions();
  countCharacters();
}

function countCharacters() {
  const count = [...ui.text.value].length; // code points, as the service counts them
  const limit = state.status?.limits.max_characters;
  const over = limit !== undefined && count > limit;
  ui.count.textContent =
    limit === undefined
      ? `${count} characters`
      : `${count} / ${limit.toLocaleString("en")} characters${over ? ": over the limit" : ""}`;
  ui.count.classList.toggle("over", over);
  ui.text.setAttribute("aria-invalid", String(over));
}

// --- Translating ------------------------------------------------------------------------------

function requestBody() {
  const beam = ui.beam.checked;
  const [source, target] = [ui.source.value, ui.target.value];
  const models = state.status?.models ?? [];
  // "auto" may send the text to any model into the target: alignments when every one aligns.
  const candidates = state.pairs
    .filter((p) => (source === "auto" || p.source === source) && p.target === target)
    .map((p) => models.find((m) => m.name === p.model));
  const aligns = candidates.length > 0 && candidates.every((m) => m?.aligns);
  return {
    text: ui.text.value,
    source,
    target,
    beam_size: beam ? Number(ui.beamSize.value) : 1,
    num_hypotheses: beam ? Number(ui.nbest.value) : 1,
    format: ui.format.value,
    return_scores: true,
    return_alignments: aligns,
  };
}

function translateSoon(delay = TYPING_PAUSE_MS) {
  clearTimeout(state.typingTimer);
  state.typingTimer = setTimeout(translate, delay);
}

async function translate() {
  clearTimeout(state.typingTimer);
  state.request?.abort();
  if (!ui.text.value.trim() || !ui.source.value || !ui.target.value) {
    showResult(null);
    return;
  }
  const request = new AbortController();
  state.request = request;
  ui.translation.setAttribute("aria-busy", "true");
  const started = performance.now();
  try {
    const answer = await callApi("translate", { body: requestBody(), signal: request.signal });
    showResult(answer, performance.now() - started);
  } catch (error) {
    if (error.name !== "AbortError") {
      showError(error);
    }
  } finally {
    if (state.request === request) {
      state.request = null;
      ui.translation.setAttribute("aria-busy", "false");
      state.refreshStatus(); // the request rate has moved
    }
  }
}

function showResult(answer, ms) {
  showError(null);
  const translation = answer?.translations[0];
  ui.translation.textContent = translation?.text ?? "";
  ui.copy.disabled = !translation?.text;
  ui.timing.textContent = answer ? `${Math.round(ms)} ms · ${answer.model}` : "";
  const detected = translation?.detected_language;
  ui.detected.textContent = detected
    ? `Detected: ${languageLabel(detected.language)} (${Math.round(100 * detected.confidence)}%)`
    : "";
  ui.details.hidden = !translation;
  if (!translation) {
    return;
  }
  const hypotheses = [translation, ...(translation.alternatives ?? [])];
  ui.nbestList.replaceChildren(...hypotheses.map(hypothesisItem));
  state.alignments = translation.alignments ?? [];
  showSentences();
}

function hypothesisItem(hypothesis) {
  const score = hypothesis.score === undefined ? "no score" : hypothesis.score.toFixed(3);
  return element(
    "li",
    {},
    element("span", { class: "hypothesis" }, hypothesis.text),
    " ",
    element("span", { class: "score" }, `score ${score}`),
  );
}

function showSentences() {
  const sentences = state.alignments;
  ui.alignmentBox.hidden = sentences.length === 0;
  ui.sentenceField.hidden = sentences.length < 2;
  const options = sentences.map((s, i) => element("option", { value: i }, `${i + 1}: ${s.source}`));
  ui.sentence.replaceChildren(...options);
  if (sentences.length > 0) {
    renderHeatmap(ui.heatmap, sentences[0]);
  }
}

function showError(error) {
  ui.error.hidden = !error;
  ui.error.textContent = error ? describe(error) : "";
  if (!error) {
    return;
  }
  ui.translation.textContent = "";
  ui.copy.disabled = true;
  ui.timing.textContent = "";
  ui.details.hidden = true;
  if (error instanceof ApiError && error.status === 401) {
    ui.keyPanel.hidden = false;
  }
}

function describe(error) {
  if (error instanceof ApiError) {
    return error.describe();
  }
  return `The service did not answer: ${error.message}`;
}

// --- Copy -------------------------------------------------------------------------------------

async function copyTranslation() {
  const text = ui.translation.textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No clipboard API outside a secure context (http to another host): select and copy.
    const range = document.createRange();
    range.selectNodeContents(ui.translation);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    document.execCommand("copy");
  }
  ui.copied.textContent = "Copied";
  setTimeout(() => (ui.copied.textContent = ""), 2000);
}

// --- API key ----------------------------------------------------------------------------------

function saveKey(event) {
  event.preventDefault();
  const key = ui.apiKey.value.trim();
  if (!key) {
    return;
  }
  storeKey(key);
  ui.apiKey.value = "";
  ui.keyState.textContent = "Key saved in this browser.";
  translateSoon(0);
}

function dropKey() {
  forgetKey();
  ui.keyState.textContent = "Key forgotten.";
}

// --- Wiring -----------------------------------------------------------------------------------

function onStatus(status) {
  const first = state.status === null;
  const detection = state.status?.language_detection;
  state.status = status;
  if (status.api_key_required) {
    ui.keyPanel.hidden = false;
    if (!storedKey()) {
      ui.keyState.textContent ||= "No key saved yet.";
    }
  }
  if (first) {
    applyLimits(status.limits);
  }
  if (first || detection !== status.language_detection) {
    showSources();
  }
}

function wire() {
  $("translate-form").addEventListener("submit", (event) => {
    event.preventDefault();
    translate();
  });
  $("translate-form").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      translate();
    }
  });
  ui.text.addEventListener("input", () => {
    countCharacters();
    if (ui.live.checked) {
      translateSoon();
    }
  });
  const optionChanged = () => {
    syncOptions();
    if (ui.live.checked) {
      translateSoon(0);
    }
  };
  for (const control of [ui.target, ui.format, ui.beamSize, ui.nbest, ui.beam, $("greedy")]) {
    control.addEventListener("change", optionChanged);
  }
  ui.source.addEventListener("change", showTargets);
  ui.target.addEventListener("change", showSwap);
  ui.source.addEventListener("change", optionChanged);
  ui.swap.addEventListener("click", swapLanguages);
  ui.copy.addEventListener("click", copyTranslation);
  ui.sentence.addEventListener("change", () => {
    renderHeatmap(ui.heatmap, state.alignments[Number(ui.sentence.value)]);
  });
  $("key-form").addEventListener("submit", saveKey);
  $("forget-key").addEventListener("click", dropKey);
  const documents = {
    form: $("document-form"),
    file: $("document-file"),
    button: $("document-translate"),
    progress: $("document-progress"),
    state: $("document-state"),
    result: $("document-result"),
  };
  setUpDocuments(documents, () => ({ source: ui.source.value, target: ui.target.value }));
}

async function start() {
  wire();
  syncOptions();
  countCharacters();
  state.refreshStatus = watchStatus($("status-summary"), $("models"), onStatus);
  const status = state.refreshStatus();
  try {
    state.pairs = await callApi("languages");
    showSources();
  } catch (error) {
    showError(error);
  }
  await status;
}

start();
