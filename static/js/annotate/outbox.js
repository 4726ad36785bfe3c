/*
 * Reliable submits: an idempotency key per assignment and a localStorage outbox.
 *
 * The key is made once per assignment (kept in sessionStorage). A submit is written to the
 * outbox before it is sent and retried with exponential backoff on network errors, 408, 429
 * and 5xx until a 2xx or a definitive 4xx, and again from any page of the site after a reload.
 * The server answers a repeated key with the first judgment, so a retry never counts twice.
 * An entry still inside its undo hold (`holdUntil` in the future) belongs to the tab holding
 * it and is left alone by the others.
 */

const OUTBOX_KEY = "prefloop.outbox.v1";
const MAX_BACKOFF_MS = 30000;

function randomHex(bytes) {
  const buffer = new Uint8Array(bytes);
  window.crypto.getRandomValues(buffer);
  return Array.from(buffer, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Return the idempotency key of this assignment, made once per browser session. */
export function keyFor(assignmentId) {
  const storageKey = "prefloop.key." + assignmentId;
  let key = null;
  try {
    key = sessionStorage.getItem(storageKey);
  } catch (e) {
    key = null;
  }
  if (!key) {
    key = "web-" + assignmentId + "-" + randomHex(16);
    try {
      sessionStorage.setItem(storageKey, key);
    } catch (e) {
      /* private mode: the key lives as long as the page */
    }
  }
  return key;
}

export function outboxRead() {
  try {
    return JSON.parse(localStorage.getItem(OUTBOX_KEY) || "{}") || {};
  } catch (e) {
    return {};
  }
}

function outboxWrite(box) {
  try {
    localStorage.setItem(OUTBOX_KEY, JSON.stringify(box));
  } catch (e) {
    /* storage full or disabled: the in-memory retry still runs */
  }
}

export function outboxPut(entry) {
  const box = outboxRead();
  box[entry.assignmentId] = entry;
  outboxWrite(box);
}

export function outboxDrop(assignmentId) {
  const box = outboxRead();
  if (box[assignmentId]) {
    delete box[assignmentId];
    outboxWrite(box);
  }
}

export function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.getAttribute("content") : "";
}

function requestInit(body, keepalive) {
  return {
    method: "POST",
    credentials: "same-origin",
    // keepalive: a submit already on its way still arrives when the page is left.
    keepalive: Boolean(keepalive),
    headers: {
      "Content-Type": "application/json",
      Accept: "application/json",
      "X-CSRFToken": csrfToken(),
    },
    body: body === undefined ? "{}" : JSON.stringify(body),
  };
}

/** POST JSON; resolve to {status, ok, data}, rejecting only when the network fails. */
export async function postJson(url, body, { keepalive = false } = {}) {
  const response = await fetch(url, requestInit(body, keepalive));
  let data = {};
  try {
    data = (await response.json()) || {};
  } catch (e) {
    data = {};
  }
  return { status: response.status, ok: response.ok, data };
}

function isRetryable(status) {
  return status === 0 || status === 408 || status === 429 || status >= 500;
}

function isAuthFailure(result) {
  const detail = String(result.data.detail || "");
  return (
    result.status === 401 ||
    (result.status === 403 &&
      (result.data.code === "not_authenticated" ||
        result.data.code === "authentication_failed" ||
        detail.includes("CSRF")))
  );
}

/** Return the wait before retry number `attempt`: doubling up to 30 s, with ±25 % jitter. */
export function backoffMs(attempt) {
  const base = Math.min(MAX_BACKOFF_MS, 1000 * 2 ** Math.min(attempt - 1, 5));
  return Math.round(base * (0.75 + Math.random() * 0.5));
}

/*
 * Send one outbox entry until it gets a 2xx or a definitive 4xx; call done(outcome).
 * `onWait(seconds, offline)` is told about each wait before a retry (for the status line).
 */
export function sendWithRetry(entry, done, { onTry = null, onWait = null } = {}) {
  let attempt = 0;
  let timer = null;
  let countdown = null;

  function onOnline() {
    if (timer) {
      clearTimeout(timer);
      clearInterval(countdown);
      timer = null;
      tryOnce();
    }
  }

  function schedule(result) {
    attempt += 1;
    let wait = backoffMs(attempt);
    if (result.status === 503 && result.data.code === "retry") wait = Math.max(wait, 1000);
    const until = Date.now() + wait;
    if (onWait) {
      const render = () => onWait(Math.max(0, Math.ceil((until - Date.now()) / 1000)), result.status === 0);
      render();
      countdown = setInterval(render, 1000);
    }
    window.addEventListener("online", onOnline);
    timer = setTimeout(() => {
      clearInterval(countdown);
      timer = null;
      tryOnce();
    }, wait);
  }

  async function tryOnce() {
    window.removeEventListener("online", onOnline);
    if (onTry) onTry(attempt);
    let result;
    try {
      result = await postJson(entry.url, entry.body, { keepalive: true });
    } catch (e) {
      result = { status: 0, ok: false, data: {} };
    }
    if (result.ok) {
      outboxDrop(entry.assignmentId);
      done({ ok: true, result });
    } else if (isRetryable(result.status)) {
      schedule(result);
    } else if (isAuthFailure(result)) {
      // Keep the answer: it is sent again after the annotator logs back in.
      done({ ok: false, auth: true, result });
    } else {
      outboxDrop(entry.assignmentId);
      done({ ok: false, result });
    }
  }

  tryOnce();
}

/** Send an entry once as the page goes away; it stays in the outbox until a page sees a 2xx. */
export function sendOnLeave(entry) {
  try {
    fetch(entry.url, requestInit(entry.body, true));
  } catch (e) {
    /* the outbox keeps it for the next page */
  }
}

/** Send the user's entries left by earlier pages (not those another tab is still holding). */
export function outboxFlush(user, { except = null } = {}) {
  const box = outboxRead();
  const now = Date.now();
  Object.keys(box).forEach((assignmentId) => {
    const entry = box[assignmentId];
    if (assignmentId === except || !entry || entry.user !== user) return;
    if (entry.holdUntil && entry.holdUntil > now) return;
    sendWithRetry(entry, () => {});
  });
}
