/*
 * Pages other than the task page: send answers still waiting in this browser's outbox (a tab
 * closed while saving), so they do not wait until the task page is opened again.
 */
import { outboxFlush } from "./outbox.js";

const holder = document.querySelector("[data-outbox-user]");
if (holder && holder.dataset.outboxUser) outboxFlush(holder.dataset.outboxUser);
