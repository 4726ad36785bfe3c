"""The Reward models page: stored metrics of each; calibration, margins, length of one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from config.console.dashboard.data import ProjectData
from config.console.dashboard.panel import Panel, empty, format_cell, number
from config.console.dashboard.specs import (
    ForestChart,
    ForestSeries,
    HistogramChart,
    ReliabilityChart,
    ReliabilityPoint,
    ReliabilitySeries,
)
from config.console.dashboard.tabs.annotators import agreement_panel
from evaluation.stats.quality import wilson_interval
from training.models import ModelVersion

# The record the reward recipe writes beside an ensemble (training.trainers.reward.ENSEMBLE_FILE;
# named here so a page view does not import the training library; a test keeps them equal).
ENSEMBLE_FILE = "prefloop_ensemble.json"


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


def length_bucket_panel(version: ModelVersion) -> Panel:
    """Return a reward model's pairwise accuracy per answer-length bucket, with the correlation."""
    key, title = "length-buckets", f"Accuracy by answer length: {version.name}"
    metrics = (version.eval_results or {}).get("rm_metrics")
    if not metrics:
        return empty(key, title, "Not evaluated yet.")
    if "length_buckets" not in metrics:
        return empty(
            key,
            title,
            "This evaluation was stored before length buckets were: run evaluate_rm --save "
            "again to see them.",
        )
    rows = []
    for bucket in metrics["length_buckets"]:
        n, accuracy = bucket["n_pairs"], number(bucket["accuracy"])
        # Ties count half a pair; the Wilson interval takes the (fractional) successes as given.
        low, high = wilson_interval(accuracy * n, n) if accuracy is not None else (None, None)
        rows.append(
            [
                bucket["lower"],
                bucket["upper"],
                n,
                accuracy,
                low,
                high,
                number(bucket["longer_chosen_share"]),
            ]
        )
    if not rows:
        return empty(key, title, "No pairs in the evaluation file.")
    length = metrics.get("length_correlation") or {}
    note = (
        "Pairs split into quarters by the mean length (characters) of their two answers; 95% "
        'Wilson intervals. A reward model that learned "longer is better" is right where the '
        "longer answer was chosen and wrong elsewhere, which one overall accuracy hides "
        "(Singhal et al. 2023, A Long Way to Go: Investigating Length Correlations in RLHF). "
    )
    if length:
        note += (
            f"Reward vs answer length over all answers: Spearman "
            f"{format_cell(number(length.get('spearman')))} (p "
            f"{format_cell(number(length.get('spearman_p')))}), Pearson "
            f"{format_cell(number(length.get('pearson')))}."
        )
    return Panel(
        key=key,
        title=title,
        columns=[
            "length from",
            "length to",
            "pairs",
            "accuracy",
            "ci low",
            "ci high",
            "longer answer chosen",
        ],
        rows=rows,
        chart=ForestChart(
            labels=[f"{r[0]:.0f}–{r[1]:.0f} chars ({r[2]} pairs)" for r in rows],
            series=[ForestSeries.from_rows("Accuracy", rows, 3, 4, 5)],
            x_label="pairwise accuracy (95% Wilson CI)",
            reference=0.5,
            reference_label="chance",
            x_min=0.0,
            x_max=1.0,
            percent=True,
        ),
        note=note,
    )


def ensemble_record(version: ModelVersion) -> dict[str, Any] | None:
    """Return the ensemble record saved beside a reward model, or None for a single model."""
    if not version.artifact_path:
        return None
    path = Path(version.artifact_path) / ENSEMBLE_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def calibration_summary_panel(version: ModelVersion) -> Panel:
    """Return what turns this model's raw reward into the one used: T, normalisation, ensemble."""
    key, title = "rm-calibration", f"Temperature, normalisation and ensemble: {version.name}"
    results = version.eval_results or {}
    stored = results.get("calibration") or {}
    temperature = (results.get("rm_metrics") or {}).get("temperature") or {}
    rows: list[list[Any]] = []
    if stored.get("temperature") is not None:
        rows.append(
            [
                "temperature T (applied by the scorer)",
                number(stored["temperature"]),
                stored.get("temperature_fitted_on", ""),
            ]
        )
    if temperature.get("value") is not None:
        held_out = f"{temperature.get('test_pairs')} held-out pairs"
        if stored.get("temperature") is None:
            rows.append(
                [
                    "temperature T (fitted, not applied)",
                    number(temperature["value"]),
                    "not stored for the scorer: raw rewards are used (evaluate_rm --save)",
                ]
            )
        rows += [
            ["held-out ECE at T = 1", number(temperature.get("test_ece")), held_out],
            ["held-out ECE at T", number(temperature.get("test_ece_at_temperature")), held_out],
            ["held-out NLL at T = 1", number(temperature.get("test_nll")), held_out],
            ["held-out NLL at T", number(temperature.get("test_nll_at_temperature")), held_out],
        ]
    normalisation = stored.get("normalisation")
    if normalisation:
        reference = ModelVersion.objects.filter(pk=normalisation["policy_version_id"]).first()
        name = reference.name if reference else f"policy {normalisation['policy_version_id']}"
        source = f"{normalisation['n_answers']} answers of {name}"
        rows += [
            ["frozen normalisation: mean", number(normalisation["mean"]), source],
            ["frozen normalisation: std", number(normalisation["std"]), source],
            ["frozen normalisation: measured at T", number(normalisation["temperature"]), ""],
        ]
    ensemble = ensemble_record(version)
    if ensemble:
        seeds = ", ".join(str(s) for s in ensemble.get("seeds", []))
        rows.append(["ensemble members", ensemble["size"], f"seeds {seeds}"])
        if ensemble.get("validation_mean_std") is not None:
            rows.append(
                [
                    "ensemble spread (mean std of a reward)",
                    number(ensemble["validation_mean_std"]),
                    "on the training export's validation pairs",
                ]
            )
    if not rows:
        return empty(
            key,
            title,
            f"Raw rewards: no temperature fitted (manage.py evaluate_rm --model-version "
            f"{version.pk} ... --save), no normalisation frozen (manage.py "
            "freeze_rm_normalisation), a single model.",
        )
    return Panel(
        key=key,
        title=title,
        columns=["quantity", "value", "measured on"],
        rows=rows,
        note="The reward the AI annotator reads is (r / T - mean) / std. T is fitted on half of "
        "the evaluation prompts and judged on the other half (temperature scaling, Guo et al. "
        "2017, On Calibration of Modern Neural Networks); mean and std are frozen once, on the "
        "reference policy's answers, so a reward reads as standard deviations from it. An "
        "ensemble's spread is the disagreement of its members (Coste et al. 2024, Reward Model "
        "Ensembles Help Mitigate Overoptimization).",
    )
