"""Write-side QC: assess and pause annotators, queue disputed items, adjudicate, store reports.

The figures come from `evaluation.selectors` (which load the rows for `evaluation.qc_metrics`);
these functions store what was found and act on it. Labels are flagged, never deleted.

Hook for the submit path (`annotation.services.judgment_submit`): call
`qc_after_submit(project_id=..., annotator_id=..., judgment_count=...)` from
``transaction.on_commit``; it queues the annotator's check on every N-th judgment only, so
a submit stays cheap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from annotation import services as annotation_services
from annotation.access import user_can_review
from annotation.errors import Forbidden, NotFound, ServiceError
from annotation.labels import PAIRWISE_LABELS
from annotation.models import (
    Adjudication,
    Assignment,
    Item,
    Judgment,
    LabelSource,
    Membership,
    Project,
    Round,
    TaskKind,
)
from evaluation import qc_metrics, selectors
from evaluation.models import AgreementReport, AnnotatorAssessment, QualityPolicy
from evaluation.stats.quality import PAUSE, assess_annotator

logger = logging.getLogger(__name__)

# Check code -> the `assess_annotator` argument it judges; the code goes into qc_flag.
CHECKS = (
    ("gold_accuracy", "gold"),
    ("stability", "stability"),
    ("position_bias", "position"),
    ("speed", "speed"),
    ("skip_rate", "skips"),
    ("consensus", "consensus"),
)
PAUSE_FLAG_PREFIX = "paused:"
POLICY_FIELDS = tuple(
    f.name
    for f in QualityPolicy._meta.get_fields()
    if f.concrete and f.name not in ("id", "project", "updated_at")
)


@dataclass(frozen=True)
class Verdict:
    """What the checks found about one annotator."""

    status: str
    failed_checks: list[str]
    reasons: list[str]
    notes: list[str]


@dataclass
class QCCheckResult:
    """What one QC run did."""

    assessments: list[AnnotatorAssessment] = field(default_factory=list)
    paused: list[int] = field(default_factory=list)
    items_marked: int = 0
    agreement: AgreementReport | None = None


# ---- policy --------------------------------------------------------------------------------


def quality_policy_update(*, project: Project, **fields) -> QualityPolicy:
    """Create or change a project's QC policy; unknown or invalid values raise ServiceError."""
    unknown = set(fields) - set(POLICY_FIELDS)
    if unknown:
        raise ServiceError(f"Unknown policy fields: {', '.join(sorted(unknown))}.", code="policy")
    sources = fields.get("review_sources")
    if sources is not None and (
        not isinstance(sources, list) or not all(s in LabelSource.values for s in sources)
    ):
        raise ServiceError(
            f"review_sources must list label sources ({', '.join(LabelSource.values)}).",
            code="policy",
        )
    with transaction.atomic():
        policy, _ = QualityPolicy.objects.select_for_update().get_or_create(project=project)
        for name, value in fields.items():
            setattr(policy, name, value)
        try:
            # Checks field types and the model's CheckConstraints.
            policy.full_clean(exclude=["project"])
        except ValidationError as exc:
            raise ServiceError(f"Invalid policy: {_messages(exc)}", code="policy") from None
        policy.save()
    _schedules.pop(project.pk, None)
    return policy


def _messages(error: ValidationError) -> str:
    if hasattr(error, "message_dict"):
        return "; ".join(f"{k}: {' '.join(v)}" for k, v in error.message_dict.items())
    return " ".join(error.messages)


# ---- annotator checks ----------------------------------------------------------------------


def annotator_verdict(
    *, quality: qc_metrics.AnnotatorQuality, policy: QualityPolicy, look: int | None = None
) -> Verdict:
    """Judge each check alone with `assess_annotator`, so every failure carries its code.

    ``look`` is which check of the annotator this is since their last resume (1 = the first);
    the test levels are spent across their checks (`evaluation.stats.quality.spent_level`).
    """
    thresholds = qc_metrics.quality_thresholds(policy=policy)
    failed, reasons, notes = [], [], []
    for code, argument in CHECKS:
        metric = getattr(quality, argument)
        if metric is None:
            continue
        result = assess_annotator(thresholds=thresholds, look=look, **{argument: metric})
        if result.status == PAUSE:
            failed.append(code)
            reasons.extend(result.reasons)
        notes.extend(result.notes)
    return Verdict(PAUSE if failed else "pass", failed, reasons, notes)


def _pause_flag(failed_checks: Iterable[str]) -> str:
    return (PAUSE_FLAG_PREFIX + ",".join(failed_checks))[:100]


@transaction.atomic
def annotator_pause(
    *,
    project: Project,
    annotator_id: int,
    failed_checks: list[str],
    reasons: list[str],
    since: datetime | None = None,
) -> bool:
    """Pause an active annotator, end their live lease and flag their labels; False if not active.

    Labels made since ``since`` (their last resume) get ``qc_flag = "paused:<checks>"``;
    nothing is deleted. Safe to call twice: the membership row is locked and a paused
    annotator is left alone.
    """
    membership = (
        Membership.objects.select_for_update().filter(project=project, user_id=annotator_id).first()
    )
    if membership is None or membership.status != Membership.Status.ACTIVE:
        return False
    annotation_services.membership_set_status(
        membership=membership,
        status=Membership.Status.PAUSED,
        reason="Paused by quality control: " + "; ".join(reasons),
        flagged=True,
    )
    now = timezone.now()
    # End the live lease first, so a submit racing with the pause either lands before the
    # flagging below (and is flagged) or finds its lease expired.
    for assignment in Assignment.objects.filter(
        project=project, annotator_id=annotator_id, status=Assignment.Status.LEASED
    ):
        annotation_services.assignment_expire(assignment=assignment, now=now)
    labels = Judgment.objects.filter(project=project, annotator_id=annotator_id).unflagged()
    if since is not None:
        labels = labels.filter(created_at__gt=since)
    labels.update(qc_flag=_pause_flag(failed_checks))
    return True


@transaction.atomic
def annotator_resume(
    *, project: Project, annotator_id: int, by, note: str = "", clear_labels: bool = True
) -> AnnotatorAssessment:
    """Resume a paused annotator and clear the flag; later checks start from this moment.

    With ``clear_labels`` the labels QC flagged when pausing become usable again. The skips
    counted against the project's skip budget are cleared too, so this also lets an
    annotator who spent it be served again. The resume is stored as an assessment with
    verdict ``resumed``.
    """
    membership = (
        Membership.objects.select_for_update().filter(project=project, user_id=annotator_id).first()
    )
    if membership is None:
        raise NotFound("No such annotator in this project.")
    annotation_services.membership_set_status(
        membership=membership, status=Membership.Status.ACTIVE, reason="", flagged=False
    )
    Membership.objects.filter(pk=membership.pk).update(skip_count=0, skips_in_row=0)
    if clear_labels:
        Judgment.objects.filter(
            project=project, annotator_id=annotator_id, qc_flag__startswith=PAUSE_FLAG_PREFIX
        ).update(qc_flag="")
    return AnnotatorAssessment.objects.create(
        project=project,
        annotator_id=annotator_id,
        verdict=AnnotatorAssessment.Verdict.RESUMED,
        reasons=[note] if note else [],
        n_judgments=Judgment.objects.filter(project=project, annotator_id=annotator_id).count(),
        trigger=AnnotatorAssessment.Trigger.MANUAL,
        created_by=by if getattr(by, "pk", None) else None,
    )


@transaction.atomic
def annotator_pause_manual(
    *, project: Project, annotator_id: int, by, reason: str
) -> AnnotatorAssessment:
    """Pause an annotator by a researcher's decision, with the reason the annotator is shown.

    Like a QC pause it ends the live lease and is stored as a ``pause`` assessment (trigger
    ``manual``), so the record says who paused whom and why; no label is flagged.
    """
    reason = reason.strip()
    if not reason:
        raise ServiceError("Say why: the annotator is shown the reason.", code="reason")
    if len(reason) > 500:
        raise ServiceError("reason is longer than 500 characters.", code="reason")
    membership = (
        Membership.objects.select_for_update().filter(project=project, user_id=annotator_id).first()
    )
    if membership is None:
        raise NotFound("No such annotator in this project.")
    if membership.status == Membership.Status.PAUSED:
        raise ServiceError("This annotator is paused already.", code="status", status=409)
    annotation_services.membership_set_status(
        membership=membership,
        status=Membership.Status.PAUSED,
        reason="Paused by a researcher: " + reason,
        flagged=True,
    )
    now = timezone.now()
    for assignment in Assignment.objects.filter(
        project=project, annotator_id=annotator_id, status=Assignment.Status.LEASED
    ):
        annotation_services.assignment_expire(assignment=assignment, now=now)
    return AnnotatorAssessment.objects.create(
        project=project,
        annotator_id=annotator_id,
        verdict=AnnotatorAssessment.Verdict.PAUSE,
        applied=True,
        failed_checks=["manual"],
        reasons=[reason],
        n_judgments=Judgment.objects.filter(project=project, annotator_id=annotator_id).count(),
        trigger=AnnotatorAssessment.Trigger.MANUAL,
        created_by=by if getattr(by, "pk", None) else None,
    )


def annotators_assess(
    *,
    project: Project,
    annotator_ids: list[int] | None = None,
    pause: bool = True,
    trigger: str = AnnotatorAssessment.Trigger.AUTO,
    progress: Callable[[Iterable], Iterable] | None = None,
    policy: QualityPolicy | None = None,
) -> QCCheckResult:
    """Assess active annotators (all, or the given ones), store the verdicts, pause failures.

    With ``pause=False`` nothing changes but the stored assessments (a dry run). Annotators
    who are paused already are not assessed again. `policy` is the project's, when the caller
    has read it already.
    """
    policy = policy or selectors.quality_policy_get(project=project)
    active = Membership.objects.filter(project=project, status=Membership.Status.ACTIVE)
    if annotator_ids is not None:
        active = active.filter(user_id__in=annotator_ids)
    ids = list(active.values_list("user_id", flat=True))
    result = QCCheckResult()
    if not ids:
        return result
    qualities = selectors.annotator_quality(project=project, annotator_ids=ids, policy=policy)
    ordered = sorted(qualities.values(), key=lambda q: q.annotator_id)
    taken = selectors.annotator_checks_taken(
        project=project, since={q.annotator_id: q.since for q in ordered}
    )
    for quality in progress(ordered) if progress else ordered:
        verdict = annotator_verdict(
            quality=quality, policy=policy, look=taken[quality.annotator_id] + 1
        )
        applied = False
        if verdict.status == PAUSE and pause:
            applied = annotator_pause(
                project=project,
                annotator_id=quality.annotator_id,
                failed_checks=verdict.failed_checks,
                reasons=verdict.reasons,
                since=quality.since,
            )
            if applied:
                result.paused.append(quality.annotator_id)
        result.assessments.append(
            AnnotatorAssessment.objects.create(
                project=project,
                annotator_id=quality.annotator_id,
                verdict=verdict.status,
                applied=applied,
                failed_checks=verdict.failed_checks,
                reasons=verdict.reasons,
                notes=verdict.notes,
                metrics=quality.as_json(),
                n_judgments=quality.n_judgments,
                trigger=trigger,
            )
        )
    return result


# ---- disagreement queue and adjudication ---------------------------------------------------


def disagreements_mark(
    *,
    project: Project,
    item_ids: Iterable[int] | None = None,
    policy: QualityPolicy | None = None,
) -> int:
    """Set ``needs_review`` on items split beyond the policy threshold; return how many changed.

    Only sets the mark: an adjudication clears it, and a later vote that settles the item does
    not (a reviewer may still want to look).
    """
    disputed = selectors.disputed_item_ids(project=project, item_ids=item_ids, policy=policy)
    if not disputed:
        return 0
    return Item.objects.filter(pk__in=list(disputed), needs_review=False).update(needs_review=True)


def _item_for_reviewer(*, item_id: int, user) -> Item:
    """Return an item the user may review: 404 outside their projects, 403 for annotators."""
    item = Item.objects.select_related("project").filter(pk=item_id).first()
    if item is None or not (
        user.is_staff or Membership.objects.filter(project=item.project, user=user).exists()
    ):
        raise NotFound("No such item.")
    if not user_can_review(project_id=item.project_id, user=user):
        raise Forbidden("Only the project's reviewers may do this.")
    return item


def item_for_review(*, item_id: int, user) -> Item:
    """Return an item for a reviewer of its project (NotFound / Forbidden otherwise)."""
    return _item_for_reviewer(item_id=item_id, user=user)


def _check_adjudication_label(
    *, project: Project, choice: str | None, ranking: list[int] | None
) -> tuple[str, list[int] | None]:
    if project.task_kind == TaskKind.PAIRWISE:
        if not choice or ranking is not None:
            raise ServiceError("A pairwise item takes a `choice` and no `ranking`.", code="choice")
        if choice not in PAIRWISE_LABELS:
            raise ServiceError(
                f"choice must be one of {', '.join(PAIRWISE_LABELS)}.", code="choice"
            )
        return choice, None
    if choice or ranking is None:
        raise ServiceError("A ranking item takes a `ranking` and no `choice`.", code="ranking")
    k = project.k
    if (
        not isinstance(ranking, list)
        or len(ranking) != k
        or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranking)
    ):
        raise ServiceError(f"ranking must list a rank for each of the {k} answers.", code="ranking")
    distinct = sorted(set(ranking))
    if distinct != list(range(1, len(distinct) + 1)):
        raise ServiceError(
            "ranks must start at 1 with no gaps (ties share a rank).", code="ranking"
        )
    return "", ranking


@transaction.atomic
def adjudication_create(
    *, item_id: int, reviewer, choice: str | None = None, ranking=None, note: str = ""
) -> Adjudication:
    """Store a reviewer's verdict beside the item's labels and take it off the review queue.

    ``choice`` / ``ranking`` are canonical (A = the answer at position 0), as the review
    payload lists the answers. The original labels are not touched.
    """
    item = _item_for_reviewer(item_id=item_id, user=reviewer)
    if len(note) > 10_000:
        raise ServiceError("note is longer than 10,000 characters.", code="note")
    choice, ranking = _check_adjudication_label(
        project=item.project, choice=choice, ranking=ranking
    )
    adjudication = Adjudication.objects.create(
        item=item, reviewer=reviewer, choice=choice, ranking=ranking, note=note
    )
    Item.objects.filter(pk=item.pk).update(needs_review=False)
    return adjudication


# ---- agreement reports ---------------------------------------------------------------------


def agreement_report_store(
    *, project: Project, round_: Round | None = None, n_boot: int = 1000, seed: int = 0
) -> AgreementReport:
    """Compute `selectors.project_agreement` and store it for the dashboard."""
    report = selectors.project_agreement(project=project, round_=round_, n_boot=n_boot, seed=seed)
    n_judgments = sum(block["n_judgments"] for block in report["by_source"].values())
    return AgreementReport.objects.create(
        project=project, round=round_, report=report, n_judgments=n_judgments
    )


# ---- whole checks --------------------------------------------------------------------------


# How far before an annotator's previous check their labels are looked at again for disputes.
RECHECK_OVERLAP = timedelta(minutes=5)


def qc_check_annotator(
    *, project: Project, annotator_id: int, trigger: str = AnnotatorAssessment.Trigger.AUTO
) -> QCCheckResult:
    """Assess one annotator (pausing per policy) and queue their disputed items for review.

    Reads only the annotator's labels and the other labels on the same items, so its cost
    grows with the annotator's work, not the project's. Disputes are looked for only on the
    items they labelled since their previous check (`RECHECK_OVERLAP` earlier, for labels
    committed while it ran): an item's split changes only with a new label, and each new
    label's author is checked after it; the project-wide check looks at every item.
    """
    policy = selectors.quality_policy_get(project=project)
    previous = (
        AnnotatorAssessment.objects.filter(project=project, annotator_id=annotator_id)
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    result = annotators_assess(
        project=project,
        annotator_ids=[annotator_id],
        pause=policy.enabled,
        trigger=trigger,
        policy=policy,
    )
    labelled = Judgment.objects.filter(project=project, annotator_id=annotator_id)
    if previous is not None:
        labelled = labelled.filter(created_at__gte=previous - RECHECK_OVERLAP)
    result.items_marked = disagreements_mark(
        project=project, item_ids=labelled.values("item_id"), policy=policy
    )
    return result


def qc_check_project(
    *,
    project: Project,
    pause: bool = True,
    trigger: str = AnnotatorAssessment.Trigger.AUTO,
    agreement: bool = True,
    n_boot: int = 1000,
    progress: Callable[[Iterable], Iterable] | None = None,
) -> QCCheckResult:
    """Assess every active annotator, mark disputed items, and store a fresh agreement report."""
    result = annotators_assess(project=project, pause=pause, trigger=trigger, progress=progress)
    result.items_marked = disagreements_mark(project=project)
    if agreement:
        result.agreement = agreement_report_store(project=project, n_boot=n_boot)
    return result


_SCHEDULE_TTL = 30.0  # seconds a process trusts its copy of a project's QC schedule
_schedules: dict[int, tuple[float, bool, int]] = {}


def _qc_schedule(project_id: int) -> tuple[bool, int]:
    """Return (enabled, check every N) for a project, cached briefly: it is read per submit."""
    now = time.monotonic()
    cached = _schedules.get(project_id)
    if cached is not None and cached[0] > now:
        return cached[1], cached[2]
    row = (
        QualityPolicy.objects.filter(project_id=project_id)
        .values_list("enabled", "check_every_n_judgments")
        .first()
    )
    enabled, every = row or (
        QualityPolicy._meta.get_field("enabled").default,
        QualityPolicy._meta.get_field("check_every_n_judgments").default,
    )
    _schedules[project_id] = (now + _SCHEDULE_TTL, enabled, every)
    return enabled, every


# A check reads the annotator's whole history since their last resume, so its cost grows with
# it: checked every N judgments for good, an annotator's checks would cost in total the square
# of their count. From their 2 * QC_EVEN_CHECKS-th check on, the spacing doubles each time the
# count does, which keeps the gap within 1/QC_EVEN_CHECKS of the count and the checks' cost
# per judgment bounded.
QC_EVEN_CHECKS = 8


def qc_check_due(judgment_count: int, every: int) -> bool:
    """Whether an annotator's check is due at this count of their judgments: every `every`
    judgments up to 2 * QC_EVEN_CHECKS of them, then every 2 * `every` up to twice that
    count, every 4 * `every` up to twice that again, and so on."""
    every = max(every, 1)
    if judgment_count <= 0:
        return False
    doublings = max(0, (judgment_count // (QC_EVEN_CHECKS * every)).bit_length() - 1)
    return judgment_count % (every << doublings) == 0


def qc_after_submit(
    *, project_id: int, annotator_id: int, judgment_count: int | None = None
) -> bool:
    """Queue the annotator's QC check when one is due (`qc_check_due`: after every N-th
    judgment, spaced out as their count grows); return whether it was queued.

    Call from `judgment_submit` once the judgment has committed (not on replays)::

        transaction.on_commit(lambda: qc_after_submit(
            project_id=project.pk, annotator_id=user.pk, judgment_count=None))

    ``judgment_count`` is the annotator's count including this judgment; when None it is read
    from their membership (one indexed query). Costs one or two small queries and, every N
    judgments, one broker message. A broker error is logged, never raised: QC must not fail
    a submit.
    """
    enabled, every = _qc_schedule(project_id)
    if not enabled:
        return False
    if judgment_count is None:
        judgment_count = (
            Membership.objects.filter(project_id=project_id, user_id=annotator_id)
            .values_list("judgment_count", flat=True)
            .first()
        ) or 0
    if not qc_check_due(judgment_count, every):
        return False
    from evaluation.tasks import qc_check_annotator_task

    try:
        qc_check_annotator_task.delay(project_id, annotator_id)
    except Exception:  # the broker is down: the next N-th judgment tries again
        logger.exception("Could not queue the QC check of annotator %s", annotator_id)
        return False
    return True
