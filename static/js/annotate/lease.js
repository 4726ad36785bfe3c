/*
 * Lease: POST /api/assignments/{id}/heartbeat/ every min(60 s, lease / 3) while the item is
 * open, unless the page has had no input for 30 minutes (then the lease may lapse and the item
 * goes back to the pool; the next input checks the lease at once). The item held ahead
 * (prefetch) is renewed by the same beats, whatever the item on screen is doing.
 */
import { postJson } from "./outbox.js";

const IDLE_LIMIT_MS = 30 * 60 * 1000;

let timer = null;
let lastActivity = Date.now();
let current = null; // {item, isLive(), onLost(detail)}
let extra = null; // {url, onLost(detail)}: the item held ahead
let every = 60000;

function ensureTimer() {
  if (!timer && (current || extra)) timer = setInterval(beat, every);
}

export function stopHeartbeat() {
  current = null;
  if (!extra) {
    clearInterval(timer);
    timer = null;
  }
}

/** Renew the lease of the item held ahead too (null: none); `onLost` hears when it is gone. */
export function beatAlso(url, onLost) {
  extra = url ? { url, onLost } : null;
  ensureTimer();
}

async function beatExtra() {
  const watched = extra;
  let result;
  try {
    result = await postJson(watched.url);
  } catch (e) {
    return;
  }
  if (extra === watched && (result.status === 409 || result.status === 404)) {
    extra = null;
    watched.onLost(result.data.detail);
  }
}

async function beat() {
  // A page left open and untouched for long does not hold its items forever.
  if (Date.now() - lastActivity > IDLE_LIMIT_MS) return;
  if (extra) beatExtra();
  const watched = current;
  if (!watched || !watched.isLive()) return;
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
  const wanted = Math.max(5, Math.min(60, Math.floor(lease / 3))) * 1000;
  if (wanted !== every) {
    clearInterval(timer);
    timer = null;
    every = wanted;
  }
  ensureTimer();
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
