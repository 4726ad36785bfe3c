"""The promotion gate: whether a new policy goes to annotators, and the researcher's override.

A policy the loop trains is evaluated (`training.policy_eval`) and then judged here against
the criteria of the project's `LoopSettings.gate`. A policy that passes is promoted; one that
fails is kept in the registry but not promoted, and the next round is generated from the last
promoted policy (`policy_current`). A researcher may promote or reject any policy of their
project by hand with a reason; the reason and who decided are stored on the version.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from annotation.errors import Conflict, NotFound, ServiceError
from annotation.models import Project, Round
from training.models import ModelVersion
from training.selectors import model_version_list

POLICY_KINDS = (ModelVersion.Kind.POLICY, ModelVersion.Kind.ENDPOINT)


# --------------------------------------------------------------------------- manual decision


def policy_promote(*, version: ModelVersion, user, reason: str) -> ModelVersion:
    """Promote a policy by hand: the next round is generated from it."""
    return _decide_by_hand(
        version=version, user=user, reason=reason, promotion=ModelVersion.Promotion.PROMOTED
    )


def policy_reject(*, version: ModelVersion, user, reason: str) -> ModelVersion:
    """Reject a policy by hand: it stays in the registry but no round is generated from it."""
    return _decide_by_hand(
        version=version, user=user, reason=reason, promotion=ModelVersion.Promotion.REJECTED
    )


def _decide_by_hand(*, version: ModelVersion, user, reason: str, promotion: str) -> ModelVersion:
    if not model_version_list(user=user).filter(pk=version.pk).exists():
        raise NotFound("No such model version.")
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("reason: say why this policy is promoted or rejected.", code="required")
    if version.kind not in POLICY_KINDS:
        raise ServiceError(
            f"model version {version.pk} is a {version.kind}, not a policy: only policies "
            "are promoted or rejected.",
            code="not_a_policy",
        )
    if version.status != ModelVersion.Status.READY:
        raise Conflict(
            f"model version {version.pk} is {version.status}: only a validated (ready) "
            "policy can be promoted or rejected."
        )
    return _decision_store(
        version=version, promotion=promotion, reason=reason, user=user, gate=None
    )


def _decision_store(
    *, version: ModelVersion, promotion: str, reason: str, user, gate: dict | None
) -> ModelVersion:
    """Store a promotion decision (by hand when `user` is given, by the gate otherwise)."""
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        locked.promotion = promotion
        locked.promotion_reason = reason
        locked.promoted_at = timezone.now()
        locked.promoted_by = user if user is not None and user.is_authenticated else None
        fields = ["promotion", "promotion_reason", "promoted_at", "promoted_by"]
        if gate is not None:
            locked.gate = gate
            fields.append("gate")
        elif locked.gate:
            # Keep the gate's own verdict beside the researcher's decision.
            locked.gate = {**locked.gate, "overridden_by_hand": True}
            fields.append("gate")
        locked.save(update_fields=fields)
    version.refresh_from_db()
    return version


# --------------------------------------------------------------------------- which policy


def project_policies(*, project: Project):
    """Return the policies of a project: trained by its runs, registered to it, or in its rounds."""
    return ModelVersion.objects.filter(kind__in=POLICY_KINDS).filter(
        Q(training_run__project=project)
        | Q(project=project)
        | Q(pk__in=Round.objects.filter(project=project).values("model_version_id"))
    )


def policy_base(*, project: Project) -> ModelVersion | None:
    """Return the loop's base policy: the policy of the project's first round that had one."""
    first = (
        Round.objects.filter(project=project, model_version__isnull=False)
        .exclude(purpose=Round.Purpose.EVAL)
        .order_by("number")
        .select_related("model_version")
        .first()
    )
    return first.model_version if first is not None else None


def policy_last_promoted(*, project: Project) -> ModelVersion | None:
    """Return the project's most recently promoted policy, or None."""
    return (
        project_policies(project=project)
        .filter(promotion=ModelVersion.Promotion.PROMOTED)
        .order_by("-promoted_at", "-pk")
        .first()
    )


def policy_current(*, project: Project) -> ModelVersion | None:
    """Return the policy rounds are generated from: the last promoted one, else the base."""
    return policy_last_promoted(project=project) or policy_base(project=project)
