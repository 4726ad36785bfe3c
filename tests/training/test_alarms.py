"""Alarms computed by the run supervisor as metrics arrive: stored on the run, and stopping it
when its config says so (a real PPO run of the tiny policy)."""

from __future__ import annotations

import pytest

from tests.factories import make_project
from tests.training import test_runs_support as support
from tests.training.test_runs_support import make_dataset_version
from training import alarms, demo, services, supervisor
from training.config_policy import InvalidTrainingConfig
from training.models import ModelVersion, TrainingRun
from training.trainers.checkpoints import checkpoint_folders

pytestmark = pytest.mark.django_db

training_settings = support.training_settings


def _ppo_run(make_snapshot, tiny_policy_dir, **config):
    prompts = [[{"role": "user", "content": p.prompt}] for p in demo.problems_in("train")[:8]]
    snapshot = make_snapshot(train=[{"prompt": p} for p in prompts])
    project = make_project()
    base = ModelVersion.objects.create(
        name=f"tiny-policy-{project.pk}", artifact_path=str(tiny_policy_dir)
    )
    return services.training_run_create(
        recipe="ppo",
        config={
            "reward_function": "demo",
            "prompt_format": "chat",
            "rollout_batch_size": 8,
            "per_device_train_batch_size": 4,
            "max_new_tokens": 8,
            "num_ppo_epochs": 4,
            "save_steps": 1,
            "logging_steps": 1,
            "seed": 3,
            **config,
        },
        dataset_version=make_dataset_version(project, snapshot),
        base_model=base,
        project=project,
        enqueue=False,
    )


def test_an_alarm_the_config_stops_on_ends_the_run_and_keeps_its_checkpoint(
    training_settings, tiny_policy_dir, make_snapshot
):
    # given a PPO run whose huge learning rate moves the policy far at every update, checked
    # at every poll, configured to stop on update-size alarms
    training_settings.TRAINING_ALARM_CHECK_SECONDS = 0
    max_steps = 200
    run = _ppo_run(
        make_snapshot,
        tiny_policy_dir,
        learning_rate=0.5,
        max_steps=max_steps,
        stop_on_alarm=["update_size", "non_finite"],
    )

    # when the supervisor runs it
    run = supervisor.training_run_execute(run_id=run.pk)

    # then the run stopped long before its last step, failed with the alarm's reason, and its
    # alarms are stored with the one that stopped it
    assert run.status == TrainingRun.Status.FAILED
    assert run.error.startswith("Stopped by the alarm "), run.error
    stopped = [a for a in run.alarms if a["action"] == "stopped"]
    assert len(stopped) == 1 and stopped[0]["kind"] in ("update_size", "non_finite")
    assert stopped[0]["kind"] in run.error
    assert run.alarms_checked_at is not None
    steps = [step for step, _ in checkpoint_folders(run.output_dir)]
    assert all(step < max_steps for step in steps)
    if steps:  # the newest checkpoint is kept and named
        assert run.checkpoint_path.endswith(f"checkpoint-{max(steps)}"), run.error
        assert f"(step {max(steps)}) is kept" in run.error
    else:  # the alarm came before the first save (a busy machine delays the save, not the poll)
        assert "It had saved no complete checkpoint." in run.error
    assert "=== stopping: alarm" in (run.log_tail or "")
    assert not ModelVersion.objects.filter(training_run=run).exists()


def test_alarms_are_recorded_without_stopping_when_the_config_does_not_say_so(
    training_settings, tiny_policy_dir, make_snapshot
):
    training_settings.TRAINING_ALARM_CHECK_SECONDS = 0
    run = _ppo_run(make_snapshot, tiny_policy_dir, learning_rate=0.5, max_steps=6)
    run = supervisor.training_run_execute(run_id=run.pk)
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error
    assert run.alarms, "a learning rate of 0.5 should trip the update-size alarm"
    assert {a["action"] for a in run.alarms} == {"recorded"}
    assert {a["kind"] for a in run.alarms} <= alarms.RECIPE_ALARMS["ppo"]


def test_stop_on_alarm_names_known_kinds_only(training_settings, tiny_policy_dir, make_snapshot):
    with pytest.raises(InvalidTrainingConfig) as error:
        _ppo_run(make_snapshot, tiny_policy_dir, stop_on_alarm=["kl_limit", "vibes"])
    assert error.value.field == "config.stop_on_alarm" and "vibes" in str(error.value)
    with pytest.raises(InvalidTrainingConfig):
        _ppo_run(make_snapshot, tiny_policy_dir, stop_on_alarm="yes")


def test_stop_kinds_follow_the_recipe():
    assert alarms.stop_kinds("dpo", {"stop_on_alarm": True}) == alarms.RECIPE_ALARMS["dpo"]
    assert alarms.stop_kinds("dpo", {"stop_on_alarm": ["kl_limit"]}) == frozenset()
    assert alarms.stop_kinds("ppo", {}) == frozenset()
