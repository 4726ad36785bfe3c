"""The Labels page, part one: round progress, label mix, position bias (two: annotators.py)."""

from __future__ import annotations

from collections import Counter, defaultdict

from django.contrib.auth import get_user_model

from annotation.labels import ranking_to_shown
from annotation.models import LabelSource, TaskKind
from config.console.dashboard.data import ProjectData
from config.console.dashboard.panel import Panel, empty, number
from config.console.dashboard.specs import ForestChart, ForestSeries, StackedChart, StackedSeries
from evaluation.stats import quality

MAX_BIAS_ANNOTATORS = 30
SLOT_NAMES = "ABCDEFGH"
OUTCOME_LABELS = {"A": "A better", "B": "B better", "tie": "Tie", "both_bad": "Both bad"}
LABEL_COLORS = {"A": "a", "B": "b", "tie": "tie", "both_bad": "bad"}


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
        ranks = ranking_to_shown(ranking, order)
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
