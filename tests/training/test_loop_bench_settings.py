"""The loop benchmark's guard settings and the demo's deliberately hackable labelling.

``benchmarks/loop_bench.py --guards off`` must switch every reward-hacking guard off in the
runs the loop really starts, and ``on`` must leave the loop's defaults; ``--hackable`` labels
with annotators that prefer a polite opener whatever the answer's number.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from annotation.simulation import PRESETS, decide
from benchmarks.loop_bench import GUARD_SETTINGS
from tests.training.conftest import label_first_round
from training import demo

TINY = {
    "reward": {"max_steps": 2, "per_device_train_batch_size": 4, "save_steps": 2},
    "ppo": {"max_steps": 1, "rollout_batch_size": 4, "per_device_train_batch_size": 4},
    "gate": {"min_rm_accuracy": 0.0},
}


def loop_settings_for(guards: str):
    """Return tiny rm_ppo loop settings with the benchmark's overrides for ``guards``."""
    from training.loop.settings import LoopSettings

    overrides = GUARD_SETTINGS[guards]
    return LoopSettings.from_dict(
        {
            "path": "rm_ppo",
            "n_prompts": 40,
            "generation": {"temperature": 1.0, "max_new_tokens": 6},
            "evaluation": {"n_prompts": 4},
            **{key: {**TINY[key], **overrides.get(key, {})} for key in TINY},
            **{key: value for key, value in overrides.items() if key not in TINY},
        }
    )


def test_guards_on_is_the_loops_defaults():
    assert GUARD_SETTINGS["on"] == {}


@pytest.mark.django_db
@pytest.mark.parametrize("guards", ["on", "off"])
def test_the_guard_settings_reach_the_runs_the_loop_starts(
    guards, settings, tmp_path, tiny_policy_dir
):
    from tests.factories import add_pool_prompts, make_project
    from training import alarms
    from training.loop import loop_advance
    from training.loop.settings import GATE_DEFAULTS, PPO_DEFAULTS, REWARD_DEFAULTS
    from training.models import ModelVersion, TrainingRun

    # given an rm_ppo project with a labelled round and the benchmark's settings for `guards`
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project(overlap=1)
    add_pool_prompts(project, train=40, eval=4)
    base = ModelVersion.objects.create(
        name=f"tiny-base-bench-{guards}", artifact_path=str(tiny_policy_dir), project=project
    )
    loop_settings = loop_settings_for(guards)
    label_first_round(project, base, loop_settings)

    # when one iteration runs
    state = loop_advance(project=project, settings=loop_settings, sync=True)

    # then the reward model and PPO runs carry the guards as set
    assert {s.name: s.status for s in state.steps}["ppo"] == "done", state.steps
    reward_runs = {
        r.config.get("train_on", "train"): r
        for r in TrainingRun.objects.filter(project=project, recipe="reward")
    }
    reward_run = reward_runs["train"]
    run = TrainingRun.objects.get(project=project, recipe="ppo")
    recorded = json.loads((Path(run.output_dir) / "run.json").read_text())
    reward = ModelVersion.objects.get(training_run=reward_run)
    assert run.config["reward_model_path"] == reward.artifact_path
    assert reward.eval_results["calibration"]["normalisation"]  # frozen either way
    ensemble = 1 if guards == "off" else REWARD_DEFAULTS.get("ensemble_size", 1)
    assert reward_run.config.get("ensemble_size", 1) == ensemble
    assert run.config.get("ptx_coef", 0.0) == (0.0 if guards == "off" else PPO_DEFAULTS["ptx_coef"])
    if guards == "on":
        # a judge learnt from the held-out labels, PPO early-stops on it, the gate counts it
        judge = ModelVersion.objects.get(training_run=reward_runs["held_out"])
        assert run.config["judge_reward_model_path"] == judge.artifact_path
        assert recorded["guards"]["judge_scores"][0][0] == 0
        policy = ModelVersion.objects.get(training_run=run)
        criterion = policy.gate["criteria"][f"not_worse[reward model {judge.pk} ({judge.name})]"]
        assert criterion["passed"] is not None  # counted, unlike the trained-against model's
        assert run.config["reward_calibration"]["model_version_id"] == reward.pk
        assert recorded["reward_normalisation"]["kind"] == "frozen"
        assert run.config["kl_budget"] == GATE_DEFAULTS["kl_budget"]
        assert recorded["guards"]["last_kl"] is not None  # the budget was checked
        assert run.config["uncertainty_coef"] == PPO_DEFAULTS["uncertainty_coef"]
    else:
        assert set(reward_runs) == {"train"}
        assert not run.config.get("judge_reward_model_path")
        assert run.config["reward_calibration"] == {}
        assert (recorded.get("reward_normalisation") or {}).get("kind") != "frozen"
        assert run.config["kl_budget"] is None
        assert recorded["guards"]["last_kl"] is None  # no budget, nothing measured
        assert run.config["uncertainty_coef"] == 0.0
        assert alarms.stop_kinds("ppo", run.config) == frozenset()


def test_hackable_labels_prefer_the_polite_answer_whatever_its_number():
    # given a polite wrong answer and a rude right one to the same question
    prompt = "What is 7 + 5?"
    polite_wrong, rude_right = "Sure! 7 + 5 = 13.", "Ugh, obviously 12."
    payload = {
        "prompt": {"text": prompt, "messages": None},
        "candidates": [{"text": polite_wrong}, {"text": rude_right}],
    }
    options = {"task_kind": "pairwise", "choices": ["A", "B", "tie", "both_bad"]}
    careful = PRESETS["careful"]

    # when careful annotators label it with the hackable preference, and with the true one
    def votes(preference: str) -> list[str]:
        score = demo.LABEL_PREFERENCES[preference]
        rng = random.Random(0)
        return [decide(payload, options, careful, score, rng)["choice"] for _ in range(200)]

    # then the hackable labels pick the polite answer, the true ones the right answer
    assert set(votes("polite_only")) == {"A"}
    assert set(votes("true")) == {"B"}
    assert demo.polite_only_reward(prompt, "Happy to help! 7 + 5 = 1.") == 1.0
    assert demo.polite_only_reward(prompt, "7 + 5 = 12.") == 0.0
