"""Human evaluation rounds: the new policy against the previous one, labelled by people.

The round is served like any round but drawn from the pool's evaluation split and never
exported for training; its counted labels become one judge row (`PolicyEvaluation`) per round,
beside the reward-model and LLM judges of `training.policy_eval`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import transaction

from annotation.models import Project, Prompt
from evaluation.stats.winrate import win_rate
from training.models import ModelVersion, PolicyEvaluation
from training.policy_eval import policy_opponents

if TYPE_CHECKING:
    from training.loop.settings import LoopSettings

JudgeKind = PolicyEvaluation.JudgeKind

HUMAN_ROUND_KEY = "loop-eval-policy-{policy_id}"


def human_eval_round_request(
    *, policy: ModelVersion, project: Project, settings: LoopSettings, sync: bool
):
    """Queue (or, with `sync`, run) a human evaluation round of the policy vs the previous one.

    The round is generated from the pool's evaluation split, side by side (the new policy's
    answer and the previous policy's; pairwise projects only), and served like any round;
    its labels are never exported for training. Returns the generation job,
    or None with the reason when no such round can be made.
    """
    from training.rounds import generation_job_create, generation_job_run

    previous, _base = policy_opponents(policy=policy, project=project)
    if previous is None:
        return None, "no previous policy to compare with"
    if project.k != 2:
        return (
            None,
            f"a human evaluation round compares two answers; this project shows {project.k}",
        )
    versions = [policy, previous]
    available = Prompt.objects.filter(
        project=project, in_pool=True, split=Prompt.Split.EVAL
    ).count()
    if not available:
        return None, "the prompt pool has no evaluation prompts"
    job = generation_job_create(
        project=project,
        user=None,
        policies=[v.pk for v in versions],
        mode="side_by_side",
        n_prompts=min(settings.evaluation["n_prompts"], available),
        sampling=[
            {"temperature": settings.evaluation["temperature"] or 1.0} for _ in range(project.k)
        ],
        seed=settings.evaluation["seed"],
        purpose="eval",
        source_key=HUMAN_ROUND_KEY.format(policy_id=policy.pk),
        enqueue=not sync,
    )
    if sync:
        job = generation_job_run(job_id=job.pk)
    return job, ""


def human_eval_verdicts(*, project: Project) -> list[PolicyEvaluation]:
    """Turn the labels of the loop's human evaluation rounds into one judge row per round.

    Each counted human label of an item (primary, unflagged) is a win, tie, loss or both-bad
    of the round's policy against the first other policy; both-bad labels are reported but
    not counted in the win rate. A round's row is replaced when new labels came in; returns
    the rows written.
    """
    from annotation.models import Judgment, LabelSource, Round
    from training.models import GenerationJob

    rows = []
    jobs = GenerationJob.objects.filter(
        project=project,
        source_key__startswith=f"genjob-{project.pk}-" + HUMAN_ROUND_KEY.split("{")[0],
        round__isnull=False,
        round__purpose=Round.Purpose.EVAL,
    ).select_related("round", "round__model_version")
    for job in jobs:
        round_ = job.round
        policy = round_.model_version
        opponent_id = job.request["policies"][1]
        names = dict(
            ModelVersion.objects.filter(pk__in=job.request["policies"]).values_list("pk", "name")
        )
        votes = (
            Judgment.objects.filter(item__round=round_)
            .counted([LabelSource.HUMAN])
            .exclude(choice="")
            .select_related("item__prompt")
            .prefetch_related("item__slots__candidate")
            .order_by("id")
        )
        outcomes, prompt_keys = [], []
        for vote in votes:
            by_position = {
                slot.position: slot.candidate.model_name for slot in vote.item.slots.all()
            }
            outcome = _human_outcome(vote.choice, by_position, names[policy.pk], names[opponent_id])
            if outcome is None:
                continue
            outcomes.append(outcome)
            prompt_keys.append(vote.item.prompt.content_hash)
        judge = f"human evaluation round {round_.number}"
        stored = PolicyEvaluation.objects.filter(
            policy=policy, judge_kind=JudgeKind.HUMAN, judge=judge
        )
        if not outcomes or any(r.details.get("labels") == len(outcomes) for r in stored):
            continue  # nothing new since the last count
        result = win_rate(outcomes, prompt_keys, seed=0)
        with transaction.atomic():
            stored.delete()
            rows.append(
                PolicyEvaluation.objects.create(
                    policy=policy,
                    opponent_id=opponent_id,
                    judge_kind=JudgeKind.HUMAN,
                    judge=judge,
                    wins=result.wins,
                    ties=result.ties,
                    losses=result.losses,
                    win_rate=result.win_rate,
                    ci_low=result.ci_low,
                    ci_high=result.ci_high,
                    n_prompts=result.n_prompts,
                    details={
                        "round": round_.number,
                        "both_bad": result.both_bad,
                        "labels": len(outcomes),
                        "convention": result.convention,
                    },
                )
            )
    return rows


def _human_outcome(choice: str, by_position: dict, new_name: str, old_name: str) -> str | None:
    """Return the new policy's outcome of one pairwise label (None: it did not compare them)."""
    if choice == "tie":
        return "tie"
    if choice == "both_bad":
        return "both_bad"
    picked = by_position.get({"A": 0, "B": 1}.get(choice))
    others = set(by_position.values()) - {picked}
    if picked == new_name and old_name in others:
        return "win"
    if picked == old_name and new_name in others:
        return "loss"
    return None
