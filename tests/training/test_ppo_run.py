"""PPO runs as a TrainingRun through the same job machinery as the TRL recipes."""

from __future__ import annotations

import pytest

from tests.factories import make_project
from tests.training import test_runs_support as support
from tests.training.test_runs_support import make_dataset_version
from training import demo, services, supervisor
from training.models import ModelVersion, TrainingRun

pytestmark = pytest.mark.django_db

training_settings = support.training_settings


def test_ppo_recipe_runs_as_a_training_run_and_registers_a_policy(
    training_settings, tiny_policy_dir, make_snapshot
):
    # given a prompt snapshot of demo questions and a tiny policy
    prompts = [[{"role": "user", "content": p.prompt}] for p in demo.problems_in("train")[:8]]
    snapshot = make_snapshot(train=[{"prompt": p} for p in prompts])
    project = make_project()
    base = ModelVersion.objects.create(name="tiny-policy", artifact_path=str(tiny_policy_dir))
    config = {
        "reward_function": "demo",  # a name of PREFLOOP_REWARD_FUNCTIONS
        "prompt_format": "chat",
        "rollout_batch_size": 8,
        "per_device_train_batch_size": 4,
        "max_new_tokens": 8,
        "max_steps": 2,
        "num_ppo_epochs": 1,
        "save_steps": 1,
        "seed": 3,
    }

    # when the run is created like any other recipe and executed by the run service
    run = services.training_run_create(
        recipe="ppo",
        config=config,
        dataset_version=make_dataset_version(project, snapshot),
        base_model=base,
        project=project,
        enqueue=False,
    )
    run = supervisor.training_run_execute(run_id=run.pk)

    # then it succeeded with PPO's metrics streamed into the row and one registered policy
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error
    assert run.progress == 1.0
    assert run.current_metrics["global_step"] == 2
    version = ModelVersion.objects.get(training_run=run)
    assert version.kind == ModelVersion.Kind.POLICY and version.parent == base
    assert (tiny_policy_dir / "config.json").exists()
