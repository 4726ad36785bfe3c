"""The Models page: leaderboard, battles per pair, win rates, true reward, samples."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from annotation.models import Candidate, Prompt, TaskKind
from config.console.dashboard.data import Battle, ProjectData
from config.console.dashboard.panel import (
    MAX_SAMPLE_CHARS,
    Panel,
    clip,
    empty,
    messages_text,
    number,
)
from config.console.dashboard.specs import ForestChart, ForestSeries
from evaluation.stats import leaderboard, winrate

MAX_WINRATE_PAIRS = 20
MAX_SAMPLE_PROMPTS = 3
LEADERBOARD_BOOT = 200
WINRATE_BOOT = 1_000
LC_BOOT = 100
# Below this many decisive votes the length fit is mostly noise (often separable): not shown.
LC_MIN_VOTES = 30

BATTLE_NOTE = (
    "Battles are human, non-gold, non-repeat, unflagged judgments on items whose answers "
    "come from different models."
)


def leaderboard_panel(data: ProjectData) -> Panel:
    """Return Bradley-Terry ratings with bootstrap CIs and CI-based ranks."""
    title = "Leaderboard"
    counts = data.battle_counts
    if len(counts.models) < 2:
        return empty("leaderboard", title, "Needs judgments comparing at least two models.")
    board = leaderboard.leaderboard(
        counts,
        n_boot=LEADERBOARD_BOOT,
        seed=0,
        ties="half",
    )
    rows = [
        [
            r.rank,
            str(r.model),
            r.rating,
            r.ci_low,
            r.ci_high,
            r.n_battles,
            r.wins,
            r.losses,
            r.ties,
            r.both_bad,
        ]
        for r in board.rows
    ]
    note = (
        f"Bradley-Terry ratings (Bradley and Terry 1952) on the Chatbot Arena scale (Chiang et al. "
        "2024; mean 1000, 400 points = 10:1 odds); 95% CIs from "
        f"{LEADERBOARD_BOOT} bootstrap resamples of battles; a tie counts half, both-bad is left "
        "out of the fit. Rank = 1 + models whose interval lies wholly above. " + BATTLE_NOTE
    )
    if data.project.task_kind == TaskKind.RANKING:
        note += " Rankings were split into pairs, which are correlated: the CIs are too narrow."
    return Panel(
        key="leaderboard",
        title=title,
        columns=[
            "rank",
            "model",
            "rating",
            "ci low",
            "ci high",
            "battles",
            "wins",
            "losses",
            "ties",
            "both bad",
        ],
        rows=rows,
        chart=ForestChart(
            labels=[f"#{r[0]} {r[1]}" for r in rows],
            series=[ForestSeries.from_rows("Rating", rows, 2, 3, 4)],
            x_label="Bradley-Terry rating (95% bootstrap CI)",
            reference=1000.0,
            reference_label="mean",
        ),
        note=note,
    )


def battle_counts_panel(data: ProjectData) -> Panel:
    """Return the raw battle graph: outcomes per model pair."""
    counts = data.battle_counts
    if counts.n_battles == 0:
        return empty("battles", "Battles per model pair", "No battles yet.")
    rows = []
    for p in range(len(counts.first)):
        first, second = counts.models[counts.first[p]], counts.models[counts.second[p]]
        outcome = [int(counts.first_wins[p]), int(counts.second_wins[p])]
        ties, both_bad = int(counts.ties[p]), int(counts.both_bad[p])
        rows.append(
            [str(first), str(second), *outcome, ties, both_bad, sum(outcome) + ties + both_bad]
        )
    rows.sort(key=lambda r: -r[-1])
    return Panel(
        key="battles",
        title="Battles per model pair",
        columns=["model", "opponent", "model wins", "opponent wins", "ties", "both bad", "battles"],
        rows=rows,
        note="The raw comparisons behind the leaderboard, so the ratings can be checked.",
    )


def _pair_outcomes(
    battles: list[Battle], model: str, opponent: str
) -> tuple[list[int], list[str], list[float]]:
    """Return prompts, outcomes from ``model``'s side and its length advantage per battle."""
    as_a = {"A": "win", "B": "loss", "tie": "tie", "both_bad": "both_bad"}
    as_b = {"A": "loss", "B": "win", "tie": "tie", "both_bad": "both_bad"}
    prompts, outcomes, diffs = [], [], []
    for b in battles:
        if (b.model_a, b.model_b) == (model, opponent):
            prompts.append(b.prompt_id)
            outcomes.append(as_a[b.outcome])
            diffs.append(float(b.length_a - b.length_b))
        elif (b.model_a, b.model_b) == (opponent, model):
            prompts.append(b.prompt_id)
            outcomes.append(as_b[b.outcome])
            diffs.append(float(b.length_b - b.length_a))
    return prompts, outcomes, diffs


def _win_rate_row(
    battles: list[Battle], newer: str, older: str, relation: str
) -> list[float | int | str | None]:
    prompts, outcomes, diffs = _pair_outcomes(battles, newer, older)
    result = winrate.win_rate(outcomes, prompts, n_boot=WINRATE_BOOT, seed=0)
    lc = None
    if result.wins + result.ties + result.losses >= LC_MIN_VOTES and any(diffs):
        lc = winrate.length_controlled_win_rate(outcomes, diffs, prompts, n_boot=LC_BOOT)
    n = len(outcomes)
    return [
        newer,
        older,
        relation,
        result.wins,
        result.ties,
        result.losses,
        result.both_bad,
        result.both_bad / n if n else None,
        result.win_rate,
        result.ci_low,
        result.ci_high,
        result.n_prompts,
        lc.win_rate if lc else None,
        lc.ci_low if lc else None,
        lc.ci_high if lc else None,
        float(np.mean(diffs)) if diffs else None,
    ]


def win_rate_panel(data: ProjectData) -> Panel:
    """Return newer-vs-older win rates for every model pair that met, with clustered CIs."""
    title = "Win rates: newer model vs older"
    battles = data.battles
    pair_sizes = Counter(frozenset((b.model_a, b.model_b)) for b in battles)
    if not pair_sizes:
        return empty("winrates", title, "No battles yet.")
    order = data.model_order
    parents = {v.name: v.parent.name for v in data.versions if v.parent_id}
    baseline = min(order, key=order.__getitem__) if order else None
    rows = []
    for pair, _ in pair_sizes.most_common(MAX_WINRATE_PAIRS):
        older, newer = sorted(pair, key=lambda m: (order.get(m, math.inf), m))
        relation = (
            "vs parent"
            if parents.get(newer) == older
            else "vs baseline"
            if older == baseline
            else ""
        )
        rows.append(_win_rate_row(battles, newer, older, relation))
    rows.sort(key=lambda r: (-order.get(r[0], -1), order.get(r[1], -1)))
    chart = ForestChart(
        labels=[f"{r[0]} vs {r[1]}" + (f" ({r[2][3:]})" if r[2] else "") for r in rows],
        series=[
            ForestSeries.from_rows("Win rate", rows, 8, 9, 10),
            ForestSeries.from_rows("Length-controlled", rows, 12, 13, 14),
        ],
        x_label="win rate of the newer model, (W + T/2) / (W + T + L), 95% CI by prompt",
        reference=0.5,
        reference_label="parity",
        x_min=0.0,
        x_max=1.0,
        percent=True,
    )
    return Panel(
        key="winrates",
        title=title,
        columns=[
            "model",
            "opponent",
            "relation",
            "wins",
            "ties",
            "losses",
            "both bad",
            "both-bad share",
            "win rate",
            "ci low",
            "ci high",
            "prompts",
            "LC win rate",
            "LC ci low",
            "LC ci high",
            "mean length diff (chars)",
        ],
        rows=rows,
        chart=chart,
        wide=True,
        note="Ties count half; both-bad votes are reported apart and left out of the rate. "
        f"CIs resample prompts ({WINRATE_BOOT} draws), not votes. The length-controlled rate "
        "is the win rate predicted at equal answer length (Dubois et al. 2024, Length-Controlled "
        "AlpacaEval), shown from "
        f"{LC_MIN_VOTES} decisive votes. "
        f"Newer = registered later (or, without a version, first generated later). {BATTLE_NOTE}",
    )


def true_reward_panel(data: ProjectData) -> Panel | None:
    """Return the demo domain's held-out true reward per policy (None when no version has it)."""
    rows = []
    for version in data.versions:
        results = version.eval_results or {}
        estimate = number(results.get("true_reward"))
        if estimate is None:
            continue
        interval = results.get("true_reward_ci95") or [None, None]
        rows.append(
            [
                version.name,
                version.parent.name if version.parent_id else None,
                estimate,
                number(interval[0]),
                number(interval[1]),
                number(results.get("accuracy")),
                results.get("n_prompts"),
            ]
        )
    if not rows:
        return None
    return Panel(
        key="true-reward",
        title="True reward on held-out prompts",
        columns=["policy", "parent", "true reward", "ci low", "ci high", "accuracy", "prompts"],
        rows=rows,
        chart=ForestChart(
            labels=[r[0] for r in rows],
            series=[ForestSeries.from_rows("True reward", rows, 2, 3, 4)],
            x_label="mean true reward (95% CI, prompts resampled)",
        ),
        note="The demo domain's programmatic reward, which no policy was trained on.",
    )


def _sample_prompts(data: ProjectData) -> tuple[list[int], dict[int, set], dict[tuple, int]]:
    """Return the prompts to show, the models that answered each, and each latest answer."""
    models_per_prompt: dict[int, set[str]] = defaultdict(set)
    latest: dict[tuple[int, str], int] = {}
    for prompt_id, candidate_id, key in data.candidate_models:
        models_per_prompt[prompt_id].add(key)
        latest[(prompt_id, key)] = max(latest.get((prompt_id, key), 0), candidate_id)
    newest = {p: max(latest[(p, m)] for m in models) for p, models in models_per_prompt.items()}
    ranked = sorted(
        (p for p, models in models_per_prompt.items() if len(models) >= 2),
        key=lambda p: (-len(models_per_prompt[p]), -newest[p]),
    )
    # Newest prompts first, but each pick should bring a model not shown yet, while any is.
    chosen: list[int] = []
    covered: set[str] = set()
    for prompt_id in ranked:
        if len(chosen) == MAX_SAMPLE_PROMPTS:
            break
        if models_per_prompt[prompt_id] - covered:
            chosen.append(prompt_id)
            covered |= models_per_prompt[prompt_id]
    for prompt_id in ranked:
        if len(chosen) == MAX_SAMPLE_PROMPTS:
            break
        if prompt_id not in chosen:
            chosen.append(prompt_id)
    return chosen, models_per_prompt, latest


def samples_panel(data: ProjectData) -> Panel:
    """Return answers of each model to the same few prompts, and each version's eval example."""
    rows = []
    for version in data.versions:
        example = (version.eval_results or {}).get("example")
        if isinstance(example, dict) and example.get("answer") is not None:
            rows.append(
                [
                    "held-out example",
                    version.name,
                    clip(str(example.get("prompt", ""))),
                    clip(str(example["answer"])),
                ]
            )
    chosen, models_per_prompt, latest = _sample_prompts(data)
    if chosen:
        prompts = {p.pk: p for p in Prompt.objects.filter(pk__in=chosen)}
        wanted = [cid for (pid, _), cid in latest.items() if pid in prompts]
        texts = dict(Candidate.objects.filter(pk__in=wanted).values_list("pk", "text"))
        order = data.model_order
        for prompt_id in chosen:
            prompt = prompts[prompt_id]
            prompt_text = prompt.text or messages_text(prompt.messages)
            for key in sorted(models_per_prompt[prompt_id], key=lambda m: order.get(m, 0)):
                text = texts.get(latest[(prompt_id, key)], "")
                rows.append([f"prompt {prompt_id}", key, clip(prompt_text), clip(text)])
    if not rows:
        return empty("samples", "Samples", "No prompt was answered by two models yet.")
    groups: list[dict[str, Any]] = []
    for source, model, prompt_text, answer in rows:
        if not groups or (groups[-1]["source"], groups[-1]["prompt"]) != (source, prompt_text):
            groups.append({"source": source, "prompt": prompt_text, "answers": []})
        groups[-1]["answers"].append({"model": model, "text": answer})
    return Panel(
        extra={"groups": groups},
        show_table=False,
        key="samples",
        title="Samples on the same prompts",
        columns=["source", "model", "prompt", "answer"],
        rows=rows,
        note="Each policy's held-out evaluation example, then up to "
        f"{MAX_SAMPLE_PROMPTS} prompts from the latest rounds chosen to show every model "
        "(latest answer of each). Texts are cut at "
        f"{MAX_SAMPLE_CHARS} characters.",
    )
