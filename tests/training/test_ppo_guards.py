"""PPO guards against reward hacking, each on a real tiny PPO run or a hand-computed value.

Frozen reward calibration, PPO-ptx, the ensemble reward with an uncertainty penalty, the KL
budget and early stopping on a held-out judge (``training.trainers.ppo_guards``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.training.conftest import arithmetic_rows, label_first_round, read_metrics
from training.trainers import ppo
from training.trainers import ppo_core as core
from training.trainers.common import ConfigError
from training.trainers.ppo_models import EnsembleReward, ModelReward
from training.trainers.reward import Calibration

RUN = {
    "reward_function": "training.demo:true_reward",
    "prompt_format": "auto",
    "rollout_batch_size": 8,
    "per_device_train_batch_size": 4,
    "per_device_eval_batch_size": 8,
    "max_new_tokens": 6,
    "max_length": 48,
    "learning_rate": 3e-3,
    "num_ppo_epochs": 2,
    "num_sample_prompts": 0,
    "save_steps": 1,
    "save_total_limit": None,
    "logging_steps": 1,
    "evaluate_at_end": False,
    "seed": 11,
}


@pytest.fixture(scope="module")
def second_reward_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Return a second tiny reward model (another seed): an ensemble member or a judge."""
    from training.trainers.tiny import build_tiny_reward_model

    out = tmp_path_factory.mktemp("reward_model_b")
    return build_tiny_reward_model(tiny_tokenizer, out, n_layer=2, n_embd=64, n_head=2, seed=5)


@pytest.fixture
def preference_snapshot(make_snapshot):
    rows = arithmetic_rows(24, seed=3, conversational=True)
    return make_snapshot(train=rows[:16], validation=rows[16:])


def run_ppo(policy_dir: Path, snapshot: Path, out: Path, **overrides) -> dict:
    config = ppo.Config(model_name_or_path=str(policy_dir), **{**RUN, **overrides})
    config.validate()
    return ppo.train(config, snapshot, out)


def state(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder)).state_dict()


def same_weights(a: Path, b: Path) -> bool:
    left, right = state(a), state(b)
    return all(torch.equal(left[k], right[k]) for k in left)


def run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


# --------------------------------------------------------------------------- hand-computed


def test_uncertainty_penalty_is_mean_minus_k_population_std():
    # members x sequences: sequence 0 members disagree (1 and 3), sequence 1 agree (2 and 2)
    members = torch.tensor([[1.0, 2.0], [3.0, 2.0]])
    reward, mean, std = core.uncertainty_penalized(members, 0.5)
    assert mean.tolist() == [2.0, 2.0]
    assert std.tolist() == [1.0, 0.0]
    assert reward.tolist() == [1.5, 2.0]


def test_sft_loss_of_uniform_logits_is_log_vocabulary_over_masked_tokens():
    logits = torch.zeros(2, 3, 10)
    logits[0, 0, 4] = 100.0  # a masked position that would be near-free if it counted
    labels = torch.tensor([[4, 1, 2], [3, 3, 3]])
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    assert core.sft_loss(logits, labels, mask).item() == pytest.approx(math.log(10))


@pytest.mark.parametrize(
    "overrides",
    [
        {"reward_calibration": {"temperature": 2.0, "mean": 0.1}},  # no std
        {"reward_calibration": {"temperature": 0.0, "mean": 0.1, "std": 1.0}},
        {"reward_calibration": {"temperature": 1.0, "mean": 0.1, "std": 1.0, "path": "/x"}},
        {"ptx_coef": -1.0},
        {"uncertainty_coef": 1.0},  # a reward function has no ensemble
        {"kl_budget": 0.0},
        {"judge_every": 0},
        {"reward_function": "", "reward_model_paths": ["a"], "reward_model_path": "b"},
    ],
)
def test_guard_settings_that_cannot_work_are_refused(tiny_policy_dir, overrides):
    config = ppo.Config(model_name_or_path=str(tiny_policy_dir), **{**RUN, **overrides})
    with pytest.raises(ConfigError):
        config.validate()


def test_a_frozen_calibration_excludes_normalising_on_the_fly_and_a_judge_must_be_held_out(
    tiny_policy_dir, tiny_reward_dir
):
    base = {**RUN, "reward_function": "", "reward_model_path": str(tiny_reward_dir)}
    calibration = {"temperature": 2.0, "mean": 0.1, "std": 0.5}
    with pytest.raises(ConfigError, match="normalize_score"):
        ppo.Config(
            model_name_or_path=str(tiny_policy_dir),
            **base,
            reward_calibration=calibration,
            normalize_score=True,
        ).validate()
    with pytest.raises(ConfigError, match="judge_reward_model_path"):
        ppo.Config(
            model_name_or_path=str(tiny_policy_dir),
            **base,
            judge_reward_model_path=str(tiny_reward_dir),
        ).validate()


# --------------------------------------------------------------------------- real tiny runs


def test_ppo_scores_with_the_frozen_calibration_and_records_it(
    tiny_policy_dir, tiny_reward_dir, preference_snapshot, tmp_path
):
    # given a reward model version's frozen calibration (temperature, mean and std)
    calibration = {"temperature": 2.0, "mean": 0.25, "std": 0.5, "model_version_id": 42}
    out = tmp_path / "run"
    run_ppo(
        tiny_policy_dir,
        preference_snapshot,
        out,
        reward_function="",
        reward_model_path=str(tiny_reward_dir),
        reward_calibration=calibration,
        max_steps=1,
        num_sample_prompts=2,
    )
    # then the run recorded which normalisation it used
    assert run_json(out)["reward_normalisation"] == {"kind": "frozen", **calibration}
    # and the logged sample scores are (raw / T - mean) / std of the raw reward model's score
    samples = [json.loads(line) for line in (out / ppo.SAMPLES_FILE).read_text().splitlines()]
    raw = ModelReward(tiny_reward_dir)(
        [s["prompt"] for s in samples], [s["response"] for s in samples]
    )
    expected = [(r / 2.0 - 0.25) / 0.5 for r in raw.tolist()]
    assert [s["score"] for s in samples] == pytest.approx(expected, rel=1e-4)
    # and a run normalising on the fly says so instead
    other = tmp_path / "running"
    run_ppo(tiny_policy_dir, preference_snapshot, other, max_steps=1, normalize_score=True)
    assert run_json(other)["reward_normalisation"]["kind"] == "running"


def test_calibrated_scorer_matches_the_calibration_formula(tiny_reward_dir):
    prompts = [[{"role": "user", "content": "What is 2 + 3?"}]] * 3
    answers = ["2 + 3 = 5.", "No idea.", "5"]
    raw = ModelReward(tiny_reward_dir)(prompts, answers)
    calibrated = ModelReward(tiny_reward_dir, calibration=Calibration(4.0, 0.5, 2.0))
    assert calibrated(prompts, answers).tolist() == pytest.approx(
        [(r / 4.0 - 0.5) / 2.0 for r in raw.tolist()], rel=1e-5
    )


def test_a_critic_warm_started_from_the_reward_model_predicts_calibrated_rewards(
    tiny_reward_dir, tiny_tokenizer
):
    from transformers import AutoModelForSequenceClassification

    from training.trainers.ppo_models import value_from_reward_model

    ids = torch.tensor([tiny_tokenizer("What is 2 + 3? 2 + 3 = 5.")["input_ids"]])
    mask = torch.ones_like(ids)
    rm = AutoModelForSequenceClassification.from_pretrained(str(tiny_reward_dir)).eval()
    with torch.no_grad():
        raw = float(rm(input_ids=ids, attention_mask=mask).logits[0, 0])
        plain = value_from_reward_model(tiny_reward_dir).eval()
        calibrated = value_from_reward_model(tiny_reward_dir, Calibration(2.0, 0.3, 0.5)).eval()
        # the value at the last token is the reward model's score of the whole sequence
        assert float(plain(ids, mask)[0, -1]) == pytest.approx(raw, abs=1e-5)
        assert float(calibrated(ids, mask)[0, -1]) == pytest.approx(
            (raw / 2.0 - 0.3) / 0.5, abs=1e-5
        )


def test_ppo_ptx_mixes_the_chosen_answers_sft_loss_into_the_policy_loss(
    tiny_policy_dir, preference_snapshot, tmp_path
):
    # given the same run with and without PPO-ptx
    plain, mixed = tmp_path / "plain", tmp_path / "ptx"
    run_ppo(tiny_policy_dir, preference_snapshot, plain, max_steps=3)
    run_ppo(tiny_policy_dir, preference_snapshot, mixed, max_steps=3, ptx_coef=1.0)

    # then the ptx run logged its SFT loss on every update
    logged = [m["ppo/ptx_loss"] for m in read_metrics(mixed) if "ppo/ptx_loss" in m]
    assert len(logged) == 3 and all(value > 0 for value in logged)
    assert not any("ppo/ptx_loss" in m for m in read_metrics(plain))

    # and its policy gives the export's chosen answers a lower NLL than the plain one does
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.trainers.data import load_sft
    from training.trainers.ppo_guards import ptx_examples

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    rows = list(load_sft(preference_snapshot).train)
    examples = ptx_examples(tokenizer, rows, "auto", 48)
    assert len(examples) == 16

    def nll(folder: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(str(folder / "final")).eval()
        total = 0.0
        with torch.no_grad():
            for ids, mask in examples:
                logits = model(input_ids=torch.tensor([ids])).logits
                total += float(
                    core.sft_loss(logits[:, :-1], torch.tensor([ids[1:]]), torch.tensor([mask[1:]]))
                )
        return total / len(examples)

    assert nll(mixed) < nll(plain) - 0.05


def test_ptx_needs_demonstrations(tiny_policy_dir, make_snapshot, tmp_path):
    prompts_only = make_snapshot(train=[{"prompt": "What is 1 + 2?"}] * 4)
    with pytest.raises(ConfigError, match="ptx_coef needs demonstrations"):
        run_ppo(tiny_policy_dir, prompts_only, tmp_path / "run", max_steps=1, ptx_coef=1.0)


def test_ensemble_reward_is_mean_minus_k_std_of_the_members_and_is_logged(
    tiny_policy_dir, tiny_reward_dir, second_reward_dir, preference_snapshot, tmp_path
):
    # given two reward models as one ensemble with k = 2
    paths = [str(tiny_reward_dir), str(second_reward_dir)]
    prompts = [[{"role": "user", "content": "What is 4 + 4?"}]] * 2
    answers = ["4 + 4 = 8.", "Maybe later."]
    a = ModelReward(tiny_reward_dir)(prompts, answers)
    b = ModelReward(second_reward_dir)(prompts, answers)
    members = EnsembleReward(paths).member_scores(prompts, answers)
    assert torch.allclose(members, torch.stack([a, b]))

    out = tmp_path / "run"
    run_ppo(
        tiny_policy_dir,
        preference_snapshot,
        out,
        reward_function="",
        reward_model_paths=paths,
        uncertainty_coef=2.0,
        max_steps=2,
    )
    # then every update logged the ensemble's mean and std, and the score it trained on is
    # mean - 2 std (per sequence, so also on the batch means)
    logged = [m for m in read_metrics(out) if "reward/ensemble_std" in m]
    assert len(logged) == 2
    for metrics in logged:
        assert metrics["reward/ensemble_std"] > 0
        assert metrics["score/raw_mean"] == pytest.approx(
            metrics["reward/ensemble_mean"] - 2.0 * metrics["reward/ensemble_std"], abs=1e-5
        )


def test_kl_budget_stops_training_and_keeps_the_last_policy_under_budget(
    tiny_policy_dir, preference_snapshot, tmp_path
):
    # given a run without a budget, whose rollouts measure the KL at each update boundary
    free = tmp_path / "free"
    run_ppo(tiny_policy_dir, preference_snapshot, free, max_steps=6, learning_rate=1e-2)
    kls = [m["kl/seq_mean"] for m in read_metrics(free) if "kl/seq_mean" in m]
    assert len(kls) == 6 and kls[0] == pytest.approx(0.0, abs=1e-5)  # boundary 0 is the base
    # a budget between the largest KL before some boundary u >= 2 and the KL at u
    u = max(range(2, 6), key=lambda i: kls[i] - max(kls[:i]))
    assert kls[u] > max(kls[:u]), kls
    budget = (kls[u] + max(kls[:u])) / 2

    # when the same run trains under that budget
    guarded = tmp_path / "guarded"
    metrics = run_ppo(
        tiny_policy_dir,
        preference_snapshot,
        guarded,
        max_steps=6,
        learning_rate=1e-2,
        kl_budget=budget,
    )
    # then it stopped at boundary u and kept the policy of boundary u - 1 as final
    guards = run_json(guarded)["guards"]
    assert guards["stop_reason"].startswith("kl_budget")
    assert metrics["updates"] == u and guards["final_update"] == u - 1
    assert same_weights(guarded / "final", free / f"checkpoint-{u - 1}")
    assert not same_weights(guarded / "final", free / f"checkpoint-{u}")


def test_held_out_judge_keeps_the_best_judged_policy_and_stops_with_patience(
    tiny_policy_dir, second_reward_dir, preference_snapshot, tmp_path
):
    # given a judge reward model not used for training, scoring every update
    out = tmp_path / "judged"
    metrics = run_ppo(
        tiny_policy_dir,
        preference_snapshot,
        out,
        max_steps=5,
        learning_rate=1e-2,
        judge_reward_model_path=str(second_reward_dir),
        judge_every=1,
    )
    logged = [
        (m["step"], m["judge/score_mean"]) for m in read_metrics(out) if "judge/score_mean" in m
    ]
    # then it judged the base and every update (the key the judge_falling alarm reads)
    assert [step for step, _ in logged] == list(range(6))
    best_step, best_score = max(logged, key=lambda item: (item[1], -item[0]))
    guards = run_json(out)["guards"]
    assert guards["final_update"] == best_step and metrics["final_update"] == best_step
    assert metrics["judge_best_score"] == pytest.approx(best_score)
    # and final/ is the best-judged policy: its greedy answers get the best score again
    reference = tiny_policy_dir if best_step == 0 else out / f"checkpoint-{best_step}"
    assert same_weights(out / "final", reference)

    # when patience is 1, the run stops at the first score that is not a new best
    patient = tmp_path / "patient"
    run_ppo(
        tiny_policy_dir,
        preference_snapshot,
        patient,
        max_steps=5,
        learning_rate=1e-2,
        judge_reward_model_path=str(second_reward_dir),
        judge_every=1,
        judge_patience=1,
    )
    scores = [score for _, score in logged]
    first_miss = next((i for i in range(1, len(scores)) if scores[i] <= max(scores[:i])), None)
    stopped = run_json(patient)["guards"]
    if first_miss is None:
        assert not stopped["stop_reason"]
    else:
        assert stopped["stop_reason"].startswith("judge_patience")
        assert [s for _, s in stopped["judge_scores"]] == pytest.approx(scores[: first_miss + 1])


def test_a_judge_needs_held_out_prompts(
    tiny_policy_dir, second_reward_dir, make_snapshot, tmp_path
):
    train_only = make_snapshot(train=arithmetic_rows(8, conversational=True))
    with pytest.raises(ConfigError, match="validation split"):
        run_ppo(
            tiny_policy_dir,
            train_only,
            tmp_path / "run",
            max_steps=1,
            judge_reward_model_path=str(second_reward_dir),
        )


# --------------------------------------------------------------------------- the loop


@pytest.mark.django_db
def test_the_loop_gives_ppo_the_reward_models_frozen_calibration_and_the_gates_kl_budget(
    settings, tmp_path, tiny_policy_dir
):
    from tests.factories import add_pool_prompts, make_project
    from training.loop import loop_advance
    from training.loop.settings import LoopSettings
    from training.models import ModelVersion, TrainingRun

    # given a project whose loop learns by reward model then PPO, with a gate budget of 15 nats
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project(overlap=1)
    add_pool_prompts(project, train=40, eval=4)
    base = ModelVersion.objects.create(
        name=f"tiny-base-guards-{project.pk}", artifact_path=str(tiny_policy_dir), project=project
    )
    loop_settings = LoopSettings(
        path="rm_ppo",
        n_prompts=40,
        generation={"temperature": 1.0, "max_new_tokens": 6},
        reward={"max_steps": 2, "per_device_train_batch_size": 4, "save_steps": 2},
        ppo={"max_steps": 1, "rollout_batch_size": 4, "per_device_train_batch_size": 4},
        evaluation={"n_prompts": 4},
        gate={"kl_budget": 15.0, "min_rm_accuracy": 0.0},
    )
    label_first_round(project, base, loop_settings)

    # when one iteration runs
    state = loop_advance(project=project, settings=loop_settings, sync=True)

    # then PPO trained on the reward model's frozen calibration and under the gate's budget
    assert {s.name: s.status for s in state.steps}["ppo"] == "done", state.steps
    run = TrainingRun.objects.get(project=project, recipe="ppo")
    reward = ModelVersion.objects.get(artifact_path=run.config["reward_model_path"])
    frozen = reward.eval_results["calibration"]["normalisation"]
    assert run.config["kl_budget"] == 15.0
    expected = {
        "temperature": frozen["temperature"],
        "mean": frozen["mean"],
        "std": frozen["std"],
        "model_version_id": reward.pk,
    }
    assert run.config["reward_calibration"] == expected
    recorded = json.loads((Path(run.output_dir) / "run.json").read_text())
    assert recorded["reward_normalisation"] == {"kind": "frozen", **expected}
    assert recorded["guards"]["last_kl"] is not None  # the budget was checked


# --------------------------------------------------------------------------- who names what

_security = pytest.importorskip("tests.training.test_security")
training_settings = _security.training_settings
reward_snapshot = _security.reward_snapshot
world = _security.world
sent = _security.sent


def _guarded_ppo(world, **config) -> dict:
    return _security._ppo(world, **config)


@pytest.mark.django_db
def test_a_researcher_names_the_ensemble_and_the_judge_by_ids_of_the_project(world, sent):
    import os

    # when a researcher of project A names two reward models and a judge by id
    second = _security._finished_run(
        world["a"], world["root"], Path(world["reward_a"].artifact_path), "reward"
    )
    response = _security._client(world["researcher"]).post(
        _security.RUNS,
        _guarded_ppo(
            world,
            reward_model_ids=[world["reward_a"].pk, second.pk],
            judge_reward_model_id=world["policy_a"].pk,
            uncertainty_coef=1.0,
        ),
        format="json",
    )
    # then the ids became the checked folders the trainer reads
    assert response.status_code == 201, response.content
    from training.models import TrainingRun

    config = TrainingRun.objects.get(pk=response.json()["id"]).config
    assert config["reward_model_paths"] == [
        os.path.realpath(world["reward_a"].artifact_path),
        os.path.realpath(second.artifact_path),
    ]
    assert config["judge_reward_model_path"] == os.path.realpath(world["policy_a"].artifact_path)
    assert "reward_model_ids" not in config and "judge_reward_model_id" not in config


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("who", "config", "field", "status"),
    [
        # paths are for staff
        ("researcher", {"reward_model_paths": ["reward_a"]}, "config.reward_model_paths", 400),
        (
            "researcher",
            {"judge_reward_model_path": "reward_a"},
            "config.judge_reward_model_path",
            400,
        ),
        # another project's ids: unseen (404) or seen but not of this project (400)
        ("researcher", {"reward_model_ids": ["reward_b"]}, "config.reward_model_ids[0]", 404),
        (
            "both",
            {"reward_model_ids": ["reward_a", "reward_b"]},
            "config.reward_model_ids[1]",
            400,
        ),
        ("both", {"judge_reward_model_id": "reward_b"}, "config.judge_reward_model_id", 400),
        # not a list of ids
        ("researcher", {"reward_model_ids": "reward_a"}, "config.reward_model_ids", 400),
    ],
)
def test_guard_models_of_another_project_or_by_path_are_refused(
    world, sent, who, config, field, status
):
    def value(name):
        model = world[name]
        return model.artifact_path if "path" in field else model.pk

    resolved = {}
    for key, names in config.items():
        if isinstance(names, list):
            resolved[key] = [value(name) for name in names]
        else:
            resolved[key] = value(names) if key != "reward_model_ids" else names
    payload = _guarded_ppo(world, **resolved)
    response = _security._client(world[who]).post(_security.RUNS, payload, format="json")
    _security._refused(world, sent, response, field, status)
