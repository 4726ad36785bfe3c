"""The loop's evaluate, human evaluation and gate steps of one iteration (`training.loop.steps`).

Each takes the iteration's `LoopState` and records what it did as a step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import transaction

from training.models import ModelVersion

if TYPE_CHECKING:
    from training.loop.steps import LoopState


def num(value) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "n/a"


def evaluate_step(project, policy: ModelVersion, settings, state: LoopState, sync) -> str | None:
    """Evaluate the new policy once (judges, KL, text statistics).

    Return '' when it is evaluated, an error message when the evaluation failed, or None
    while it waits for a `gpu` worker: outside `sync`, the evaluation (which loads and
    samples the policies) is queued there like generation, never run in the tick's worker.
    """
    from annotation.errors import ServiceError
    from training.generation.base import GenerationError
    from training.policy_eval import policy_evaluate, policy_evaluated

    if not policy_evaluated(policy) and not sync:
        return evaluation_queue(project, policy, settings, state)
    if not policy_evaluated(policy):
        try:
            policy_evaluate(policy=policy, project=project, settings=settings)
        except (ServiceError, GenerationError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            state.add("evaluate", "failed", message[:300])
            return message
    if settings.prompt_source == "demo" and "true_reward" not in policy.eval_results:
        # The demo also keeps its programmatic reward of the policy alone, as a report.
        from training.demo_eval import policy_true_reward

        result = policy_true_reward(policy.artifact_path, seed=settings.seed)
        policy.refresh_from_db(fields=["eval_results"])
        policy.eval_results = {**policy.eval_results, **result}
        policy.save(update_fields=["eval_results"])
    state.add("evaluate", "done", evaluation_summary(policy))
    return ""


def evaluation_queue(project, policy: ModelVersion, settings, state: LoopState) -> str | None:
    """Queue the policy's evaluation on the gpu queue unless a worker already has it.

    Return the last attempt's error (it is queued again, as a sync tick would retry it), or
    None while the evaluation is queued or running.
    """
    from training.loop_tasks import evaluate_policy
    from training.policy_eval import policy_evaluation_claim

    queued, error = policy_evaluation_claim(policy=policy)
    if not queued:
        state.add("evaluate", "waiting", f"policy {policy.pk} is being evaluated on a gpu worker")
        return None
    transaction.on_commit(lambda: evaluate_policy.delay(project.pk, policy.pk, settings.to_dict()))
    if error:
        state.add("evaluate", "failed", f"{error[:250]} (queued again)")
        return error
    state.add("evaluate", "started", f"policy {policy.pk} queued for evaluation on a gpu worker")
    return None


def evaluation_summary(policy: ModelVersion) -> str:
    from training.models import PolicyEvaluation

    generation = policy.eval_results.get("generation") or {}
    parts = []
    for verdict in PolicyEvaluation.objects.filter(
        policy=policy, opponent_id=generation.get("previous_id")
    ).order_by("judge_kind", "judge"):
        parts.append(
            f"{verdict.judge}: {verdict.wins}/{verdict.ties}/{verdict.losses} "
            f"win rate {num(verdict.win_rate)} [{num(verdict.ci_low)}, {num(verdict.ci_high)}]"
        )
    kl = generation.get("kl_reference") or {}
    parts.append(f"KL to reference {num(kl.get('value')) if kl.get('available') else 'n/a'}")
    stats = generation.get("stats") or {}
    parts.append(
        f"length {num(stats.get('mean_length'))}, distinct-2 {num(stats.get('distinct_2'))}"
    )
    if "true_reward" in policy.eval_results:
        parts.append(f"true reward {policy.eval_results['true_reward']:.3f}")
    return "; ".join(parts)[:1000]


def human_round_step(project, policy: ModelVersion, settings, state: LoopState, sync) -> None:
    """Open a human evaluation round of the new policy vs the previous one (never exported)."""
    from annotation.errors import ServiceError
    from training.generation.base import GenerationError
    from training.human_eval import human_eval_round_request

    try:
        job, reason = human_eval_round_request(
            policy=policy, project=project, settings=settings, sync=sync
        )
    except (ServiceError, GenerationError) as exc:
        state.add("human_eval", "failed", (getattr(exc, "message", None) or str(exc))[:300])
        return
    if job is None:
        state.add("human_eval", "skipped", reason)
    elif job.round_id is not None:
        state.add("human_eval", "done", f"evaluation round {job.round.number}")
    elif job.status == job.Status.FAILED:
        state.add("human_eval", "failed", f"generation job {job.pk}: {job.error[-300:]}")
    else:
        state.add("human_eval", "started", f"generation job {job.pk}")


def human_verdicts_step(project, state: LoopState) -> None:
    """Count the labels of the loop's human evaluation rounds as one more judge."""
    from training.human_eval import human_eval_verdicts

    for verdict in human_eval_verdicts(project=project):
        state.add(
            "human_eval",
            "done",
            f"{verdict.judge}: policy {verdict.policy_id} {verdict.wins}/{verdict.ties}/"
            f"{verdict.losses} win rate {num(verdict.win_rate)} "
            f"[{num(verdict.ci_low)}, {num(verdict.ci_high)}]",
        )


def gate_step(policy: ModelVersion, settings, state: LoopState) -> None:
    """Promote the policy if it passes the gate; otherwise keep it unpromoted."""
    from training.loop.gate import policy_gate

    decided = policy_gate(policy=policy, settings=settings)
    who = "by hand" if decided.promoted_by_id else "by the gate"
    state.add("gate", "done", f"{decided.promotion} {who}: {decided.promotion_reason}"[:1000])
