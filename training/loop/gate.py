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


# --------------------------------------------------------------------------- the gate


def _criterion(value, threshold, *, at_most: bool, note: str = "") -> dict:
    if threshold is None:
        return {"value": value, "threshold": None, "passed": None, "note": "not checked"}
    if value is None:
        return {"value": None, "threshold": threshold, "passed": None, "note": note}
    passed = value <= threshold if at_most else value >= threshold
    return {"value": value, "threshold": threshold, "passed": bool(passed)}


def gate_criteria(*, policy: ModelVersion, settings) -> dict[str, dict]:
    """Return each gate criterion of a policy: its value, threshold and whether it passed.

    A criterion without a value (no judge of that kind, KL not available, no held-out reward
    model accuracy) has ``passed`` None: reported, not counted either way.
    """
    from training.models import PolicyEvaluation

    gate = settings.gate
    generation = policy.eval_results.get("generation") or {}
    criteria: dict[str, dict] = {}
    previous_id = generation.get("previous_id")
    verdicts = PolicyEvaluation.objects.filter(
        policy=policy, opponent_id=previous_id, judge_kind__in=gate["win_rate_judges"]
    ).order_by("judge_kind", "judge")
    for verdict in verdicts:
        if verdict.details.get("held_out_judge"):
            # The loop's held-out judge: a non-inferiority check (see GATE_DEFAULTS).
            criteria[f"not_worse[{verdict.judge}]"] = {
                **_criterion(
                    verdict.ci_high,
                    gate["held_out_judge_min_win_rate_ci_high"],
                    at_most=False,
                    note="no decisive verdict",
                ),
                "judge_kind": verdict.judge_kind,
                "opponent": previous_id,
                "win_rate": verdict.win_rate,
            }
            continue
        if verdict.details.get("optimised_against"):
            # The policy was trained to please this judge: its verdict is reported only.
            criterion = {
                "value": verdict.ci_low,
                "threshold": gate["min_win_rate_ci_low"],
                "passed": None,
                "note": "not counted: the policy was optimised against this reward model",
            }
        else:
            criterion = _criterion(
                verdict.ci_low,
                gate["min_win_rate_ci_low"],
                at_most=False,
                note="no decisive verdict",
            )
        criteria[f"win_rate_ci_low[{verdict.judge}]"] = {
            **criterion,
            "judge_kind": verdict.judge_kind,
            "opponent": previous_id,
            "win_rate": verdict.win_rate,
        }
    if not criteria:
        criteria["win_rate_ci_low"] = _criterion(
            None, gate["min_win_rate_ci_low"], at_most=False, note="no judge evaluated it"
        )
    kl = generation.get("kl_reference") or {}
    criteria["kl_reference"] = _criterion(
        kl.get("value") if kl.get("available") else None,
        gate["kl_budget"],
        at_most=True,
        note=kl.get("reason", "not measured"),
    )
    criteria["length_ratio"] = _criterion(
        generation.get("length_ratio_vs_previous"),
        gate["max_length_ratio"],
        at_most=True,
        note="no previous policy's answers to compare with",
    )
    reward_model = _iteration_reward_model(policy)
    accuracy = None
    if reward_model is not None:
        report = reward_model.eval_results.get("rm_metrics") or {}
        if report.get("split") == "test":
            accuracy = report.get("accuracy")
    criteria["rm_test_accuracy"] = {
        **_criterion(
            accuracy,
            gate["min_rm_accuracy"],
            at_most=False,
            note="no reward model with held-out test metrics in this iteration",
        ),
        "reward_model": reward_model.pk if reward_model is not None else None,
    }
    return criteria


def _iteration_reward_model(policy: ModelVersion) -> ModelVersion | None:
    """Return the reward model the policy was trained against (the one trained on the same
    dataset version when the run names none), if any; never the iteration's held-out judge."""
    run = policy.training_run
    if run is None or run.dataset_version_id is None:
        return None
    candidates = ModelVersion.objects.filter(
        kind=ModelVersion.Kind.REWARD, training_run__dataset_version_id=run.dataset_version_id
    ).order_by("-created_at", "-pk")
    trained_against = (run.config or {}).get("reward_model_path")
    if trained_against:
        named = candidates.filter(artifact_path=trained_against).first()
        if named is not None:
            return named
    judge = (run.config or {}).get("judge_reward_model_path")
    return candidates.exclude(artifact_path=judge).first() if judge else candidates.first()


def policy_gate(*, policy: ModelVersion, settings, evaluation_error: str = "") -> ModelVersion:
    """Judge a policy by the loop's gate criteria; promote it or keep it unpromoted.

    A decision already taken (by the gate or by hand) stands. A policy whose evaluation
    failed is not promoted: nothing says it is better.
    """
    policy.refresh_from_db()
    if policy.promotion:
        return policy
    if evaluation_error:
        record = {"passed": False, "criteria": {}, "evaluation_error": evaluation_error}
        reason = f"not evaluated: {evaluation_error}"
    else:
        criteria = gate_criteria(policy=policy, settings=settings)
        failed = [name for name, c in criteria.items() if c["passed"] is False]
        record = {"passed": not failed, "criteria": criteria, "settings": settings.gate}
        if failed:
            reason = "failed: " + "; ".join(
                f"{name} {_shown(criteria[name]['value'])} vs {criteria[name]['threshold']}"
                for name in failed
            )
        else:
            checked = [name for name, c in criteria.items() if c["passed"]]
            reason = "passed: " + (", ".join(checked) or "no criterion had a value")
    promotion = (
        ModelVersion.Promotion.PROMOTED if record["passed"] else ModelVersion.Promotion.REJECTED
    )
    return _decision_store(
        version=policy, promotion=promotion, reason=reason, user=None, gate=record
    )


def _shown(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def kl_budget(*, settings) -> float | None:
    """Return the loop's KL budget in nats (the one home the reward-hacking guards read)."""
    return settings.gate["kl_budget"]
