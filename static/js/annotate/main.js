/*
 * Task page: choose / rank, keyboard shortcuts, undo, reliable submit, heartbeat.
 *
 * Every listener is bound once per page, on the document, and reads the item on screen; an
 * item only gets its own state (and SortableJS) when htmx swaps a new one into #task. htmx
 * also fires afterSwap for the out-of-band #my-count counter, so setting up on every swap
 * would run it twice and turn one click into two actions.
 *
 * Undo: a submit is held in the browser for GRACE_MS before it is sent ("Submitting in 5 s,
 * U to undo, Enter to send now"); nothing reaches the server during that time, so undo needs
 * no server support. Enter (or Submit) a second time sends at once. Leaving the page during
 * the hold sends the answer first; closing the tab sends it with a keepalive request, and the
 * outbox (outbox.js) sends it again from the next page until the server has it.
 *
 * One round trip: the answer is sent with `"next": true` and the server's reply carries the
 * next item, rendered by the page's own template (escaped Markdown), which is shown as is.
 *
 * Prefetch (on by default, PREFETCH_DEFAULT; ?prefetch=0 turns it off, ?prefetch=1 on): the page
 * holds the next item under its own lease (POST prefetch), renewed by the heartbeat, so Enter
 * shows it at once while the answer waits out its hold off screen. Undo brings the previous
 * item back and the next one is held again. The reply to the held answer brings the item
 * after that (`"ahead": true`). Leaving the page (pagehide, or the tab hidden) releases the
 * held item; a visible tab holds one again.
 */
import {
  backoffMs,
  keyFor,
  outboxDrop,
  outboxFlush,
  outboxPut,
  outboxRead,
  postJson,
  sendOnLeave,
  sendWithRetry,
} from "./outbox.js";
import { beatAlso, startHeartbeat, stopHeartbeat, watchActivity } from "./lease.js";
import { computeRanks, onRankingClick, setupRanking, teardownRanking } from "./ranking.js";
import { keydownHandler } from "./shortcuts.js";
import { announce, setStatus, setStatusWithLink } from "./status.js";

const GRACE_MS = 5000;
const PREFETCH_DEFAULT = true;

let item = null; // the item on screen: its element, kind and phase (editing, grace, sending, done)
let held = null; // the previous item, its answer in the hold or on its way, kept off screen
let ahead = null; // the next item held under its own lease: {id, fragment, heartbeatUrl, releaseUrl}
let aheadAsked = false; // a prefetch request is on its way
let aheadDone = false; // the server had nothing more to hold ahead
const nextRetry = { timer: null, attempt: 0 };

const byId = (id) => document.getElementById(id);

function task() {
  return byId("task");
}

function userId() {
  const el = task();
  return el ? el.dataset.user : "";
}

function prefetchOn() {
  const el = task();
  if (!el || !el.dataset.prefetchUrl) return false;
  const asked = new URLSearchParams(window.location.search).get("prefetch");
  return asked === null ? PREFETCH_DEFAULT : asked === "1";
}

/* ---------- the item held ahead (prefetch) ---------- */

function fragmentFromHtml(html) {
  const template = document.createElement("template");
  template.innerHTML = html;
  return template.content;
}

function holdAhead(id, fragment) {
  const el = fragment.querySelector("#item");
  if (!el) return;
  ahead = {
    id: String(id),
    fragment,
    heartbeatUrl: el.dataset.heartbeatUrl,
    releaseUrl: el.dataset.releaseUrl,
  };
  // Said on the page too (tests and benchmarks wait for it).
  task().dataset.ahead = ahead.id;
  const mine = ahead;
  beatAlso(ahead.heartbeatUrl, () => {
    // Its lease ran out: forget it and hold another.
    if (ahead === mine) {
      dropAhead();
      requestAhead();
    }
  });
}

function dropAhead() {
  ahead = null;
  beatAlso(null);
  const el = task();
  if (el) el.dataset.ahead = "";
}

async function requestAhead() {
  if (!prefetchOn() || ahead || aheadAsked || aheadDone || held || !item) return;
  if (document.visibilityState === "hidden") return;
  aheadAsked = true;
  let result = null;
  try {
    result = await postJson(task().dataset.prefetchUrl, { html: true });
  } catch (e) {
    result = null; // offline: the next answer's reply brings the item instead
  }
  aheadAsked = false;
  if (!result) return;
  if (result.status === 204) {
    markAheadDone();
    return;
  }
  if (!result.ok || ahead || (item && String(result.data.assignment_id) === item.id)) return;
  holdAhead(result.data.assignment_id, fragmentFromHtml(result.data.html));
}

function markAheadDone() {
  aheadDone = true;
  // Said on the page too: tests wait for it to know no item will be held ahead.
  const el = task();
  if (el) el.dataset.aheadDone = "1";
}

function releaseAhead() {
  if (!ahead) return;
  sendOnLeave({ url: ahead.releaseUrl, body: {} });
  dropAhead();
}

/* ---------- swapping items in place ---------- */

function detachTask() {
  const fragment = document.createDocumentFragment();
  const el = task();
  while (el.firstChild) fragment.appendChild(el.firstChild);
  return fragment;
}

function showFragment(fragment) {
  const el = task();
  el.replaceChildren(fragment);
  if (window.htmx) window.htmx.process(el);
  itemShown();
}

function bumpCount() {
  const count = byId("my-count");
  if (count && /^\d+$/.test(count.textContent.trim())) {
    count.textContent = String(parseInt(count.textContent, 10) + 1);
  }
}

/* ---------- loading the next item (htmx) ---------- */

function loadNext() {
  const el = task();
  if (!el || !window.htmx) return;
  clearTimeout(nextRetry.timer);
  stopHeartbeat();
  window.htmx.ajax("POST", el.dataset.nextUrl, { target: "#task", swap: "innerHTML" });
}

function onHtmxError(event) {
  const detail = event.detail || {};
  const path = (detail.requestConfig && detail.requestConfig.path) || "";
  const el = task();
  if (el && path === el.dataset.nextUrl) {
    nextRetry.attempt += 1;
    const wait = backoffMs(nextRetry.attempt);
    setStatus("Saved. Offline: loading the next item again in " + Math.ceil(wait / 1000) + " s", "offline");
    clearTimeout(nextRetry.timer);
    nextRetry.timer = setTimeout(loadNext, wait);
    window.addEventListener("online", loadNext, { once: true });
  } else if (detail.elt && detail.elt.id === "skip-form") {
    setStatus("Could not skip: no connection. Try again.", "error");
  }
}

/* ---------- reading the form ---------- */

function checkedValue(name) {
  const input = item.el.querySelector('input[name="' + name + '"]:checked');
  return input ? input.value : "";
}

function pick(name, value) {
  if (!item) return false;
  const input = item.el.querySelector('input[name="' + name + '"][value="' + value + '"]');
  if (!input || input.disabled) return false;
  input.checked = true;
  input.dispatchEvent(new Event("change", { bubbles: true }));
  return true;
}

function updateStrengthEnabled() {
  const choice = checkedValue("choice");
  const enabled = choice === "A" || choice === "B";
  item.el.querySelectorAll('input[name="strength"]').forEach((input) => {
    input.disabled = !enabled;
    if (!enabled) input.checked = false;
  });
}

function collect() {
  const body = { idempotency_key: item.key };
  if (item.kind === "pairwise") {
    const choice = checkedValue("choice");
    if (!choice) return { error: "Choose an answer first." };
    body.choice = choice;
    const strength = checkedValue("strength");
    if (strength && (choice === "A" || choice === "B")) body.strength = strength;
  } else {
    if (!item.touched && !item.confirmUnchanged) {
      item.confirmUnchanged = true;
      return { error: "You have not moved any card. Submit again to keep this order." };
    }
    body.ranking = computeRanks(item);
  }
  const confidence = checkedValue("confidence");
  if (confidence) body.confidence = parseInt(confidence, 10);
  const rationale = byId("rationale");
  if (rationale && rationale.value.trim()) body.rationale = rationale.value;
  return { body };
}

/* ---------- the action bar ---------- */

function showActions(shown) {
  const actions = byId("item-actions");
  if (actions) actions.hidden = !shown;
}

function setLocked(locked) {
  item.el.classList.toggle("is-pending", locked);
  if (locked !== item.locked) {
    item.el.querySelectorAll("input, textarea, .rank-card button").forEach((input) => {
      if (input.closest("#skip-dialog")) return;
      if (locked) {
        input.dataset.wasDisabled = input.disabled ? "1" : "0";
        input.disabled = true;
      } else {
        input.disabled = input.dataset.wasDisabled === "1";
      }
    });
    item.locked = locked;
  }
  if (item.sortable) item.sortable.option("disabled", locked);
  const submit = byId("submit-btn");
  const skip = byId("skip-btn");
  const undoButton = byId("undo-btn");
  if (skip) skip.disabled = locked;
  if (undoButton) undoButton.hidden = !((locked && item.phase === "grace") || heldInGrace());
  if (submit) {
    submit.disabled = locked && item.phase !== "grace";
    submit.firstChild.textContent = item.phase === "grace" ? "Send now " : "Submit ";
  }
  if (!locked) updateStrengthEnabled();
}

/* ---------- submit, undo, send ---------- */

function heldInGrace() {
  return Boolean(held && held.phase === "grace");
}

/** The answer waiting out its hold: the item on screen's, or the previous item's. */
function inGrace() {
  if (item && item.phase === "grace") return item;
  return heldInGrace() ? held : null;
}

function startHold(target) {
  const render = () => {
    const seconds = Math.max(0, Math.ceil((target.graceEnds - Date.now()) / 1000));
    setStatus(
      target === item
        ? "Submitting in " + seconds + " s — U to undo, Enter to send now"
        : "Submitting the previous answer in " + seconds + " s — U to undo",
      "pending"
    );
  };
  render();
  announce(
    target === item
      ? "Answer held for 5 seconds. Press U to undo."
      : "Next item. The previous answer is held for 5 seconds; press U to undo."
  );
  target.graceTick = setInterval(render, 250);
  target.graceTimer = setTimeout(() => sendNow(target), GRACE_MS);
}

/** Show the item held ahead; the item on screen, its answer in the hold, waits off screen. */
function swapToAhead() {
  const previous = item;
  setLocked(false); // undo brings it back ready to change
  teardownRanking(previous);
  previous.fragment = detachTask();
  held = previous;
  item = null;
  const next = ahead;
  dropAhead();
  showFragment(next.fragment);
  setLocked(false);
}

function commit() {
  if (!item) return;
  if (item.phase === "grace") {
    sendNow(item);
    return;
  }
  if (item.phase !== "editing") return;
  const collected = collect();
  if (collected.error) {
    setStatus(collected.error, "warn");
    announce(collected.error);
    return;
  }
  collected.body.time_spent_ms = Math.round(performance.now() - item.shownAt);
  // One answer waits at a time: an earlier one still in its hold goes now.
  if (heldInGrace()) sendNow(held);
  item.graceEnds = Date.now() + GRACE_MS;
  item.entry = {
    user: userId(),
    assignmentId: item.id,
    url: item.el.dataset.submitUrl,
    body: collected.body,
    holdUntil: item.graceEnds,
  };
  outboxPut(item.entry);
  item.phase = "grace";
  if (ahead && !held) {
    // The next item is already here: show it in this frame; the answer waits off screen.
    const previous = item;
    swapToAhead();
    startHold(previous);
    setLocked(false);
    return;
  }
  setLocked(true);
  startHold(item);
}

function undo() {
  if (item && item.phase === "grace") {
    clearTimeout(item.graceTimer);
    clearInterval(item.graceTick);
    outboxDrop(item.id);
    item.phase = "editing";
    item.entry = null;
    item.leave = null;
    setLocked(false);
  } else if (heldInGrace()) {
    // The item on screen is held ahead again (as it is, with anything chosen on it) and the
    // previous one comes back, ready to change.
    const back = held;
    clearTimeout(back.graceTimer);
    clearInterval(back.graceTick);
    outboxDrop(back.id);
    held = null;
    const shownId = item ? item.id : null;
    teardownItem();
    stopHeartbeat();
    const fragment = detachTask();
    if (shownId) holdAhead(shownId, fragment);
    showFragment(back.fragment);
  } else {
    return;
  }
  setStatus("Undone. Change your answer and submit again.", "info", 4000);
  announce("Undone.");
}

function sendNow(target) {
  if (!target || target.phase !== "grace") return;
  clearTimeout(target.graceTimer);
  clearInterval(target.graceTick);
  target.phase = "sending";
  target.entry.holdUntil = 0;
  outboxPut(target.entry);
  if (target === item) setLocked(true);
  else if (item) setLocked(item.locked);
  // The reply carries the next item (and, with prefetch, the one after it), ready to show.
  const extra = target.leave ? {} : { next: true, ahead: prefetchOn(), html: true };
  const wire = { ...target.entry, body: { ...target.entry.body, ...extra } };
  const watching = () => item === target || (held === target && !target.leave);
  sendWithRetry(wire, (outcome) => submitted(target, outcome), {
    onTry: (attempt) => {
      if (item === target) setStatus(attempt ? "Saving… (try " + (attempt + 1) + ")" : "Saving…", "saving");
    },
    onWait: (seconds, offline) => {
      if (!watching()) return;
      const why = offline ? "Offline" : "Server busy";
      setStatus(why + ", retrying in " + seconds + " s — your answer is kept", "offline");
    },
  });
}

/** Show what the reply to a sent answer brings: the next item and the one held after it. */
function applyReply(target, data) {
  const next = data.next;
  if (data.ahead) {
    const aheadId = String(data.ahead.assignment_id);
    if (!ahead && (!item || item.id !== aheadId)) holdAhead(aheadId, fragmentFromHtml(data.ahead.html));
  } else if (data.ahead === null) {
    markAheadDone();
  }
  if (target === item) {
    if (!next) {
      loadNext(); // nothing left, paused or out of skips: the page says which
      return;
    }
    const nextId = String(next.assignment_id);
    if (ahead && ahead.id === nextId) {
      const fragment = ahead.fragment;
      dropAhead();
      showFragment(fragment);
    } else {
      showFragment(fragmentFromHtml(next.html));
    }
    return;
  }
  // The previous item's reply: the item on screen is its next one; if the server had to
  // serve another (the held lease was lost), show that instead.
  if (next && item && item.phase === "editing" && item.id !== String(next.assignment_id)) {
    showFragment(fragmentFromHtml(next.html));
  } else if (ahead && item && item.phase === "grace" && !held) {
    // The item on screen was answered while this reply was on its way: show the next now.
    swapToAhead();
  }
  requestAhead();
}

function submitted(current, outcome) {
  const onScreen = item === current;
  if (!onScreen && held !== current) return;
  const result = outcome.result;
  if (outcome.ok || (result.status === 409 && result.data.code === "already_submitted")) {
    current.phase = "done";
    if (held === current) held = null;
    if (current.leave) {
      current.leave();
      return;
    }
    if (result.status === 201) bumpCount();
    setStatus("Saved", "saved", 2500);
    announce(onScreen ? "Saved. Next item." : "Previous answer saved.");
    nextRetry.attempt = 0;
    if (outcome.ok && "next" in result.data) applyReply(current, result.data);
    else if (onScreen) loadNext();
    else requestAhead();
    if (item) setLocked(item.locked);
    return;
  }
  if (!onScreen) {
    // The previous item's answer was refused or can no longer be recorded.
    if (outcome.auth) {
      setStatusWithLink(
        "You are logged out. Your answer is kept and will be sent when you come back:",
        "log in",
        "/accounts/login/",
        "error"
      );
      return;
    }
    current.phase = "done";
    held = null;
    setStatus("Previous answer not saved: " + (result.data.detail || "the item is no longer yours."), "error", 8000);
    // The item on screen was leased on the same terms (a pause expires both leases): ask the
    // server what to show, unless that item's own answer is already under way.
    if (item && item.phase === "editing") loadNext();
    else requestAhead();
    return;
  }
  if (outcome.auth) {
    current.phase = "sending";
    current.leave = null;
    setStatusWithLink(
      "You are logged out. Your answer is kept and will be sent when you come back:",
      "log in",
      "/accounts/login/",
      "error"
    );
    return;
  }
  if (result.status === 400) {
    current.phase = "editing";
    current.leave = null;
    setLocked(false);
    setStatus("Not saved: " + (result.data.detail || "the answer was refused."), "error");
    return;
  }
  // Expired lease, skipped, not found, paused: this answer cannot be recorded.
  current.phase = "done";
  if (current.leave) {
    current.leave();
    return;
  }
  setStatus("Not saved: " + (result.data.detail || "the item is no longer yours."), "error", 8000);
  loadNext();
}

/* ---------- leaving the page during the hold ---------- */

function leaveAfterSending(leave) {
  const target = inGrace();
  target.leave = leave;
  setStatus("Sending your answer before you leave…", "saving");
  releaseAhead();
  sendNow(target);
}

function onLinkClick(event) {
  if (!inGrace() || event.defaultPrevented) return;
  if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
  const link = event.target.closest && event.target.closest("a[href]");
  if (!link || link.target === "_blank" || link.hasAttribute("download")) return;
  const url = new URL(link.href, window.location.href);
  if (url.origin !== window.location.origin || (url.hash && url.pathname === window.location.pathname)) return;
  event.preventDefault();
  leaveAfterSending(() => window.location.assign(url.href));
}

function onFormSubmit(event) {
  const form = event.target;
  if (form.id === "judgment-form") {
    event.preventDefault();
    commit();
  } else if (inGrace() && !form.closest("#task")) {
    // Log out (or any other form of the page) waits until the held answer is sent.
    event.preventDefault();
    leaveAfterSending(() => form.submit());
  }
}

function onPageHide() {
  releaseAhead();
  const target = inGrace();
  if (!target) return;
  // The tab is closing or navigating away: send now; the outbox keeps it until confirmed.
  target.entry.holdUntil = 0;
  outboxPut(target.entry);
  sendOnLeave(target.entry);
}

function onVisibilityChange() {
  // A hidden tab (often the last event a phone sends) gives the held item back; a visible
  // one holds one again.
  if (document.visibilityState === "hidden") releaseAhead();
  else requestAhead();
}

function onBeforeUnload(event) {
  if ((item && item.phase === "sending") || (held && held.phase === "sending")) {
    event.preventDefault();
    event.returnValue = "";
  }
}

/* ---------- skip ---------- */

function openSkip() {
  const dialog = byId("skip-dialog");
  if (!dialog || !item || item.phase !== "editing") return;
  if (held) {
    // The server serves the previous item until its answer is in: send it first.
    if (heldInGrace()) sendNow(held);
    setStatus("Sending the previous answer first; skip again in a moment.", "info", 4000);
    return;
  }
  dialog.showModal();
  const first = dialog.querySelector('input[name="reason"]:checked') || dialog.querySelector("input");
  if (first) first.focus();
}

function onSkipRequest(event) {
  const form = event.detail && event.detail.elt;
  if (!form || form.id !== "skip-form") return;
  const other = byId("reason-other");
  if (form.reason && form.reason.value === "other" && !other.value.trim()) {
    event.preventDefault();
    other.focus();
    setStatus("Say why you skip it.", "warn", 4000);
    return;
  }
  stopHeartbeat();
}

/* ---------- clicks and changes (bound once) ---------- */

function onClick(event) {
  const target = event.target;
  if (!target.closest) return;
  if (target.closest("#undo-btn")) {
    undo();
  } else if (target.closest("#skip-btn")) {
    openSkip();
  } else if (target.closest("#skip-dialog .dialog-cancel")) {
    byId("skip-dialog").close();
  } else if (item && item.phase === "editing" && target.closest("#ranking button")) {
    onRankingClick(item, event);
  } else {
    onLinkClick(event);
  }
}

function onChange(event) {
  if (!item) return;
  const name = event.target.name;
  if (name === "choice") updateStrengthEnabled();
  else if (name === "reason" && event.target.closest("#skip-dialog")) {
    byId("reason-other").required = event.target.value === "other";
  }
}

/* ---------- set-up per item ---------- */

function teardownItem() {
  if (!item) return;
  clearTimeout(item.graceTimer);
  clearInterval(item.graceTick);
  teardownRanking(item);
  item = null;
}

function setupItem() {
  const el = byId("item");
  if (item && item.el === el) return; // the same item: nothing to set up again
  teardownItem();
  stopHeartbeat();
  showActions(Boolean(el));
  if (!el) return;
  const id = el.dataset.assignment;
  item = {
    el,
    id,
    kind: el.dataset.kind,
    k: parseInt(el.dataset.k, 10),
    allowTies: el.dataset.allowTiedRanks === "1",
    key: keyFor(id),
    shownAt: performance.now(),
    phase: "editing",
    touched: false,
    confirmUnchanged: false,
    sortable: null,
    entry: null,
    leave: null,
    locked: false,
  };
  if (item.kind === "ranking") setupRanking(item);
  setLocked(false);
  // The server serves the held item as the current one once the one before is gone (a
  // skip, a reload): it is on screen now, no longer ahead.
  if (ahead && ahead.id === id) dropAhead();
  requestAhead();
  const current = item;
  startHeartbeat(current, {
    isLive: () => item === current && current.phase === "editing",
    onLost: (detail) => {
      if (item !== current) return;
      setStatus((detail || "The lease on this item ran out.") + " Press K to skip or reload for a new item.", "warn");
    },
  });

  // An answer to this very item may be waiting in the outbox (page reloaded while saving).
  const pending = outboxRead()[id];
  if (pending && pending.user === userId()) {
    item.entry = pending;
    item.phase = "grace";
    setLocked(true);
    sendNow(item);
  }
}

function onAfterSwap(event) {
  // Only the swap into #task brings a new item; out-of-band swaps (#my-count) do not.
  if (event.target !== task()) return;
  itemShown();
}

function itemShown() {
  nextRetry.attempt = 0;
  setupItem();
  const focusTarget = byId("item") || document.querySelector("#task [tabindex='-1']");
  window.scrollTo(0, 0);
  if (focusTarget) focusTarget.focus({ preventScroll: true });
}

function start() {
  document.addEventListener("keydown", keydownHandler({ item: () => item, canUndo: () => Boolean(inGrace()), commit, undo, openSkip, pick }));
  document.addEventListener("click", onClick);
  document.addEventListener("change", onChange);
  document.addEventListener("submit", onFormSubmit);
  document.addEventListener("htmx:beforeRequest", onSkipRequest);
  document.addEventListener("htmx:afterRequest", (event) => {
    const elt = event.detail.elt;
    if (elt && elt.id === "skip-form" && event.detail.successful) setStatus("Skipped", "saved", 2500);
  });
  document.addEventListener("htmx:sendError", onHtmxError);
  document.addEventListener("htmx:responseError", onHtmxError);
  document.addEventListener("htmx:afterSwap", onAfterSwap);
  window.addEventListener("beforeunload", onBeforeUnload);
  window.addEventListener("pagehide", onPageHide);
  document.addEventListener("visibilitychange", onVisibilityChange);
  window.addEventListener("pageshow", (event) => {
    if (event.persisted) requestAhead();
  });
  watchActivity();
  setupItem();
  outboxFlush(userId(), { except: item ? item.id : null });
}

start();
