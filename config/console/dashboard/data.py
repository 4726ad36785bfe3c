"""Everything the dashboard reads: one `ProjectData` per request, shared by a page's panels.

A `ProjectData` loads a project's judgments, candidates, model versions and QC figures once,
on first use. Battles (leaderboard, win rates) are the counted votes (human, primary,
unflagged: `annotation.querysets`) on items whose candidates come from different models. A
model is its registered policy version when the candidate has one, else its ``model_name``
(else checkpoint). A pairwise choice is one battle (position 0 vs position 1); a K-way ranking
gives K(K-1)/2 battles, which are correlated, so their intervals are too narrow by an unknown
factor (said on the page).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import combinations
from pathlib import Path
from typing import Any

from django.db.models import (
    Count,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Length, NullIf

from annotation.labels import pair_outcome
from annotation.models import (
    Item,
    ItemCandidate,
    Judgment,
    Membership,
    Project,
    Round,
)
from annotation.querysets import is_counted_row
from evaluation import selectors as qc
from evaluation.agreement_cache import project_agreement_cached
from evaluation.stats.leaderboard import PairCounts, pair_counts
from training.models import ModelVersion, TrainingRun

# Size caps: pages stay fast on big projects; each cap is named on the page when it bites.
MAX_JUDGMENTS = 200_000
MAX_METRIC_LINES = 50_000
MAX_QUEUE_ROWS = 20
AGREEMENT_BOOT = 300


def dashboard_projects(*, user) -> list[Project]:
    """Return the projects whose dashboard the user may read: all for staff, else researched."""
    projects = Project.objects.all()
    if not user.is_staff:
        projects = projects.filter(
            memberships__user=user, memberships__role=Membership.Role.RESEARCHER
        )
    return list(projects.order_by("name"))


def project_overview(*, projects: list[Project]) -> list[Project]:
    """Return the projects with rounds, non-gold items, labels, runs and last label counted."""

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
    return list(
        Project.objects.filter(pk__in=[p.pk for p in projects])
        .annotate(
            n_rounds=count(Round),
            n_items=count(Item, is_gold=False),
            n_judgments=count(Judgment),
            n_runs=count(TrainingRun),
            last_label=Subquery(last.values("created_at")[:1]),
        )
        .order_by("name")
    )


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


def _model_key_sql():
    """Return `model_key` of an ItemCandidate row as an SQL expression."""
    return Coalesce(
        NullIf("candidate__policy_version__name", Value("")),
        NullIf("candidate__model_name", Value("")),
        NullIf("candidate__checkpoint_id", Value("")),
        Value("unnamed model"),
    )


def _slot_model(index: int) -> Subquery:
    """Return the model at a judged item's index-th lowest position (as `slots` sorts them)."""
    return Subquery(
        ItemCandidate.objects.filter(item_id=OuterRef("item_id"))
        .order_by("position")
        .annotate(model=_model_key_sql())
        .values("model")[index : index + 1]
    )


def pairwise_battles(judgments: Iterable[dict], slots: dict[int, list[tuple]]) -> list[Battle]:
    """Turn judgments into battles between the models at their item's positions.

    ``slots`` maps item id to ``(position, model, length)`` sorted by position. Only counted
    votes (human, primary, unflagged: `is_counted_row`) give battles, and only between
    different models.
    """
    battles = []
    for j in judgments:
        if not is_counted_row(j):
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
            outcome = pair_outcome(ranking, i, k)
            battles.append(Battle(prompt, model_a, model_b, outcome, len_a, len_b))
    return battles


def item_slots(*, item_ids) -> dict[int, list[tuple[int, str, int]]]:
    """Return item id -> [(position, model, answer length in characters)] for these items."""
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


class ProjectData:
    """A project's labels, candidates and QC figures, loaded once per request."""

    def __init__(self, project: Project, *, round_: Round | None = None):
        self.project = project
        self.round = round_

    # ---- QC figures (evaluation.selectors) ----

    @cached_property
    def agreement(self) -> dict:
        """Return agreement: the newest stored report if no label arrived since, else fresh."""
        return self._stored_agreement() or project_agreement_cached(
            project=self.project, round_=self.round, n_boot=AGREEMENT_BOOT
        )

    def _stored_agreement(self) -> dict | None:
        report = qc.agreement_report_latest(project=self.project, round_=self.round)
        if report is None:
            return None
        labels = Judgment.objects.filter(project=self.project)
        if self.round is not None:
            labels = labels.filter(item__round=self.round)
        newest = labels.aggregate(newest=Max("created_at"))["newest"]
        return report.report if newest is None or report.created_at >= newest else None

    @cached_property
    def label_distribution(self) -> dict:
        return qc.label_distribution(project=self.project, round_=self.round)

    @cached_property
    def annotator_quality(self) -> list[dict]:
        return qc.annotator_quality_table(project=self.project)

    @cached_property
    def disagreements(self) -> dict:
        return qc.disagreement_queue(project=self.project, limit=MAX_QUEUE_ROWS)

    # ---- rounds and labels ----

    @cached_property
    def rounds(self) -> list[Round]:
        return list(Round.objects.filter(project=self.project).select_related("model_version"))

    @cached_property
    def round_counts(self) -> dict[int, dict[str, int]]:
        """Return round id -> non-gold items, complete, started, judgments done (capped), labels.

        An item counts ``min(n_done, overlap)`` judgments done: extra labels beyond the
        overlap (reviews, re-labels) do not make a round look further along than it is.
        """
        overlap = self.project.overlap
        items = Item.objects.filter(project=self.project, is_gold=False)
        counts: dict[int, dict[str, int]] = defaultdict(dict)
        for row in items.values("round_id").annotate(
            items=Count("pk"),
            complete=Count("pk", filter=Q(n_done__gte=overlap)),
            started=Count("pk", filter=Q(n_done__gt=0, n_done__lt=overlap)),
            done=Sum("n_done"),
        ):
            counts[row["round_id"]].update(row)
        for round_id, extra in (
            items.filter(n_done__gt=overlap)
            .values("round_id")
            .annotate(extra=Sum("n_done") - Count("pk") * overlap)
            .values_list("round_id", "extra")
        ):
            counts[round_id]["done"] -= extra or 0
        for round_id, n in (
            Judgment.objects.filter(project=self.project)
            .values("item__round_id")
            .annotate(n=Count("pk"))
            .values_list("item__round_id", "n")
        ):
            counts[round_id]["labels"] = n
        return dict(counts)

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
                "item__is_gold",
                "is_repeat",
                "qc_flag",
                "assignment__display_order",
            )[:MAX_JUDGMENTS]
        )

    @property
    def judgments_capped(self) -> bool:
        return len(self.judgments) >= MAX_JUDGMENTS

    # ---- models ----

    @cached_property
    def slots(self) -> dict[int, list[tuple[int, str, int]]]:
        """Return item id -> [(position, model, answer length in characters)]."""
        return item_slots(item_ids={j["item_id"] for j in self.judgments})

    @cached_property
    def battles(self) -> list[Battle]:
        return pairwise_battles(self.judgments, self.slots)

    def _judgment_window(self) -> QuerySet:
        """Return the judgments `judgments` loads (the newest MAX_JUDGMENTS) as a queryset."""
        qs = Judgment.objects.filter(project=self.project)
        if self.round is not None:
            qs = qs.filter(item__round=self.round)
        oldest = qs.order_by("-id").values("id")[MAX_JUDGMENTS - 1 : MAX_JUDGMENTS]
        return qs.filter(id__gte=Coalesce(Subquery(oldest), Value(0)))

    @cached_property
    def battle_counts(self) -> PairCounts:
        """Return the outcomes per model pair of `battles`, pairwise votes counted in SQL.

        Pairwise votes are grouped by the database (GROUP BY the two models and the outcome),
        so Python sees a row per group, never one per battle. K-way rankings stay in Python
        (`pairwise_battles`): the ranks are a JSON list, and turning them into K(K-1)/2 pair
        outcomes is not simple SQL. Models keep the order in which `pair_counts` would meet
        them in `battles` (newest judgment first), so the bootstrap draws, and with them the
        intervals, are the same as from the per-battle list.
        """
        counted = self._judgment_window().counted()
        groups = (
            counted.exclude(choice="")
            .annotate(model_a=_slot_model(0), model_b=_slot_model(1))
            .values("model_a", "model_b", "choice")
            .annotate(n=Count("pk"), newest=Max("pk"))
            .order_by()
        )
        # (model a, model b, outcome) -> battles, and where `battles` first shows the group
        table: dict[tuple[str, str, str], list] = {}
        for row in groups:
            a, b = row["model_a"], row["model_b"]
            if b is not None and a != b:
                table[(a, b, row["choice"])] = [row["n"], (-row["newest"], 0)]
        rankings = counted.filter(choice="", ranking__isnull=False)
        slots = item_slots(item_ids=rankings.values("item_id"))
        fields = ("id", "item_id", "item__prompt_id", "choice", "ranking", "source")
        for judgment in rankings.values(*fields):
            for index, battle in enumerate(pairwise_battles([judgment], slots)):
                key = (battle.model_a, battle.model_b, battle.outcome)
                entry = table.setdefault(key, [0, (-judgment["id"], index)])
                entry[0] += 1
                entry[1] = min(entry[1], (-judgment["id"], index))
        first_seen: list[str] = []
        for side in (0, 1):  # pair_counts numbers model A's column first, then model B's
            seen: dict[str, tuple] = {}
            for key, (_, order) in table.items():
                seen[key[side]] = min(seen.get(key[side], order), order)
            first_seen.extend(sorted(seen, key=seen.__getitem__))
        return pair_counts(
            model_a=[key[0] for key in table],
            model_b=[key[1] for key in table],
            outcome=[key[2] for key in table],
            count=[n for n, _ in table.values()],
            models=list(dict.fromkeys(first_seen)),
        )

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
    def candidate_models(self) -> list[tuple[int, int, str]]:
        """Return (prompt id, candidate id, model) for every non-gold item's candidates."""
        rows = ItemCandidate.objects.filter(
            item__project=self.project, item__is_gold=False
        ).values_list(
            "item__prompt_id",
            "candidate_id",
            "candidate__model_name",
            "candidate__checkpoint_id",
            "candidate__policy_version__name",
        )
        return [
            (prompt_id, candidate_id, model_key(name, checkpoint, version))
            for prompt_id, candidate_id, name, checkpoint, version in rows
        ]

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

    @cached_property
    def reward_models(self) -> list[ModelVersion]:
        return [v for v in self.versions if v.kind == ModelVersion.Kind.REWARD]

    @cached_property
    def runs(self) -> list[TrainingRun]:
        """Return the project's runs, and the runs that made its model versions, newest first."""
        version_runs = [v.training_run_id for v in self.versions if v.training_run_id]
        return list(
            TrainingRun.objects.filter(
                Q(project=self.project)
                | Q(dataset_version__project=self.project)
                | Q(pk__in=version_runs)
            )
            .select_related("model_version")
            .distinct()
            .order_by("-created_at", "-pk")
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
