"""The Labels page: round progress, label mix, position bias, agreement, annotators, queue."""

from __future__ import annotations

from collections import Counter, defaultdict

from django.contrib.auth import get_user_model

from annotation.models import LabelSource, Membership, TaskKind
from config.console.dashboard.data import ProjectData
from config.console.dashboard.panel import Panel, clip, empty, format_cell, messages_text, number
from config.console.dashboard.specs import ForestChart, ForestSeries, StackedChart, StackedSeries
from evaluation.stats import quality

MAX_BIAS_ANNOTATORS = 30
SLOT_NAMES = "ABCDEFGH"
OUTCOME_LABELS = {"A": "A better", "B": "B better", "tie": "Tie", "both_bad": "Both bad"}
LABEL_COLORS = {"A": "a", "B": "b", "tie": "tie", "both_bad": "bad"}
AGREEMENT_METRICS = (
    ("alpha", "Krippendorff's alpha"),
    ("percent_agreement", "Percent agreement"),
    ("fleiss_kappa", "Fleiss' kappa"),
    ("kendall_tau", "Kendall's tau-b"),
)


def round_progress_panel(data: ProjectData) -> Panel:
    """Return per round: items complete / in progress / not started and judgments needed."""
    overlap = data.project.overlap
    counts = data.round_counts
    rows = []
    for round_ in data.rounds:
        stats = counts.get(round_.pk, {})
        items = stats.get("items", 0)
        complete = stats.get("complete", 0)
        started = stats.get("started", 0)
        needed = items * overlap
        done = stats.get("done") or 0
        rows.append(
            [
                round_.number,
                round_.status,
                round_.model_version.name if round_.model_version else None,
                items,
                complete,
                started,
                items - complete - started,
                done,
                needed,
                done / needed if needed else None,
                stats.get("labels", 0),
            ]
        )
    if not rows:
        return empty("progress", "Round progress", "No rounds yet.")
    chart = StackedChart(
        labels=[f"Round {r[0]}" for r in rows],
        series=[
            StackedSeries("Complete", [r[4] for r in rows], "ok"),
            StackedSeries("In progress", [r[5] for r in rows], "warn"),
            StackedSeries("Not started", [r[6] for r in rows], "muted"),
        ],
        x_label="items",
    )
    return Panel(
        key="progress",
        title="Round progress",
        columns=[
            "round",
            "status",
            "policy",
            "items",
            "complete",
            "in progress",
            "not started",
            "judgments done",
            "judgments needed",
            "fraction done",
            "labels (all sources)",
        ],
        rows=rows,
        chart=chart,
        note=f"Items exclude gold; an item is complete with {overlap} primary judgments "
        "(the project's overlap). Labels count every source, gold and repeats included.",
    )


def label_distribution_panel(data: ProjectData) -> Panel:
    """Return the share of A / B / tie / both-bad per label source (ranks for rankings)."""
    key, title = "labels", "Label distribution"
    result = data.label_distribution
    by_source = result["by_source"]
    if not by_source:
        return empty(key, title, "No labels yet.")
    note = "Primary labels: no gold items, no repeats."
    if result["n_flagged"]:
        note += f" {result['n_flagged']} QC-flagged label(s) left out."
    if result["task_kind"] == TaskKind.RANKING:
        return _rank_distribution(key, title, by_source, note)
    rows = []
    for source, block in by_source.items():
        rows.append(
            [
                source,
                block["n"],
                *(block["counts"].get(label, 0) for label in OUTCOME_LABELS),
                *(number(block["shares"].get(label)) for label in OUTCOME_LABELS),
                number(block["left_share"]),
            ]
        )
    chart = StackedChart(
        labels=[f"{r[0]} (n={r[1]})" for r in rows],
        series=[
            StackedSeries(name, [r[6 + i] for r in rows], LABEL_COLORS[label])
            for i, (label, name) in enumerate(OUTCOME_LABELS.items())
        ],
        x_label="share of labels",
        percent=True,
    )
    return Panel(
        key=key,
        title=title,
        columns=[
            "source",
            "labels",
            "A",
            "B",
            "tie",
            "both bad",
            "A share",
            "B share",
            "tie share",
            "both-bad share",
            "left share",
        ],
        rows=rows,
        chart=chart,
        note=note + " A = the answer at canonical position 0 (not the side shown).",
    )


def _rank_distribution(key: str, title: str, by_source: dict, note: str) -> Panel:
    rows = []
    for source, block in by_source.items():
        for position, counts in enumerate(block["rank_counts"]):
            total = sum(counts) or 1
            rows.append([source, SLOT_NAMES[position], *counts, *(c / total for c in counts)])
    k = len(next(iter(by_source.values()))["rank_counts"])
    first = next(iter(by_source))
    shown = [r for r in rows if r[0] == first]
    chart = StackedChart(
        labels=[f"{first}: position {r[1]}" for r in shown],
        series=[
            StackedSeries(f"rank {rank + 1}", [r[2 + k + rank] for r in shown]) for rank in range(k)
        ],
        x_label="share of rankings",
        percent=True,
    )
    return Panel(
        key=key,
        title=title,
        columns=[
            "source",
            "position",
            *(f"rank {r + 1}" for r in range(k)),
            *(f"rank {r + 1} share" for r in range(k)),
        ],
        rows=rows,
        chart=chart,
        note=note + " Positions are canonical (A = position 0).",
    )


def position_bias_panel(data: ProjectData) -> Panel:
    """Return the share of decisions for the left-hand (or first-shown) answer, with CIs."""
    title = "Position bias"
    human = [
        j
        for j in data.judgments
        if j["source"] == LabelSource.HUMAN
        and not j["is_repeat"]
        and j["assignment__display_order"]
    ]
    if data.project.task_kind == TaskKind.RANKING:
        return _ranking_position_panel(data, human)
    groups: dict[str, list[str]] = {"All rounds": []}
    per_annotator: dict[int, list[str]] = defaultdict(list)
    for j in human:
        if j["shown_choice"] not in ("A", "B"):
            continue
        side = "left" if j["shown_choice"] == "A" else "right"
        groups["All rounds"].append(side)
        groups.setdefault(f"Round {j['item__round__number']}", []).append(side)
        if j["annotator_id"] is not None:
            per_annotator[j["annotator_id"]].append(side)
    top = sorted(per_annotator, key=lambda a: -len(per_annotator[a]))[:MAX_BIAS_ANNOTATORS]
    names = dict(get_user_model().objects.filter(pk__in=top).values_list("pk", "username"))
    scopes = sorted(groups, key=lambda g: (g != "All rounds", _round_sort(g)))
    scopes += sorted((names.get(a, str(a)) for a in top), key=str.lower)
    for annotator in top:
        groups[names.get(annotator, str(annotator))] = per_annotator[annotator]
    rows = []
    for name in scopes:
        bias = quality.position_bias(groups[name])
        if bias.n_decisions == 0:
            continue
        low, high = quality.wilson_interval(bias.n_left, bias.n_decisions)
        rows.append([name, bias.n_decisions, bias.n_left, bias.left_share, low, high, bias.p_value])
    if not rows:
        return empty("position-bias", title, "No human A/B decisions yet.")
    return Panel(
        key="position-bias",
        title=title,
        columns=["scope", "A/B decisions", "left chosen", "left share", "ci low", "ci high", "p"],
        rows=rows,
        chart=ForestChart(
            labels=[r[0] for r in rows],
            series=[ForestSeries.from_rows("Left share", rows, 3, 4, 5)],
            x_label="share of A/B decisions for the left answer (95% Wilson CI)",
            reference=0.5,
            reference_label="no bias",
            percent=True,
        ),
        note="Ties and both-bad are left out. Sides were shuffled per assignment, so an "
        "unbiased pool sits on 50%; p is a two-sided binomial test. Rows: all rounds, each "
        f"round, then each annotator (up to {MAX_BIAS_ANNOTATORS}, most decisions first).",
    )


def _round_sort(name: str) -> int:
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else 0


def _ranking_position_panel(data: ProjectData, human: list[dict]) -> Panel:
    """Return how often each display slot was ranked alone at the top, vs 1/K."""
    k = data.project.k
    firsts: Counter[int] = Counter()
    n = 0
    for j in human:
        ranking, order = j["ranking"], j["assignment__display_order"]
        if not ranking or len(order) != len(ranking):
            continue
        ranks = [ranking[position] for position in order]
        best = min(ranks)
        if ranks.count(best) != 1:
            continue
        firsts[ranks.index(best)] += 1
        n += 1
    if n == 0:
        return empty("position-bias", "Position bias", "No rankings with a single winner yet.")
    rows = []
    for slot in range(k):
        low, high = quality.wilson_interval(firsts[slot], n)
        rows.append([f"Slot {SLOT_NAMES[slot]}", n, firsts[slot], firsts[slot] / n, low, high])
    return Panel(
        key="position-bias",
        title="Position bias",
        columns=["shown as", "rankings", "ranked first", "share", "ci low", "ci high"],
        rows=rows,
        chart=ForestChart(
            labels=[r[0] for r in rows],
            series=[ForestSeries.from_rows("Ranked first", rows, 3, 4, 5)],
            x_label="share of rankings with this display slot alone on top (95% Wilson CI)",
            reference=1 / k,
            reference_label=f"1/{k}",
            percent=True,
        ),
        note="Display order was shuffled per assignment, so every slot should win 1/K of the "
        "time. Rankings with a tie at the top are left out.",
    )


def _ci_parts(ci: dict | None) -> tuple[float | None, float | None, float | None]:
    """Return (estimate, low, high) of a bootstrap CI block; None throughout when absent."""
    if ci is None:
        return None, None, None
    return number(ci["estimate"]), number(ci["low"]), number(ci["high"])


def agreement_panel(data: ProjectData) -> Panel:
    """Return agreement figures per label source with bootstrap CIs (human first)."""
    key, title = "agreement", "Inter-annotator agreement"
    result = data.agreement
    rows = []
    for source in result["sources"]:
        block = result["by_source"][source]
        for metric, label in AGREEMENT_METRICS:
            if block.get(metric) is None:
                continue
            estimate, low, high = _ci_parts(block[metric])
            rows.append(
                [
                    source,
                    label,
                    estimate,
                    low,
                    high,
                    block["n_items"],
                    block["n_judgments"],
                    block["n_annotators"],
                ]
            )
    if not rows:
        return empty(key, title, "No item has two labels yet.")
    scope = f"round {result['round']}" if result.get("round") else "all rounds"
    lows = [r[3] for r in rows if r[3] is not None]
    return Panel(
        key=key,
        title=title,
        columns=[
            "source",
            "metric",
            "estimate",
            "ci low",
            "ci high",
            "items with 2+ labels",
            "labels",
            "annotators",
        ],
        rows=rows,
        chart=ForestChart(
            labels=[f"{r[0]} · {r[1]}" for r in rows],
            series=[ForestSeries.from_rows("Agreement", rows, 2, 3, 4)],
            x_label=f"agreement, {scope} (95% CI, items resampled)",
            reference=0.0,
            reference_label="chance",
            x_min=min([0.0, *lows]),
            x_max=1.0,
        ),
        note="Alpha and kappa are chance-corrected (0 = chance, 1 = perfect); percent "
        "agreement is not. Sources are never pooled: simulated or AI labels are shown "
        "beside the human ones.",
        extra={"matrix": _kappa_matrix(result)},
    )


def _kappa_matrix(result: dict) -> dict | None:
    """Return the human annotator x annotator matrix as heat-table rows, or None."""
    block = result["by_source"].get("human") or {}
    pairwise = block.get("pairwise") or {}
    names = [a["name"] for a in pairwise.get("annotators", [])]
    if len(names) < 2 or len(names) > 30:
        return None
    rows = []
    for name, values, shared in zip(names, pairwise["matrix"], pairwise["n_shared"], strict=True):
        cells = []
        for value, n in zip(values, shared, strict=True):
            kappa = number(value)
            level = None if kappa is None else max(0, min(4, int((kappa + 0.2) / 0.24)))
            cells.append({"text": format_cell(kappa), "level": level, "n": n})
        rows.append({"name": name, "cells": cells})
    metric = "Cohen's kappa" if pairwise["metric"] == "cohen_kappa" else "Kendall's tau-b"
    return {
        "metric": metric,
        "names": names,
        "rows": rows,
        "min_shared": pairwise["min_shared_items"],
    }


def annotator_agreement_panel(data: ProjectData) -> Panel:
    """Return each human annotator's agreement with the others' consensus, with CIs."""
    key, title = "consensus", "Agreement with the other annotators"
    result = data.agreement
    block = result["by_source"].get("human")
    if not block:
        return empty(key, title, "No human labels yet.")
    rows = []
    for row in block["leave_one_out"]:
        estimate, low, high = _ci_parts(row["agreement"])
        if estimate is None:
            continue
        rows.append([row["name"], row["n_items"], estimate, low, high])
    if not rows:
        return empty(key, title, "No annotator shares an item with another yet.")
    ranking = result["task_kind"] == TaskKind.RANKING
    return Panel(
        key=key,
        title=title,
        columns=["annotator", "items", "agreement", "ci low", "ci high"],
        rows=rows,
        chart=ForestChart(
            labels=[r[0] for r in rows],
            series=[ForestSeries.from_rows("Agreement", rows, 2, 3, 4)],
            x_label="tau-b with the others' mean ranks"
            if ranking
            else "share of labels equal to the others' majority (95% CI)",
            x_min=-1.0 if ranking else 0.0,
            x_max=1.0,
            percent=not ranking,
        ),
        note="Each annotator against the consensus of the others on the same items "
        "(leave one out); a low outlier is worth a look before it is a verdict.",
    )


def annotator_quality_panel(data: ProjectData) -> Panel:
    """Return one row per annotator: labels, latest QC verdict and the figures behind it."""
    key, title = "annotators", "Annotator quality"
    rows = []
    gold_rows = []
    for row in data.annotator_quality:
        metrics = row["metrics"] or {}
        gold = metrics.get("gold") or {}
        stability = metrics.get("stability") or {}
        position = metrics.get("position") or {}
        speed = metrics.get("speed") or {}
        consensus = metrics.get("consensus") or {}
        assessment = row["assessment"] or {}
        labels = sum(row["sources"].values())
        if not labels and row["role"] != Membership.Role.ANNOTATOR:
            continue
        rows.append(
            [
                row["username"],
                row["role"],
                row["status"],
                labels,
                assessment.get("verdict"),
                ", ".join(assessment.get("failed_checks") or []),
                number(gold.get("accuracy")),
                gold.get("n_items"),
                number(stability.get("agreement")),
                stability.get("n_pairs"),
                number(position.get("left_share")),
                number(position.get("p_value")),
                number(speed.get("share_flagged")),
                number(consensus.get("p_value")),
                number(row["trust_weight"]),
            ]
        )
        if gold.get("n_items"):
            low, high = quality.wilson_interval(gold["n_correct"], gold["n_items"])
            gold_rows.append([row["username"], gold["n_correct"] / gold["n_items"], low, high])
    if not rows:
        return empty(key, title, "No annotator has labelled yet.")
    chart = None
    if gold_rows:
        chart = ForestChart(
            labels=[g[0] for g in gold_rows],
            series=[ForestSeries.from_rows("Gold accuracy", gold_rows, 1, 2, 3)],
            x_label="accuracy on gold items at the last QC check (95% Wilson CI)",
            x_min=0.0,
            x_max=1.0,
            percent=True,
        )
    return Panel(
        key=key,
        title=title,
        columns=[
            "annotator",
            "role",
            "status",
            "labels",
            "last verdict",
            "failed checks",
            "gold accuracy",
            "gold items",
            "self-agreement",
            "repeats",
            "left share",
            "left p",
            "too fast share",
            "consensus p",
            "trust weight",
        ],
        rows=rows,
        chart=chart,
        wide=True,
        note="Figures are from each annotator's latest stored QC assessment; a dash means "
        "not judged yet (too little data) or no check has run.",
    )


def disagreement_panel(data: ProjectData) -> Panel:
    """Return the items waiting for review, most split first."""
    key, title = "disagreements", "Disagreement queue"
    result = data.disagreements
    rows = [
        [
            entry["item_id"],
            entry["round"],
            number(entry["majority_share"]),
            entry["n_votes"],
            ", ".join(f"{k}: {v}" for k, v in sorted(entry["vote_counts"].items())),
            len(entry["adjudications"]),
            clip(entry["prompt"]["text"] or messages_text(entry["prompt"]["messages"]))[:120],
        ]
        for entry in result["results"]
    ]
    if not rows:
        return empty(key, title, "No item is waiting for review.")
    return Panel(
        key=key,
        title=title,
        columns=[
            "item",
            "round",
            "majority share",
            "votes",
            "votes by label",
            "adjudications",
            "prompt",
        ],
        rows=rows,
        note=f"{result['count']} item(s) flagged for review; the {len(rows)} most split "
        "are listed. Split items may be signal (ambiguous prompts), not noise.",
        wide=True,
    )
