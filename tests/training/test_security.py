"""Red-team tests of training: what a researcher of project A may name, and what a run leaks.

Each refusal is a 400 (or a 404 for an id the caller cannot see) that names the field, with
no run row, no queued task and no folder created.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from rest_framework.test import APIClient

from annotation.models import Membership
from tests.factories import add_member, make_project, make_user
from tests.training import test_runs_support as support
from tests.training.test_runs_support import make_dataset_version, reward_config
from training import run_files, services, supervisor
from training.config_policy import SERVER_PATH, TRL_ARGS_ALLOWED, training_roots
from training.models import ModelVersion, TrainingRun

pytestmark = pytest.mark.django_db

training_settings = support.training_settings
reward_snapshot = support.reward_snapshot

RUNS = "/api/training/runs/"


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def sent(monkeypatch):
    """Capture the run ids queued after commit instead of sending them to a broker."""
    from training import tasks

    queued: list[int] = []
    monkeypatch.setattr(tasks.run_training, "delay", queued.append)
    return queued


def _finished_run(project, output_root: Path, folder_of: Path, recipe: str) -> ModelVersion:
    """Return a registered model whose run in ``project`` wrote ``final/`` (a copy of a folder)."""
    run = TrainingRun.objects.create(
        recipe=recipe, project=project, status=TrainingRun.Status.SUCCEEDED
    )
    run.output_dir = str(output_root / f"run-{run.pk}")
    run.save(update_fields=["output_dir"])
    final = Path(run.output_dir) / "final"
    shutil.copytree(folder_of, final)
    checkpoint = Path(run.output_dir) / "checkpoint-1"
    shutil.copytree(folder_of, checkpoint)
    (checkpoint / "trainer_state.json").write_text("{}")
    kind = ModelVersion.Kind.REWARD if recipe == "reward" else ModelVersion.Kind.POLICY
    return ModelVersion.objects.create(
        name=f"{recipe}-{run.pk}", kind=kind, artifact_path=str(final), training_run=run
    )


@pytest.fixture
def world(training_settings, reward_snapshot, tiny_policy_dir, tiny_reward_dir):
    project_a, project_b = make_project(), make_project()
    researcher, other, both, staff = make_user(), make_user(), make_user(), make_user(staff=True)
    add_member(project_a, researcher, Membership.Role.RESEARCHER)
    add_member(project_b, other, Membership.Role.RESEARCHER)
    add_member(project_a, both, Membership.Role.RESEARCHER)
    add_member(project_b, both, Membership.Role.RESEARCHER)
    root = Path(training_settings.TRAINING_OUTPUT_ROOT)
    return {
        "a": project_a,
        "b": project_b,
        "researcher": researcher,
        "both": both,
        "staff": staff,
        "data_a": make_dataset_version(project_a, reward_snapshot),
        "data_b": make_dataset_version(project_b, reward_snapshot),
        "policy_a": _finished_run(project_a, root, tiny_policy_dir, "sft"),
        "reward_a": _finished_run(project_a, root, tiny_reward_dir, "reward"),
        "policy_b": _finished_run(project_b, root, tiny_policy_dir, "sft"),
        "reward_b": _finished_run(project_b, root, tiny_reward_dir, "reward"),
        "root": root,
    }


def _ppo(world, **config) -> dict:
    """Return a PPO request of project A from its own SFT policy."""
    return {
        "recipe": "ppo",
        "dataset_version_id": world["data_a"].pk,
        "base_model_id": world["policy_a"].pk,
        "config": {"prompt_format": "chat", "max_steps": 1, **config},
    }


def _refused(world, sent, response, field: str, status: int = 400) -> None:
    """Assert a refusal that names ``field`` and left nothing behind."""
    assert response.status_code == status, response.content
    body = response.json()
    assert field in body["detail"], body
    if status == 400:
        assert body["field"] == field and body["code"] == "invalid_config"
    assert TrainingRun.objects.count() == 4  # the four finished runs of the fixture
    assert sorted(p.name for p in world["root"].iterdir()) == sorted(
        Path(v.training_run.output_dir).name for v in ModelVersion.objects.all()
    )
    assert sent == []


# --------------------------------------------------------------------------- reward functions


@pytest.mark.parametrize(
    "spec", ["cProfile:run", "os:system", "training.demo:true_reward", "builtins:exec", 7]
)
def test_a_reward_function_import_path_is_refused(world, sent, spec):
    response = _client(world["researcher"]).post(
        RUNS, _ppo(world, reward_function=spec), format="json"
    )
    _refused(world, sent, response, "config.reward_function")
    assert "demo" in response.json()["detail"]  # the names that may be used


def test_a_registered_reward_function_is_named_and_resolved_only_for_the_cli(
    world, sent, settings, django_capture_on_commit_callbacks
):
    settings.PREFLOOP_REWARD_FUNCTIONS = {"digits": "training.demo:true_reward"}
    with django_capture_on_commit_callbacks(execute=True):
        response = _client(world["researcher"]).post(
            RUNS, _ppo(world, reward_function="digits"), format="json"
        )
    assert response.status_code == 201, response.content
    run = TrainingRun.objects.get(pk=response.json()["id"])
    assert run.config["reward_function"] == "digits" and sent == [run.pk]
    # the deployment's registry, not the request, gives the import path the CLI receives
    settings.PREFLOOP_REWARD_FUNCTIONS = {}
    run = supervisor.training_run_execute(run_id=run.pk)
    assert run.status == TrainingRun.Status.FAILED
    assert "not a registered reward function" in run.error
    assert not (Path(run.output_dir) / run_files.CONFIG_FILE).exists()


# --------------------------------------------------------------------------- paths and ids


@pytest.mark.parametrize(
    "field",
    ["reward_model_path", "reference_model_path", "value_model_path", "tokenizer_name_or_path"],
)
def test_a_path_to_another_projects_run_is_refused(world, sent, field):
    config = {"reward_function": "demo", field: world["reward_b"].artifact_path}
    if field == "reward_model_path":
        config.pop("reward_function")
    response = _client(world["researcher"]).post(RUNS, _ppo(world, **config), format="json")
    _refused(world, sent, response, f"config.{field}")
    assert world["reward_b"].artifact_path not in response.json()["detail"]


def test_model_name_or_path_and_resume_checkpoint_of_another_project_are_refused(world, sent):
    client = _client(world["researcher"])
    b_folder = world["policy_b"].artifact_path
    response = client.post(
        RUNS, _ppo(world, reward_function="demo", model_name_or_path=b_folder), format="json"
    )
    _refused(world, sent, response, "config.model_name_or_path")
    checkpoint_b = str(Path(world["policy_b"].training_run.output_dir) / "checkpoint-1")
    response = client.post(
        RUNS,
        _ppo(world, reward_function="demo", resume_from_checkpoint=checkpoint_b),
        format="json",
    )
    _refused(world, sent, response, "config.resume_from_checkpoint")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("output_dir", None),  # filled with project B's run folder below
        ("logging_dir", None),
        ("save_total_limit", 1),
        ("push_to_hub", True),
        ("hub_model_id", "someone/model"),
        ("model_init_kwargs", {"trust_remote_code": True}),
        ("trust_remote_code", True),
        ("resume_from_checkpoint", None),
    ],
)
def test_trl_args_outside_the_allowlist_are_refused(world, sent, tiny_reward_dir, key, value):
    if value is None:
        value = world["policy_b"].training_run.output_dir
    payload = {
        "recipe": "reward",
        "dataset_version_id": world["data_a"].pk,
        "base_model_id": world["reward_a"].pk,
        "config": {"max_steps": 1, "trl_args": {"learning_rate": 1e-4, key: value}},
    }
    response = _client(world["researcher"]).post(RUNS, payload, format="json")
    _refused(world, sent, response, f"config.trl_args.{key}")


def test_allowed_trl_args_exist_in_the_trl_config_of_their_recipe():
    import dataclasses

    import trl

    classes = {
        "sft": trl.SFTConfig,
        "reward": trl.RewardConfig,
        "dpo": trl.DPOConfig,
        "grpo": trl.GRPOConfig,
        "rloo": trl.RLOOConfig,
    }
    for recipe, config_cls in classes.items():
        names = {f.name for f in dataclasses.fields(config_cls)}
        assert TRL_ARGS_ALLOWED[recipe] <= names, recipe
        assert not {"output_dir", "save_total_limit", "push_to_hub"} & TRL_ARGS_ALLOWED[recipe]


def test_dot_dot_and_symlinks_out_are_refused_even_for_staff(world, sent, settings):
    # given a folder outside every root (the checkout itself may sit under the temp folder,
    # which the test settings make a model root), and a symlink to it inside the artefact root
    roots = [root.resolve() for root in training_roots()]
    outside = next(
        folder
        for folder in (Path(sys.base_prefix), Path("/usr/share"), Path("/etc"))
        if folder.is_dir() and not any(folder.resolve().is_relative_to(root) for root in roots)
    )
    link = world["root"] / "innocent"
    link.symlink_to(outside)
    staff = _client(world["staff"])
    inside_then_out = f"{world['policy_a'].artifact_path}/../../../../../etc"
    for field, value in [
        ("config.tokenizer_name_or_path", inside_then_out),
        ("config.tokenizer_name_or_path", str(link)),
        ("config.tokenizer_name_or_path", str(outside)),
        ("config.tokenizer_name_or_path", "relative/folder"),
        ("config.reward_model_path", str(link)),
    ]:
        key = field.split(".")[1]
        config = {"reward_function": "demo", key: value}
        if key == "reward_model_path":
            config.pop("reward_function")
        response = staff.post(RUNS, _ppo(world, **config), format="json")
        assert response.status_code == 400, (value, response.content)
        assert response.json()["field"] == field
        assert str(outside) not in response.json()["detail"]
    # and a researcher may name no path at all, not even one of their own project
    for value in (str(link), world["policy_a"].artifact_path):
        response = _client(world["researcher"]).post(
            RUNS, _ppo(world, reward_function="demo", tokenizer_name_or_path=value), format="json"
        )
        assert response.json()["field"] == "config.tokenizer_name_or_path"
    link.unlink()
    _refused(world, sent, response, "config.tokenizer_name_or_path")
    # while staff may name a folder under the roots, stored resolved
    response = staff.post(
        RUNS, _ppo(world, reward_model_path=world["reward_b"].artifact_path), format="json"
    )
    assert response.status_code == 201, response.content
    assert TrainingRun.objects.get(pk=response.json()["id"]).config["reward_model_path"] == (
        os.path.realpath(world["reward_b"].artifact_path)
    )


def test_ids_of_the_own_project_resolve_to_their_folders(world, sent):
    response = _client(world["researcher"]).post(
        RUNS,
        _ppo(
            world,
            reward_model_id=world["reward_a"].pk,
            reference_model_id=world["policy_a"].pk,
            resume_from_run_id=world["policy_a"].training_run.pk,
        ),
        format="json",
    )
    assert response.status_code == 201, response.content
    config = TrainingRun.objects.get(pk=response.json()["id"]).config
    assert config["reward_model_path"] == os.path.realpath(world["reward_a"].artifact_path)
    assert config["reference_model_path"] == os.path.realpath(world["policy_a"].artifact_path)
    assert config["resume_from_checkpoint"].endswith("/checkpoint-1")
    assert "reward_model_id" not in config


@pytest.mark.parametrize(
    ("who", "change", "field", "status"),
    [
        ("researcher", {"dataset_version_id": "data_b"}, "dataset_version_id", 404),
        ("researcher", {"base_model_id": "policy_b"}, "base_model_id", 404),
        ("both", {"base_model_id": "policy_b"}, "base_model_id", 400),
        ("researcher", {"config.reward_model_id": "reward_b"}, "config.reward_model_id", 404),
        ("both", {"config.reward_model_id": "reward_b"}, "config.reward_model_id", 400),
        ("both", {"config.reference_model_id": "policy_b"}, "config.reference_model_id", 400),
        ("researcher", {"config.value_model_id": "policy_b"}, "config.value_model_id", 404),
        ("researcher", {"config.resume_from_run_id": "policy_b"}, "config.resume_from_run_id", 404),
        ("both", {"config.resume_from_run_id": "policy_b"}, "config.resume_from_run_id", 400),
    ],
)
def test_ids_of_another_project_in_the_body_are_refused(world, sent, who, change, field, status):
    payload = _ppo(world, reward_function="demo")
    for key, name in change.items():
        target = world[name]
        value = target.training_run.pk if key.endswith("run_id") else target.pk
        if key.startswith("config."):
            payload["config"][key.split(".", 1)[1]] = value
            if key == "config.reward_model_id":
                payload["config"].pop("reward_function")
        else:
            payload[key] = value
    response = _client(world[who]).post(RUNS, payload, format="json")
    _refused(world, sent, response, field, status)


def test_a_project_id_of_another_project_is_refused(world, sent):
    payload = {**_ppo(world, reward_function="demo"), "project_id": world["b"].pk}
    del payload["base_model_id"]
    response = _client(world["researcher"]).post(RUNS, payload, format="json")
    assert response.status_code == 403
    response = _client(world["both"]).post(RUNS, payload, format="json")
    _refused(world, sent, response, "dataset_version_id")


# --------------------------------------------------------------------------- the process


SECRETS = {
    "DJANGO_SECRET_KEY": "secret-key-4f1c",
    "DATABASE_URL": "postgres://prefloop:db-pass-4f1c@db:5432/prefloop",
    "CELERY_BROKER_URL": "redis://:broker-pass-4f1c@redis:6379/0",
    "REDIS_PASSWORD": "redis-pass-4f1c",
    "AWS_SECRET_ACCESS_KEY": "aws-4f1c",
    "AWS_ACCESS_KEY_ID": "aws-id-4f1c",
    "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp-4f1c.json",
    "AZURE_STORAGE_KEY": "azure-4f1c",
    "HF_TOKEN": "hf-4f1c",
}


def test_the_training_process_environment_holds_no_secret(
    training_settings, reward_snapshot, tiny_reward_dir, monkeypatch
):
    # given a worker whose environment holds the deployment's secrets
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = services.training_run_create(
        recipe="reward",
        config=reward_config(tiny_reward_dir, max_steps=4, save_steps=10),
        dataset_path=str(reward_snapshot),
        enqueue=False,
    )
    seen: dict[str, bytes] = {}

    def read_child_environment(progress) -> None:
        pid = TrainingRun.objects.filter(pk=progress.run_id).values_list("child_pid", flat=True)[0]
        if pid and not seen:
            seen["environ"] = Path(f"/proc/{pid}/environ").read_bytes()

    # when a real training process runs, read its environment while it is alive
    run = supervisor.training_run_execute(run_id=run.pk, on_progress=read_child_environment)

    # then it trained, and its environment held none of the secrets
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error
    environ = dict(entry.split(b"=", 1) for entry in seen["environ"].split(b"\0") if b"=" in entry)
    for name, value in SECRETS.items():
        assert name.encode() not in environ, name
        assert value.encode() not in seen["environ"], name
    assert environ[b"OMP_NUM_THREADS"] == b"1" and b"PATH" in environ


def test_error_and_log_tail_hide_server_paths_outside_the_run_folder(
    training_settings, make_snapshot, tiny_reward_dir
):
    # given a run whose dataset folder disappears before it starts
    from tests.training.conftest import arithmetic_rows

    snapshot = make_snapshot(train=arithmetic_rows(8))
    run = services.training_run_create(
        recipe="reward",
        config=reward_config(tiny_reward_dir),
        dataset_path=str(snapshot),
        enqueue=False,
    )
    shutil.rmtree(snapshot)

    # when the real CLI fails on it
    run = supervisor.training_run_execute(run_id=run.pk)

    # then the error and the log tail name no folder but the run's own
    assert run.status == TrainingRun.Status.FAILED and run.exit_code == 2
    for text in (run.error, run.log_tail):
        assert "dataset folder not found" in text
        assert str(snapshot) not in text and sys.executable not in text
        assert SERVER_PATH in text
    assert run.output_dir in run.log_tail  # the run's own folder stays readable


# --------------------------------------------------------------------------- checkpoints


def test_ppo_checkpoints_load_with_weights_only(tiny_policy_dir, tiny_tokenizer, tmp_path):
    from tests.training.test_ppo import make_trainer

    trainer = make_trainer(
        tiny_policy_dir, tiny_tokenizer, output_dir=tmp_path, max_steps=1, num_ppo_epochs=1
    )
    trainer.train()
    directory = trainer.save_checkpoint(tmp_path / "checkpoint-1")
    state_files = sorted((directory / "ppo_state").glob("*.pt"))
    assert {p.name for p in state_files} >= {"rng_state.pt", "policy_optimizer.pt"}
    for path in state_files:
        torch.load(path, weights_only=True)  # raises on any pickled object
    resumed = make_trainer(tiny_policy_dir, tiny_tokenizer, max_steps=1, num_ppo_epochs=1)
    resumed.load_checkpoint(directory)
    assert resumed.update_step == 1
