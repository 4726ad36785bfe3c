"""Calibrated, frozen rewards: temperature and normalisation stored on the model version and
applied by the scorer; length-bucketed accuracy in the reward-model evaluation."""

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from annotation.errors import Conflict
from annotation.imports import content_hash
from annotation.models import Candidate, Project, Prompt
from training import rm_evaluation
from training.management.commands.simulate import Command as SimulateCommand
from training.models import ModelVersion
from training.scoring import reward_calibration, reward_scores
from training.trainers.reward import Calibration, RewardScorer

ANSWERS = [
    "5.",
    "2 + 3 = 5.",
    "I don't know.",
    "The answer is 5, happy to help!",
    "No idea, sorry.",
    "Five.",
]


def test_calibration_divides_by_the_temperature_then_shifts_and_scales():
    assert Calibration(temperature=2.0).apply([4.0, -1.0]) == [2.0, -0.5]
    assert Calibration(temperature=2.0, shift=1.0, scale=0.5).apply([4.0]) == [2.0]
    with pytest.raises(ValueError):
        Calibration(temperature=0.0)


def test_the_scorer_applies_its_calibration(tiny_reward_dir):
    prompts = ["Q: What is 2 + 3?\nA:"] * 3
    raw = RewardScorer(tiny_reward_dir, device="cpu").score(prompts, ANSWERS[:3])
    scaled = RewardScorer(
        tiny_reward_dir, device="cpu", calibration=Calibration(temperature=4.0, shift=1.0)
    ).score(prompts, ANSWERS[:3])
    assert scaled == pytest.approx([r / 4.0 - 1.0 for r in raw], rel=1e-5)


def test_length_buckets_report_accuracy_per_answer_length():
    # Given short pairs the model orders right and long pairs it orders wrong,
    pairs = [
        {"prompt": f"q{i}", "chosen": "a" * n, "rejected": "b" * n, "soft_label": 1.0}
        for i, n in enumerate((2, 2, 4, 4, 40, 40, 80, 80))
    ]
    chosen = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    rejected = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    buckets = rm_evaluation.length_bucket_accuracy(chosen, rejected, pairs)
    # then each quartile of length says how often the model was right there (ties count 1/2).
    assert [b["n_pairs"] for b in buckets] == [2, 2, 2, 2]
    assert [b["accuracy"] for b in buckets] == [1.0, 0.75, 0.0, 0.5]
    assert buckets[0]["lower"] == 2.0 and buckets[-1]["upper"] == 80.0
    report = rm_evaluation.rm_report(pairs, chosen + 0.01 * np.arange(8), rejected, seed=0)
    assert [b["n_pairs"] for b in report["length_buckets"]] == [2, 2, 2, 2]


@pytest.mark.django_db
def test_saving_an_evaluation_stores_its_temperature_for_the_scorer():
    version = ModelVersion.objects.create(
        name="rm", kind=ModelVersion.Kind.REWARD, artifact_path="/nowhere"
    )
    assert reward_calibration(version.eval_results) is None
    report = {"accuracy": 0.7, "temperature": {"value": 2.5, "fitted_on": "validation half"}}
    rm_evaluation.reward_model_evaluation_save(version=version, report=report)
    version.refresh_from_db()
    assert version.eval_results["rm_metrics"] == report
    assert version.eval_results["calibration"]["temperature"] == 2.5
    assert reward_calibration(version.eval_results) == Calibration(temperature=2.5)


def _reference_answers(project, policy) -> None:
    for q, text in enumerate(ANSWERS):
        question = f"What is {q} + 5?"
        prompt = Prompt.objects.create(
            project=project, text=question, content_hash=content_hash(question)
        )
        Candidate.objects.create(
            prompt=prompt, text=text, content_hash=content_hash(text), policy_version=policy
        )


@pytest.mark.django_db
def test_normalisation_is_measured_on_the_reference_policy_and_frozen(tiny_reward_dir):
    project = Project.objects.create(name="norm")
    policy = ModelVersion.objects.create(name="sft", artifact_path="/sft")
    other = ModelVersion.objects.create(name="other", artifact_path="/other")
    version = ModelVersion.objects.create(
        name="rm",
        kind=ModelVersion.Kind.REWARD,
        artifact_path=str(tiny_reward_dir),
        eval_results={"calibration": {"temperature": 2.0}},
    )
    _reference_answers(project, policy)
    Candidate.objects.create(
        prompt=Prompt.objects.first(),
        text="not the reference",
        content_hash="x",
        policy_version=other,
    )

    call_command(
        "freeze_rm_normalisation", "--model-version", version.pk, "--policy-version", policy.pk
    )

    version.refresh_from_db()
    frozen = version.eval_results["calibration"]["normalisation"]
    assert frozen["n_answers"] == len(ANSWERS) and frozen["policy_version_id"] == policy.pk
    assert frozen["temperature"] == 2.0
    calibration = reward_calibration(version.eval_results)
    calibrated = [
        reward_scores(tiny_reward_dir, c.prompt.text, [c.text], calibration=calibration)[0]
        for c in Candidate.objects.filter(policy_version=policy).order_by("pk")
    ]
    # The reference policy's answers now read as mean 0, std 1.
    assert np.mean(calibrated) == pytest.approx(0.0, abs=1e-5)
    assert np.std(calibrated) == pytest.approx(1.0, rel=1e-4)
    # Frozen means frozen: a second measurement is refused, the first one stays.
    with pytest.raises(Conflict):
        rm_evaluation.reward_model_normalisation_freeze(version=version, policy_version=other)
    with pytest.raises(CommandError, match="policy model version"):
        call_command(
            "freeze_rm_normalisation", "--model-version", version.pk, "--policy-version", version.pk
        )
    version.refresh_from_db()
    assert version.eval_results["calibration"]["normalisation"] == frozen


@pytest.mark.django_db
def test_the_ai_annotator_scores_through_the_frozen_calibration(tiny_reward_dir):
    # Given an untrained reward model whose raw scores differ by far less than the tie margin,
    project = Project.objects.create(name="ai-norm")
    policy = ModelVersion.objects.create(name="sft", artifact_path="/sft")
    version = ModelVersion.objects.create(
        name="rm", kind=ModelVersion.Kind.REWARD, artifact_path=str(tiny_reward_dir)
    )
    _reference_answers(project, policy)
    payload = {
        "prompt": {"text": "What is 0 + 5?", "messages": None},
        "candidates": [{"slot": "A", "text": ANSWERS[0]}, {"slot": "B", "text": ANSWERS[2]}],
    }
    options = {"task_kind": "pairwise", "choices": ["A", "B", "tie"]}
    raw = reward_scores(tiny_reward_dir, "What is 0 + 5?", [ANSWERS[0], ANSWERS[2]])
    margin = abs(raw[0] - raw[1]) * 1.5
    judge = SimulateCommand()._ai_judges([version.pk], margin)[f"ai-rm-{version.pk}"]
    assert judge(payload, options) == {"choice": "tie"}
    # when its normalisation is frozen (std of its rewards well below that difference's scale),
    rm_evaluation.reward_model_normalisation_freeze(version=version, policy_version=policy)
    version.refresh_from_db()
    std = version.eval_results["calibration"]["normalisation"]["std"]
    assert abs(raw[0] - raw[1]) / std > margin
    # then the AI annotator judges on normalised rewards and the tie becomes a decision.
    judge = SimulateCommand()._ai_judges([version.pk], margin)[f"ai-rm-{version.pk}"]
    assert judge(payload, options) == {"choice": "A" if raw[0] > raw[1] else "B"}
