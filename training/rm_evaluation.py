"""Evaluate a reward model on preference pairs: read them, score them, report the metrics.

Rows are read like ``import_preferences`` reads them (HH-RLHF dialogues, or TRL
``prompt/chosen/rejected``, plain or conversational; ``.gz`` allowed) and scored with
``training.trainers.reward.RewardScorer``, which tokenises exactly as the reward recipe did in
training (same eos, truncation and chat template). TRL rows are scored in their own shape;
an HH dialogue is scored through the tokenizer's chat template when the model has one of its
own (tiny GPT-2 RMs) and as the original plain dialogue otherwise (BERT-style encoders).

Metrics (``evaluation.stats.rm_metrics``): pairwise accuracy with a bootstrap CI,
Bradley-Terry NLL, ROC-AUC with the A/B order randomised (a chosen-first file has only
positive labels), ECE with its reliability bins, a temperature fitted on one half of the
prompts and judged on the other, the margin histogram, the reward's correlation with answer
length, and the reward scale (mean/std) the model puts out on these pairs.
``manage.py evaluate_rm`` is the command-line front.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import random
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.stats import rm_metrics

FORMATS = ("hh", "trl")
RENDERS = ("auto", "chat", "plain")
N_BINS = 10
N_BOOT = 1000


# ---- reading ----------------------------------------------------------------------------


def parse_pair_line(raw: bytes, fmt: str) -> tuple[dict | None, str | None]:
    """Return (pair, None) for a usable line, or (None, the problem).

    A pair is ``{"prompt": str} | {"messages": [...]}`` plus ``chosen``/``rejected`` answer
    texts and ``soft_label`` (P(chosen preferred), default 1; a row below 1/2 is turned round
    as the training loader does).
    """
    from annotation.imports import parse_pair

    try:
        row = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "not valid JSON"
    if not isinstance(row, dict) or not {"chosen", "rejected"} <= set(row):
        return None, "needs 'chosen' and 'rejected'"
    record, problems = parse_pair(row, fmt)
    if record is None:
        return None, problems[0] if problems else "unreadable pair"
    soft = row.get("soft_label", 1.0)
    if not isinstance(soft, int | float) or isinstance(soft, bool) or not 0 <= soft <= 1:
        return None, "'soft_label' must be a number in [0, 1]"
    chosen, rejected = (c["text"] for c in record["candidates"])
    if soft < 0.5:
        chosen, rejected, soft = rejected, chosen, 1.0 - soft
    pair = {"chosen": chosen, "rejected": rejected, "soft_label": float(soft)}
    if "messages" in record:
        pair["messages"] = record["messages"]
    else:
        pair["prompt"] = record["prompt"]
    return pair, None


def read_pairs(path: Path, fmt: str) -> tuple[list[dict], dict[str, Any]]:
    """Return the usable pairs of a JSONL file (gzip by suffix) and a summary of the rest."""
    opener = gzip.open if path.suffix == ".gz" else open
    digest = hashlib.sha256()
    pairs: list[dict] = []
    skipped: dict[str, int] = {}
    examples: list[str] = []
    rows = 0
    with opener(path, "rb") as stream:
        for lineno, raw in enumerate(stream, 1):
            digest.update(raw)
            if not raw.strip():
                continue
            rows += 1
            pair, problem = parse_pair_line(raw, fmt)
            if pair is not None:
                pairs.append(pair)
                continue
            skipped[problem] = skipped.get(problem, 0) + 1
            if len(examples) < 5:
                examples.append(f"line {lineno}: {problem}")
    summary = {
        "rows": rows,
        "skipped": sum(skipped.values()),
        "skipped_reasons": skipped,
        "skipped_examples": examples,
        "sha256": digest.hexdigest(),
    }
    return pairs, summary


def prompt_key(pair: dict) -> str:
    """Return a stable key of a pair's prompt (the unit of the validation/test split)."""
    payload = pair.get("prompt") if "prompt" in pair else pair["messages"]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# ---- scoring ----------------------------------------------------------------------------


def has_own_chat_template(tokenizer) -> bool:
    """Return whether the tokenizer came with a chat template (not the plain HH fallback)."""
    from training.trainers.chat_templates import PLAIN_CHAT_TEMPLATE

    template = getattr(tokenizer, "chat_template", None)
    return bool(template) and template != PLAIN_CHAT_TEMPLATE


def scoring_inputs(pair: dict, fmt: str, chat: bool) -> tuple[Any, Any, Any]:
    """Return (prompt, chosen completion, rejected completion) as the scorer takes them."""
    from annotation.imports import render_hh

    if "prompt" in pair:
        return pair["prompt"], pair["chosen"], pair["rejected"]
    messages = pair["messages"]
    if chat:
        return (
            messages,
            [{"role": "assistant", "content": pair["chosen"]}],
            [{"role": "assistant", "content": pair["rejected"]}],
        )
    # The plain dialogue, exactly as HH-RLHF writes it: "...\n\nAssistant: <answer>".
    return render_hh(messages) + "\n\nAssistant:", " " + pair["chosen"], " " + pair["rejected"]


def score_pairs(
    model_dir: str, pairs: list[dict], *, fmt: str, render: str, batch_size: int
) -> tuple[np.ndarray, np.ndarray, str]:
    """Return the chosen and rejected rewards of every pair and the rendering used."""
    from training.trainers.reward import RewardScorer

    scorer = RewardScorer(model_dir, batch_size=batch_size)
    chat = has_own_chat_template(scorer.tokenizer) if render == "auto" else render == "chat"
    prompts, chosen, rejected = [], [], []
    for pair in pairs:
        p, c, r = scoring_inputs(pair, fmt, chat)
        prompts.append(p)
        chosen.append(c)
        rejected.append(r)
    rewards = scorer.score(prompts + prompts, chosen + rejected)
    n = len(pairs)
    conversational = any("messages" in pair for pair in pairs)
    used = ("chat template" if chat else "plain dialogue") if conversational else "as given"
    return np.asarray(rewards[:n], dtype=float), np.asarray(rewards[n:], dtype=float), used


# ---- metrics ----------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Return JSON-ready data: dataclasses as dicts, numpy as Python, NaN/inf as None."""
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def accuracy_interval(
    chosen: np.ndarray, rejected: np.ndarray, *, seed: int, n_boot: int = N_BOOT
) -> list[float]:
    """Return the 95% percentile bootstrap interval of pairwise accuracy (pairs resampled)."""
    wins = np.where(chosen > rejected, 1.0, np.where(chosen == rejected, 0.5, 0.0))
    rng = np.random.default_rng(seed)
    means = wins[rng.integers(0, wins.size, size=(n_boot, wins.size))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return [float(low), float(high)]


def validation_split(pairs: list[dict], seed: int) -> np.ndarray:
    """Return a mask of the validation half, drawn by prompt so no prompt sits on both sides."""
    keys = sorted({prompt_key(p) for p in pairs})
    random.Random(seed).shuffle(keys)
    validation = set(keys[: len(keys) // 2])
    return np.array([prompt_key(p) in validation for p in pairs], dtype=bool)


def rm_report(
    pairs: list[dict], chosen: np.ndarray, rejected: np.ndarray, *, seed: int, n_bins: int = N_BINS
) -> dict[str, Any]:
    """Return every metric of one scored file as JSON-ready data."""
    soft = np.array([p["soft_label"] for p in pairs], dtype=float)
    soft_labels = None if np.all(soft == 1.0) else soft
    lengths_c = [len(p["chosen"]) for p in pairs]
    lengths_r = [len(p["rejected"]) for p in pairs]
    full = rm_metrics.evaluate_reward_model(
        chosen,
        rejected,
        soft_labels=soft_labels,
        chosen_lengths=lengths_c,
        rejected_lengths=lengths_r,
        n_bins=n_bins,
        seed=seed,
    )
    margins = chosen - rejected
    rewards = np.concatenate([chosen, rejected])
    report: dict[str, Any] = {
        "n_pairs": full["n_pairs"],
        "accuracy": full["accuracy"],
        "accuracy_ci95": accuracy_interval(chosen, rejected, seed=seed),
        "nll": full["nll"],
        "roc_auc": full["roc_auc"],
        "roc_auc_order": f"A/B order randomised with seed {seed}",
        "ece": full["ece"],
        "n_bins": n_bins,
        "reliability": full["reliability"],
        "margin_histogram": full["margin_histogram"],
        "margin": {
            "mean": float(margins.mean()),
            "median": float(np.median(margins)),
            "p05": float(np.quantile(margins, 0.05)),
            "p95": float(np.quantile(margins, 0.95)),
        },
        "length_correlation": full.get("length_correlation"),
        "length_buckets": length_bucket_accuracy(chosen, rejected, pairs),
        "reward_scale": {"mean": float(rewards.mean()), "std": float(rewards.std())},
    }
    report["temperature"] = temperature_report(
        pairs, chosen, rejected, soft, seed=seed, n_bins=n_bins
    )
    report = _plain(report)
    for bins in (
        report["reliability"],
        report["temperature"].get("test_reliability") or [],
        report["temperature"].get("test_reliability_at_temperature") or [],
    ):
        for row in bins:  # 0.30000000000000004 -> 0.3
            row["lower"], row["upper"] = round(row["lower"], 10), round(row["upper"], 10)
    return report


def length_bucket_accuracy(
    chosen: np.ndarray, rejected: np.ndarray, pairs: list[dict], *, n_buckets: int = 4
) -> list[dict[str, Any]]:
    """Return pairwise accuracy per quantile bucket of the pair's mean answer length (chars).

    A reward model that only learned "longer is better" is right on some buckets and wrong
    on others; one accuracy over all pairs hides it (Singhal et al. 2023, §3).
    """
    lengths = np.array([(len(p["chosen"]) + len(p["rejected"])) / 2 for p in pairs], dtype=float)
    edges = np.quantile(lengths, np.linspace(0, 1, n_buckets + 1))
    which = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, n_buckets - 1)
    wins = np.where(chosen > rejected, 1.0, np.where(chosen == rejected, 0.5, 0.0))
    longer_chosen = np.array([len(p["chosen"]) > len(p["rejected"]) for p in pairs])
    buckets = []
    for index in range(n_buckets):
        mask = which == index
        if not mask.any():
            continue
        buckets.append(
            {
                "lower": float(edges[index]),
                "upper": float(edges[index + 1]),
                "n_pairs": int(mask.sum()),
                "accuracy": float(wins[mask].mean()),
                "longer_chosen_share": float(longer_chosen[mask].mean()),
            }
        )
    return buckets


def temperature_report(
    pairs: list[dict],
    chosen: np.ndarray,
    rejected: np.ndarray,
    soft: np.ndarray,
    *,
    seed: int,
    n_bins: int,
) -> dict[str, Any]:
    """Fit T on the validation half of the prompts; return calibration before/after on the rest."""
    validation = validation_split(pairs, seed)
    test = ~validation
    if validation.sum() < 2 or test.sum() < 2:
        return {"value": None, "note": "too few prompts to split for temperature fitting"}
    temperature = rm_metrics.fit_temperature(
        chosen[validation], rejected[validation], soft[validation]
    )
    c, r, s = chosen[test], rejected[test], soft[test]
    before = rm_metrics.pair_confidences(c, r, 1.0)
    after = rm_metrics.pair_confidences(c, r, temperature)
    return {
        "value": temperature,
        "fitted_on": "validation half (split by prompt)",
        "validation_pairs": int(validation.sum()),
        "test_pairs": int(test.sum()),
        "test_nll": rm_metrics.bt_nll(c, r, s),
        "test_nll_at_temperature": rm_metrics.bt_nll(c, r, s, temperature),
        "test_ece": rm_metrics.expected_calibration_error(*before, n_bins),
        "test_ece_at_temperature": rm_metrics.expected_calibration_error(*after, n_bins),
        "test_reliability": rm_metrics.reliability_diagram(*before, n_bins),
        "test_reliability_at_temperature": rm_metrics.reliability_diagram(*after, n_bins),
    }


def reward_model_evaluate(
    *,
    model_dir: str | Path,
    pairs: list[dict],
    fmt: str,
    render: str = "auto",
    batch_size: int = 16,
    seed: int = 0,
) -> tuple[dict[str, Any], str]:
    """Score ``pairs`` with the reward model in ``model_dir``; return its report and rendering."""
    chosen, rejected, rendering = score_pairs(
        str(model_dir), pairs, fmt=fmt, render=render, batch_size=batch_size
    )
    return rm_report(pairs, chosen, rejected, seed=seed), rendering


def reward_model_evaluation_save(*, version, report: dict[str, Any]) -> None:
    """Store ``report`` as the model version's ``eval_results["rm_metrics"]``, keeping the rest.

    The temperature fitted on the held-out half goes to ``eval_results["calibration"]``, where
    the scorer reads it; a normalisation already frozen keeps the temperature it was measured at.
    """
    version.refresh_from_db(fields=["eval_results"])
    results = {**version.eval_results, "rm_metrics": report}
    temperature = (report.get("temperature") or {}).get("value")
    if temperature is not None:
        results["calibration"] = {
            **(results.get("calibration") or {}),
            "temperature": temperature,
            "temperature_fitted_on": report["temperature"]["fitted_on"],
        }
    version.eval_results = results
    version.save(update_fields=["eval_results"])


def reward_model_normalisation_freeze(
    *, version, policy_version, limit: int = 2000
) -> dict[str, Any]:
    """Measure mean and std of the reward of a reference policy's answers; freeze them.

    Scores are taken at the stored temperature; the result is written once into
    ``eval_results["calibration"]["normalisation"]`` and an existing one is never replaced.
    """
    from annotation.errors import Conflict
    from annotation.models import Candidate
    from training.loop import reward_model_trained_on_chat
    from training.scoring import reward_calibration, reward_scores

    version.refresh_from_db(fields=["eval_results"])
    stored = version.eval_results.get("calibration") or {}
    if stored.get("normalisation"):
        raise Conflict("this reward model's normalisation is already frozen")
    temperature = float(stored.get("temperature") or 1.0)
    from django.db.models import Q

    # Generated rounds name each candidate's policy by its (unique) version name.
    candidates = list(
        Candidate.objects.filter(
            Q(policy_version=policy_version)
            | Q(policy_version__isnull=True, model_name=policy_version.name)
        )
        .select_related("prompt")
        .order_by("pk")[:limit]
    )
    if len(candidates) < 2:
        raise Conflict(f"the reference policy has {len(candidates)} answer(s); 2 or more needed")
    chat = reward_model_trained_on_chat(version)
    calibration = reward_calibration({"calibration": {"temperature": temperature}})
    scores = []
    for candidate in candidates:
        prompt = candidate.prompt.messages or candidate.prompt.text
        if chat and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        scores.extend(
            reward_scores(version.artifact_path, prompt, [candidate.text], calibration=calibration)
        )
    values = np.asarray(scores, dtype=float)
    std = float(values.std())
    if not std > 0:
        raise Conflict("the reference policy's answers all get the same reward")
    normalisation = {
        "mean": float(values.mean()),
        "std": std,
        "temperature": temperature,
        "n_answers": len(candidates),
        "policy_version_id": policy_version.pk,
    }
    version.eval_results = {
        **version.eval_results,
        "calibration": {**stored, "normalisation": normalisation},
    }
    version.save(update_fields=["eval_results"])
    return normalisation


def reward_model_test_split_evaluate(*, version, dataset_version, seed: int = 0) -> dict | None:
    """Evaluate a reward model on its dataset version's held-out test split and store it.

    Returns the report (also saved as ``eval_results["rm_metrics"]`` with ``split: "test"``),
    or None when the export has no test pairs.
    """
    path = Path(dataset_version.path) / "test.jsonl"
    if not path.is_file():
        return None
    pairs, summary = read_pairs(path, "trl")
    if not pairs:
        return None
    report, rendering = reward_model_evaluate(
        model_dir=version.artifact_path, pairs=pairs, fmt="trl", seed=seed
    )
    report = {
        **report,
        "split": "test",
        "dataset_version_id": dataset_version.pk,
        "file_sha256": summary["sha256"],
        "rendering": rendering,
    }
    reward_model_evaluation_save(version=version, report=report)
    return report
