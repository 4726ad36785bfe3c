"""The Reward models page: stored metrics of each, calibration and margins of one."""

from __future__ import annotations

from config.console.dashboard.data import ProjectData
from config.console.dashboard.panel import Panel, empty, format_cell, number
from config.console.dashboard.specs import (
    HistogramChart,
    ReliabilityChart,
    ReliabilityPoint,
    ReliabilitySeries,
)
from config.console.dashboard.tabs.annotators import agreement_panel
from training.models import ModelVersion


def reward_model_table_panel(versions: list[ModelVersion]) -> Panel:
    """Return one row per reward model: its stored evaluation metrics."""
    rows = []
    for v in versions:
        metrics = (v.eval_results or {}).get("rm_metrics") or {}
        temperature = metrics.get("temperature") or {}
        interval = metrics.get("accuracy_ci95") or [None, None]
        rows.append(
            [
                v.pk,
                v.name,
                (metrics.get("data") or {}).get("file"),
                metrics.get("n_pairs"),
                number(metrics.get("accuracy")),
                number(interval[0]),
                number(interval[1]),
                number(metrics.get("nll")),
                number(metrics.get("roc_auc")),
                number(metrics.get("ece")),
                number(temperature.get("value")),
                number(temperature.get("test_ece_at_temperature")),
                number((v.eval_results or {}).get("eval_accuracy")),
            ]
        )
    if not rows:
        return empty("reward-models", "Reward models", "No reward model in this project yet.")
    return Panel(
        key="reward-models",
        title="Reward models",
        columns=[
            "id",
            "reward model",
            "evaluated on",
            "pairs",
            "accuracy",
            "ci low",
            "ci high",
            "NLL",
            "ROC-AUC",
            "ECE",
            "temperature",
            "ECE at T (held-out half)",
            "training eval accuracy",
        ],
        rows=rows,
        wide=True,
        note="From manage.py evaluate_rm --model-version ID --file F --save. ROC-AUC uses a "
        "random A/B order; T (temperature scaling, Guo et al. 2017) is fitted on half of the "
        "prompts and judged on the other half.",
    )


def calibration_panel(version: ModelVersion) -> Panel:
    """Return a reward model's reliability diagram (before and after temperature scaling)."""
    title = f"Calibration: {version.name}"
    metrics = (version.eval_results or {}).get("rm_metrics")
    if not metrics:
        return empty(
            "calibration",
            title,
            f"Not evaluated yet: manage.py evaluate_rm --model-version {version.pk} "
            "--file <preferences.jsonl> --save",
        )
    temperature = metrics.get("temperature") or {}
    series_sources = [("All pairs, T = 1", metrics.get("reliability") or [])]
    if temperature.get("test_reliability_at_temperature"):
        value = number(temperature.get("value")) or 1.0
        series_sources = [
            ("Held-out half, T = 1", temperature.get("test_reliability") or []),
            (f"Held-out half, T = {value:.2f}", temperature["test_reliability_at_temperature"]),
        ]
    rows = []
    for name, bins in series_sources:
        for b in bins:
            if not b.get("count"):
                continue
            rows.append(
                [
                    name,
                    b["lower"],
                    b["upper"],
                    number(b["mean_confidence"]),
                    number(b["accuracy"]),
                    b["count"],
                ]
            )
    chart = ReliabilityChart(
        series=[
            ReliabilitySeries(
                name, [ReliabilityPoint(r[3], r[4], r[5]) for r in rows if r[0] == name]
            )
            for name, _ in series_sources
        ],
        x_label="model confidence max(p, 1 - p)",
        y_label="accuracy of the model's pick",
    )
    ece = number(metrics.get("ece"))
    note = (
        f"ECE (all pairs, T = 1) {format_cell(ece)}; points on the diagonal are calibrated, "
        "below it over-confident (ECE: expected calibration error, Guo et al. 2017). "
    )
    if temperature.get("value") is not None:
        note += (
            f"On the held-out half ECE goes {format_cell(number(temperature.get('test_ece')))} "
            f"→ {format_cell(number(temperature.get('test_ece_at_temperature')))} with T = "
            f"{format_cell(number(temperature.get('value')))}."
        )
    return Panel(
        key="calibration",
        title=title,
        columns=["series", "bin low", "bin high", "mean confidence", "accuracy", "pairs"],
        rows=rows,
        chart=chart,
        note=note,
    )


def margin_panel(version: ModelVersion) -> Panel:
    """Return a reward model's histogram of r(chosen) - r(rejected)."""
    title = f"Reward margins: {version.name}"
    metrics = (version.eval_results or {}).get("rm_metrics") or {}
    histogram = metrics.get("margin_histogram")
    if not histogram:
        return empty("margins", title, "Not evaluated yet.")
    edges, counts = histogram["edges"], histogram["counts"]
    rows = [[edges[i], edges[i + 1], counts[i]] for i in range(len(counts))]
    length = metrics.get("length_correlation") or {}
    scale = metrics.get("reward_scale") or {}
    note = "Pairs left of zero are ones the model gets wrong."
    if length:
        note += (
            f" Reward vs answer length: Spearman {format_cell(number(length.get('spearman')))} "
            f"(p {format_cell(number(length.get('spearman_p')))})."
        )
    if scale:
        note += (
            f" Reward scale on this file: mean {format_cell(number(scale.get('mean')))}, "
            f"sd {format_cell(number(scale.get('std')))}."
        )
    return Panel(
        key="margins",
        title=title,
        columns=["margin from", "margin to", "pairs"],
        rows=rows,
        chart=HistogramChart(
            edges=edges, counts=counts, x_label="reward margin r(chosen) - r(rejected)"
        ),
        note=note,
    )


def human_agreement_context_panel(data: ProjectData) -> Panel:
    """Return human-human agreement, the ceiling a reward model's accuracy is read against."""
    panel = agreement_panel(data)
    panel.title = "Human-human agreement (context for RM accuracy)"
    panel.extra = {}
    panel.note = "Annotators disagree too; RM accuracy is read against this, not against 100%."
    return panel
