// The status panel: GET /status (the models, their cards and licenses, queue depth, requests
// per second), refreshed while the page is visible.

import { callApi } from "./api.js";
import { element } from "./dom.js";

const REFRESH_MS = 5000;

/** Poll /status every few seconds while the page is shown; `onStatus` gets each answer.
 * Returns the refresh, to call when the page knows the status changed (after a translation). */
export function watchStatus(summary, models, onStatus) {
  let timer = null;
  const refresh = async () => {
    clearTimeout(timer);
    try {
      const status = await callApi("status");
      renderSummary(summary, status);
      renderModels(models, status.models);
      onStatus(status);
    } catch (error) {
      renderUnreachable(summary, error);
    }
    clearTimeout(timer); // one timer, however many refreshes overlapped
    if (document.visibilityState === "visible") {
      timer = setTimeout(refresh, REFRESH_MS);
    }
  };
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") {
      refresh();
    }
  });
  return refresh;
}

function term(name, value) {
  return [element("dt", {}, name), element("dd", {}, String(value))];
}

function renderSummary(summary, status) {
  const state = status.draining ? "shutting down" : status.ready ? "ready" : "not ready";
  const devices = [...new Set(status.models.map((m) => m.device.toUpperCase()))].join(", ");
  summary.replaceChildren(
    ...term("State", state),
    ...term("Device", devices || "none"),
    ...term("Queue depth", `${status.queue_depth} segments`),
    ...term("In flight", `${status.in_flight} requests`),
    ...term(
      `Requests per second (last ${status.rate_window_s} s)`,
      status.requests_per_second.toFixed(2),
    ),
  );
}

function renderUnreachable(summary, error) {
  const message = error.describe ? error.describe() : String(error.message ?? error);
  summary.replaceChildren(...term("State", `unreachable (${message})`));
}

// The model list is rebuilt only when the models change, so that an open card stays open.
function renderModels(container, models) {
  const signature = JSON.stringify(models.map(({ queue_depth, ...fixed }) => fixed));
  if (container.dataset.signature === signature) {
    for (const model of models) {
      const depth = container.querySelector(`[data-depth="${CSS.escape(model.name)}"]`);
      if (depth) {
        depth.textContent = `${model.queue_depth} segments`;
      }
    }
    return;
  }
  container.dataset.signature = signature;
  container.replaceChildren(...models.map(modelEntry));
}

function modelEntry(model) {
  const depth = element("dd", { "data-depth": model.name }, `${model.queue_depth} segments`);
  const facts = element(
    "dl",
    { class: "summary" },
    ...term("Languages", `${model.source} → ${model.targets.join(", ")}`),
    ...term("Device", `${model.device.toUpperCase()} (${model.provider})`),
    ...term("Precision", model.dtype),
    ...term("Word alignment", model.aligns ? "yes" : "no (text only)"),
    ...term("License", model.license ?? "not recorded in the bundle"),
    element("dt", {}, "Queue depth"),
    depth,
  );
  const entry = element("article", { class: "model" }, element("h3", {}, model.name), facts);
  if (model.card) {
    entry.append(cardDetails(model.card));
  }
  return entry;
}

/** The model card, fetched the first time it is opened. */
function cardDetails(url) {
  const text = element("pre", { class: "card" });
  const details = element("details", {}, element("summary", {}, "Model card"), text);
  details.addEventListener("toggle", async () => {
    if (!details.open || text.dataset.loaded) {
      return;
    }
    try {
      text.textContent = await callApi(url);
      text.dataset.loaded = "yes";
    } catch (error) {
      text.textContent = error.describe ? error.describe() : String(error);
    }
  });
  return details;
}
