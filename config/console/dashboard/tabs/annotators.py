"""The Labels page, part two: agreement, each annotator against the others, QC, review queue."""

from __future__ import annotations

from annotation.models import Membership, TaskKind
from config.console.dashboard.data import ProjectData
from config.console.dashboard.panel import Panel, clip, empty, format_cell, messages_text, number
from config.console.dashboard.specs import ForestChart, ForestSeries
from evaluation.ai_agreement import ai_agreement_by_annotator
from evaluation.stats import quality

AGREEMENT_METRICS = (
    ("alpha", "Krippendorff's alpha"),
    ("percent_agreement", "Percent agreement"),
    ("fleiss_kappa", "Fleiss' kappa"),
    ("kendall_tau", "Kendall's tau-b"),
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
        note="Krippendorff's alpha (Krippendorff 2004) and Cohen's kappa (Cohen 1960) are "
        "chance-corrected (0 = chance, 1 = perfect); percent "
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


def ai_agreement_panel(data: ProjectData, *, n_boot: int = 300) -> Panel:
    """Return each AI annotator's agreement with the human majority, per round, with CIs."""
    key, title = "ai-agreement", "AI annotators against the humans"
    rows = []
    for row in ai_agreement_by_annotator(project=data.project, round_=data.round, n_boot=n_boot):
        estimate, low, high = _ci_parts(row["agreement"])
        rows.append(
            [
                row["round"],
                row["username"],
                row["description"],
                estimate,
                low,
                high,
                number(row["kappa"]),
                row["n_items"],
                row["n_decided"],
            ]
        )
    if not rows:
        return empty(key, title, "No AI annotator has labelled an item people labelled too.")
    ranking = data.project.task_kind == TaskKind.RANKING
    return Panel(
        key=key,
        title=title,
        columns=[
            "round",
            "annotator",
            "judge",
            "agreement",
            "ci low",
            "ci high",
            "cohen kappa",
            "items",
            "items with a human majority",
        ],
        rows=rows,
        chart=ForestChart(
            labels=[f"round {r[0]} · {r[1]}" for r in rows],
            series=[ForestSeries.from_rows("Agreement", rows, 3, 4, 5)],
            x_label="tau-b with the humans' mean ranks (95% CI)"
            if ranking
            else "share of items where the AI label equals the human majority (95% CI)",
            x_min=-1.0 if ranking else 0.0,
            x_max=1.0,
            percent=not ranking,
        ),
        wide=True,
        note="Each AI account (an LLM judge, a reward model) on the items people labelled too, "
        "never pooled (AlpacaFarm and MT-Bench validate AI judges this way). Agreement: the "
        "share of items whose AI label equals the human majority (1/m for one of m tied "
        "modes); Cohen's kappa against the majority where it is unique. An LLM judge's "
        "ties include the items whose two display orders disagreed.",
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
