"""Data behind the researchers' evaluation dashboard: one builder per panel, and its CSV.

Every panel is a `Panel`: a table (columns + rows, the numbers a researcher can download)
and, for most, a chart spec that `static/dashboard/dashboard.js` draws with Chart.js. The
chart is built from the same rows, so the CSV is always what the chart shows.

Figures come from the pure libraries (`leaderboard`, `winrate`, `rm_metrics`, `curves`,
`quality`) and from the QC selectors in `evaluation.selectors` (agreement, annotator
quality, label distribution, disagreements); a QC selector that does not exist yet gives an
"unavailable" panel. A `ProjectData` loads a project's judgments and candidates once per
request, and the panels of a page share it.

Battles (leaderboard, win rates): every human, non-gold, non-repeat judgment on an item whose
candidates come from different models. A model is its registered policy version when the
candidate has one, else its ``model_name`` (else checkpoint). A pairwise choice is one battle
(position 0 vs position 1); a K-way ranking gives K(K-1)/2 battles, which are correlated, so
their intervals are too narrow by an unknown factor (said on the page).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, is_dataclass
from functools import cached_property
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from django.contrib.auth import get_user_model
from django.db.models import Count, IntegerField, Max, Min, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce, Length

from annotation.models import (
    Choice,
    Item,
    ItemCandidate,
    Judgment,
    LabelSource,
    Membership,
    Project,
    Round,
    TaskKind,
)
from evaluation import leaderboard
from evaluation.agreement_cache import project_agreement_cached
from evaluation.stats import curves, quality, winrate
from training.models import ModelVersion, TrainingRun

# Size caps: pages stay fast on big projects; each cap is named on the page when it bites.
MAX_JUDGMENTS = 200_000
MAX_WINRATE_PAIRS = 20
MAX_SAMPLE_PROMPTS = 3
MAX_SAMPLE_CHARS = 1_500
MAX_METRIC_LINES = 50_000
MAX_CURVE_POINTS = 1_000
MAX_QC_ROWS = 200
MAX_QUEUE_ROWS = 20
MAX_BIAS_ANNOTATORS = 30
AGREEMENT_BOOT = 300
LEADERBOARD_BOOT = 200
WINRATE_BOOT = 1_000
LC_BOOT = 100
# Below this many decisive votes the length fit is mostly noise (often separable): not shown.
LC_MIN_VOTES = 30

OUTCOMES = (Choice.A, Choice.B, Choice.TIE, Choice.BOTH_BAD)
OUTCOME_LABELS = {"A": "A better", "B": "B better", "tie": "Tie", "both_bad": "Both bad"}

# Logged keys of each curve, first match wins (our PPO, TRL GRPO/RLOO, TRL PPO, SFT/DPO/RM).
CURVE_KEYS: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "score/raw_mean", "objective/scores", "objective/rlhf_reward"),
    "kl": ("kl/seq_mean", "kl", "objective/kl"),
    "entropy": ("entropy/rollout", "entropy", "ppo/entropy", "policy/entropy_avg"),
    "response_length": ("response/length_mean", "completions/mean_length", "response_length"),
    "loss": ("loss", "ppo/policy_loss", "loss/policy_avg"),
    "value_loss": ("value_loss", "ppo/value_loss", "loss/value_avg"),
}
# The curve each alarm kind is about (its label is drawn there; other curves get the line).
ALARM_METRICS = {
    "kl_limit": "kl",
    "kl_superlinear": "kl",
    "length_explosion": "response_length",
    "entropy_collapse": "entropy",
    "value_loss_spike": "value_loss",
}
CURVE_TITLES = {
    "reward": "Reward",
    "kl": "KL to the reference",
    "entropy": "Entropy",
    "response_length": "Response length",
    "loss": "Loss",
    "value_loss": "Value loss",
}


# ---- panels -----------------------------------------------------------------------------


@dataclass
class Panel:
    """One dashboard panel: a table, an optional chart spec drawn from it, and notes."""

    key: str
    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    chart: dict[str, Any] | None = None
    note: str = ""
    status: str = "ok"  # ok | empty | unavailable
    message: str = ""
    wide: bool = False
    show_table: bool = True
    # Template-only extras (e.g. samples grouped by prompt); never part of the CSV.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def has_data(self) -> bool:
        return self.status == "ok" and bool(self.rows)

    def cells(self) -> list[list[tuple[str, bool]]]:
        """Return the rows as (short text, is a number) pairs for the HTML table."""
        return [
            [
                (format_cell(value), isinstance(value, int | float) and not isinstance(value, bool))
                for value in row
            ]
            for row in self.rows
        ]

    def as_csv(self) -> str:
        """Return the table as CSV (full precision; empty cell for a missing value)."""
        out = io.StringIO()
        # RFC 4180 line ends: a cell holding a lone carriage return is quoted too.
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow([csv_cell(column) for column in self.columns])
        for row in self.rows:
            writer.writerow(["" if v is None else csv_cell(v) for v in row])
        return out.getvalue()


def format_cell(value: Any) -> str:
    """Return a cell as text: floats to 3 decimals (0 from 100 up), None as a dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3f}"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


# A spreadsheet runs a cell that starts with one of these as a formula ("CSV injection",
# OWASP); text cells get a leading apostrophe so they stay text. Tab and carriage return are
# on the list because some spreadsheets strip them and then read the rest as a formula.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """Return a value as written to a CSV cell: numbers as numbers, formula-like text escaped."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, int | float | np.number):
        return value
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    if text.startswith(FORMULA_START) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def finite(value: Any) -> Any:
    """Return chart data with NaN and infinities as None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if isinstance(value, np.generic):
        return finite(value.item())
    return value


def empty(key: str, title: str, message: str, **extra: Any) -> Panel:
    return Panel(key=key, title=title, status="empty", message=message, **extra)


def unavailable(key: str, title: str, message: str) -> Panel:
    return Panel(key=key, title=title, status="unavailable", message=message)


def _num(value: Any) -> float | None:
    """Return a finite float, or None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def forest_chart(
    labels: list[str],
    series: list[dict[str, Any]],
    *,
    x_label: str,
    reference: float | None = None,
    reference_label: str = "",
    x_min: float | None = None,
    x_max: float | None = None,
    percent: bool = False,
) -> dict[str, Any]:
    """Return a forest-plot spec: per label, each series' estimate with its interval."""
    return {
        "type": "forest",
        "labels": labels,
        "series": series,
        "x_label": x_label,
        "reference": reference,
        "reference_label": reference_label,
        "x_min": x_min,
        "x_max": x_max,
        "percent": percent,
    }


# ---- access -----------------------------------------------------------------------------


def dashboard_projects(*, user) -> list[Project]:
    """Return the projects whose dashboard the user may read: all for staff, else researched."""
    projects = Project.objects.all()
    if not user.is_staff:
        projects = projects.filter(
            memberships__user=user, memberships__role=Membership.Role.RESEARCHER
        )
    return list(projects.order_by("name"))


def project_overview_panel(*, projects: list[Project]) -> Panel:
    """Return one row per project: rounds, items, labels, models, runs, last label."""
    ids = [p.pk for p in projects]

    def count(model, **filters):
        return Coalesce(
            Subquery(
                model.objects.filter(project=OuterRef("pk"), **filters)
                .order_by()
                .values("project")
                .annotate(n=Count("pk"))
                .values("n"),
                output_field=IntegerField(),
            ),
            0,
        )

    last = Judgment.objects.filter(project=OuterRef("pk")).order_by("-created_at")
    rows = (
        Project.objects.filter(pk__in=ids)
        .annotate(
            n_rounds=count(Round),
            n_items=count(Item, is_gold=False),
            n_judgments=count(Judgment),
            n_runs=count(TrainingRun),
            last_label=Subquery(last.values("created_at")[:1]),
        )
        .order_by("name")
    )
    table = [
        [
            p.pk,
            p.name,
            p.get_task_kind_display(),
            p.n_rounds,
            p.n_items,
            p.n_judgments,
            p.n_runs,
            p.last_label.strftime("%Y-%m-%d %H:%M") if p.last_label else None,
        ]
        for p in rows
    ]
    return Panel(
        key="projects",
        title="Projects",
        columns=[
            "id",
            "project",
            "task",
            "rounds",
            "items",
            "labels",
            "training runs",
            "last label",
        ],
        rows=table,
    )


# ---- per-request data -------------------------------------------------------------------


@dataclass(frozen=True)
class Battle:
    """One comparison of two models on one prompt, from one judgment."""

    prompt_id: int
    model_a: str
    model_b: str
    outcome: str  # A, B, tie, both_bad (A = model_a better)
    length_a: int
    length_b: int


def model_key(model_name: str, checkpoint_id: str, version_name: str | None) -> str:
    """Return the name a candidate's model goes by on the dashboard."""
    return version_name or model_name or checkpoint_id or "unnamed model"


def pairwise_battles(judgments: Iterable[dict], slots: dict[int, list[tuple]]) -> list[Battle]:
    """Turn judgments into battles between the models at their item's positions.

    ``slots`` maps item id to ``(position, model, length)`` sorted by position. Gold, repeat
    and QC-flagged judgments, non-human labels and items whose models coincide give no battle.
    """
    battles = []
    for j in judgments:
        if j["is_gold"] or j["is_repeat"] or j["source"] != LabelSource.HUMAN:
            continue
        if j.get("qc_flag"):
            continue
        item_slots = slots.get(j["item_id"])
        if not item_slots or len(item_slots) < 2:
            continue
        prompt = j["item__prompt_id"]
        if j["choice"]:
            (_, model_a, len_a), (_, model_b, len_b) = item_slots[0], item_slots[1]
            if model_a != model_b:
                battles.append(Battle(prompt, model_a, model_b, j["choice"], len_a, len_b))
            continue
        ranking = j["ranking"] or []
        if len(ranking) != len(item_slots):
            continue
        for (i, model_a, len_a), (k, model_b, len_b) in combinations(item_slots, 2):
            if model_a == model_b:
                continue
            ra, rb = ranking[i], ranking[k]
            outcome = Choice.A if ra < rb else Choice.B if rb < ra else Choice.TIE
            battles.append(Battle(prompt, model_a, model_b, str(outcome), len_a, len_b))
    return battles


class ProjectData:
    """A project's labels and candidates, loaded once and shared by the panels of a request."""

    def __init__(self, project: Project, *, round_: Round | None = None):
        self.project = project
        self.round = round_
        self._qc: dict[str, Any] = {}

    def qc(self, selector: str, **kwargs: Any) -> Any:
        """Return a QC selector's result, computed once per request (kwargs fixed per name).

        Agreement comes from the newest stored report when no label arrived after it
        (the QC check stores one), else it is computed now.
        """
        if selector not in self._qc:
            stored = self._stored_agreement() if selector == "project_agreement" else None
            compute = (
                project_agreement_cached
                if selector == "project_agreement"
                else qc_selector(selector)
            )
            self._qc[selector] = stored or compute(**kwargs)
        return self._qc[selector]

    def _stored_agreement(self) -> dict | None:
        latest = qc_selector("agreement_report_latest")
        report = latest(project=self.project, round_=self.round) if latest else None
        if report is None:
            return None
        labels = Judgment.objects.filter(project=self.project)
        if self.round is not None:
            labels = labels.filter(item__round=self.round)
        newest = labels.aggregate(newest=Max("created_at"))["newest"]
        return report.report if newest is None or report.created_at >= newest else None

    @cached_property
    def rounds(self) -> list[Round]:
        return list(Round.objects.filter(project=self.project).select_related("model_version"))

    @cached_property
    def judgments(self) -> list[dict]:
        """Return the newest judgments (at most MAX_JUDGMENTS) as dicts."""
        qs = Judgment.objects.filter(project=self.project)
        if self.round is not None:
            qs = qs.filter(item__round=self.round)
        return list(
            qs.order_by("-id").values(
                "id",
                "item_id",
                "item__prompt_id",
                "item__round__number",
                "annotator_id",
                "choice",
                "ranking",
                "shown_choice",
                "source",
                "is_gold",
                "is_repeat",
                "qc_flag",
                "assignment__display_order",
            )[:MAX_JUDGMENTS]
        )

    @property
    def judgments_capped(self) -> bool:
        return len(self.judgments) >= MAX_JUDGMENTS

    @cached_property
    def slots(self) -> dict[int, list[tuple[int, str, int]]]:
        """Return item id -> [(position, model, answer length in characters)]."""
        item_ids = {j["item_id"] for j in self.judgments}
        rows = (
            ItemCandidate.objects.filter(item_id__in=item_ids)
            .annotate(length=Length("candidate__text"))
            .values_list(
                "item_id",
                "position",
                "candidate__model_name",
                "candidate__checkpoint_id",
                "candidate__policy_version__name",
                "length",
            )
        )
        out: dict[int, list[tuple[int, str, int]]] = defaultdict(list)
        for item_id, position, name, checkpoint, version, length in rows:
            out[item_id].append((position, model_key(name, checkpoint, version), length or 0))
        for value in out.values():
            value.sort()
        return dict(out)

    @cached_property
    def battles(self) -> list[Battle]:
        return pairwise_battles(self.judgments, self.slots)

    @cached_property
    def model_order(self) -> dict[str, int]:
        """Return model -> age rank, oldest 0: registration time, else its first answer's."""
        born: dict[str, Any] = {}
        rows = (
            ItemCandidate.objects.filter(item__project=self.project)
            .values(
                "candidate__model_name",
                "candidate__checkpoint_id",
                "candidate__policy_version__name",
                "candidate__policy_version__created_at",
            )
            .annotate(first=Min("candidate__created_at"))
        )
        for row in rows:
            key = model_key(
                row["candidate__model_name"],
                row["candidate__checkpoint_id"],
                row["candidate__policy_version__name"],
            )
            when = row["candidate__policy_version__created_at"] or row["first"]
            born[key] = min(born.get(key, when), when)
        return {key: rank for rank, key in enumerate(sorted(born, key=lambda k: (born[k], k)))}

    @cached_property
    def versions(self) -> list[ModelVersion]:
        """Return the model versions of this project (candidates, rounds, runs, datasets)."""
        return list(
            ModelVersion.objects.filter(
                Q(candidates__prompt__project=self.project)
                | Q(rounds__project=self.project)
                | Q(training_run__project=self.project)
                | Q(dataset_version__project=self.project)
            )
            .select_related("parent", "training_run")
            .distinct()
            .order_by("created_at", "pk")
        )


# ---- labels -----------------------------------------------------------------------------


def round_progress_panel(data: ProjectData) -> Panel:
    """Return per round: items complete / in progress / not started and judgments needed."""
    project = data.project
    overlap = project.overlap
    per_round = {
        row["round_id"]: row
        for row in Item.objects.filter(project=project, is_gold=False)
        .values("round_id")
        .annotate(
            items=Count("pk"),
            complete=Count("pk", filter=Q(n_done__gte=overlap)),
            started=Count("pk", filter=Q(n_done__gt=0, n_done__lt=overlap)),
            done=Sum("n_done"),
        )
    }
    labels = dict(
        Judgment.objects.filter(project=project)
        .values("item__round_id")
        .annotate(n=Count("pk"))
        .values_list("item__round_id", "n")
    )
    capped_done = dict(
        Item.objects.filter(project=project, is_gold=False, n_done__gt=overlap)
        .values("round_id")
        .annotate(extra=Sum("n_done") - Count("pk") * overlap)
        .values_list("round_id", "extra")
    )
    rows = []
    for round_ in data.rounds:
        stats = per_round.get(round_.pk, {})
        items = stats.get("items", 0)
        complete = stats.get("complete", 0)
        started = stats.get("started", 0)
        needed = items * overlap
        done = (stats.get("done") or 0) - (capped_done.get(round_.pk) or 0)
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
                labels.get(round_.pk, 0),
            ]
        )
    if not rows:
        return empty("progress", "Round progress", "No rounds yet.")
    chart = {
        "type": "stacked",
        "horizontal": True,
        "labels": [f"Round {r[0]}" for r in rows],
        "series": [
            {"name": "Complete", "values": [r[4] for r in rows], "color": "ok"},
            {"name": "In progress", "values": [r[5] for r in rows], "color": "warn"},
            {"name": "Not started", "values": [r[6] for r in rows], "color": "muted"},
        ],
        "x_label": "items",
    }
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
        chart=forest_chart(
            [r[0] for r in rows],
            [
                {
                    "name": "Left share",
                    "estimate": [r[3] for r in rows],
                    "low": [r[4] for r in rows],
                    "high": [r[5] for r in rows],
                }
            ],
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
        rows.append([f"Slot {'ABCDEFGH'[slot]}", n, firsts[slot], firsts[slot] / n, low, high])
    return Panel(
        key="position-bias",
        title="Position bias",
        columns=["shown as", "rankings", "ranked first", "share", "ci low", "ci high"],
        rows=rows,
        chart=forest_chart(
            [r[0] for r in rows],
            [
                {
                    "name": "Ranked first",
                    "estimate": [r[3] for r in rows],
                    "low": [r[4] for r in rows],
                    "high": [r[5] for r in rows],
                }
            ],
            x_label="share of rankings with this display slot alone on top (95% Wilson CI)",
            reference=1 / k,
            reference_label=f"1/{k}",
            percent=True,
        ),
        note="Display order was shuffled per assignment, so every slot should win 1/K of the "
        "time. Rankings with a tie at the top are left out.",
    )


# ---- QC (selectors written alongside, in evaluation.selectors) --------------------------


def qc_selector(name: str) -> Callable | None:
    """Return the QC selector of that name, or None while it does not exist."""
    try:
        from evaluation import selectors
    except ImportError:
        return None
    return getattr(selectors, name, None)


def plain(value: Any) -> Any:
    """Return dataclasses, numpy values and model rows as plain data."""
    if is_dataclass(value) and not isinstance(value, type):
        return plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "pk") and hasattr(value, "_meta"):
        return str(value)
    return value


def flatten(record: dict, prefix: str = "") -> dict:
    """Return nested dicts as one level of ``a.b`` keys; lists stay as they are."""
    out = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def table_from(result: Any) -> tuple[list[str], list[list[Any]]]:
    """Return columns and rows from a selector's result, whatever its plain shape."""
    result = plain(result)
    if isinstance(result, dict):
        if all(isinstance(v, dict) for v in result.values()) and result:
            records = [{"key": k, **flatten(v)} for k, v in result.items()]
        else:
            records = [{"metric": k, "value": v} for k, v in flatten(result).items()]
    elif isinstance(result, list):
        records = [flatten(r) if isinstance(r, dict) else {"value": r} for r in result]
    else:
        records = [{"value": result}]
    columns: list[str] = []
    for record in records:
        for key in record:
            if key not in columns:
                columns.append(key)
    return columns, [[record.get(c) for c in columns] for record in records[:MAX_QC_ROWS]]


def qc_call(
    data: ProjectData, key: str, title: str, selector: str, **kwargs: Any
) -> tuple[Any, Panel | None]:
    """Return (result, None) from a QC selector, or (None, an 'unavailable' panel)."""
    if qc_selector(selector) is None:
        return None, unavailable(
            key, title, f"Not available yet: evaluation.selectors.{selector} is being written."
        )
    return data.qc(selector, **kwargs), None


def generic_panel(key: str, title: str, result: Any) -> Panel:
    """Return any selector result as a plain table (used when its shape is unexpected)."""
    columns, rows = table_from(result)
    if not rows:
        return empty(key, title, "Nothing to show yet.")
    return Panel(key=key, title=title, columns=columns, rows=rows, wide=len(columns) > 6)


def _shaped(key: str, title: str, result: Any, build: Callable[[Any], Panel]) -> Panel:
    """Return ``build(result)``, or the generic table if the result has another shape."""
    try:
        return build(result)
    except (KeyError, TypeError, AttributeError, IndexError):
        return generic_panel(key, title, result)


def _ci_parts(ci: Any) -> tuple[float | None, float | None, float | None]:
    if not isinstance(ci, dict):
        return None, None, None
    return _num(ci.get("estimate")), _num(ci.get("low")), _num(ci.get("high"))


AGREEMENT_METRICS = (
    ("alpha", "Krippendorff's alpha"),
    ("percent_agreement", "Percent agreement"),
    ("fleiss_kappa", "Fleiss' kappa"),
    ("kendall_tau", "Kendall's tau-b"),
)


def agreement_panel(data: ProjectData) -> Panel:
    """Return agreement figures per label source with bootstrap CIs (human first)."""
    key, title = "agreement", "Inter-annotator agreement"
    result, missing = qc_call(
        data,
        key,
        title,
        "project_agreement",
        project=data.project,
        round_=data.round,
        n_boot=AGREEMENT_BOOT,
    )
    if missing:
        return missing

    def build(result: dict) -> Panel:
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
            chart=forest_chart(
                [f"{r[0]} · {r[1]}" for r in rows],
                [
                    {
                        "name": "Agreement",
                        "estimate": [r[2] for r in rows],
                        "low": [r[3] for r in rows],
                        "high": [r[4] for r in rows],
                    }
                ],
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

    return _shaped(key, title, result, build)


def _kappa_matrix(result: dict) -> dict | None:
    """Return the human annotator x annotator matrix as heat-table rows, or None."""
    block = result["by_source"].get("human") or {}
    pairwise = block.get("pairwise") or {}
    names = [a["name"] for a in pairwise.get("annotators", [])]
    if len(names) < 2 or len(names) > 30:
        return None
    rows = []
    for name, values, shared in zip(names, pairwise["matrix"], pairwise["n_shared"], strict=False):
        cells = []
        for value, n in zip(values, shared, strict=False):
            number = _num(value)
            level = None if number is None else max(0, min(4, int((number + 0.2) / 0.24)))
            cells.append({"text": format_cell(number), "level": level, "n": n})
        rows.append({"name": name, "cells": cells})
    metric = "Cohen's kappa" if pairwise.get("metric") == "cohen_kappa" else "Kendall's tau-b"
    return {
        "metric": metric,
        "names": names,
        "rows": rows,
        "min_shared": pairwise.get("min_shared_items"),
    }


def annotator_agreement_panel(data: ProjectData) -> Panel:
    """Return each human annotator's agreement with the others' consensus, with CIs."""
    key, title = "consensus", "Agreement with the other annotators"
    result, missing = qc_call(
        data,
        key,
        title,
        "project_agreement",
        project=data.project,
        round_=data.round,
        n_boot=AGREEMENT_BOOT,
    )
    if missing:
        return missing

    def build(result: dict) -> Panel:
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
        ranking = result.get("task_kind") == TaskKind.RANKING
        return Panel(
            key=key,
            title=title,
            columns=["annotator", "items", "agreement", "ci low", "ci high"],
            rows=rows,
            chart=forest_chart(
                [r[0] for r in rows],
                [
                    {
                        "name": "Agreement",
                        "estimate": [r[2] for r in rows],
                        "low": [r[3] for r in rows],
                        "high": [r[4] for r in rows],
                    }
                ],
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

    return _shaped(key, title, result, build)


def annotator_quality_panel(data: ProjectData) -> Panel:
    """Return one row per annotator: labels, latest QC verdict and the figures behind it."""
    key, title = "annotators", "Annotator quality"
    result, missing = qc_call(data, key, title, "annotator_quality_table", project=data.project)
    if missing:
        return missing

    def build(result: list) -> Panel:
        rows = []
        gold_rows = []
        for row in result:
            metrics = row.get("metrics") or {}
            gold = metrics.get("gold") or {}
            stability = metrics.get("stability") or {}
            position = metrics.get("position") or {}
            speed = metrics.get("speed") or {}
            consensus = metrics.get("consensus") or {}
            assessment = row.get("assessment") or {}
            labels = sum((row.get("sources") or {}).values())
            if not labels and row.get("role") != Membership.Role.ANNOTATOR:
                continue
            rows.append(
                [
                    row["username"],
                    row.get("role"),
                    row.get("status"),
                    labels,
                    assessment.get("verdict"),
                    ", ".join(assessment.get("failed_checks") or []),
                    _num(gold.get("accuracy")),
                    gold.get("n_items"),
                    _num(stability.get("agreement")),
                    stability.get("n_pairs"),
                    _num(position.get("left_share")),
                    _num(position.get("p_value")),
                    _num(speed.get("share_flagged")),
                    _num(consensus.get("p_value")),
                    _num(row.get("trust_weight")),
                ]
            )
            if gold.get("n_items"):
                low, high = quality.wilson_interval(gold["n_correct"], gold["n_items"])
                gold_rows.append((row["username"], gold["n_correct"] / gold["n_items"], low, high))
        if not rows:
            return empty(key, title, "No annotator has labelled yet.")
        chart = None
        if gold_rows:
            chart = forest_chart(
                [g[0] for g in gold_rows],
                [
                    {
                        "name": "Gold accuracy",
                        "estimate": [g[1] for g in gold_rows],
                        "low": [g[2] for g in gold_rows],
                        "high": [g[3] for g in gold_rows],
                    }
                ],
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

    return _shaped(key, title, result, build)


LABEL_COLORS = {"A": "a", "B": "b", "tie": "tie", "both_bad": "bad"}


def label_distribution_panel(data: ProjectData) -> Panel:
    """Return the share of A / B / tie / both-bad per label source (ranks for rankings)."""
    key, title = "labels", "Label distribution"
    result, missing = qc_call(
        data, key, title, "label_distribution", project=data.project, round_=data.round
    )
    if missing:
        return missing

    def build(result: dict) -> Panel:
        by_source = result["by_source"]
        if not by_source:
            return empty(key, title, "No labels yet.")
        note = "Primary labels: no gold items, no repeats."
        if result.get("n_flagged"):
            note += f" {result['n_flagged']} QC-flagged label(s) left out."
        if result.get("task_kind") == TaskKind.RANKING:
            return _rank_distribution(key, title, by_source, note)
        labels = list(OUTCOME_LABELS)
        rows = []
        for source, block in by_source.items():
            counts = block["counts"]
            rows.append(
                [
                    source,
                    block["n"],
                    *(counts.get(label, 0) for label in labels),
                    *(_num(block["shares"].get(label)) for label in labels),
                    _num(block.get("left_share")),
                ]
            )
        chart = {
            "type": "stacked",
            "horizontal": True,
            "percent": True,
            "labels": [f"{r[0]} (n={r[1]})" for r in rows],
            "series": [
                {
                    "name": OUTCOME_LABELS[label],
                    "values": [r[6 + i] for r in rows],
                    "color": LABEL_COLORS[label],
                }
                for i, label in enumerate(labels)
            ],
            "x_label": "share of labels",
        }
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

    return _shaped(key, title, result, build)


def _rank_distribution(key: str, title: str, by_source: dict, note: str) -> Panel:
    rows = []
    for source, block in by_source.items():
        for position, counts in enumerate(block["rank_counts"]):
            total = sum(counts) or 1
            rows.append([source, "ABCDEFGH"[position], *counts, *(c / total for c in counts)])
    k = len(next(iter(by_source.values()))["rank_counts"])
    first = next(iter(by_source))
    shown = [r for r in rows if r[0] == first]
    chart = {
        "type": "stacked",
        "horizontal": True,
        "percent": True,
        "labels": [f"{first}: position {r[1]}" for r in shown],
        "series": [
            {"name": f"rank {rank + 1}", "values": [r[2 + k + rank] for r in shown]}
            for rank in range(k)
        ],
        "x_label": "share of rankings",
    }
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


def disagreement_panel(data: ProjectData) -> Panel:
    """Return the items waiting for review, most split first."""
    key, title = "disagreements", "Disagreement queue"
    result, missing = qc_call(
        data, key, title, "disagreement_queue", project=data.project, limit=MAX_QUEUE_ROWS
    )
    if missing:
        return missing

    def build(result: dict) -> Panel:
        rows = [
            [
                entry["item_id"],
                entry["round"],
                _num(entry["majority_share"]),
                entry["n_votes"],
                ", ".join(f"{k}: {v}" for k, v in sorted(entry["vote_counts"].items())),
                len(entry.get("adjudications") or []),
                _clip(
                    entry["prompt"].get("text") or _messages_text(entry["prompt"].get("messages"))
                )[:120],
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

    return _shaped(key, title, result, build)


# ---- models -----------------------------------------------------------------------------


BATTLE_NOTE = (
    "Battles are human, non-gold, non-repeat, unflagged judgments on items whose answers "
    "come from different models."
)


def leaderboard_panel(data: ProjectData) -> Panel:
    """Return Bradley-Terry ratings with bootstrap CIs and CI-based ranks."""
    title = "Leaderboard"
    battles = data.battles
    models = {b.model_a for b in battles} | {b.model_b for b in battles}
    if len(models) < 2:
        return empty("leaderboard", title, "Needs judgments comparing at least two models.")
    board = leaderboard.leaderboard(
        [(b.model_a, b.model_b, b.outcome) for b in battles],
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
        f"Bradley-Terry on the Arena scale (mean 1000, 400 points = 10:1 odds); 95% CIs from "
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
        chart=forest_chart(
            [f"#{r[0]} {r[1]}" for r in rows],
            [
                {
                    "name": "Rating",
                    "estimate": [r[2] for r in rows],
                    "low": [r[3] for r in rows],
                    "high": [r[4] for r in rows],
                }
            ],
            x_label="Bradley-Terry rating (95% bootstrap CI)",
            reference=1000.0,
            reference_label="mean",
        ),
        note=note,
    )


def battle_counts_panel(data: ProjectData) -> Panel:
    """Return the raw battle graph: outcomes per model pair."""
    battles = data.battles
    if not battles:
        return empty("battles", "Battles per model pair", "No battles yet.")
    counts = leaderboard.pair_counts([(b.model_a, b.model_b, b.outcome) for b in battles])
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
        prompts, outcomes, diffs = _pair_outcomes(battles, newer, older)
        result = winrate.win_rate(outcomes, prompts, n_boot=WINRATE_BOOT, seed=0)
        lc = None
        if result.wins + result.ties + result.losses >= LC_MIN_VOTES and any(diffs):
            lc = winrate.length_controlled_win_rate(outcomes, diffs, prompts, n_boot=LC_BOOT)
        relation = (
            "vs parent"
            if parents.get(newer) == older
            else "vs baseline"
            if older == baseline
            else ""
        )
        n = len(outcomes)
        rows.append(
            [
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
        )
    rows.sort(key=lambda r: (-order.get(r[0], -1), order.get(r[1], -1)))
    labels = [f"{r[0]} vs {r[1]}" + (f" ({r[2][3:]})" if r[2] else "") for r in rows]
    chart = forest_chart(
        labels,
        [
            {
                "name": "Win rate",
                "estimate": [r[8] for r in rows],
                "low": [r[9] for r in rows],
                "high": [r[10] for r in rows],
            },
            {
                "name": "Length-controlled",
                "estimate": [r[12] for r in rows],
                "low": [r[13] for r in rows],
                "high": [r[14] for r in rows],
            },
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
        "is the win rate predicted at equal answer length (AlpacaEval 2.0 style), shown from "
        f"{LC_MIN_VOTES} decisive votes. "
        f"Newer = registered later (or, without a version, first generated later). {BATTLE_NOTE}",
    )


def true_reward_panel(data: ProjectData) -> Panel | None:
    """Return the demo domain's held-out true reward per policy (None when no version has it)."""
    rows = []
    for version in data.versions:
        results = version.eval_results or {}
        estimate = _num(results.get("true_reward"))
        if estimate is None:
            continue
        interval = results.get("true_reward_ci95") or [None, None]
        rows.append(
            [
                version.name,
                version.parent.name if version.parent_id else None,
                estimate,
                _num(interval[0]),
                _num(interval[1]),
                _num(results.get("accuracy")),
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
        chart=forest_chart(
            [r[0] for r in rows],
            [
                {
                    "name": "True reward",
                    "estimate": [r[2] for r in rows],
                    "low": [r[3] for r in rows],
                    "high": [r[4] for r in rows],
                }
            ],
            x_label="mean true reward (95% CI, prompts resampled)",
        ),
        note="The demo domain's programmatic reward, which no policy was trained on.",
    )


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
                    _clip(str(example.get("prompt", ""))),
                    _clip(str(example["answer"])),
                ]
            )
    slots = list(
        ItemCandidate.objects.filter(item__project=data.project, item__is_gold=False)
        .select_related("candidate__policy_version", "item__prompt")
        .values_list(
            "item__prompt_id",
            "candidate_id",
            "candidate__model_name",
            "candidate__checkpoint_id",
            "candidate__policy_version__name",
        )
    )
    models_per_prompt: dict[int, set[str]] = defaultdict(set)
    latest: dict[tuple[int, str], int] = {}
    for prompt_id, candidate_id, name, checkpoint, version in slots:
        key = model_key(name, checkpoint, version)
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
    if chosen:
        from annotation.models import Candidate, Prompt

        prompts = {p.pk: p for p in Prompt.objects.filter(pk__in=chosen)}
        wanted = [cid for (pid, _), cid in latest.items() if pid in prompts]
        texts = dict(Candidate.objects.filter(pk__in=wanted).values_list("pk", "text"))
        order = data.model_order
        for prompt_id in chosen:
            prompt = prompts[prompt_id]
            prompt_text = prompt.text or _messages_text(prompt.messages)
            for key in sorted(models_per_prompt[prompt_id], key=lambda m: order.get(m, 0)):
                text = texts.get(latest[(prompt_id, key)], "")
                rows.append([f"prompt {prompt_id}", key, _clip(prompt_text), _clip(text)])
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


def _clip(text: str) -> str:
    return text if len(text) <= MAX_SAMPLE_CHARS else text[:MAX_SAMPLE_CHARS] + " […]"


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)


# ---- reward models ----------------------------------------------------------------------


def reward_models(data: ProjectData) -> list[ModelVersion]:
    return [v for v in data.versions if v.kind == ModelVersion.Kind.REWARD]


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
                _num(metrics.get("accuracy")),
                _num(interval[0]),
                _num(interval[1]),
                _num(metrics.get("nll")),
                _num(metrics.get("roc_auc")),
                _num(metrics.get("ece")),
                _num(temperature.get("value")),
                _num(temperature.get("test_ece_at_temperature")),
                _num((v.eval_results or {}).get("eval_accuracy")),
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
        "random A/B order; T is fitted on half of the prompts and judged on the other half.",
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
        value = _num(temperature.get("value")) or 1.0
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
                    _num(b["mean_confidence"]),
                    _num(b["accuracy"]),
                    b["count"],
                ]
            )
    chart = {
        "type": "reliability",
        "series": [
            {
                "name": name,
                "points": [{"x": r[3], "y": r[4], "n": r[5]} for r in rows if r[0] == name],
            }
            for name, _ in series_sources
        ],
        "x_label": "model confidence max(p, 1 - p)",
        "y_label": "accuracy of the model's pick",
    }
    ece = _num(metrics.get("ece"))
    note = (
        f"ECE (all pairs, T = 1) {format_cell(ece)}; points on the diagonal are calibrated, "
        "below it over-confident. "
    )
    if temperature.get("value") is not None:
        note += (
            f"On the held-out half ECE goes {format_cell(_num(temperature.get('test_ece')))} "
            f"→ {format_cell(_num(temperature.get('test_ece_at_temperature')))} with T = "
            f"{format_cell(_num(temperature.get('value')))}."
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
            f" Reward vs answer length: Spearman {format_cell(_num(length.get('spearman')))} "
            f"(p {format_cell(_num(length.get('spearman_p')))})."
        )
    if scale:
        note += (
            f" Reward scale on this file: mean {format_cell(_num(scale.get('mean')))}, "
            f"sd {format_cell(_num(scale.get('std')))}."
        )
    return Panel(
        key="margins",
        title=title,
        columns=["margin from", "margin to", "pairs"],
        rows=rows,
        chart={
            "type": "histogram",
            "edges": edges,
            "counts": counts,
            "x_label": "reward margin r(chosen) - r(rejected)",
        },
        note=note,
    )


# ---- training curves --------------------------------------------------------------------


def project_runs(data: ProjectData) -> list[TrainingRun]:
    version_runs = [v.training_run_id for v in data.versions if v.training_run_id]
    return list(
        TrainingRun.objects.filter(
            Q(project=data.project)
            | Q(dataset_version__project=data.project)
            | Q(pk__in=version_runs)
        )
        .select_related("model_version")
        .distinct()
        .order_by("-created_at", "-pk")
    )


def runs_panel(runs: list[TrainingRun]) -> Panel:
    """Return the training runs: recipe, status, progress, model made."""
    rows = []
    for run in runs:
        try:
            version = run.model_version.name
        except ModelVersion.DoesNotExist:
            version = None
        rows.append(
            [
                run.pk,
                run.recipe,
                run.status,
                run.progress,
                version,
                run.created_at.strftime("%Y-%m-%d %H:%M"),
                run.finished_at.strftime("%Y-%m-%d %H:%M") if run.finished_at else None,
            ]
        )
    if not rows:
        return empty("runs", "Training runs", "No training runs yet.")
    return Panel(
        key="runs",
        title="Training runs",
        columns=["run", "recipe", "status", "progress", "model", "created", "finished"],
        rows=rows,
    )


def read_metrics(run: TrainingRun) -> list[dict]:
    """Return the metric records of a run's metrics.jsonl (events skipped, last lines kept)."""
    if not run.output_dir:
        return []
    path = Path(run.output_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()[-MAX_METRIC_LINES:]
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written while we read
        if isinstance(record, dict) and "event" not in record and "step" in record:
            records.append(record)
    return records


def canonical_metrics(records: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """Return records renamed to the curve names, and which logged key each came from."""
    sources: dict[str, str] = {}
    for name, keys in CURVE_KEYS.items():
        for key in keys:
            if any(_num(r.get(key)) is not None for r in records):
                sources[name] = key
                break
    out = []
    for record in records:
        row = {"step": record["step"]}
        for name, key in sources.items():
            if key in record and isinstance(record[key], int | float):
                row[name] = float(record[key])
        if len(row) > 1:
            out.append(row)
    return out, sources


def _thin(indices: int) -> np.ndarray:
    """Return the indices kept so a series has at most MAX_CURVE_POINTS points (ends kept)."""
    if indices <= MAX_CURVE_POINTS:
        return np.arange(indices)
    return np.unique(np.linspace(0, indices - 1, MAX_CURVE_POINTS).round().astype(int))


def curves_panel(run: TrainingRun) -> tuple[Panel, Panel]:
    """Return the run's curves (raw and smoothed) and its reward-hacking alarms."""
    records, sources = canonical_metrics(read_metrics(run))
    title = f"Training curves: run {run.pk} ({run.recipe})"
    if not records:
        message = "No metrics logged yet." if run.output_dir else "The run has no output folder."
        return empty("curves", title, message), empty("alarms", "Alarms", "No metrics to check.")
    series = curves.curve_series(records)
    for name in CURVE_KEYS:  # the library smooths its alarm metrics; the rest alike here
        points = sorted((r["step"], r[name]) for r in records if name in r)
        if name not in series and points:
            raw = np.array([p[1] for p in points], dtype=float)
            steps = np.array([p[0] for p in points], dtype=float)
            series[name] = curves.Series(steps, raw, curves.smooth(raw))
    rows = []
    charts = []
    for name in CURVE_KEYS:
        if name not in series:
            continue
        s = series[name]
        keep = _thin(len(s.steps))
        points = []
        for i in keep:
            raw, smoothed = _num(s.raw[i]), _num(s.smoothed[i])
            rows.append([name, sources[name], int(s.steps[i]), raw, smoothed])
            points.append([int(s.steps[i]), raw, smoothed])
        charts.append(
            {"metric": name, "title": CURVE_TITLES[name], "source": sources[name], "points": points}
        )
    alarms = curves.training_alarms(records)
    alarm_rows = [[a.step, a.kind, a.reason] for a in alarms]
    chart = {
        "type": "curves",
        "charts": charts,
        "alarms": [
            {"step": a.step, "kind": a.kind, "metric": ALARM_METRICS.get(a.kind, "")}
            for a in alarms
        ],
    }
    curves_panel_ = Panel(
        key="curves",
        title=title,
        columns=["metric", "logged as", "step", "raw", "smoothed"],
        rows=rows,
        chart=chart,
        wide=True,
        show_table=False,
        note="Read together (seed spec §9.4): reward rising with KL exploding, length growing "
        "or entropy collapsing is the reward-hacking pattern. Smoothing: debiased EMA 0.6. "
        "Dashed lines mark alarms.",
    )
    if alarm_rows:
        alarms_panel = Panel(
            key="alarms", title="Alarms", columns=["step", "kind", "why"], rows=alarm_rows
        )
    else:
        alarms_panel = empty(
            "alarms", "Alarms", "No alarm: KL, length, entropy and value loss look sane."
        )
    return curves_panel_, alarms_panel
