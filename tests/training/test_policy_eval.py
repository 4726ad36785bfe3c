"""The loop's evaluation of a new policy: judges, win rates with CIs, KL and text statistics."""

from __future__ import annotations

import shutil

import pytest

from annotation.models import Prompt
from evaluation.stats.textstats import text_stats
from tests.factories import add_pool_prompts, make_project, make_round
from training.loop.settings import LoopSettings
from training.models import ModelVersion, PolicyEvaluation, TrainingRun
from training.policy_eval import (
    TIE_TOLERANCE,
    EvaluationUnavailable,
    evaluation_prompts,
    policy_answers,
    policy_evaluate,
    reward_model_outcomes,
    sequence_kl,
)
from training.scoring import reward_scores

pytestmark = pytest.mark.django_db

N_EVAL = 6


def _perturbed_copy(source, folder):
    """Return a copy of a policy folder with its output layer changed (a 'trained' policy)."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, folder)
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    torch.manual_seed(7)
    with torch.no_grad():
        # A large shift of the final layer norm moves the next-token distribution far.
        model.transformer.ln_f.bias.add_(3.0 * torch.randn_like(model.transformer.ln_f.bias))
    model.save_pretrained(str(folder))
    return folder


def _project_with_pool(n_train=4, n_eval=N_EVAL):
    project = make_project(rubric="Correct sums win; be brief.")
    add_pool_prompts(project, train=n_train, eval=n_eval)
    return project


def _settings(**evaluation):
    return LoopSettings(
        path="dpo",
        prompt_source="pool",
        generation={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6},
        evaluation={"n_prompts": N_EVAL, "seed": 3, **evaluation},
    )


@pytest.fixture
def lineage(tmp_path, tiny_policy_dir, tiny_reward_dir):
    """A project with a base policy (round 1), a changed child, and a trained reward model."""
    project = _project_with_pool()
    base = ModelVersion.objects.create(
        name="base", artifact_path=str(tiny_policy_dir), project=project
    )
    round_ = make_round(project)
    round_.model_version = base
    round_.save(update_fields=["model_version"])
    child = ModelVersion.objects.create(
        name="child",
        artifact_path=str(_perturbed_copy(tiny_policy_dir, tmp_path / "child")),
        parent=base,
        project=project,
    )
    run = TrainingRun.objects.create(recipe="reward", project=project, status="succeeded")
    reward = ModelVersion.objects.create(
        name="rm", kind="reward", artifact_path=str(tiny_reward_dir), training_run=run
    )
    return project, base, child, reward


def test_reward_model_judge_kl_and_text_statistics_are_stored(lineage):
    project, base, child, reward = lineage
    settings = _settings()

    record = policy_evaluate(policy=child, project=project, settings=settings)

    # Nothing promoted yet: the previous policy is the parent, which is also the base.
    assert record["previous_id"] == base.pk and record["base_id"] == base.pk
    rows = list(PolicyEvaluation.objects.filter(policy=child))
    assert [(r.judge_kind, r.opponent_id) for r in rows] == [("reward_model", base.pk)]
    verdict = rows[0]
    assert verdict.n_prompts == N_EVAL
    assert verdict.wins + verdict.ties + verdict.losses == N_EVAL
    assert verdict.win_rate == pytest.approx((verdict.wins + verdict.ties / 2) / N_EVAL)
    assert verdict.ci_low <= verdict.win_rate <= verdict.ci_high
    assert verdict.details["role"] == "previous+base"

    # Re-score the same answers with the reward model: every per-prompt outcome agrees.
    prompts = evaluation_prompts(project=project, settings=settings)
    assert {p.key for p in prompts} == set(
        Prompt.objects.filter(project=project, split="eval").values_list("content_hash", flat=True)
    )
    new = policy_answers(version=child, prompts=prompts, settings=settings)
    old = policy_answers(version=base, prompts=prompts, settings=settings)
    expected = []
    for p, a, b in zip(prompts, new, old, strict=True):
        score_a, score_b = reward_scores(reward.artifact_path, p.prompt, [a, b])
        if a == b or abs(score_a - score_b) <= TIE_TOLERANCE:
            expected.append("tie")
        else:
            expected.append("win" if score_a > score_b else "loss")
    assert verdict.details["outcomes"] == expected

    # The child moved away from its parent: KL > 0, measured on its own answers.
    generation = child.eval_results["generation"]
    assert generation["kl_reference"]["available"] is True
    assert generation["kl_reference"]["value"] > 0
    assert generation["kl_base"]["value"] == pytest.approx(generation["kl_reference"]["value"])
    assert generation["stats"] == text_stats(new)
    assert generation["opponent_stats"][str(base.pk)] == text_stats(old)
    assert [s["answer"] for s in generation["samples"]] == new

    # Evaluated again: one set of rows, not two.
    policy_evaluate(policy=child, project=project, settings=settings)
    assert PolicyEvaluation.objects.filter(policy=child).count() == 1


def test_answers_an_earlier_evaluation_stored_are_read_back_for_the_same_prompts_and_sampling(
    lineage,
):
    project, base, child, _reward = lineage
    settings = _settings()
    policy_evaluate(policy=child, project=project, settings=settings)
    prompts = evaluation_prompts(project=project, settings=settings)

    # Mark what the evaluation stored: the child's own answers and the base's as an opponent.
    child.refresh_from_db()
    record = child.eval_results["generation"]
    record["opponent_answers"][str(base.pk)] = [f"base-{i}" for i in range(N_EVAL)]
    for i, sample in enumerate(record["samples"]):
        sample["answer"] = f"child-{i}"
    child.save(update_fields=["eval_results"])

    assert policy_answers(version=base, prompts=prompts, settings=settings) == [
        f"base-{i}" for i in range(N_EVAL)
    ]
    assert policy_answers(version=child, prompts=prompts, settings=settings) == [
        f"child-{i}" for i in range(N_EVAL)
    ]
    # Other sampling settings or other prompts: sampled, not read back.
    reseeded = _settings(seed=4)
    assert not any(
        a.startswith("base-")
        for a in policy_answers(version=base, prompts=prompts, settings=reseeded)
    )
    fewer = policy_answers(version=base, prompts=prompts[:-1], settings=settings)
    assert len(fewer) == N_EVAL - 1 and not any(a.startswith("base-") for a in fewer)


def test_a_reward_model_judge_calls_the_same_answer_a_tie_wherever_it_sits_in_a_batch(lineage):
    # given answers of a policy to the evaluation prompts, and the same answers again
    project, _base, child, reward = lineage
    settings = _settings()
    prompts = evaluation_prompts(project=project, settings=settings)
    answers = policy_answers(version=child, prompts=prompts, settings=settings)

    # when a reward model judges them against themselves
    outcomes, details = reward_model_outcomes(
        reward_model=reward, prompts=prompts, new=answers, old=list(answers)
    )

    # then every prompt is a tie, whatever float32 noise their scores carry
    assert outcomes == ["tie"] * N_EVAL
    assert all(abs(m) <= 1e-3 for m in details["margins"])


def test_kl_of_a_policy_against_itself_is_zero(lineage):
    project, base, child, _reward = lineage
    settings = _settings()
    prompts = evaluation_prompts(project=project, settings=settings)
    answers = policy_answers(version=child, prompts=prompts, settings=settings)
    same = sequence_kl(
        policy_path=child.artifact_path,
        reference_path=child.artifact_path,
        prompts=prompts,
        answers=answers,
    )
    assert same["value"] == 0.0 and same["per_answer"] == [0.0] * N_EVAL
    changed = sequence_kl(
        policy_path=child.artifact_path,
        reference_path=base.artifact_path,
        prompts=prompts,
        answers=answers,
    )
    assert changed["value"] > 0


def test_an_empty_evaluation_split_is_refused_by_name():
    project = _project_with_pool(n_eval=0)
    with pytest.raises(EvaluationUnavailable, match="no evaluation prompts"):
        evaluation_prompts(project=project, settings=_settings())


def test_evaluation_settings_refuse_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown evaluation setting"):
        _settings(judges=3)
    with pytest.raises(ValueError, match="n_prompts"):
        _settings(n_prompts=0)
    with pytest.raises(ValueError, match="llm_judge"):
        _settings(llm_judge={"url": "http://evil"})


def test_llm_judge_through_the_real_served_endpoint(settings, served_policy, lineage):
    project, base, child, _reward = lineage
    base_url, model = served_policy
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        "judge": {"base_url": base_url, "models": [model], "timeout_seconds": 120}
    }
    loop_settings = _settings(
        reward_models=0, llm_judge={"endpoint": "judge", "model": model, "max_new_tokens": 4}
    )

    policy_evaluate(policy=child, project=project, settings=loop_settings)

    verdict = PolicyEvaluation.objects.get(policy=child)
    assert verdict.judge_kind == "llm" and verdict.opponent_id == base.pk
    assert verdict.wins + verdict.ties + verdict.losses == N_EVAL
    details = verdict.details
    assert details["judge"]["rubric"] == project.rubric
    assert details["agreed"] + details["disagreed"] + details["unparseable"] == N_EVAL
    # Every prompt was asked in both orders; orders that disagree (or say nothing) are ties.
    for outcome, exchange in zip(details["outcomes"], details["verdicts"], strict=True):
        assert [e["order"] for e in exchange["exchanges"]] == ["original", "swapped"]
        assert (
            project.rubric in exchange["exchanges"][0]["request"]["body"]["messages"][0]["content"]
        )
        if exchange["outcome"] != "agreed":
            assert outcome == "tie"


def test_human_evaluation_round_labels_are_never_exported(settings, tmp_path):
    from annotation.exports import dataset_version_export, dataset_version_load
    from annotation.models import Judgment, Round
    from tests.factories import make_items, make_user

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project()
    train_round = make_round(project)
    eval_round = make_round(project)
    eval_round.purpose = Round.Purpose.EVAL
    eval_round.save(update_fields=["purpose"])
    (train_item,) = make_items(project, 1, round_=train_round)
    (eval_item,) = make_items(project, 1, round_=eval_round)
    user = make_user()
    for item in (train_item, eval_item):
        Judgment.objects.create(project=project, item=item, annotator=user, choice="A")

    version = dataset_version_export(
        project=project, policy={"hf": False, "split": {"train": 1.0}, "rounds": [1, 2]}
    )

    rows = dataset_version_load(dataset_version=version)["train"]
    assert [r["prompt"] for r in rows] == [train_item.prompt.text]


def test_evaluation_prompts_never_reach_a_training_round(lineage):
    from training.loop.mining import prompts_select

    project, *_ = lineage
    settings = _settings()
    settings.n_prompts = 50
    chosen = prompts_select(project=project, settings=settings, reward_models=[])
    texts = [p if isinstance(p, str) else p[-1]["content"] for p in chosen]
    eval_texts = set(
        Prompt.objects.filter(project=project, split="eval").values_list("text", flat=True)
    )
    assert texts and not eval_texts & set(texts)
    assert {p.prompt for p in evaluation_prompts(project=project, settings=settings)} <= eval_texts


def test_a_human_evaluation_round_is_served_and_its_labels_become_a_judge(lineage):
    from annotation.models import Judgment, Round
    from tests.factories import make_user
    from training.human_eval import human_eval_round_request, human_eval_verdicts
    from training.loop import loop_advance

    project, base, child, _reward = lineage
    settings = _settings()
    job, reason = human_eval_round_request(
        policy=child, project=project, settings=settings, sync=True
    )
    assert reason == "" and job.status == "succeeded", job.error
    round_ = job.round
    assert round_.purpose == Round.Purpose.EVAL and round_.status == Round.Status.OPEN
    items = list(round_.items.select_related("prompt").prefetch_related("slots__candidate"))
    assert items and {i.prompt.split for i in items} == {"eval"}
    for item in items:
        assert {s.candidate.model_name for s in item.slots.all()} == {child.name, base.name}

    # Label: the child's answer wins on the first items, the base's on one, a tie on one.
    annotator = make_user()
    expected = []
    for n, item in enumerate(items):
        child_slot = next(s for s in item.slots.all() if s.candidate.model_name == child.name)
        child_letter = "AB"[child_slot.position]
        base_letter = "AB"[1 - child_slot.position]
        choice, outcome = [(child_letter, "win"), (base_letter, "loss"), ("tie", "tie")][n % 3]
        Judgment.objects.create(project=project, item=item, annotator=annotator, choice=choice)
        expected.append(outcome)

    (verdict,) = human_eval_verdicts(project=project)
    assert verdict.judge_kind == "human" and verdict.policy == child
    assert verdict.opponent == base
    assert (verdict.wins, verdict.losses, verdict.ties) == (
        expected.count("win"),
        expected.count("loss"),
        expected.count("tie"),
    )
    assert verdict.ci_low <= verdict.win_rate <= verdict.ci_high
    assert human_eval_verdicts(project=project) == []  # nothing new: not rewritten

    # The loop still learns from round 1, not from the evaluation round.
    state = loop_advance(project=project, settings=settings)
    assert state.key.endswith("-r1")


def test_a_policy_behind_an_endpoint_is_evaluated_with_kl_reported_not_available(
    settings, served_policy, lineage
):
    from training.generation.endpoints import model_version_endpoint_create

    project, base, _child, _reward = lineage
    base_url, model = served_policy
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        "served": {"base_url": base_url, "models": [model], "timeout_seconds": 120}
    }
    hosted = model_version_endpoint_create(
        name="hosted", endpoint="served", model=model, project=project
    )
    hosted.parent = base
    hosted.save(update_fields=["parent"])

    record = policy_evaluate(policy=hosted, project=project, settings=_settings())

    assert record["kl_reference"]["available"] is False
    assert "log-probabilities" in record["kl_reference"]["reason"]
    assert record["stats"]["n_answers"] == N_EVAL
    verdict = PolicyEvaluation.objects.get(policy=hosted)
    assert verdict.judge_kind == "reward_model" and verdict.opponent == base
    assert verdict.wins + verdict.ties + verdict.losses == N_EVAL


@pytest.mark.django_db(transaction=True)
def test_outside_sync_a_gpu_worker_evaluates_the_policy_and_a_failure_is_queued_again(
    lineage, tmp_path
):
    import time

    import redis
    from django.conf import settings as django_settings

    from tests.celery_worker import Worker
    from training.loop.evaluate_steps import evaluate_step
    from training.loop.steps import LoopState
    from training.policy_eval import policy_evaluated

    project, base, child, _reward = lineage
    settings = _settings()
    redis.Redis.from_url(django_settings.CELERY_BROKER_URL).flushdb()

    # given no gpu worker yet: the tick queues the evaluation once, then only waits
    state = LoopState(key="evaluate-queue")
    assert evaluate_step(project, child, settings, state, False) is None
    assert evaluate_step(project, child, settings, state, False) is None
    assert [(s.name, s.status) for s in state.steps] == [
        ("evaluate", "started"),
        ("evaluate", "waiting"),
    ]
    assert not policy_evaluated(child)

    # when a gpu worker comes up, it evaluates the policy and the next tick goes on
    worker = Worker(
        queue="gpu",
        broker_url=django_settings.CELERY_BROKER_URL,
        log_path=tmp_path / "worker.log",
        name="evaluate",
    )
    try:
        deadline = time.monotonic() + 900
        while not policy_evaluated(ModelVersion.objects.get(pk=child.pk)):
            assert time.monotonic() < deadline, worker.text()[-3000:]
            assert worker.process.poll() is None, worker.text()[-3000:]
            time.sleep(1)
        child.refresh_from_db()
        assert "evaluation_task" not in child.eval_results
        assert PolicyEvaluation.objects.filter(policy=child, judge_kind="reward_model").exists()
        state = LoopState(key="evaluate-done")
        assert evaluate_step(project, child, settings, state, False) == ""
        assert state.steps[-1].status == "done"

        # a policy whose evaluation fails: the error reaches the next tick, which queues it again
        Prompt.objects.filter(project=project).update(split="train")
        other = ModelVersion.objects.create(
            name="other", artifact_path=child.artifact_path, parent=base, project=project
        )
        state = LoopState(key="evaluate-fails")
        assert evaluate_step(project, other, settings, state, False) is None
        deadline = time.monotonic() + 600
        while "error" not in (
            ModelVersion.objects.get(pk=other.pk).eval_results.get("evaluation_task") or {}
        ):
            assert time.monotonic() < deadline, worker.text()[-3000:]
            time.sleep(1)
        error = evaluate_step(project, other, settings, state, False)
        assert error and "no evaluation prompts" in error
        assert state.steps[-1].status == "failed" and "queued again" in state.steps[-1].detail
        assert not policy_evaluated(ModelVersion.objects.get(pk=other.pk))
    finally:
        worker.stop()
