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
 */
import {
  backoffMs,
  keyFor,
  outboxDrop,
  outboxFlush,
  outboxPut,
  outboxRead,
  sendOnLeave,
  sendWithRetry,
} from "./outbox.js";
import { startHeartbeat, stopHeartbeat, watchActivity } from "./lease.js";
import { computeRanks, onRankingClick, setupRanking, teardownRanking } from "./ranking.js";
import { keydownHandler } from "./shortcuts.js";
import { announce, setStatus, setStatusWithLink } from "./status.js";

const GRACE_MS = 5000;

let item = null; // the item on screen: its element, kind and phase (editing, grace, sending, done)
const nextRetry = { timer: null, attempt: 0 };

const byId = (id) => document.getElementById(id);

function task() {
  return byId("task");
}

function userId() {
  const el = task();
  return el ? el.dataset.user : "";
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
  if (undoButton) undoButton.hidden = !(locked && item.phase === "grace");
  if (submit) {
    submit.disabled = locked && item.phase !== "grace";
    submit.firstChild.textContent = item.phase === "grace" ? "Send now " : "Submit ";
  }
  if (!locked) updateStrengthEnabled();
}

/* ---------- submit, undo, send ---------- */

function commit() {
  if (!item) return;
  if (item.phase === "grace") {
    sendNow();
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
  setLocked(true);
  const held = item;
  const render = () => {
    const seconds = Math.max(0, Math.ceil((held.graceEnds - Date.now()) / 1000));
    setStatus("Submitting in " + seconds + " s — U to undo, Enter to send now", "pending");
  };
  render();
  announce("Answer held for 5 seconds. Press U to undo.");
  item.graceTick = setInterval(render, 250);
  item.graceTimer = setTimeout(sendNow, GRACE_MS);
}

function undo() {
  if (!item || item.phase !== "grace") return;
  clearTimeout(item.graceTimer);
  clearInterval(item.graceTick);
  outboxDrop(item.id);
  item.phase = "editing";
  item.entry = null;
  item.leave = null;
  setLocked(false);
  setStatus("Undone. Change your answer and submit again.", "info", 4000);
  announce("Undone.");
}

function sendNow() {
  if (!item || item.phase !== "grace") return;
  clearTimeout(item.graceTimer);
  clearInterval(item.graceTick);
  item.phase = "sending";
  item.entry.holdUntil = 0;
  outboxPut(item.entry);
  setLocked(true);
  const current = item;
  sendWithRetry(current.entry, (outcome) => submitted(current, outcome), {
    onTry: (attempt) => {
      if (item === current) setStatus(attempt ? "Saving… (try " + (attempt + 1) + ")" : "Saving…", "saving");
    },
    onWait: (seconds, offline) => {
      if (item !== current) return;
      const why = offline ? "Offline" : "Server busy";
      setStatus(why + ", retrying in " + seconds + " s — your answer is kept", "offline");
    },
  });
}

function submitted(current, outcome) {
  if (item !== current) return;
  const result = outcome.result;
  if (outcome.ok || (result.status === 409 && result.data.code === "already_submitted")) {
    current.phase = "done";
    if (current.leave) {
      current.leave();
      return;
    }
    setStatus("Saved", "saved", 2500);
    announce("Saved. Loading the next item.");
    nextRetry.attempt = 0;
    loadNext();
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
  item.leave = leave;
  setStatus("Sending your answer before you leave…", "saving");
  sendNow();
}

function onLinkClick(event) {
  if (!item || item.phase !== "grace" || event.defaultPrevented) return;
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
  } else if (item && item.phase === "grace" && !form.closest("#task")) {
    // Log out (or any other form of the page) waits until the held answer is sent.
    event.preventDefault();
    leaveAfterSending(() => form.submit());
  }
}

function onPageHide() {
  if (!item || item.phase !== "grace") return;
  // The tab is closing or navigating away: send now; the outbox keeps it until confirmed.
  item.entry.holdUntil = 0;
  outboxPut(item.entry);
  sendOnLeave(item.entry);
}

function onBeforeUnload(event) {
  if (item && item.phase === "sending") {
    event.preventDefault();
    event.returnValue = "";
  }
}

/* ---------- skip ---------- */

function openSkip() {
  const dialog = byId("skip-dialog");
  if (!dialog || !item || item.phase !== "editing") return;
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
    sendNow();
  }
}

function onAfterSwap(event) {
  // Only the swap into #task brings a new item; out-of-band swaps (#my-count) do not.
  if (event.target !== task()) return;
  nextRetry.attempt = 0;
  setupItem();
  const focusTarget = byId("item") || document.querySelector("#task [tabindex='-1']");
  window.scrollTo(0, 0);
  if (focusTarget) focusTarget.focus({ preventScroll: true });
}

function start() {
  document.addEventListener("keydown", keydownHandler({ item: () => item, commit, undo, openSkip, pick }));
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
  watchActivity();
  setupItem();
  outboxFlush(userId(), { except: item ? item.id : null });
}

start();
