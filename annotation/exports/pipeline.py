"""Run one export: read, decide, render and write every row of a snapshot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.db import connection, transaction
from django.db.models import Q

from annotation.dedup import DedupTracker, MinHasher
from annotation.exports.decisions import Decider, Decision, gold_weights, votes_by_pair
from annotation.exports.formats import Renderer, encode
from annotation.exports.policy import UNTRUSTED_WEIGHT, ExportPolicy, split_for
from annotation.exports.select import excluded_counts, merge_units, prompt_groups
from annotation.exports.writer import SnapshotWriter
from annotation.imports import render_hh
from annotation.models import (
    Project,
    Prompt,
)
from evaluation.stats import aggregation
from training.trainers.data import SPLITS


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
        units = merge_units(group, tracker, policy.merge_duplicate_pairs)
        tracker.forget_prompt_scope()
        for unit in units:
            for (i, j), votes in votes_by_pair(unit).items():
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
    n_adjudicated = 0
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
            units = merge_units(group, tracker, policy.merge_duplicate_pairs)
            prompt_json = encode(renderer.prompt(group.payload))
            for unit in units:
                rounds |= unit.rounds
                n_votes += len(unit.votes)
                n_adjudicated += unit.adjudicated
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
        "judgments": excluded_counts(project, policy),
        "votes_used": n_votes,
        "decisions": dict(decisions),
        "dropped": dropped,
        "dedup": tracker.report(),
        "conversational": conversational,
    }
    if policy.adjudicated_wins:
        report["adjudicated_items"] = n_adjudicated
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
