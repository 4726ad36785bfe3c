"""Read a project's prompts, items and votes for an export in one streaming pass.

Reading is one consistent snapshot (REPEATABLE READ when the export opens the transaction)
of three server-side cursors ordered by prompt and item, merged in a streaming pass: memory
stays flat in the number of judgments (except for Dawid-Skene, see above).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from django.db.models import Count, Q, TextField
from django.db.models.functions import Cast

from annotation import labels
from annotation.dedup import DedupTracker, preview
from annotation.exports.policy import CHUNK, ExportPolicy
from annotation.models import (
    Adjudication,
    ItemCandidate,
    Judgment,
    Project,
    Prompt,
)

PROMPT_FIELDS = ("id", "text", "messages", "content_hash", "group_key")
SLOT_FIELDS = (
    "item__prompt_id",
    "item_id",
    "item__round__number",
    "candidate__text",
    "candidate__content_hash",
    "candidate__model_name",
)
VOTE_FIELDS = (
    "item__prompt_id",
    "item_id",
    "id",
    "annotator_id",
    "external_rater",
    "choice",
    "ranking_text",  # the JSON as text: no per-row converter; parsed only when present
    "strength",
    "source",
)
RAW_FIELDS = (
    "confidence",
    "time_spent_ms",
    "shown_choice",
    "rationale",
    "is_gold",
    "is_repeat",
    "qc_flag",
    "assignment__display_order",
)


@dataclass
class Vote:
    judgment_id: int
    rater: tuple
    label: Any  # "A" | "B" | "tie" | "both_bad" | list of ranks
    strength: str
    source: str
    raw: tuple = ()


ADJUDICATED = "adjudicated"  # the source of a reviewer's verdict standing in for the votes


@dataclass
class Unit:
    """One decision target: an item (or items with the same prompt and answers)."""

    item_ids: list[int]
    rounds: set[int]
    answers: list[tuple[str, str, str]]  # (text, content hash, model) in canonical order
    votes: list[Vote]
    gid: str = ""
    adjudicated: bool = False  # the votes are one reviewer's verdict (adjudicated_wins)


@dataclass
class PromptGroup:
    prompt_id: int
    payload: Any  # text or messages
    content_hash: str
    group_key: str
    units: list[Unit]


def excluded_counts(project: Project, policy: ExportPolicy) -> dict:
    """Count judgments in scope that the filters leave out, per reason (first reason wins)."""
    rows = (
        Judgment.objects.filter(project=project)
        .in_rounds(policy.rounds)
        .values("source", "is_gold", "item__is_gold", "is_repeat", "qc_flag")
        .annotate(n=Count("id"))
        .order_by()
    )
    out: Counter = Counter()
    by_source: Counter = Counter()
    for row in rows:
        if row["source"] not in policy.sources:
            out[f"source_{row['source']}"] += row["n"]
        elif not policy.include_gold and (row["is_gold"] or row["item__is_gold"]):
            out["gold"] += row["n"]
        elif not policy.include_repeats and row["is_repeat"]:
            out["repeat"] += row["n"]
        elif not policy.include_qc_flagged and row["qc_flag"]:
            out["qc_flagged"] += row["n"]
        else:
            by_source[row["source"]] += row["n"]
    return {"excluded": dict(sorted(out.items())), "included_by_source": dict(by_source)}


def _groups(rows: Iterable[tuple]) -> Iterator[tuple[int, list[tuple]]]:
    for key, grouped in groupby(rows, key=lambda r: r[0]):
        yield key, list(grouped)


def _label_of(choice: str, ranking_text: str | None) -> Any:
    return choice if choice else json.loads(ranking_text)


def verdict_votes(project: Project) -> dict[int, Vote]:
    """Return item id -> the newest adjudication of the item, as a vote."""
    verdicts = {}
    for pk, item_id, reviewer_id, choice, ranking in (
        Adjudication.objects.filter(item__project=project)
        .order_by("id")
        .values_list("id", "item_id", "reviewer_id", "choice", "ranking")
    ):
        # Negative ids: never equal to a judgment's id, which ranking decisions key on.
        label = choice or ranking
        verdicts[item_id] = Vote(-pk, ("adj", reviewer_id), label, "", ADJUDICATED)
    return verdicts


def prompt_groups(project: Project, policy: ExportPolicy) -> Iterator[PromptGroup]:
    """Yield prompts with their judged items and included votes, in prompt and item order.

    Three server-side cursors (prompts, item slots, votes) ordered by prompt id are merged
    here; call inside one transaction so that they see the same data.
    """
    scope = Q(item__project=project)
    if policy.rounds is not None:
        scope &= Q(item__round__number__in=policy.rounds)
    if not policy.include_gold:
        scope &= Q(item__is_gold=False)
    slots = (
        ItemCandidate.objects.filter(scope)
        .order_by("item__prompt_id", "item_id", "position")
        .values_list(*SLOT_FIELDS)
        .iterator(chunk_size=CHUNK)
    )
    fields = VOTE_FIELDS + (RAW_FIELDS if policy.format == "raw" else ())
    votes = (
        Judgment.objects.filter(project=project)
        .for_policy(policy)
        .annotate(ranking_text=Cast("ranking", TextField()))
        .order_by("item__prompt_id", "item_id", "id")
        .values_list(*fields)
        .iterator(chunk_size=CHUNK)
    )
    prompts = (
        Prompt.objects.filter(project=project)
        .order_by("id")
        .values_list(*PROMPT_FIELDS)
        .iterator(chunk_size=CHUNK)
    )
    verdicts = verdict_votes(project) if policy.adjudicated_wins else {}
    vote_groups = _groups(votes)
    current_votes = next(vote_groups, None)
    prompt_row = next(prompts, None)
    for prompt_id, slot_rows in _groups(slots):
        while current_votes is not None and current_votes[0] < prompt_id:
            current_votes = next(vote_groups, None)
        if current_votes is None or current_votes[0] != prompt_id:
            continue
        while prompt_row is not None and prompt_row[0] < prompt_id:
            prompt_row = next(prompts, None)
        _, text, messages, chash, group_key = prompt_row
        by_item: dict[int, list[Vote]] = defaultdict(list)
        for row in current_votes[1]:
            rater = ("u", row[3]) if row[3] is not None else ("x", row[4])
            vote = Vote(row[2], rater, _label_of(row[5], row[6]), row[7], row[8], row[9:])
            by_item[row[1]].append(vote)
        units = []
        for item_id, item_slots in groupby(slot_rows, key=lambda r: r[1]):
            item_slots = list(item_slots)
            if item_id not in by_item:
                continue
            answers = [(r[3], r[4], r[5]) for r in item_slots]
            verdict = verdicts.get(item_id)
            if verdict is not None:
                units.append(Unit([item_id], {item_slots[0][2]}, answers, [verdict], "", True))
                continue
            units.append(Unit([item_id], {item_slots[0][2]}, answers, by_item[item_id]))
        if units:
            yield PromptGroup(prompt_id, messages or text, chash, group_key, units)


def merge_units(group: PromptGroup, tracker: DedupTracker, merge: bool) -> list[Unit]:
    """Count response and pair duplicates in a prompt; merge items with the same answers.

    The export streams prompt by prompt, so response and pair keys only need to live for
    one prompt: they are plain local sets here, and the tracker only gets the counts.
    """
    seen_answers: set[tuple[str, str]] = set()
    seen_texts: set[str] = set()
    merged: dict[tuple, Unit] = {}
    out = []
    for unit in group.units:
        for text, chash, model in unit.answers:
            if (chash, model) in seen_answers:
                continue
            seen_answers.add((chash, model))
            tracker.seen["responses"] += 1
            if chash in seen_texts:
                tracker.response.add(
                    {"where": f"prompt {group.prompt_id}", "response": preview(text)}, tracker.limit
                )
            seen_texts.add(chash)
        hashes = [a[1] for a in unit.answers]
        key = tuple(sorted(hashes))
        if len(hashes) == 2:
            tracker.seen["pairs"] += 1
        first = merged.get(key)
        if first is not None:
            if len(hashes) == 2:
                tracker.pair.add(
                    {"where": f"item {unit.item_ids[0]}", "same_as": f"item {first.item_ids[0]}"},
                    tracker.limit,
                )
            if merge:
                order = [a[1] for a in first.answers]
                perm = [order.index(h) for h in hashes]
                for vote in unit.votes:
                    vote.label = labels.relabel(vote.label, perm)
                # A verdict outweighs the votes of every merged copy (adjudicated_wins).
                if unit.adjudicated and not first.adjudicated:
                    first.votes, first.adjudicated = unit.votes, True
                elif first.adjudicated == unit.adjudicated:
                    first.votes.extend(unit.votes)
                first.item_ids.extend(unit.item_ids)
                first.rounds |= unit.rounds
                continue
        unit.gid = hashlib.sha256((group.content_hash + "|" + "|".join(key)).encode()).hexdigest()[
            :16
        ]
        if first is not None:
            unit.gid += f"-{unit.item_ids[0]}"
        else:
            merged[key] = unit
        out.append(unit)
    return out
