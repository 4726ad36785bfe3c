/* The status line in the action bar and the screen-reader live region. */

let clearTimer = null;

function statusElement() {
  return document.getElementById("save-status");
}

/** Show `text` in the status line; clear it after `clearAfterMs` when given. */
export function setStatus(text, kind, clearAfterMs) {
  const el = statusElement();
  if (!el) return;
  clearTimeout(clearTimer);
  el.textContent = text;
  el.dataset.kind = kind || "idle";
  if (clearAfterMs) {
    clearTimer = setTimeout(() => {
      el.textContent = "";
      el.dataset.kind = "idle";
    }, clearAfterMs);
  }
}

/** Show `text` followed by a link that opens in a new tab (the page keeps its answer). */
export function setStatusWithLink(text, linkText, href, kind) {
  const el = statusElement();
  if (!el) return;
  clearTimeout(clearTimer);
  el.textContent = text + " ";
  const link = document.createElement("a");
  link.href = href;
  link.target = "_blank";
  link.rel = "noopener";
  link.textContent = linkText;
  el.appendChild(link);
  el.dataset.kind = kind || "error";
}

/** Read `text` aloud through the assertive live region. */
export function announce(text) {
  const el = document.getElementById("live");
  if (!el) return;
  el.textContent = "";
  // A new text node after a tick makes screen readers read repeated messages again.
  setTimeout(() => {
    el.textContent = text;
  }, 30);
}
