// The service's API as the page uses it: same-origin requests with the stored API key, and
// errors kept as the API phrases them (docs/api.md#errors), with Retry-After when there is one.

const KEY_STORAGE = "transformer-mt.api-key";

/** The API key this browser keeps ("" when none). */
export function storedKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) ?? "";
  } catch {
    return ""; // storage disabled: the page still works without keys
  }
}

export function storeKey(key) {
  localStorage.setItem(KEY_STORAGE, key);
}

export function forgetKey() {
  localStorage.removeItem(KEY_STORAGE);
}

/** A refused request: the HTTP status, the API's error type and message, and Retry-After. */
export class ApiError extends Error {
  constructor(status, type, message, retryAfter) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
    this.retryAfter = retryAfter;
  }

  /** "422 input_too_long: <the API's message>", and when to retry for a 429 or 503. */
  describe() {
    const kind = this.type ? ` ${this.type}` : "";
    const retry = this.retryAfter ? ` Retry after ${this.retryAfter} s.` : "";
    return `${this.status}${kind}: ${this.message}${retry}`;
  }
}

// Header values travel as bytes: a key's UTF-8 bytes, one character each, are what the service
// decodes (service/http/middleware.py), so a non-ASCII key works as it does in a body.
function headerBytes(text) {
  return String.fromCharCode(...new TextEncoder().encode(text));
}

function keyed(headers) {
  const key = storedKey();
  if (key) {
    headers["X-API-Key"] = headerBytes(key);
  }
  return headers;
}

/** GET `path` (relative to the page), or POST `body` as JSON; the parsed answer or an ApiError. */
export async function callApi(path, { body, signal } = {}) {
  const headers = keyed({ Accept: "application/json" });
  const init = { method: "GET", headers, signal, cache: "no-store" };
  if (body !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    throw await errorOf(response);
  }
  const type = response.headers.get("Content-Type") ?? "";
  return type.startsWith("application/json") ? response.json() : response.text();
}

/** POST `form` (a FormData: a file upload) to `path`; the parsed JSON answer or an ApiError. */
export async function sendForm(path, form) {
  const init = { method: "POST", headers: keyed({ Accept: "application/json" }), body: form };
  const response = await fetch(path, init);
  if (!response.ok) {
    throw await errorOf(response);
  }
  return response.json();
}

/** GET `path` as a file: its Blob, or an ApiError. */
export async function fetchFile(path) {
  const response = await fetch(path, { headers: keyed({}), cache: "no-store" });
  if (!response.ok) {
    throw await errorOf(response);
  }
  return response.blob();
}

async function errorOf(response) {
  let type = "";
  let message = response.statusText || "request failed";
  try {
    const error = (await response.json()).error;
    type = error?.type ?? "";
    message = error?.message ?? message;
  } catch {
    // not the API's JSON (a proxy's page, say): the status line is all there is
  }
  return new ApiError(response.status, type, message, response.headers.get("Retry-After"));
}
