"""Evaluate a new policy inside the loop: judges, win rates, KL and text statistics.

The new policy, the previous promoted policy and the base (the policy of the project's first
round) each answer the same evaluation prompts — the pool's evaluation split, which no
training round uses (the demo: its held-out problems) — with one fixed seed. Then, for each
opponent, each judge gives a win / tie / loss per prompt:

* the project's newest reward model(s), by comparing the two answers' scores;
* an LLM judge behind a declared OpenAI-compatible endpoint (`training.judging.llm`), with the
  project rubric, asked in both display orders; orders that disagree make a tie;
* the demo's programmatic reward, when the project is the demo domain;
* a human evaluation round (new vs previous), once its judgments are in.

Each verdict is stored as a `PolicyEvaluation` row: counts, win rate and a 95% CI that
resamples prompts (`evaluation.stats.winrate.win_rate`). The policy's own figures —
sequence-level KL to its reference (its parent) and to the base, answer length, distinct-1/2
and repetition (`evaluation.stats.textstats`) — go to ``eval_results["generation"]``, where
the promotion gate and the reward-hacking guards read them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from annotation.errors import ServiceError
from annotation.models import Project, Prompt
from evaluation.stats.textstats import mean_length, text_stats
from evaluation.stats.winrate import win_rate
from training.generation import GenerationSettings
from training.generation.endpoints import candidates_generate
from training.loop.gate import policy_base, policy_last_promoted
from training.models import ModelVersion, PolicyEvaluation

if TYPE_CHECKING:
    from training.loop.settings import LoopSettings

logger = logging.getLogger(__name__)

JudgeKind = PolicyEvaluation.JudgeKind
# Reward scores this close count as a tie. Scores are float32: one text scored beside different
# texts in a batch moves by ~1e-7, and two answers closer than 1e-5 are not told apart.
TIE_TOLERANCE = 1e-5


class EvaluationUnavailable(ServiceError):
    """The policy cannot be evaluated as asked (e.g. the pool has no evaluation prompts)."""

    code = "evaluation_unavailable"


@dataclass(frozen=True)
class EvalPrompt:
    key: str  # what the bootstrap clusters on: the prompt's content hash
    prompt: str | list[dict]  # text, or chat messages


# --------------------------------------------------------------------------- prompts


def evaluation_prompts(*, project: Project, settings: LoopSettings) -> list[EvalPrompt]:
    """Return the fixed, seeded sample of evaluation prompts the policies answer.

    Pool prompts of the evaluation split (never used by a training round); the demo domain
    uses its held-out problems instead.
    """
    n, seed = settings.evaluation["n_prompts"], settings.evaluation["seed"]
    if settings.prompt_source == "demo":
        from training.demo_eval import held_out_prompts

        texts = held_out_prompts()
        chosen = sorted(random.Random(seed).sample(range(len(texts)), min(n, len(texts))))
        return [EvalPrompt(key=texts[i], prompt=texts[i]) for i in chosen]
    pool = list(
        Prompt.objects.filter(project=project, in_pool=True, split=Prompt.Split.EVAL)
        .order_by("content_hash")
        .values("content_hash", "text", "messages")
    )
    if not pool:
        raise EvaluationUnavailable(
            "the project's prompt pool has no evaluation prompts: import prompts into the "
            "pool (a share of them is set aside for evaluation)."
        )
    rows = random.Random(seed).sample(pool, min(n, len(pool)))
    return [EvalPrompt(key=r["content_hash"], prompt=r["messages"] or r["text"]) for r in rows]


# --------------------------------------------------------------------------- answers


def policy_answers(
    *, version: ModelVersion, prompts: list[EvalPrompt], settings: LoopSettings
) -> list[str]:
    """Return one sampled answer per prompt from a policy, with the evaluation's fixed seed.

    A version's answers to the same prompts under the same generation settings are the same
    every time (fixed seed, same batches), so answers an earlier evaluation stored — the
    previous policy's own, the base's as an opponent — are read back instead of sampled again.
    """
    generation = _evaluation_generation(settings)
    key = answers_key(prompts, generation)
    stored = _stored_answers(version, key, len(prompts))
    if stored is not None:
        return stored
    samples = candidates_generate(
        model_version=version, prompts=[p.prompt for p in prompts], k=1, settings=generation
    )
    # PostgreSQL text (and JSON) cannot hold NUL; an untrained model may sample it.
    return [cands[0]["text"].replace("\x00", "") for cands in samples]


def _evaluation_generation(settings: LoopSettings) -> GenerationSettings:
    evaluation = settings.evaluation
    return GenerationSettings(
        **{
            **settings.generation,
            "temperature": evaluation["temperature"],
            "max_new_tokens": evaluation["max_new_tokens"]
            or settings.generation.get("max_new_tokens", 32),
            "seed": evaluation["seed"],
        }
    )


def answers_key(prompts: list[EvalPrompt], generation: GenerationSettings) -> str:
    """Return what identifies a set of evaluation answers: the prompts and the sampling."""
    payload = {"prompts": [p.key for p in prompts], "generation": asdict(generation)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _stored_answers(version: ModelVersion, key: str, n: int) -> list[str] | None:
    """Return the version's answers stored by an evaluation with the same answers key."""
    records = ModelVersion.objects.filter(eval_results__generation__answers_key=key).values_list(
        "pk", "eval_results__generation"
    )
    for pk, record in records:
        if pk == version.pk:
            answers = [sample.get("answer") for sample in record.get("samples") or []]
        else:
            answers = (record.get("opponent_answers") or {}).get(str(version.pk)) or []
        if len(answers) == n and all(isinstance(a, str) for a in answers):
            return answers
    return None


def _outcome(new: float, old: float) -> str:
    if abs(new - old) <= TIE_TOLERANCE:
        return "tie"
    return "win" if new > old else "loss"


# --------------------------------------------------------------------------- judges


def reward_model_outcomes(
    *, reward_model: ModelVersion, prompts: list[EvalPrompt], new: list[str], old: list[str]
) -> tuple[list[str], dict]:
    """Return per-prompt outcomes of `new` vs `old` by the reward model's scores."""
    from training.loop.mining import reward_model_trained_on_chat
    from training.scoring import reward_scores

    chat = reward_model_trained_on_chat(reward_model)
    outcomes, margins, scores_new, scores_old = [], [], [], []
    for item, a, b in zip(prompts, new, old, strict=True):
        prompt = item.prompt
        if chat and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        score_new, score_old = reward_scores(reward_model.artifact_path, prompt, [a, b])
        outcomes.append("tie" if a == b else _outcome(score_new, score_old))
        margins.append(score_new - score_old)
        scores_new.append(score_new)
        scores_old.append(score_old)
    # Per-answer scores: the dashboard shows the answers this reward model likes most.
    return outcomes, {"margins": margins, "scores_new": scores_new, "scores_old": scores_old}


def llm_judge_for(*, project: Project, settings: LoopSettings):
    """Return the LLM judge the evaluation settings name, or None."""
    spec = settings.evaluation["llm_judge"]
    if not spec:
        return None
    from training.judging.llm import LLMJudge

    return LLMJudge(
        endpoint=spec["endpoint"],
        model=spec["model"],
        rubric=project.rubric,
        on_disagreement="tie",
        seed=settings.evaluation["seed"],
        **({"max_new_tokens": spec["max_new_tokens"]} if "max_new_tokens" in spec else {}),
    )


def llm_outcomes(
    *, judge, prompts: list[EvalPrompt], new: list[str], old: list[str]
) -> tuple[list[str], dict]:
    """Return per-prompt outcomes of `new` vs `old` by the LLM judge (both orders asked)."""
    verdicts = judge.compare_many(
        [(p.prompt, a, b) for p, a, b in zip(prompts, new, old, strict=True)]
    )
    as_outcome = {"A": "win", "B": "loss", "tie": "tie", None: "tie"}
    outcomes = [as_outcome[v.winner] for v in verdicts]
    kinds = [v.outcome for v in verdicts]
    return outcomes, {
        "judge": judge.describe(),
        "agreed": kinds.count("agreed"),
        "disagreed": kinds.count("disagreed"),
        "unparseable": kinds.count("unparseable"),
        "verdicts": [v.as_dict() for v in verdicts],
    }


def programmatic_outcomes(
    *, prompts: list[EvalPrompt], new: list[str], old: list[str]
) -> tuple[list[str], dict]:
    """Return per-prompt outcomes by the demo domain's true reward."""
    from training import demo

    rewards = [
        (demo.true_reward(p.prompt, a), demo.true_reward(p.prompt, b))
        for p, a, b in zip(prompts, new, old, strict=True)
    ]
    return [_outcome(a, b) for a, b in rewards], {"rewards": rewards}


# --------------------------------------------------------------------------- KL


def sequence_kl(
    *, policy_path: str, reference_path: str, prompts: list[EvalPrompt], answers: list[str]
) -> dict[str, Any]:
    """Return a Monte-Carlo estimate of KL(policy || reference) per answer, in nats.

    The mean over the policy's sampled answers of log p(y|x) - log q(y|x), the sequence-level
    estimate of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences",
    §2.2). Both models score the same tokens: the answer as an assistant turn through the
    policy's chat template (end-of-turn included), so a policy against itself gives 0.
    """
    import numpy as np
    from transformers import AutoModelForCausalLM

    from training.trainers.dpo import completion_logps, load_policy_tokenizer

    tokenizer = load_policy_tokenizer(policy_path)
    policy = AutoModelForCausalLM.from_pretrained(policy_path).eval()
    reference = AutoModelForCausalLM.from_pretrained(reference_path).eval()
    if policy.get_input_embeddings().num_embeddings != (
        reference.get_input_embeddings().num_embeddings
    ):
        return {"available": False, "reason": "the two models have different vocabularies"}
    per_answer = []
    for item, answer in zip(prompts, answers, strict=True):
        messages = item.prompt
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        completion = [{"role": "assistant", "content": answer}]
        log_p = completion_logps(policy, tokenizer, messages, completion)
        log_q = completion_logps(reference, tokenizer, messages, completion)
        per_answer.append(log_p - log_q)
    values = np.asarray(per_answer, dtype=float)
    return {
        "available": True,
        "value": float(values.mean()),
        "std": float(values.std()),
        "n": len(per_answer),
        "per_answer": [float(v) for v in values],
        "estimator": "mean of log p_new(y|x) - log p_ref(y|x) over sampled answers y",
    }


def _kl_to(policy: ModelVersion, other: ModelVersion | None, prompts, answers) -> dict:
    if other is None:
        return {"available": False, "reason": "no such policy"}
    if policy.kind == ModelVersion.Kind.ENDPOINT or other.kind == ModelVersion.Kind.ENDPOINT:
        return {
            "available": False,
            "reason": "not available: a policy behind an endpoint returns no log-probabilities",
            "of": other.pk,
        }
    if other.pk == policy.pk:
        return {"available": True, "value": 0.0, "n": len(answers), "of": other.pk}
    result = sequence_kl(
        policy_path=policy.artifact_path,
        reference_path=other.artifact_path,
        prompts=prompts,
        answers=answers,
    )
    return {**result, "of": other.pk}


# --------------------------------------------------------------------------- evaluation


def policy_opponents(
    *, policy: ModelVersion, project: Project
) -> tuple[ModelVersion | None, ModelVersion | None]:
    """Return (previous promoted policy or else the base, base), leaving out the policy itself."""
    base = policy_base(project=project)
    previous = (
        policy_last_promoted(project=project)
        if policy.promotion != ModelVersion.Promotion.PROMOTED
        else None
    )
    if previous is None or previous.pk == policy.pk:
        previous = policy.parent if policy.parent_id else base
    if base is not None and base.pk == policy.pk:
        base = None
    if previous is not None and previous.pk == policy.pk:
        previous = None
    return previous, base


def policy_evaluated(policy: ModelVersion) -> bool:
    """Return whether the loop's evaluation of this policy is stored."""
    return "generation" in policy.eval_results


# A queued evaluation not finished after this long is taken to be lost and queued again (a
# worker that died mid-task has its message redelivered anyway: the task is acked late).
EVALUATION_STALE_SECONDS = 6 * 3600
_TASK_KEY = "evaluation_task"


def policy_evaluation_claim(*, policy: ModelVersion) -> tuple[bool, str]:
    """Mark the policy's evaluation as queued unless a live one is; return (queued, error).

    ``error`` is the failure of the last attempt, if any: the caller reports it and queues
    the evaluation again.
    """
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=policy.pk)
        task = locked.eval_results.get(_TASK_KEY) or {}
        error = str(task.get("error") or "")
        queued_at = task.get("queued_at")
        now = timezone.now()
        live = (
            queued_at is not None
            and not error
            and (now - datetime.fromisoformat(queued_at)).total_seconds() < EVALUATION_STALE_SECONDS
        )
        if live:
            return False, ""
        locked.eval_results = {**locked.eval_results, _TASK_KEY: {"queued_at": now.isoformat()}}
        locked.save(update_fields=["eval_results"])
    return True, error


def policy_evaluation_run(*, project_id: int, policy_id: int, settings: dict) -> None:
    """Evaluate a policy queued by the loop; record a failure on its row for the next tick."""
    from training.generation.base import GenerationError
    from training.loop.settings import LoopSettings

    policy = ModelVersion.objects.filter(pk=policy_id).first()
    project = Project.objects.filter(pk=project_id).first()
    if policy is None or project is None or policy_evaluated(policy):
        return
    try:
        policy_evaluate(policy=policy, project=project, settings=LoopSettings.from_dict(settings))
        error = ""
    except (ServiceError, GenerationError) as exc:
        error = getattr(exc, "message", None) or str(exc)
    except Exception as exc:
        _evaluation_task_end(policy_id, error=f"{type(exc).__name__}: {exc}")
        raise
    _evaluation_task_end(policy_id, error=error)


def _evaluation_task_end(policy_id: int, *, error: str) -> None:
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().filter(pk=policy_id).first()
        if locked is None:
            return
        results = dict(locked.eval_results)
        if error:
            results[_TASK_KEY] = {**(results.get(_TASK_KEY) or {}), "error": error[:2000]}
        else:
            results.pop(_TASK_KEY, None)
        locked.eval_results = results
        locked.save(update_fields=["eval_results"])


def policy_evaluate(
    *, policy: ModelVersion, project: Project, settings: LoopSettings
) -> dict[str, Any]:
    """Evaluate a policy against the previous promoted policy and the base; store the results.

    Returns the ``eval_results["generation"]`` record. PolicyEvaluation rows of this policy
    are replaced as a whole, in one transaction, so a repeated call leaves one set.
    """
    prompts = evaluation_prompts(project=project, settings=settings)
    previous, base = policy_opponents(policy=policy, project=project)
    opponents: dict[int, tuple[ModelVersion, list[str]]] = {}
    for version in (previous, base):
        if version is not None and version.pk not in opponents:
            opponents[version.pk] = (version, [])
    new_answers = policy_answers(version=policy, prompts=prompts, settings=settings)
    for pk, (version, _) in list(opponents.items()):
        opponents[pk] = (
            version,
            policy_answers(version=version, prompts=prompts, settings=settings),
        )

    judges = _judges(project=project, settings=settings, prompts=prompts, policy=policy)
    keys = [p.key for p in prompts]
    rows: list[PolicyEvaluation] = []
    for version, old_answers in opponents.values():
        for kind, name, judge_call in judges:
            outcomes, details = judge_call(new_answers, old_answers)
            result = win_rate(outcomes, keys, seed=settings.evaluation["seed"])
            rows.append(
                PolicyEvaluation(
                    policy=policy,
                    opponent=version,
                    judge_kind=kind,
                    judge=name,
                    wins=result.wins,
                    ties=result.ties,
                    losses=result.losses,
                    win_rate=result.win_rate,
                    ci_low=result.ci_low,
                    ci_high=result.ci_high,
                    n_prompts=result.n_prompts,
                    details={
                        **details,
                        "outcomes": outcomes,
                        "prompts": keys,
                        "role": _role(version, previous, base),
                        "convention": result.convention,
                    },
                )
            )

    reference = policy.parent
    kl_reference = _kl_to(policy, reference, prompts, new_answers)
    base_policy = policy_base(project=project)
    kl_base = (
        kl_reference
        if reference is not None and base_policy is not None and base_policy.pk == reference.pk
        else _kl_to(policy, base_policy, prompts, new_answers)
    )
    stats = text_stats(new_answers)
    previous_answers = opponents[previous.pk][1] if previous is not None else None
    previous_length = mean_length(previous_answers) if previous_answers else None
    record = {
        "n_prompts": len(prompts),
        "answers_key": answers_key(prompts, _evaluation_generation(settings)),
        "prompt_source": "demo held-out" if settings.prompt_source == "demo" else "pool eval",
        "settings": settings.evaluation,
        "previous_id": previous.pk if previous is not None else None,
        "base_id": base.pk if base is not None else None,
        "reference_id": reference.pk if reference is not None else None,
        "stats": stats,
        "opponent_stats": {str(pk): text_stats(answers) for pk, (_v, answers) in opponents.items()},
        "opponent_answers": {str(pk): answers for pk, (_v, answers) in opponents.items()},
        "length_ratio_vs_previous": (
            stats["mean_length"] / previous_length
            if previous_length and stats["mean_length"] is not None
            else None
        ),
        "kl_reference": _summary(kl_reference),
        "kl_base": _summary(kl_base),
        "judges": [name for _kind, name, _call in judges],
        "samples": [
            {
                "prompt": p.prompt,
                "answer": a,
                "kl_reference": _nth(kl_reference, i),
                "kl_base": _nth(kl_base, i),
            }
            for i, (p, a) in enumerate(zip(prompts, new_answers, strict=True))
        ],
    }
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=policy.pk)
        PolicyEvaluation.objects.filter(policy=locked).delete()
        PolicyEvaluation.objects.bulk_create(rows)
        locked.eval_results = {**locked.eval_results, "generation": record}
        locked.save(update_fields=["eval_results"])
    policy.eval_results = locked.eval_results
    return record


def _marked(result: tuple[list[str], dict], **marks) -> tuple[list[str], dict]:
    outcomes, details = result
    return outcomes, {**details, **marks}


def _role(version, previous, base) -> str:
    roles = []
    if previous is not None and version.pk == previous.pk:
        roles.append("previous")
    if base is not None and version.pk == base.pk:
        roles.append("base")
    return "+".join(roles)


def _summary(kl: dict) -> dict:
    return {k: v for k, v in kl.items() if k != "per_answer"}


def _nth(kl: dict, i: int) -> float | None:
    values = kl.get("per_answer")
    return values[i] if values else None


def _held_out_judge(*, project: Project, policy: ModelVersion) -> ModelVersion | None:
    """Return the held-out judge reward model the policy's run named, if any."""
    path = (
        (policy.training_run.config or {}).get("judge_reward_model_path")
        if (policy.training_run_id)
        else None
    )
    if not path:
        return None
    return (
        ModelVersion.objects.filter(
            kind=ModelVersion.Kind.REWARD, training_run__project=project, artifact_path=path
        )
        .order_by("-id")
        .first()
    )


def _judges(
    *, project: Project, settings: LoopSettings, prompts: list[EvalPrompt], policy: ModelVersion
) -> list[tuple[str, str, Any]]:
    """Return (kind, name, call(new, old) -> (outcomes, details)) of each judge to ask."""
    from training.loop.mining import reward_models_newest

    judges: list[tuple[str, str, Any]] = []
    prompts_of = prompts
    count = settings.evaluation["reward_models"]
    trained_against = (
        (policy.training_run.config or {}).get("reward_model_path")
        if (policy.training_run_id)
        else None
    )
    reward_models = reward_models_newest(project=project, limit=count) if count else []
    judge = _held_out_judge(project=project, policy=policy)
    if judge is not None and judge.pk not in {rm.pk for rm in reward_models}:
        reward_models.append(judge)  # the iteration's held-out judge is always asked
    for rm in reward_models:
        # A policy optimised against this reward model is judged by it too, but that verdict
        # is biased in the policy's favour (reward over-optimisation, Gao et al. 2023
        # "Scaling Laws for Reward Model Overoptimization"): it is marked so.
        optimised = bool(trained_against) and trained_against == rm.artifact_path
        held_out = judge is not None and rm.pk == judge.pk
        judges.append(
            (
                JudgeKind.REWARD_MODEL,
                f"reward model {rm.pk} ({rm.name})",
                lambda new, old, rm=rm, optimised=optimised, held_out=held_out: _marked(
                    reward_model_outcomes(reward_model=rm, prompts=prompts_of, new=new, old=old),
                    optimised_against=optimised,
                    held_out_judge=held_out,
                ),
            )
        )
    llm_judge = llm_judge_for(project=project, settings=settings)
    if llm_judge is not None:
        judges.append(
            (
                JudgeKind.LLM,
                f"LLM judge {llm_judge.name}",
                lambda new, old: llm_outcomes(
                    judge=llm_judge, prompts=prompts_of, new=new, old=old
                ),
            )
        )
    if settings.prompt_source == "demo":
        judges.append(
            (
                JudgeKind.PROGRAMMATIC,
                "demo true reward",
                lambda new, old: programmatic_outcomes(prompts=prompts_of, new=new, old=old),
            )
        )
    return judges
