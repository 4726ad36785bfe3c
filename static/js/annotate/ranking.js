/*
 * K-way ranking: cards in order, best first. Moving a card clears its tie; "= above" gives a
 * card the same rank as the card above it. Ranks are read from the DOM order when submitting.
 */
import { announce } from "./status.js";

export function cards(item) {
  return Array.from(item.el.querySelectorAll("#ranking .rank-card"));
}

export function renumber(item) {
  let rank = 0;
  cards(item).forEach((card, i) => {
    if (i === 0) card.dataset.tie = "0";
    const tied = card.dataset.tie === "1";
    if (!tied) rank += 1;
    card.dataset.rank = String(rank);
    card.querySelector(".rank-num").textContent = String(rank);
    const toggle = card.querySelector(".tie-toggle");
    if (toggle) toggle.setAttribute("aria-pressed", tied ? "true" : "false");
    const slot = card.dataset.slot;
    card.setAttribute(
      "aria-label",
      "Response " + slot + ", rank " + rank + (tied ? ", same rank as the card above" : "")
    );
    const badge = item.el.querySelector('.rank-badge[data-rank-for="' + slot + '"]');
    if (badge) badge.textContent = "Rank " + rank;
  });
}

/** Return ranks[i] = rank of the response shown at display slot i. */
export function computeRanks(item) {
  const ranks = [];
  cards(item).forEach((card) => {
    ranks[parseInt(card.dataset.index, 10)] = parseInt(card.dataset.rank, 10);
  });
  return ranks;
}

export function moveCard(item, card, toIndex) {
  const list = item.el.querySelector("#ranking");
  const all = cards(item);
  const from = all.indexOf(card);
  const to = Math.max(0, Math.min(all.length - 1, toIndex));
  if (from === to) return;
  list.removeChild(card);
  const rest = cards(item);
  if (to >= rest.length) list.appendChild(card);
  else list.insertBefore(card, rest[to]);
  card.dataset.tie = "0";
  item.touched = true;
  renumber(item);
  card.focus();
  announce("Response " + card.dataset.slot + " moved to place " + (to + 1) + ", rank " + card.dataset.rank);
}

export function toggleTie(item, card) {
  if (!item.allowTies || cards(item).indexOf(card) === 0) return;
  card.dataset.tie = card.dataset.tie === "1" ? "0" : "1";
  item.touched = true;
  renumber(item);
  announce(
    "Response " + card.dataset.slot + (card.dataset.tie === "1" ? " now shares rank " : " now has rank ") + card.dataset.rank
  );
}

/** Handle a click on a card's ↑ / ↓ / "= above" button; the listener is bound once per page. */
export function onRankingClick(item, event) {
  const button = event.target.closest("#ranking button");
  if (!button) return;
  const card = button.closest(".rank-card");
  if (button.classList.contains("tie-toggle")) toggleTie(item, card);
  else if (button.dataset.move) moveCard(item, card, cards(item).indexOf(card) + parseInt(button.dataset.move, 10));
}

/** Make the item's cards draggable (SortableJS) and number them. */
export function setupRanking(item) {
  const list = item.el.querySelector("#ranking");
  if (!list) return;
  if (window.Sortable) {
    item.sortable = window.Sortable.create(list, {
      animation: 120,
      filter: "button",
      preventOnFilter: false,
      ghostClass: "rank-ghost",
      chosenClass: "rank-chosen",
      onEnd(event) {
        if (event.oldIndex === event.newIndex) return;
        event.item.dataset.tie = "0";
        item.touched = true;
        renumber(item);
        announce("Response " + event.item.dataset.slot + " moved to place " + (event.newIndex + 1));
      },
    });
  }
  renumber(item);
}

export function teardownRanking(item) {
  if (item.sortable) {
    item.sortable.destroy();
    item.sortable = null;
  }
}

/** Focus the card of response `key` (a letter); return whether there is one. */
export function focusCardByLetter(item, key) {
  if (!/^[a-h]$/.test(key)) return false;
  const card = item.el.querySelector('.rank-card[data-slot="' + key.toUpperCase() + '"]');
  if (!card) return false;
  card.focus();
  return true;
}
