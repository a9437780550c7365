// The page's document panel: a file sent to POST /documents with the languages chosen above,
// its progress from GET /documents/{id}, then a link to the translated file (fetched with the
// API key, so it works on a keyed service too). docs/api.md#documents.

import { ApiError, callApi, fetchFile, sendForm } from "./api.js";

const POLL_MS = 500;

/** Wire the panel: `languages()` gives the {source, target} chosen in the translate form. */
export function setUpDocuments(ui, languages) {
  let link = null; // the object URL of the last result, released when replaced

  function show(text, failed = false) {
    ui.state.textContent = text;
    ui.state.classList.toggle("error", failed);
  }

  async function follow(id, name) {
    for (;;) {
      const status = await callApi(`documents/${id}`);
      const { done, total } = status.progress;
      ui.progress.max = Math.max(total, 1);
      ui.progress.value = done;
      if (status.status === "error") {
        throw new ApiError(422, status.error.type, status.error.message, null);
      }
      if (status.status === "done") {
        return status;
      }
      const left =
        status.seconds_left == null ? "" : `, about ${Math.ceil(status.seconds_left)} s left`;
      show(`${name}: ${status.status}, ${done} of ${total} sentences${left}`);
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
  }

  async function translateDocument(event) {
    event.preventDefault();
    const file = ui.file.files[0];
    if (!file) {
      show("Choose a file first.", true);
      return;
    }
    const { source, target } = languages();
    const form = new FormData();
    form.append("file", file, file.name);
    form.append("source", source);
    form.append("target", target);
    ui.button.disabled = true;
    ui.result.hidden = true;
    ui.progress.hidden = false;
    ui.progress.removeAttribute("value");
    show(`${file.name}: sending`);
    try {
      const job = await sendForm("documents", form);
      const status = await follow(job.id, file.name);
      const blob = await fetchFile(`documents/${job.id}/result`);
      if (link) {
        URL.revokeObjectURL(link);
      }
      link = URL.createObjectURL(blob);
      const dot = file.name.lastIndexOf(".");
      const named =
        dot > 0 ? `${file.name.slice(0, dot)}.${target}${file.name.slice(dot)}` : file.name;
      ui.result.href = link;
      ui.result.download = named;
      ui.result.textContent = `Download ${named}`;
      ui.result.hidden = false;
      const total = status.progress.total;
      show(`${file.name}: done, ${total} sentence${total === 1 ? "" : "s"}`);
    } catch (error) {
      show(error instanceof ApiError ? error.describe() : String(error), true);
    } finally {
      ui.button.disabled = false;
      ui.progress.hidden = true;
    }
  }

  ui.form.addEventListener("submit", translateDocument);
}
