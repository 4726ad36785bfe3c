/* Keyboard shortcuts of the task page; bound once per page and read the item on screen. */
import { cards, focusCardByLetter, moveCard, toggleTie } from "./ranking.js";
import { announce } from "./status.js";

const PAIRWISE_KEYS = { 1: "A", a: "A", 2: "B", b: "B", t: "tie", x: "both_bad" };
const STRENGTH_KEYS = { s: "slightly", m: "much" };
const CHOICE_WORDS = { A: "A is better", B: "B is better", tie: "Tie", both_bad: "Both bad" };

/** Open or close the guidelines; return whether there are any. */
export function toggleGuidelines() {
  const rubric = document.getElementById("rubric");
  if (!rubric) return false;
  rubric.open = !rubric.open;
  announce(rubric.open ? "Guidelines shown." : "Guidelines hidden.");
  return true;
}

function onRankingKey(item, key, target, event) {
  const card = target.closest && target.closest(".rank-card");
  if (!card) {
    if (focusCardByLetter(item, key)) event.preventDefault();
    return;
  }
  const index = cards(item).indexOf(card);
  if (key === "ArrowUp") moveCard(item, card, index - 1);
  else if (key === "ArrowDown") moveCard(item, card, index + 1);
  else if (key === "Home") moveCard(item, card, 0);
  else if (key === "End") moveCard(item, card, item.k - 1);
  else if (/^[1-8]$/.test(key) && parseInt(key, 10) <= item.k) moveCard(item, card, parseInt(key, 10) - 1);
  else if (key === "=" || key === "t") toggleTie(item, card);
  else if (!focusCardByLetter(item, key)) return;
  event.preventDefault();
}

/*
 * Return the keydown listener. `actions` gives: item() (the item on screen or null),
 * canUndo() (an answer is in its hold, on screen or off), commit(), undo(), openSkip(),
 * pick(name, value).
 */
export function keydownHandler(actions) {
  return function onKeyDown(event) {
    const dialog = document.getElementById("skip-dialog");
    if (dialog && dialog.open) return; // the dialog's own controls (and Esc) handle keys
    const item = actions.item();
    const target = event.target;
    const typing = target.matches && target.matches("textarea, input[type=text], select, [contenteditable]");
    if (typing) {
      if (!item) return;
      if (event.key === "Escape") {
        event.preventDefault();
        target.blur();
        item.el.focus({ preventScroll: true });
      } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        actions.commit();
      }
      return;
    }
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    const key = event.key.length === 1 ? event.key.toLowerCase() : event.key;

    // G shows the guidelines; with seven or more cards G is a card's letter, so Shift+G.
    const cardG = item && item.kind === "ranking" && item.k >= 7;
    if (key === "g" && (event.shiftKey || !cardG)) {
      if (toggleGuidelines()) event.preventDefault();
      return;
    }
    if (!item) return;
    if (key === "Enter") {
      // Let Enter activate a focused link, summary or button other than Submit.
      if (target.closest && target.closest("a, summary, button:not(#submit-btn)")) return;
      event.preventDefault();
      actions.commit();
      return;
    }
    if (key === "u") {
      if (actions.canUndo()) {
        event.preventDefault();
        actions.undo();
      }
      return;
    }
    if (item.phase !== "editing") return;

    if (event.shiftKey && /^Digit[1-5]$/.test(event.code || "")) {
      if (actions.pick("confidence", event.code.slice(5))) event.preventDefault();
      return;
    }
    if (key === "k") {
      event.preventDefault();
      actions.openSkip();
      return;
    }
    if (key === "r") {
      const rationale = document.getElementById("rationale");
      if (rationale) {
        event.preventDefault();
        rationale.focus();
      }
      return;
    }
    if (event.shiftKey) return;

    if (item.kind === "pairwise") {
      if (PAIRWISE_KEYS[key] && actions.pick("choice", PAIRWISE_KEYS[key])) {
        event.preventDefault();
        announce(CHOICE_WORDS[PAIRWISE_KEYS[key]] + " selected");
      } else if (STRENGTH_KEYS[key] && actions.pick("strength", STRENGTH_KEYS[key])) {
        event.preventDefault();
      }
      return;
    }
    onRankingKey(item, key, target, event);
  };
}
