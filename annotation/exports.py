"""Export judgments as versioned, immutable preference-data snapshots.

A snapshot is the folder of the training contract (docs/DEVELOPING.md):
``ARTIFACT_ROOT/datasets/<project id>/<version>/`` holding ``train.jsonl``, optional
``validation.jsonl`` / ``test.jsonl``, ``manifest.json`` (content hash, counts, policies,
filters, source rounds, dedup report) and ``hf/`` (the same splits saved with
``datasets.DatasetDict.save_to_disk``). Side files ``<split>.both_bad.jsonl`` hold both-bad
pairs or KTO negatives when the both-bad policy asks for them. The content hash is
`training.trainers.data.data_hash` of the split files, as the trainers compute it.

Formats (one JSON object per line):

* ``trl`` — ``{"prompt", "chosen", "rejected", "margin", "soft_label", "group_id"}`` (plus
  ``"tie"`` when ties are kept). Plain text, or conversational when any exported prompt is
  a chat transcript (``conversational`` forces either): prompt = messages, chosen/rejected =
  ``[{"role": "assistant", "content": ...}]``. Plain text renders a chat prompt HH-style.
* ``hh`` — ``{"chosen", "rejected"}``: whole ``\\n\\nHuman: `` / ``\\n\\nAssistant: `` dialogues.
* ``unpaired`` — TRL unpaired / KTO rows ``{"prompt", "completion", "label", "group_id"}``:
  a preferred answer is ``true``, a rejected or both-bad answer ``false``.
* ``raw`` — one row per judgment: pseudonymous annotator, display order, shown choice,
  strength, confidence, time, rationale, gold / repeat flags, source, qc flag.

Policies (all recorded in the manifest and on the DatasetVersion):

* ``aggregation``: ``per_judgment`` (one row per label), ``majority``, ``trust_weighted``
  (annotator weight = Laplace-smoothed gold accuracy (correct + 1) / (answered + 2); no gold
  answered = 0.5) or ``dawid_skene`` (``evaluation.stats.aggregation``; needs one pass to collect
  every vote, so it keeps one small tuple per judgment in memory).
* ``ties``: ``drop``, ``soft`` (a row with soft_label = P(A preferred), 0.5 for one tie vote,
  margin 0) or ``keep`` (the same row flagged ``"tie": true``). An even split between A and B
  under an aggregation counts as a tie.
* ``both_bad``: ``drop``, ``separate`` (``<split>.both_bad.jsonl``: prompt + both answers) or
  ``kto`` (both answers as unpaired negatives, in the side file, or in the split itself for
  the ``unpaired`` format).
* ``min_agreement``: drop a decision whose agreement is lower: the winning label's share of
  the votes (majority, per_judgment), of the trust weight (trust_weighted) or its posterior
  (dawid_skene). ``min_votes``: drop decisions with fewer votes.
* ``sources``: label sources included, default ``["human"]``; ``ai``, ``simulated`` and
  ``imported`` labels are used only when named. Votes per source are reported.
* gold and repeat judgments and qc-flagged labels are left out unless included (the raw
  format includes them by default).
* ``margins``: strength -> margin, default slightly = 1.0, much = 2.0, not given = 0.0 (the
  margin in the Bradley-Terry loss of Llama 2, Touvron et al. 2023, sec. 3.2.2). Aggregated
  rows take the mean margin of the votes for the winning label.
* Rankings decompose into the n(n-1)/2 pairs of their positions (ties per the tie policy);
  the pairs of one ranking share a ``group_id``.
* ``split``: fractions for train / validation / test; a prompt's split is fixed by
  sha256(seed, group) where the group is the prompt's normalised content hash, or its
  ``group_key`` when ``group_by="group_key"``; with ``near_duplicates="group"`` a prompt
  near-duplicating an earlier one joins its group. No prompt is in two splits.
* Items repeating the same prompt and answers (in either order) are merged into one decision
  and reported (``merge_duplicate_pairs``).

Reading is one consistent snapshot (REPEATABLE READ when the export opens the transaction)
of three server-side cursors ordered by prompt and item, merged in a streaming pass: memory
stays flat in the number of judgments (except for Dawid-Skene, see above).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import groupby
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Count, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from annotation import labels
from annotation.dedup import DedupTracker, MinHasher, preview
from annotation.errors import ServiceError
from annotation.imports import render_hh
from annotation.models import (
    DatasetVersion,
    ItemCandidate,
    Judgment,
    LabelSource,
    Project,
    Prompt,
)
from evaluation.stats import aggregation
from training.trainers.data import MANIFEST, SPLITS, data_hash

FORMATS = ("trl", "hh", "unpaired", "raw")
AGGREGATIONS = ("per_judgment", "majority", "trust_weighted", "dawid_skene")
TIE_POLICIES = ("drop", "soft", "keep")
BOTH_BAD_POLICIES = ("drop", "separate", "kto")
GROUP_BY = ("prompt", "group_key")
NEAR_DUPLICATES = ("off", "report", "group")
DEFAULT_MARGINS = {"": 0.0, "slightly": 1.0, "much": 2.0}
DEFAULT_SPLIT = {"train": 0.9, "validation": 0.05, "test": 0.05}
CHUNK = 5000
UNTRUSTED_WEIGHT = 0.5  # (0 + 1) / (0 + 2): an annotator with no gold answers yet


class PolicyError(ServiceError):
    code = "invalid_policy"


# ---- policy -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportPolicy:
    """Everything that decides an export's rows; stored with the snapshot."""

    format: str = "trl"
    conversational: bool | None = None
    aggregation: str = "per_judgment"
    ties: str = "drop"
    both_bad: str = "drop"
    min_agreement: float = 0.0
    min_votes: int = 1
    sources: tuple[str, ...] = (LabelSource.HUMAN.value,)
    include_gold: bool | None = None
    include_repeats: bool | None = None
    include_qc_flagged: bool | None = None
    margins: dict = field(default_factory=lambda: dict(DEFAULT_MARGINS))
    split: dict = field(default_factory=lambda: dict(DEFAULT_SPLIT))
    seed: int = 0
    group_by: str = "prompt"
    near_duplicates: str = "off"
    merge_duplicate_pairs: bool = True
    rounds: tuple[int, ...] | None = None
    hf: bool = True

    FILTER_KEYS = ("sources", "include_gold", "include_repeats", "include_qc_flagged", "rounds")

    @classmethod
    def from_dict(cls, data: dict | None) -> ExportPolicy:
        """Return a checked policy from JSON-like data; raise PolicyError on a bad value."""
        data = dict(data or {})
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise PolicyError(f"unknown policy field(s): {', '.join(sorted(unknown))}")
        if "sources" in data:
            data["sources"] = tuple(data["sources"] or ())
        if data.get("rounds") is not None:
            data["rounds"] = tuple(sorted({int(r) for r in data["rounds"]}))
        for name, kind in (("min_agreement", float), ("min_votes", int), ("seed", int)):
            if name in data:
                try:
                    data[name] = kind(data[name])
                except (TypeError, ValueError) as exc:
                    raise PolicyError(f"{name} must be a number") from exc
        if "margins" in data:
            data["margins"] = {**DEFAULT_MARGINS, **(data["margins"] or {})}
        try:
            policy = cls(**data)
        except TypeError as exc:
            raise PolicyError(str(exc)) from exc
        policy.check()
        raw = policy.format == "raw"
        for name in ("include_gold", "include_repeats", "include_qc_flagged"):
            if getattr(policy, name) is None:
                object.__setattr__(policy, name, raw)
        return policy

    def check(self) -> None:
        """Raise PolicyError when a field is out of range or fields contradict each other."""
        choices = {
            "format": FORMATS,
            "aggregation": AGGREGATIONS,
            "ties": TIE_POLICIES,
            "both_bad": BOTH_BAD_POLICIES,
            "group_by": GROUP_BY,
            "near_duplicates": NEAR_DUPLICATES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise PolicyError(f"{name} must be one of {', '.join(allowed)}")
        if not self.sources or set(self.sources) - set(LabelSource.values):
            raise PolicyError(f"sources must name some of {', '.join(LabelSource.values)}")
        if not 0.0 <= float(self.min_agreement) <= 1.0:
            raise PolicyError("min_agreement must lie in [0, 1]")
        if int(self.min_votes) < 1:
            raise PolicyError("min_votes must be at least 1")
        if set(self.split) - set(SPLITS) or "train" not in self.split:
            raise PolicyError("split must give train and optionally validation, test")
        fractions = list(self.split.values())
        if any(float(f) < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
            raise PolicyError("split fractions must be non-negative and sum to 1")
        if float(self.split["train"]) <= 0:
            raise PolicyError("the train fraction must be positive")
        if set(self.margins) - set(DEFAULT_MARGINS) or not all(
            isinstance(v, int | float) for v in self.margins.values()
        ):
            raise PolicyError("margins maps '', 'slightly' and 'much' to numbers")
        if self.format in ("hh", "unpaired") and self.ties != "drop":
            raise PolicyError(f"the {self.format} format has no way to hold ties: use ties=drop")
        if self.format == "raw" and (
            self.aggregation != "per_judgment" or self.min_agreement or self.min_votes > 1
        ):
            raise PolicyError("the raw format is one row per judgment: no aggregation filters")

    def policies(self) -> dict:
        """Return the row-shaping policies (JSON)."""
        data = asdict(self)
        return {k: v for k, v in data.items() if k not in self.FILTER_KEYS}

    def filters(self) -> dict:
        """Return the label filters (JSON)."""
        data = asdict(self)
        out = {k: data[k] for k in self.FILTER_KEYS}
        out["sources"] = list(out["sources"])
        out["rounds"] = None if out["rounds"] is None else list(out["rounds"])
        return out


def split_for(seed: int, group: str, fractions: dict[str, float]) -> str:
    """Return the split of a group: where sha256(seed, group) falls in the cumulative fractions."""
    digest = hashlib.sha256(f"{seed}\x00{group}".encode()).hexdigest()
    u = int(digest[:15], 16) / 16**15
    total = 0.0
    chosen = "train"
    for name in SPLITS:
        share = float(fractions.get(name, 0.0))
        if share <= 0:
            continue
        chosen = name
        total += share
        if u < total:
            return name
    return chosen


def pseudonym(project_id: int, annotator_id: int | None, external: str) -> str:
    """Return a stable pseudonymous annotator id (salted with the deployment's secret)."""
    who = f"user:{annotator_id}" if annotator_id is not None else f"ext:{external}"
    salt = getattr(settings, "SECRET_KEY", "")
    return "r" + hashlib.sha256(f"{salt}\x00{project_id}\x00{who}".encode()).hexdigest()[:12]


# ---- streaming read -----------------------------------------------------------------------

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


@dataclass
class Unit:
    """One decision target: an item (or items with the same prompt and answers)."""

    item_ids: list[int]
    rounds: set[int]
    answers: list[tuple[str, str, str]]  # (text, content hash, model) in canonical order
    votes: list[Vote]
    gid: str = ""


@dataclass
class PromptGroup:
    prompt_id: int
    payload: Any  # text or messages
    content_hash: str
    group_key: str
    units: list[Unit]


def _excluded_counts(project: Project, policy: ExportPolicy) -> dict:
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
            units.append(Unit([item_id], {item_slots[0][2]}, answers, by_item[item_id]))
        if units:
            yield PromptGroup(prompt_id, messages or text, chash, group_key, units)


def _merge_units(group: PromptGroup, tracker: DedupTracker, merge: bool) -> list[Unit]:
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


# ---- decisions ---------------------------------------------------------------------------


@dataclass
class Decision:
    """What one aggregated (or single) label says about two answers of a unit."""

    first: int  # answer index of the preferred answer (or of A for ties / both-bad)
    second: int
    label: str  # "win" | "tie" | "both_bad"
    soft_label: float | None
    margin: float
    group_id: str


def _decision_votes(unit: Unit) -> dict[tuple[int, int], list[tuple[Vote, str]]]:
    """Return {(i, j): [(vote, "A"/"B"/"tie"/"both_bad")]} for each compared answer pair."""
    k = len(unit.answers)
    out: dict[tuple[int, int], list] = defaultdict(list)
    for vote in unit.votes:
        if isinstance(vote.label, list):
            if len(vote.label) != k:
                continue
            for i, j, outcome in labels.ranking_outcomes(vote.label):
                out[(i, j)].append((vote, outcome))
        elif k == 2:
            out[(0, 1)].append((vote, vote.label))
    return out


def _to_decision(
    label: str, i: int, j: int, soft_a: float | None, margin: float, gid: str
) -> Decision:
    if label == "A":
        return Decision(i, j, "win", 1.0 if soft_a is None else soft_a, margin, gid)
    if label == "B":
        return Decision(j, i, "win", 1.0 if soft_a is None else 1.0 - soft_a, margin, gid)
    if label == "tie":
        return Decision(i, j, "tie", 0.5 if soft_a is None else soft_a, 0.0, gid)
    return Decision(i, j, "both_bad", None, 0.0, gid)


class Decider:
    """Turn a unit's votes into decisions under the aggregation policy; count drops."""

    def __init__(self, policy: ExportPolicy, weights: dict | None = None, ds_labels=None):
        self.policy = policy
        self.weights = weights or {}
        self.ds_labels = ds_labels or {}
        self.dropped: Counter = Counter()
        self._majority: dict[tuple, aggregation.AggregatedLabel] = {}

    def majority(self, votes: list[tuple[Vote, str]]) -> aggregation.AggregatedLabel:
        """Return `aggregation.majority_vote` of the votes, memoised on the label multiset.

        An unweighted vote depends only on how many votes each label got, and a few labels
        over a few annotators make few distinct multisets: most decisions hit the cache.
        """
        key = tuple(sorted(lab for _, lab in votes))
        result = self._majority.get(key)
        if result is None:
            result = aggregation.majority_vote([(0, n, lab) for n, lab in enumerate(key)])[0]
            self._majority[key] = result
        return result

    def margin_of(self, votes: list[tuple[Vote, str]], label: str) -> float:
        values = [
            float(self.policy.margins.get(v.strength, 0.0)) for v, lab in votes if lab == label
        ]
        return sum(values) / len(values) if values else 0.0

    def decide(self, unit: Unit) -> list[Decision]:
        policy = self.policy
        out: list[Decision] = []
        ranking = len(unit.answers) > 2
        ordinals = {v.judgment_id: n for n, v in enumerate(unit.votes)} if ranking else {}
        decision_votes = _decision_votes(unit)
        for i, j in sorted(decision_votes) if ranking else decision_votes:
            votes = decision_votes[(i, j)]
            if len(votes) < policy.min_votes:
                self.dropped["few_votes"] += 1
                continue
            if policy.aggregation == "per_judgment":
                agreement = self.majority(votes).confidence if policy.min_agreement else 1.0
                if agreement < policy.min_agreement:
                    self.dropped["low_agreement"] += len(votes)
                    continue
                for vote, lab in votes:
                    gid = f"{unit.gid}/{ordinals[vote.judgment_id]}" if ranking else unit.gid
                    margin = float(policy.margins.get(vote.strength, 0.0))
                    out.append(_to_decision(lab, i, j, None, margin, gid))
                continue
            if policy.aggregation == "majority":
                result = self.majority(votes)
            elif policy.aggregation == "trust_weighted":
                tuples = [((i, j), v.rater, lab) for v, lab in votes]  # one decision at a time
                result = aggregation.weighted_vote(
                    tuples, self.weights, default_weight=UNTRUSTED_WEIGHT
                )[(i, j)]
            else:
                result = self.ds_labels[(unit.gid, i, j)]
            if result.confidence < policy.min_agreement:
                self.dropped["low_agreement"] += 1
                continue
            label = "tie" if result.split else result.label
            if result.split:
                self.dropped["split_counted_as_tie"] += 1
            margin = self.margin_of(votes, label)
            out.append(_to_decision(label, i, j, result.soft_label, margin, unit.gid))
        return out


def gold_weights(project: Project) -> dict[tuple, float]:
    """Return each annotator's trust: Laplace-smoothed accuracy on gold items."""
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    rows = (
        Judgment.objects.filter(project=project, item__is_gold=True)
        .exclude(item__gold_answer__isnull=True)
        .values_list("annotator_id", "external_rater", "choice", "ranking", "item__gold_answer")
        .iterator(chunk_size=CHUNK)
    )
    for annotator_id, external, choice, ranking, gold in rows:
        rater = ("u", annotator_id) if annotator_id is not None else ("x", external)
        label = choice if choice else ranking
        counts[rater][0] += int(label == gold)
        counts[rater][1] += 1
    # (correct + 1) / (answered + 2): Laplace's rule of succession
    return {rater: (c + 1) / (n + 2) for rater, (c, n) in counts.items()}


# ---- rows ----------------------------------------------------------------------------------


class Renderer:
    """Build output rows for one prompt in the export's format."""

    def __init__(self, policy: ExportPolicy, conversational: bool, project_id: int):
        self.policy = policy
        self.conversational = conversational
        self.project_id = project_id

    def prompt(self, payload):
        if self.conversational:
            return [{"role": "user", "content": payload}] if isinstance(payload, str) else payload
        if isinstance(payload, str):
            return payload
        return render_hh(payload) + "\n\nAssistant:"

    def answer(self, text: str):
        if self.conversational:
            return [{"role": "assistant", "content": text}]
        return text

    def plain_answer(self, payload, text: str) -> str:
        # An HH-style prompt ends in "Assistant:"; its answer starts after one space.
        return text if isinstance(payload, str) else " " + text

    def completion(self, payload, text: str):
        return self.answer(text) if self.conversational else self.plain_answer(payload, text)

    def preference(self, payload, unit: Unit, d: Decision) -> dict:
        chosen, rejected = unit.answers[d.first][0], unit.answers[d.second][0]
        if self.policy.format == "hh":
            return {"chosen": render_hh(payload, chosen), "rejected": render_hh(payload, rejected)}
        row = {
            "prompt": self.prompt(payload),
            "chosen": self.completion(payload, chosen),
            "rejected": self.completion(payload, rejected),
            "margin": d.margin,
            "soft_label": d.soft_label,
            "group_id": d.group_id,
        }
        if self.policy.ties == "keep":
            row["tie"] = d.label == "tie"
        return row

    def encoded_answers(self, payload, unit: Unit) -> list[str]:
        """Return each answer of a unit JSON-encoded as it appears in a preference row."""
        if self.policy.format == "hh":
            return [encode(render_hh(payload, a[0])) for a in unit.answers]
        return [encode(self.completion(payload, a[0])) for a in unit.answers]

    def preference_line(self, prompt_json: str, answers: list[str], d: Decision) -> str:
        """Return the JSON line of `preference` from pre-encoded parts (the hot path)."""
        if self.policy.format == "hh":
            return f'{{"chosen":{answers[d.first]},"rejected":{answers[d.second]}}}'
        line = (
            f'{{"prompt":{prompt_json},"chosen":{answers[d.first]},'
            f'"rejected":{answers[d.second]},"margin":{_number(d.margin)},'
            f'"soft_label":{_number(d.soft_label)},"group_id":{encode(d.group_id)}'
        )
        if self.policy.ties == "keep":
            line += ',"tie":true}' if d.label == "tie" else ',"tie":false}'
        else:
            line += "}"
        return line

    def unpaired(self, payload, text: str, label: bool, gid: str) -> dict:
        return {
            "prompt": self.prompt(payload),
            "completion": self.completion(payload, text),
            "label": label,
            "group_id": gid,
        }

    def both_bad(self, payload, unit: Unit, d: Decision) -> dict:
        answers = [unit.answers[d.first][0], unit.answers[d.second][0]]
        return {
            "prompt": self.prompt(payload),
            "responses": [self.completion(payload, a) for a in answers],
            "group_id": d.group_id,
        }

    def raw(self, group: PromptGroup, unit: Unit, vote: Vote) -> dict:
        confidence, time_ms, shown, rationale, is_gold, is_repeat, qc_flag, order = vote.raw
        return {
            "judgment_id": vote.judgment_id,
            "item_id": unit.item_ids[0],
            "round": min(unit.rounds),
            "group_id": unit.gid,
            "prompt": group.payload if isinstance(group.payload, str) else None,
            "messages": None if isinstance(group.payload, str) else group.payload,
            "responses": [a[0] for a in unit.answers],
            "models": [a[2] for a in unit.answers],
            "annotator": pseudonym(self.project_id, *_rater_parts(vote.rater)),
            "source": vote.source,
            "choice": vote.label if isinstance(vote.label, str) else None,
            "ranking": vote.label if isinstance(vote.label, list) else None,
            "shown_choice": shown,
            "display_order": order,
            "strength": vote.strength,
            "confidence": confidence,
            "time_spent_ms": time_ms,
            "rationale": rationale,
            "is_gold": is_gold,
            "is_repeat": is_repeat,
            "qc_flag": qc_flag,
        }


def _rater_parts(rater: tuple) -> tuple[int | None, str]:
    return (rater[1], "") if rater[0] == "u" else (None, rater[1])


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
encode = _ENCODER.encode


def _number(value: float | None) -> str:
    return "null" if value is None else repr(float(value))


class SnapshotWriter:
    """Append JSON lines to ``<split>.jsonl`` and side files, opened on first use."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.handles: dict[str, IO] = {}
        self.counts: Counter = Counter()

    def write(self, name: str, row: dict) -> None:
        self.write_line(name, encode(row))

    def write_line(self, name: str, line: str) -> None:
        handle = self.handles.get(name)
        if handle is None:
            handle = self.handles[name] = (self.folder / name).open(
                "w", encoding="utf-8", buffering=1 << 20
            )
        handle.write(line)
        handle.write("\n")
        self.counts[name] += 1

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()


# ---- the export ----------------------------------------------------------------------------


@dataclass
class ExportResult:
    split_counts: dict
    side_counts: dict
    report: dict
    source_rounds: list[int]
    conversational: bool


def _has_chat_prompts(project: Project, policy: ExportPolicy) -> bool:
    scope = Q(items__project=project)
    if policy.rounds is not None:
        scope &= Q(items__round__number__in=policy.rounds)
    return Prompt.objects.filter(project=project, messages__isnull=False).filter(scope).exists()


def _dawid_skene_labels(project: Project, policy: ExportPolicy) -> tuple[dict, dict]:
    """First pass for Dawid-Skene: collect every vote, fit the model, return labels + summary."""
    tuples = []
    tracker = DedupTracker(examples=0)
    for group in prompt_groups(project, policy):
        units = _merge_units(group, tracker, policy.merge_duplicate_pairs)
        tracker.forget_prompt_scope()
        for unit in units:
            for (i, j), votes in _decision_votes(unit).items():
                tuples.extend(((unit.gid, i, j), v.rater, lab) for v, lab in votes)
    if not tuples:
        return {}, {"n_votes": 0}
    fit = aggregation.dawid_skene(tuples)
    summary = {
        "n_votes": len(tuples),
        "n_iter": fit.n_iter,
        "converged": fit.converged,
        "log_likelihood": fit.log_likelihood,
        "class_priors": {str(k): v for k, v in fit.class_priors.items()},
    }
    return fit.labels, summary


def export_rows(
    *,
    project: Project,
    policy: ExportPolicy,
    folder: Path,
    progress: Callable[[int], None] | None = None,
) -> ExportResult:
    """Write a snapshot's JSONL files into ``folder``; return counts and the report.

    Opens its own REPEATABLE READ transaction when not already inside one, so that the
    streamed cursors see one consistent state of the database.
    """
    outer = connection.in_atomic_block
    with transaction.atomic():
        if not outer and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return _export_rows(project, policy, folder, progress)


def _export_rows(project, policy, folder, progress) -> ExportResult:
    conversational = policy.conversational
    if conversational is None:
        conversational = policy.format != "hh" and _has_chat_prompts(project, policy)
    weights = gold_weights(project) if policy.aggregation == "trust_weighted" else {}
    ds_labels, ds_summary = ({}, None)
    if policy.aggregation == "dawid_skene":
        ds_labels, ds_summary = _dawid_skene_labels(project, policy)
    decider = Decider(policy, weights, ds_labels)
    renderer = Renderer(policy, conversational, project.pk)
    minhash = MinHasher() if policy.near_duplicates != "off" else None
    tracker = DedupTracker(near_duplicates=minhash)
    near_groups: dict[int, str] = {}
    writer = SnapshotWriter(folder)
    rounds: set[int] = set()
    decisions: Counter = Counter()
    n_votes = 0
    try:
        for group in prompt_groups(project, policy):
            group_key = group.content_hash
            if policy.group_by == "group_key" and group.group_key:
                group_key = group.group_key
            if minhash is not None:
                text = group.payload if isinstance(group.payload, str) else render_hh(group.payload)
                other = tracker.see_near_prompt(group.prompt_id, text, f"prompt {group.prompt_id}")
                if policy.near_duplicates == "group":
                    group_key = near_groups.get(other, group_key)
                    near_groups[group.prompt_id] = group_key
            split = split_for(policy.seed, group_key, policy.split)
            units = _merge_units(group, tracker, policy.merge_duplicate_pairs)
            prompt_json = encode(renderer.prompt(group.payload))
            for unit in units:
                rounds |= unit.rounds
                n_votes += len(unit.votes)
                if policy.format == "raw":
                    for vote in unit.votes:
                        writer.write(f"{split}.jsonl", renderer.raw(group, unit, vote))
                    continue
                answers = None
                for d in decider.decide(unit):
                    decisions[d.label] += 1
                    if d.label == "win" and policy.format != "unpaired":
                        if answers is None:
                            answers = renderer.encoded_answers(group.payload, unit)
                        line = renderer.preference_line(prompt_json, answers, d)
                        writer.write_line(f"{split}.jsonl", line)
                    else:
                        _write_decision(writer, renderer, policy, split, group.payload, unit, d)
            if progress is not None:
                progress(sum(len(u.votes) for u in units))
    finally:
        writer.close()
    dropped = dict(decider.dropped)
    report = {
        "judgments": _excluded_counts(project, policy),
        "votes_used": n_votes,
        "decisions": dict(decisions),
        "dropped": dropped,
        "dedup": tracker.report(),
        "conversational": conversational,
    }
    if weights:
        report["trust_weights"] = {
            "annotators_with_gold": len(weights),
            "mean_weight": sum(weights.values()) / len(weights),
            "default_weight": UNTRUSTED_WEIGHT,
        }
    if ds_summary is not None:
        report["dawid_skene"] = ds_summary
    split_counts = {s: writer.counts.get(f"{s}.jsonl", 0) for s in SPLITS}
    side = {name: n for name, n in writer.counts.items() if name.count(".") > 1}
    return ExportResult(split_counts, side, report, sorted(rounds), conversational)


def _write_decision(writer, renderer, policy, split, payload, unit, d: Decision) -> None:
    main = f"{split}.jsonl"
    side = f"{split}.both_bad.jsonl"
    if d.label == "tie":
        if policy.ties == "drop":
            return
        writer.write(main, renderer.preference(payload, unit, d))
        return
    if d.label == "both_bad":
        if policy.both_bad == "drop":
            return
        if policy.both_bad == "separate":
            writer.write(side, renderer.both_bad(payload, unit, d))
            return
        target = main if policy.format == "unpaired" else side
        for index in (d.first, d.second):
            text = unit.answers[index][0]
            writer.write(target, renderer.unpaired(payload, text, False, d.group_id))
        return
    if policy.format == "unpaired":
        writer.write(main, renderer.unpaired(payload, unit.answers[d.first][0], True, d.group_id))
        writer.write(main, renderer.unpaired(payload, unit.answers[d.second][0], False, d.group_id))
        return
    writer.write(main, renderer.preference(payload, unit, d))


# ---- snapshot files -------------------------------------------------------------------------


def dataset_root() -> Path:
    """Return the folder that holds every project's snapshots."""
    return Path(settings.ARTIFACT_ROOT) / "datasets"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_hf_folder(folder: Path) -> Path:
    """Save the snapshot's splits as a ``datasets.DatasetDict`` in ``folder/hf``."""
    import tempfile

    from datasets import Dataset, DatasetDict

    splits = {}
    with tempfile.TemporaryDirectory(prefix="prefloop-hf-") as cache:
        for split in SPLITS:
            path = folder / f"{split}.jsonl"
            if path.exists() and path.stat().st_size:
                splits[split] = Dataset.from_json(str(path), cache_dir=cache)
        DatasetDict(splits).save_to_disk(str(folder / "hf"))
    return folder / "hf"


def _make_read_only(folder: Path) -> None:
    for root, dirs, files in os.walk(folder):
        for name in files:
            os.chmod(os.path.join(root, name), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)
    os.chmod(folder, 0o555)


def _remove_tree(folder: Path) -> None:
    if not folder.exists():
        return
    for root, dirs, _ in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(folder, 0o755)
    shutil.rmtree(folder)


# ---- services -------------------------------------------------------------------------------


@transaction.atomic
def dataset_version_create(
    *, project: Project, policy: dict | ExportPolicy | None = None, name: str = "", user=None
) -> DatasetVersion:
    """Record a new export (status building) under the project's next version number."""
    if not isinstance(policy, ExportPolicy):
        policy = ExportPolicy.from_dict(policy)
    Project.objects.select_for_update().filter(pk=project.pk).first()
    last = DatasetVersion.objects.filter(project=project).order_by("-version").first()
    return DatasetVersion.objects.create(
        project=project,
        version=(last.version + 1) if last else 1,
        name=name,
        format=policy.format,
        policies=policy.policies(),
        filters=policy.filters(),
        created_by=user,
    )


def _policy_of(dataset_version: DatasetVersion) -> ExportPolicy:
    data = {**dataset_version.policies, **dataset_version.filters}
    return ExportPolicy.from_dict(data)


def dataset_version_build(
    *, dataset_version_id: int, progress: Callable[[int], None] | None = None
) -> DatasetVersion:
    """Write a building version's snapshot and mark it ready (or failed, with the error).

    Idempotent: a version that is not `building` is returned as it is. Two workers building
    the same version write to private folders; the first to finish publishes its folder.
    """
    with transaction.atomic():
        dv = (
            DatasetVersion.objects.select_for_update()
            .select_related("project")
            .get(pk=dataset_version_id)
        )
        if dv.status != DatasetVersion.Status.BUILDING:
            return dv
    project_dir = dataset_root() / str(dv.project_id)
    final = project_dir / str(dv.version)
    work = project_dir / f".{dv.version}.{uuid.uuid4().hex}.tmp"
    try:
        work.mkdir(parents=True)
        policy = _policy_of(dv)
        result = export_rows(project=dv.project, policy=policy, folder=work, progress=progress)
        if not result.split_counts["train"]:
            raise ServiceError(
                "no training rows: no judgment passed the filters and policies "
                f"(report: {json.dumps(result.report['judgments'])})",
                code="empty_export",
            )
        if policy.hf:
            write_hf_folder(work)
        content = data_hash(work)
        files = {
            p.name: _file_sha256(p) for p in sorted(work.iterdir()) if p.name.endswith(".jsonl")
        }
        manifest = {
            "content_hash": content,
            "hash_method": "training.trainers.data.data_hash (sha256 of split files)",
            "project": {"id": dv.project_id, "name": dv.project.name},
            "version": dv.version,
            "name": dv.name,
            "format": dv.format,
            "kind": {"raw": "raw", "unpaired": "unpaired"}.get(dv.format, "preference"),
            "counts": result.split_counts,
            "side_files": result.side_counts,
            "files": files,
            "policies": dv.policies,
            "filters": dv.filters,
            "source_rounds": result.source_rounds,
            "report": result.report,
            "created_at": timezone.now().isoformat(),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
        with transaction.atomic():
            dv = DatasetVersion.objects.select_for_update().get(pk=dataset_version_id)
            if dv.status != DatasetVersion.Status.BUILDING:
                _remove_tree(work)
                return dv
            _remove_tree(final)
            _make_read_only(work)
            os.replace(work, final)
            dv.status = DatasetVersion.Status.READY
            dv.content_hash = content
            dv.split_counts = result.split_counts
            dv.source_rounds = result.source_rounds
            dv.report = {**result.report, "side_files": result.side_counts}
            dv.path = str(final)
            dv.finished_at = timezone.now()
            dv.save()
        return dv
    except (OperationalError, InterfaceError):
        _remove_tree(work)  # transient: the task retries; the version stays `building`
        raise
    except Exception as exc:
        with contextlib.suppress(OSError):  # a full or read-only disk must not hide the cause
            _remove_tree(work)
        if isinstance(exc, ServiceError):
            error = exc.message
        elif isinstance(exc, OSError):
            error = f"{_disk_problem(exc, project_dir)}\n{traceback.format_exc()}"
        else:
            error = traceback.format_exc()
        dataset_version_fail(dataset_version_id=dataset_version_id, error=error)
        raise


def _disk_problem(exc: OSError, folder: Path) -> str:
    """Return a one-line reason why a snapshot could not be written under ``folder``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"Disk full: cannot write the snapshot under {folder}."
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        return f"The artefact folder {folder} is not writable: {exc.strerror or exc}."
    return f"Cannot write the snapshot under {folder}: {exc.strerror or exc}."


def dataset_version_fail(*, dataset_version_id: int, error: str) -> None:
    """Record a failed build (no-op for a version that is already ready)."""
    DatasetVersion.objects.filter(
        pk=dataset_version_id, status=DatasetVersion.Status.BUILDING
    ).update(status=DatasetVersion.Status.FAILED, error=error[-20000:], finished_at=timezone.now())


def dataset_version_export(
    *,
    project: Project,
    policy: dict | ExportPolicy | None = None,
    name: str = "",
    user=None,
    progress: Callable[[int], None] | None = None,
) -> DatasetVersion:
    """Create and build a snapshot now (management command, tests, small exports)."""
    dv = dataset_version_create(project=project, policy=policy, name=name, user=user)
    return dataset_version_build(dataset_version_id=dv.pk, progress=progress)


class SnapshotCorrupt(ServiceError):
    status = 500
    code = "snapshot_corrupt"


def dataset_version_load(*, dataset_version: DatasetVersion) -> dict[str, list[dict]]:
    """Return the rows of a ready snapshot per split, after checking its content hash."""
    folder = Path(dataset_version.path)
    if dataset_version.status != DatasetVersion.Status.READY or not folder.is_dir():
        raise ServiceError("the snapshot is not ready.", code="not_ready", status=409)
    if data_hash(folder) != dataset_version.content_hash:
        raise SnapshotCorrupt(f"{folder}: files do not match content hash")
    out = {}
    for split in SPLITS:
        path = folder / f"{split}.jsonl"
        if path.exists():
            with path.open(encoding="utf-8") as fh:
                out[split] = [json.loads(line) for line in fh if line.strip()]
    return out


def dataset_file_path(*, dataset_version: DatasetVersion, name: str) -> Path:
    """Return the path of one file of a ready snapshot (a split, side file or manifest)."""
    if dataset_version.status != DatasetVersion.Status.READY:
        raise ServiceError("the snapshot is not ready.", code="not_ready", status=409)
    folder = Path(dataset_version.path)
    allowed = {p.name for p in folder.iterdir() if p.is_file()}
    if name not in allowed:
        raise ServiceError(f"no file {name!r} in this snapshot.", code="not_found", status=404)
    return folder / name
