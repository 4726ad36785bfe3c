/*
 * Lease: POST /api/assignments/{id}/heartbeat/ every min(60 s, lease / 3) while the item is
 * open, unless the page has had no input for 30 minutes (then the lease may lapse and the item
 * goes back to the pool; the next input checks the lease at once).
 */
import { postJson } from "./outbox.js";

const IDLE_LIMIT_MS = 30 * 60 * 1000;

let timer = null;
let lastActivity = Date.now();
let current = null; // {item, isLive(), onLost(detail)}

export function stopHeartbeat() {
  clearInterval(timer);
  timer = null;
  current = null;
}

async function beat() {
  const watched = current;
  if (!watched || !watched.isLive()) return;
  // A page left open and untouched for long does not hold its item forever.
  if (Date.now() - lastActivity > IDLE_LIMIT_MS) return;
  let result;
  try {
    result = await postJson(watched.item.el.dataset.heartbeatUrl);
  } catch (e) {
    return; // offline: the next beat tries again
  }
  if (current !== watched) return;
  if (result.status === 409 || result.status === 404) {
    stopHeartbeat();
    watched.onLost(result.data.detail);
  }
}

/** Keep the item's lease alive; `isLive()` says whether it still needs it. */
export function startHeartbeat(item, { isLive, onLost }) {
  stopHeartbeat();
  current = { item, isLive, onLost };
  const lease = parseInt(item.el.dataset.leaseSeconds, 10) || 300;
  const every = Math.max(5, Math.min(60, Math.floor(lease / 3))) * 1000;
  timer = setInterval(beat, every);
}

/** Track input once per page, so a return from a long break checks the lease at once. */
export function watchActivity() {
  ["keydown", "pointerdown", "wheel", "scroll", "touchstart"].forEach((type) => {
    document.addEventListener(
      type,
      () => {
        const wasIdle = Date.now() - lastActivity > IDLE_LIMIT_MS;
        lastActivity = Date.now();
        if (wasIdle) beat();
      },
      { passive: true, capture: true }
    );
  });
}
