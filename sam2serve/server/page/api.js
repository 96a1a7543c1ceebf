// The public HTTP API, as the page calls it: the API key (kept in sessionStorage, sent as
// "Authorization: Bearer"), the one error shape ({"error": {code, message}}) turned into
// an ApiError, and retries of "come back later" answers (503, 429) after Retry-After.

const KEY_STORAGE = "sam2serve.apiKey";

export class ApiError extends Error {
  constructor(status, code, message, retryAfter = null) {
    super(message);
    this.status = status; // 0: no answer (network)
    this.code = code;
    this.retryAfter = retryAfter; // seconds, from Retry-After
  }

  /** Whether asking again later may succeed (the server said so). */
  get busy() {
    return this.status === 503 || this.status === 429;
  }

  describe() {
    if (this.status === 0) return this.message;
    return `${this.status} ${this.code}: ${this.message}`;
  }
}

export class Api {
  constructor() {
    this.key = sessionStorage.getItem(KEY_STORAGE) || "";
  }

  setKey(key) {
    this.key = key.trim();
    if (this.key) sessionStorage.setItem(KEY_STORAGE, this.key);
    else sessionStorage.removeItem(KEY_STORAGE);
  }

  /** One request; resolves to parsed JSON (or a Blob for other answers), rejects with an
   * ApiError. `json`: a body to send as JSON; `form`: a FormData (multipart). */
  async call(method, path, options = {}) {
    const response = await this.send(method, path, options);
    const type = response.headers.get("content-type") || "";
    return type.includes("json") ? response.json() : response.blob();
  }

  /** One request whose answer is read as it arrives (Server-Sent Events): resolves to the
   * Response once the server accepted it, rejects with an ApiError otherwise. */
  async stream(method, path, options = {}) {
    return this.send(method, path, options);
  }

  async send(method, path, { json, form, signal, keepalive = false } = {}) {
    const headers = {};
    if (this.key) headers.Authorization = `Bearer ${this.key}`;
    let body;
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(json);
    } else if (form !== undefined) {
      body = form;
    }
    let response;
    try {
      response = await fetch(path, { method, headers, body, signal, keepalive, cache: "no-store" });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new ApiError(0, "network", `no answer from the server (${error.message})`);
    }
    if (response.ok) return response;
    throw await errorOf(response, response.headers.get("content-type") || "");
  }

  /** `attempt()` again after the server's Retry-After while it answers 503 or 429, at most
   * `tries` times in all; `onWait(error, seconds, attempt)` is told before each wait. */
  async retrying(attempt, { tries = 4, maxWaitS = 30, onWait = () => {}, signal } = {}) {
    for (let n = 1; ; n++) {
      try {
        return await attempt();
      } catch (error) {
        if (!(error instanceof ApiError) || !error.busy || n >= tries) throw error;
        const seconds = Math.min(maxWaitS, Math.max(0.2, error.retryAfter ?? 1));
        onWait(error, seconds, n);
        await sleep(seconds * 1000, signal);
      }
    }
  }
}

async function errorOf(response, type) {
  const retry = Number.parseFloat(response.headers.get("retry-after"));
  const retryAfter = Number.isFinite(retry) ? retry : null;
  let code = "http_error";
  let message = response.statusText || `HTTP ${response.status}`;
  try {
    if (type.includes("json")) {
      const body = await response.json();
      code = body?.error?.code ?? code;
      message = body?.error?.message ?? message;
    } else {
      const text = (await response.text()).trim();
      if (text) message = text.slice(0, 300);
      if (response.status === 503) code = "overloaded";
    }
  } catch {
    // keep the status line
  }
  return new ApiError(response.status, code, message, retryAfter);
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(new DOMException("aborted", "AbortError"));
    });
  });
}
