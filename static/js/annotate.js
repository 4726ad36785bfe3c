/*
 * Task page: choose / rank, keyboard shortcuts, undo, reliable submit, heartbeat.
 *
 * Undo: a submit is held in the browser for GRACE_MS before it is sent ("Submitting in 5 s,
 * U to undo, Enter to send now"); nothing reaches the server during that time, so undo needs
 * no server support. Enter a second time sends at once.
 *
 * Reliability: the idempotency key is made once per assignment (kept in sessionStorage). The
 * submit is written to a localStorage outbox before it is sent and retried with exponential
 * backoff on network errors, 408, 429 and 5xx until a 2xx or a definitive 4xx, and again after
 * a reload. The server answers a repeated key with the first judgment, so a retry never counts
 * twice. The next item is swapped in by htmx only after the server has the judgment.
 *
 * Lease: POST /api/assignments/{id}/heartbeat/ every min(60 s, lease / 3) while the item is
 * open, unless the page has had no input for 30 minutes (then the lease may lapse and the item
 * goes back to the pool; the next input checks the lease at once).
 */
(function () {
  "use strict";

  var GRACE_MS = 5000;
  var OUTBOX_KEY = "prefloop.outbox.v1";
  var MAX_BACKOFF_MS = 30000;
  var IDLE_LIMIT_MS = 30 * 60 * 1000;

  var state = null; // the item on screen
  var heartbeatTimer = null;
  var nextRetry = { timer: null, attempt: 0 };
  var statusTimer = null;
  var lastActivity = Date.now();

  function $(selector, root) {
    return (root || document).querySelector(selector);
  }

  function $all(selector, root) {
    return Array.prototype.slice.call((root || document).querySelectorAll(selector));
  }

  function task() {
    return document.getElementById("task");
  }

  function userId() {
    var el = task();
    return el ? el.dataset.user : "";
  }

  /* ---------- status line and live region ---------- */

  function setStatus(text, kind, clearAfterMs) {
    var el = document.getElementById("save-status");
    if (!el) return;
    clearTimeout(statusTimer);
    el.textContent = text;
    el.dataset.kind = kind || "idle";
    if (clearAfterMs) {
      statusTimer = setTimeout(function () {
        el.textContent = "";
        el.dataset.kind = "idle";
      }, clearAfterMs);
    }
  }

  function setStatusWithLink(text, linkText, href, kind) {
    var el = document.getElementById("save-status");
    if (!el) return;
    clearTimeout(statusTimer);
    el.textContent = text + " ";
    var link = document.createElement("a");
    link.href = href;
    link.target = "_blank";
    link.rel = "noopener";
    link.textContent = linkText;
    el.appendChild(link);
    el.dataset.kind = kind || "error";
  }

  function announce(text) {
    var el = document.getElementById("live");
    if (!el) return;
    el.textContent = "";
    // A new text node after a tick makes screen readers read repeated messages again.
    setTimeout(function () {
      el.textContent = text;
    }, 30);
  }

  /* ---------- idempotency key and outbox ---------- */

  function randomHex(bytes) {
    var buffer = new Uint8Array(bytes);
    window.crypto.getRandomValues(buffer);
    return Array.prototype.map
      .call(buffer, function (b) {
        return b.toString(16).padStart(2, "0");
      })
      .join("");
  }

  function keyFor(assignmentId) {
    var storageKey = "prefloop.key." + assignmentId;
    var key = null;
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

  function outboxRead() {
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

  function outboxPut(entry) {
    var box = outboxRead();
    box[entry.assignmentId] = entry;
    outboxWrite(box);
  }

  function outboxDrop(assignmentId) {
    var box = outboxRead();
    if (box[assignmentId]) {
      delete box[assignmentId];
      outboxWrite(box);
    }
  }

  /* ---------- network ---------- */

  function postJson(url, body) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: {
        "Content-Type": "application/json",
        Accept: "application/json",
        "X-CSRFToken": window.prefloop.csrfToken(),
      },
      body: body === undefined ? "{}" : JSON.stringify(body),
    }).then(function (response) {
      return response
        .json()
        .catch(function () {
          return {};
        })
        .then(function (data) {
          return { status: response.status, ok: response.ok, data: data || {} };
        });
    });
  }

  function isRetryable(status) {
    return status === 0 || status === 408 || status === 429 || status >= 500;
  }

  function isAuthFailure(result) {
    var detail = String(result.data.detail || "");
    return (
      result.status === 401 ||
      (result.status === 403 &&
        (result.data.code === "not_authenticated" ||
          result.data.code === "authentication_failed" ||
          detail.indexOf("CSRF") !== -1))
    );
  }

  function backoffMs(attempt) {
    var base = Math.min(MAX_BACKOFF_MS, 1000 * Math.pow(2, Math.min(attempt - 1, 5)));
    return Math.round(base * (0.75 + Math.random() * 0.5));
  }

  /*
   * Send one outbox entry until it gets a 2xx or a definitive 4xx; call done(result).
   * `quiet` entries (left over from an earlier page) do not drive the status line.
   */
  function sendWithRetry(entry, done, quiet) {
    var attempt = 0;
    var timer = null;
    var countdown = null;

    function onOnline() {
      if (timer) {
        clearTimeout(timer);
        clearInterval(countdown);
        timer = null;
        tryOnce();
      }
    }

    function tryOnce() {
      window.removeEventListener("online", onOnline);
      if (!quiet) setStatus(attempt ? "Saving… (try " + (attempt + 1) + ")" : "Saving…", "saving");
      postJson(entry.url, entry.body)
        .catch(function () {
          return { status: 0, ok: false, data: {} };
        })
        .then(function (result) {
          if (result.ok) {
            outboxDrop(entry.assignmentId);
            done({ ok: true, result: result });
          } else if (isRetryable(result.status)) {
            schedule(result);
          } else if (isAuthFailure(result)) {
            // Keep the answer: it is sent again after the annotator logs back in.
            done({ ok: false, auth: true, result: result });
          } else {
            outboxDrop(entry.assignmentId);
            done({ ok: false, result: result });
          }
        });
    }

    function schedule(result) {
      attempt += 1;
      var wait = backoffMs(attempt);
      if (result && result.status === 503 && result.data.code === "retry") wait = Math.max(wait, 1000);
      var until = Date.now() + wait;
      if (!quiet) {
        var render = function () {
          var seconds = Math.max(0, Math.ceil((until - Date.now()) / 1000));
          var why = result.status === 0 ? "Offline" : "Server busy";
          setStatus(why + ", retrying in " + seconds + " s — your answer is kept", "offline");
        };
        render();
        countdown = setInterval(render, 1000);
      }
      window.addEventListener("online", onOnline);
      timer = setTimeout(function () {
        clearInterval(countdown);
        timer = null;
        tryOnce();
      }, wait);
    }

    tryOnce();
  }

  /* ---------- loading the next item (htmx) ---------- */

  function loadNext() {
    var el = task();
    if (!el || !window.htmx) return;
    clearTimeout(nextRetry.timer);
    stopHeartbeat();
    window.htmx.ajax("POST", el.dataset.nextUrl, { target: "#task", swap: "innerHTML" });
  }

  function onHtmxError(event) {
    var detail = event.detail || {};
    var path = (detail.requestConfig && detail.requestConfig.path) || "";
    var el = task();
    if (el && path === el.dataset.nextUrl) {
      nextRetry.attempt += 1;
      var wait = backoffMs(nextRetry.attempt);
      setStatus("Saved. Offline: loading the next item again in " + Math.ceil(wait / 1000) + " s", "offline");
      clearTimeout(nextRetry.timer);
      nextRetry.timer = setTimeout(loadNext, wait);
      window.addEventListener("online", loadNext, { once: true });
    } else if (detail.elt && detail.elt.id === "skip-form") {
      setStatus("Could not skip: no connection. Try again.", "error");
    }
  }

  /* ---------- heartbeat ---------- */

  function stopHeartbeat() {
    clearInterval(heartbeatTimer);
    heartbeatTimer = null;
  }

  function startHeartbeat() {
    stopHeartbeat();
    if (!state) return;
    var lease = parseInt(state.el.dataset.leaseSeconds, 10) || 300;
    var every = Math.max(5, Math.min(60, Math.floor(lease / 3))) * 1000;
    heartbeatTimer = setInterval(beat, every);
  }

  function beat() {
    if (!state || state.phase !== "editing") return;
    // A page left open and untouched for long does not hold its item forever.
    if (Date.now() - lastActivity > IDLE_LIMIT_MS) return;
    var current = state;
    postJson(current.el.dataset.heartbeatUrl)
      .then(function (result) {
        if (state !== current) return;
        if (result.status === 409 || result.status === 404) leaseLost(result.data.detail);
      })
      .catch(function () {
        /* offline: the next beat tries again */
      });
  }

  function leaseLost(detail) {
    stopHeartbeat();
    setStatus((detail || "The lease on this item ran out.") + " Press K to skip or reload for a new item.", "warn");
  }

  /* ---------- reading the form ---------- */

  function checkedValue(name) {
    var input = state.el.querySelector('input[name="' + name + '"]:checked');
    return input ? input.value : "";
  }

  function pick(name, value) {
    var input = state.el.querySelector('input[name="' + name + '"][value="' + value + '"]');
    if (!input || input.disabled) return false;
    input.checked = true;
    input.dispatchEvent(new Event("change", { bubbles: true }));
    return true;
  }

  function updateStrengthEnabled() {
    var choice = checkedValue("choice");
    var enabled = choice === "A" || choice === "B";
    $all('input[name="strength"]', state.el).forEach(function (input) {
      input.disabled = !enabled;
      if (!enabled) input.checked = false;
    });
  }

  function collect() {
    var body = { idempotency_key: state.key };
    if (state.kind === "pairwise") {
      var choice = checkedValue("choice");
      if (!choice) return { error: "Choose an answer first." };
      body.choice = choice;
      var strength = checkedValue("strength");
      if (strength && (choice === "A" || choice === "B")) body.strength = strength;
    } else {
      if (!state.touched && !state.confirmUnchanged) {
        state.confirmUnchanged = true;
        return { error: "You have not moved any card. Press Enter again to submit this order." };
      }
      body.ranking = computeRanks();
    }
    var confidence = checkedValue("confidence");
    if (confidence) body.confidence = parseInt(confidence, 10);
    var rationale = document.getElementById("rationale");
    if (rationale && rationale.value.trim()) body.rationale = rationale.value;
    return { body: body };
  }

  function setLocked(locked) {
    state.el.classList.toggle("is-pending", locked);
    if (locked !== state.locked) {
      $all("input, textarea, .rank-card button", state.el).forEach(function (input) {
        if (input.closest("#skip-dialog")) return;
        if (locked) {
          input.dataset.wasDisabled = input.disabled ? "1" : "0";
          input.disabled = true;
        } else {
          input.disabled = input.dataset.wasDisabled === "1";
        }
      });
      state.locked = locked;
    }
    if (state.sortable) state.sortable.option("disabled", locked);
    var submit = document.getElementById("submit-btn");
    var skip = document.getElementById("skip-btn");
    var undoBtn = document.getElementById("undo-btn");
    if (skip) skip.disabled = locked;
    if (undoBtn) undoBtn.hidden = !(locked && state.phase === "grace");
    if (submit) {
      submit.disabled = locked && state.phase !== "grace";
      submit.firstChild.textContent = state.phase === "grace" ? "Send now " : "Submit ";
    }
    if (!locked) updateStrengthEnabled();
  }

  /* ---------- submit, undo, send ---------- */

  function commit() {
    if (!state) return;
    if (state.phase === "grace") {
      sendNow();
      return;
    }
    if (state.phase !== "editing") return;
    var collected = collect();
    if (collected.error) {
      setStatus(collected.error, "warn");
      announce(collected.error);
      return;
    }
    collected.body.time_spent_ms = Math.round(performance.now() - state.shownAt);
    state.entry = {
      user: userId(),
      assignmentId: state.id,
      url: state.el.dataset.submitUrl,
      body: collected.body,
    };
    outboxPut(state.entry);
    state.phase = "grace";
    setLocked(true);
    state.graceEnds = Date.now() + GRACE_MS;
    var render = function () {
      var seconds = Math.max(0, Math.ceil((state.graceEnds - Date.now()) / 1000));
      setStatus("Submitting in " + seconds + " s — U to undo, Enter to send now", "pending");
    };
    render();
    announce("Answer held for 5 seconds. Press U to undo.");
    state.graceTick = setInterval(render, 250);
    state.graceTimer = setTimeout(sendNow, GRACE_MS);
  }

  function undo() {
    if (!state || state.phase !== "grace") return;
    clearTimeout(state.graceTimer);
    clearInterval(state.graceTick);
    outboxDrop(state.id);
    state.phase = "editing";
    state.entry = null;
    setLocked(false);
    setStatus("Undone. Change your answer and submit again.", "info", 4000);
    announce("Undone.");
  }

  function sendNow() {
    if (!state || state.phase !== "grace") return;
    clearTimeout(state.graceTimer);
    clearInterval(state.graceTick);
    state.phase = "sending";
    setLocked(true);
    var current = state;
    sendWithRetry(current.entry, function (outcome) {
      submitted(current, outcome);
    });
  }

  function submitted(current, outcome) {
    if (state !== current) return;
    var result = outcome.result;
    if (outcome.ok || (result.status === 409 && result.data.code === "already_submitted")) {
      current.phase = "done";
      setStatus("Saved", "saved", 2500);
      announce("Saved. Loading the next item.");
      nextRetry.attempt = 0;
      loadNext();
      return;
    }
    if (outcome.auth) {
      current.phase = "sending";
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
      setLocked(false);
      setStatus("Not saved: " + (result.data.detail || "the answer was refused."), "error");
      return;
    }
    // Expired lease, skipped, not found, paused: this answer cannot be recorded.
    current.phase = "done";
    setStatus("Not saved: " + (result.data.detail || "the item is no longer yours."), "error", 8000);
    loadNext();
  }

  /* ---------- ranking ---------- */

  function cards() {
    return $all("#ranking .rank-card", state.el);
  }

  function renumber() {
    var rank = 0;
    cards().forEach(function (card, i) {
      if (i === 0) card.dataset.tie = "0";
      var tied = card.dataset.tie === "1";
      if (!tied) rank += 1;
      card.dataset.rank = String(rank);
      $(".rank-num", card).textContent = String(rank);
      var toggle = $(".tie-toggle", card);
      if (toggle) toggle.setAttribute("aria-pressed", tied ? "true" : "false");
      var slot = card.dataset.slot;
      card.setAttribute(
        "aria-label",
        "Response " + slot + ", rank " + rank + (tied ? ", same rank as the card above" : "")
      );
      var badge = state.el.querySelector('.rank-badge[data-rank-for="' + slot + '"]');
      if (badge) badge.textContent = "Rank " + rank;
    });
  }

  function computeRanks() {
    var ranks = [];
    cards().forEach(function (card) {
      ranks[parseInt(card.dataset.index, 10)] = parseInt(card.dataset.rank, 10);
    });
    return ranks;
  }

  function moveCard(card, toIndex) {
    var list = document.getElementById("ranking");
    var all = cards();
    var from = all.indexOf(card);
    toIndex = Math.max(0, Math.min(all.length - 1, toIndex));
    if (from === toIndex) return;
    list.removeChild(card);
    var rest = cards();
    if (toIndex >= rest.length) list.appendChild(card);
    else list.insertBefore(card, rest[toIndex]);
    card.dataset.tie = "0";
    state.touched = true;
    renumber();
    card.focus();
    announce("Response " + card.dataset.slot + " moved to place " + (toIndex + 1) + ", rank " + card.dataset.rank);
  }

  function toggleTie(card) {
    if (!state.allowTies || cards().indexOf(card) === 0) return;
    card.dataset.tie = card.dataset.tie === "1" ? "0" : "1";
    state.touched = true;
    renumber();
    announce(
      "Response " +
        card.dataset.slot +
        (card.dataset.tie === "1" ? " now shares rank " : " now has rank ") +
        card.dataset.rank
    );
  }

  function setupRanking() {
    var list = document.getElementById("ranking");
    if (!list) return;
    if (window.Sortable) {
      state.sortable = window.Sortable.create(list, {
        animation: 120,
        filter: "button",
        preventOnFilter: false,
        ghostClass: "rank-ghost",
        chosenClass: "rank-chosen",
        onEnd: function (event) {
          if (event.oldIndex === event.newIndex) return;
          event.item.dataset.tie = "0";
          state.touched = true;
          renumber();
          announce("Response " + event.item.dataset.slot + " moved to place " + (event.newIndex + 1));
        },
      });
    }
    list.addEventListener("click", function (event) {
      if (state.phase !== "editing") return;
      var button = event.target.closest("button");
      if (!button) return;
      var card = button.closest(".rank-card");
      if (button.classList.contains("tie-toggle")) toggleTie(card);
      else if (button.dataset.move) moveCard(card, cards().indexOf(card) + parseInt(button.dataset.move, 10));
    });
    renumber();
  }

  /* ---------- skip ---------- */

  function openSkip() {
    var dialog = document.getElementById("skip-dialog");
    if (!dialog || state.phase !== "editing") return;
    dialog.showModal();
    var first = dialog.querySelector('input[name="reason"]:checked') || dialog.querySelector("input");
    if (first) first.focus();
  }

  function setupSkip() {
    var dialog = document.getElementById("skip-dialog");
    var skipButton = document.getElementById("skip-btn");
    if (skipButton) skipButton.addEventListener("click", openSkip);
    if (!dialog) return;
    dialog.querySelector(".dialog-cancel").addEventListener("click", function () {
      dialog.close();
    });
    var other = dialog.querySelector("#reason-other");
    dialog.addEventListener("change", function (event) {
      if (event.target.name === "reason") other.required = event.target.value === "other";
    });
    dialog.querySelector("form").addEventListener("htmx:beforeRequest", function (event) {
      var form = event.target;
      if (form.reason && form.reason.value === "other" && !other.value.trim()) {
        event.preventDefault();
        other.focus();
        setStatus("Say why you skip it.", "warn", 4000);
        return;
      }
      stopHeartbeat();
    });
  }

  /* ---------- keyboard ---------- */

  var PAIRWISE_KEYS = { 1: "A", a: "A", 2: "B", b: "B", t: "tie", x: "both_bad" };
  var STRENGTH_KEYS = { s: "slightly", m: "much" };

  function onKeyDown(event) {
    if (!state) return;
    var dialog = document.getElementById("skip-dialog");
    if (dialog && dialog.open) return; // the dialog's own controls (and Esc) handle keys
    var target = event.target;
    var typing = target.matches && target.matches("textarea, input[type=text], select, [contenteditable]");
    if (typing) {
      if (event.key === "Escape") {
        event.preventDefault();
        target.blur();
        state.el.focus({ preventScroll: true });
      } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        commit();
      }
      return;
    }
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    var key = event.key.length === 1 ? event.key.toLowerCase() : event.key;

    if (key === "Enter") {
      // Let Enter activate a focused link, summary or button other than Submit.
      if (target.closest && target.closest("a, summary, button:not(#submit-btn)")) return;
      event.preventDefault();
      commit();
      return;
    }
    if (key === "u") {
      if (state.phase === "grace") {
        event.preventDefault();
        undo();
      }
      return;
    }
    if (state.phase !== "editing") return;

    if (event.shiftKey && /^Digit[1-5]$/.test(event.code || "")) {
      if (pick("confidence", event.code.slice(5))) event.preventDefault();
      return;
    }
    if (key === "k") {
      event.preventDefault();
      openSkip();
      return;
    }
    if (key === "r") {
      var rationale = document.getElementById("rationale");
      if (rationale) {
        event.preventDefault();
        rationale.focus();
      }
      return;
    }
    if (event.shiftKey) return;

    if (state.kind === "pairwise") {
      if (PAIRWISE_KEYS[key] && pick("choice", PAIRWISE_KEYS[key])) {
        event.preventDefault();
        announce(
          { A: "A is better", B: "B is better", tie: "Tie", both_bad: "Both bad" }[PAIRWISE_KEYS[key]] +
            " selected"
        );
      } else if (STRENGTH_KEYS[key] && pick("strength", STRENGTH_KEYS[key])) {
        event.preventDefault();
      }
      return;
    }

    // Ranking.
    var card = target.closest && target.closest(".rank-card");
    if (card) {
      var index = cards().indexOf(card);
      if (key === "ArrowUp") moveCard(card, index - 1);
      else if (key === "ArrowDown") moveCard(card, index + 1);
      else if (key === "Home") moveCard(card, 0);
      else if (key === "End") moveCard(card, state.k - 1);
      else if (/^[1-8]$/.test(key) && parseInt(key, 10) <= state.k) moveCard(card, parseInt(key, 10) - 1);
      else if (key === "=" || key === "t") toggleTie(card);
      else if (!focusCardByLetter(key)) return;
      event.preventDefault();
      return;
    }
    if (focusCardByLetter(key)) event.preventDefault();
  }

  function focusCardByLetter(key) {
    if (!/^[a-h]$/.test(key)) return false;
    var card = state.el.querySelector('.rank-card[data-slot="' + key.toUpperCase() + '"]');
    if (!card) return false;
    card.focus();
    return true;
  }

  /* ---------- set-up per item ---------- */

  function setupItem() {
    if (state) {
      clearTimeout(state.graceTimer);
      clearInterval(state.graceTick);
    }
    stopHeartbeat();
    var el = document.getElementById("item");
    if (!el) {
      state = null;
      return;
    }
    var id = el.dataset.assignment;
    state = {
      el: el,
      id: id,
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
      locked: false,
    };
    var form = document.getElementById("judgment-form");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      commit();
    });
    form.addEventListener("change", function (event) {
      if (event.target.name === "choice") updateStrengthEnabled();
    });
    document.getElementById("undo-btn").addEventListener("click", undo);
    if (state.kind === "ranking") setupRanking();
    updateStrengthEnabled();
    setupSkip();
    startHeartbeat();

    // An answer to this very item may be waiting in the outbox (page reloaded while saving).
    var pending = outboxRead()[id];
    if (pending && pending.user === userId()) {
      state.entry = pending;
      state.phase = "grace";
      setLocked(true);
      sendNow();
    }
  }

  function flushOtherOutboxEntries() {
    var box = outboxRead();
    Object.keys(box).forEach(function (assignmentId) {
      var entry = box[assignmentId];
      if (state && assignmentId === state.id) return;
      if (entry.user !== userId()) return;
      sendWithRetry(entry, function () {}, true);
    });
  }

  document.addEventListener("keydown", onKeyDown);
  ["keydown", "pointerdown", "wheel", "scroll", "touchstart"].forEach(function (type) {
    document.addEventListener(
      type,
      function () {
        var wasIdle = Date.now() - lastActivity > IDLE_LIMIT_MS;
        lastActivity = Date.now();
        if (wasIdle) beat(); // back from a long break: find out at once whether the lease held
      },
      { passive: true, capture: true }
    );
  });
  document.addEventListener("htmx:sendError", onHtmxError);
  document.addEventListener("htmx:responseError", onHtmxError);
  document.addEventListener("htmx:afterRequest", function (event) {
    var elt = event.detail.elt;
    if (elt && elt.id === "skip-form" && event.detail.successful) setStatus("Skipped", "saved", 2500);
  });
  document.addEventListener("htmx:afterSwap", function (event) {
    if (event.detail.target && event.detail.target.id === "task") {
      nextRetry.attempt = 0;
      setupItem();
      var focusTarget = document.getElementById("item") || $("#task [tabindex='-1']");
      window.scrollTo(0, 0);
      if (focusTarget) focusTarget.focus({ preventScroll: true });
    }
  });
  window.addEventListener("beforeunload", function (event) {
    if (state && state.phase === "sending") {
      event.preventDefault();
      event.returnValue = "";
    }
  });

  function start() {
    setupItem();
    flushOtherOutboxEntries();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
