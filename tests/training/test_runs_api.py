"""REST API of training runs and the model registry: who may do what, and what they see."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from annotation.models import Membership
from tests.factories import add_member, make_project, make_user
from tests.training import test_runs_support as support
from tests.training.test_runs_support import make_dataset_version, reward_config
from training.models import ModelVersion, TrainingRun

pytestmark = pytest.mark.django_db

training_settings = support.training_settings
reward_snapshot = support.reward_snapshot


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def sent(monkeypatch):
    """Capture the task ids queued after commit instead of sending them to a broker."""
    from training import tasks

    queued: list[int] = []
    monkeypatch.setattr(tasks.run_training, "delay", queued.append)
    return queued


@pytest.fixture
def world(training_settings, reward_snapshot):
    project, other_project = make_project(), make_project()
    researcher, annotator, outsider, staff = (
        make_user(),
        make_user(),
        make_user(),
        make_user(staff=True),
    )
    add_member(project, researcher, Membership.Role.RESEARCHER)
    add_member(project, annotator)
    add_member(other_project, outsider, Membership.Role.RESEARCHER)
    version = make_dataset_version(project, reward_snapshot)
    return {
        "project": project,
        "other_project": other_project,
        "researcher": researcher,
        "annotator": annotator,
        "outsider": outsider,
        "staff": staff,
        "dataset_version": version,
    }


def _create_payload(world, tiny_reward_dir, **extra) -> dict:
    """Return a researcher's request: models by id, never by server path."""
    config = reward_config(tiny_reward_dir)
    del config["model_name_or_path"]
    base, _ = ModelVersion.objects.get_or_create(
        name="tiny-reward-base",
        defaults={
            "artifact_path": str(tiny_reward_dir),
            "dataset_version": world["dataset_version"],
        },
    )
    payload = {
        "recipe": "reward",
        "config": config,
        "dataset_version_id": world["dataset_version"].pk,
        "base_model_id": base.pk,
    }
    payload.update(extra)
    return payload


def test_researcher_creates_a_run_and_it_is_queued_after_commit(
    world, tiny_reward_dir, sent, django_capture_on_commit_callbacks
):
    client = _client(world["researcher"])
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/api/training/runs/", _create_payload(world, tiny_reward_dir), format="json"
        )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "queued" and body["project"] == world["project"].pk
    assert body["progress"] == 0.0 and body["log_tail"] == ""
    assert sent == [body["id"]]
    assert TrainingRun.objects.get().created_by == world["researcher"]


def test_bad_config_is_a_clear_400(world, tiny_reward_dir, sent):
    response = _client(world["researcher"]).post(
        "/api/training/runs/",
        _create_payload(world, tiny_reward_dir, config={"model_name_or_path": "/nope"}),
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_config"
    assert "model_name_or_path" in response.json()["detail"]
    assert not TrainingRun.objects.exists() and sent == []


def test_who_may_create(world, tiny_reward_dir, reward_snapshot, sent):
    payload = _create_payload(world, tiny_reward_dir)
    assert (
        _client(world["annotator"]).post("/api/training/runs/", payload, format="json").status_code
        == 403
    )
    # a researcher of another project may not train on this project's data (nor see it)
    assert (
        _client(world["outsider"]).post("/api/training/runs/", payload, format="json").status_code
        == 404
    )
    # an arbitrary folder on the server is for staff only
    by_path = {
        "recipe": "reward",
        "config": reward_config(tiny_reward_dir),
        "dataset_path": str(reward_snapshot),
        "project_id": world["project"].pk,
    }
    assert (
        _client(world["researcher"]).post("/api/training/runs/", by_path, format="json").status_code
        == 403
    )
    assert (
        _client(world["staff"]).post("/api/training/runs/", by_path, format="json").status_code
        == 201
    )
    both = {**payload, "dataset_path": str(reward_snapshot)}
    assert (
        _client(world["staff"]).post("/api/training/runs/", both, format="json").status_code == 400
    )


def test_list_and_detail_are_scoped_to_researched_projects(world):
    mine = TrainingRun.objects.create(
        recipe="reward",
        project=world["project"],
        status=TrainingRun.Status.RUNNING,
        progress=0.4,
        current_metrics={"step": 8, "loss": 0.5},
        log_tail="[prefloop] step 8/20: loss=0.5",
    )
    theirs = TrainingRun.objects.create(recipe="dpo", project=world["other_project"])

    researcher = _client(world["researcher"])
    listed = researcher.get("/api/training/runs/").json()
    assert [run["id"] for run in listed["results"]] == [mine.pk]
    detail = researcher.get(f"/api/training/runs/{mine.pk}/").json()
    assert detail["progress"] == 0.4 and detail["current_metrics"]["step"] == 8
    assert detail["log_tail"].endswith("loss=0.5")
    assert researcher.get(f"/api/training/runs/{theirs.pk}/").status_code == 404

    staff_ids = {
        r["id"] for r in _client(world["staff"]).get("/api/training/runs/").json()["results"]
    }
    assert staff_ids == {mine.pk, theirs.pk}
    assert _client(world["annotator"]).get("/api/training/runs/").status_code == 403
    assert APIClient().get("/api/training/runs/").status_code in (401, 403)
    filtered = researcher.get("/api/training/runs/?status=queued").json()
    assert filtered["results"] == []
    # A status no run can have, a NUL byte (which PostgreSQL refuses) too, finds none.
    for odd in ("nonsense", "%00"):
        found = researcher.get(f"/api/training/runs/?status={odd}")
        assert found.status_code == 200 and found.json()["results"] == []


def test_cancel_and_resume_endpoints(world, sent, django_capture_on_commit_callbacks):
    run = TrainingRun.objects.create(recipe="reward", project=world["project"])
    client = _client(world["researcher"])

    response = client.post(f"/api/training/runs/{run.pk}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert client.post(f"/api/training/runs/{run.pk}/cancel/").status_code == 200  # no-op

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/api/training/runs/{run.pk}/resume/")
    assert response.status_code == 200 and response.json()["status"] == "queued"
    assert sent == [run.pk]

    TrainingRun.objects.filter(pk=run.pk).update(status=TrainingRun.Status.SUCCEEDED)
    conflict = client.post(f"/api/training/runs/{run.pk}/cancel/")
    assert conflict.status_code == 409 and conflict.json()["code"] == "conflict"
    assert client.post(f"/api/training/runs/{run.pk}/resume/").status_code == 409
    assert (
        _client(world["outsider"]).post(f"/api/training/runs/{run.pk}/cancel/").status_code == 404
    )


def test_model_versions_list_with_lineage(world):
    base_run = TrainingRun.objects.create(
        recipe="sft", project=world["project"], status=TrainingRun.Status.SUCCEEDED
    )
    base = ModelVersion.objects.create(
        name="sft-1",
        artifact_path="/a/sft/final",
        base_model_path="/models/tiny",
        training_run=base_run,
    )
    rm_run = TrainingRun.objects.create(
        recipe="reward", project=world["project"], status=TrainingRun.Status.SUCCEEDED
    )
    reward = ModelVersion.objects.create(
        name="rm-1",
        kind=ModelVersion.Kind.REWARD,
        artifact_path="/a/rm/final",
        parent=base,
        training_run=rm_run,
        dataset_version=world["dataset_version"],
        eval_results={"eval_accuracy": 0.9},
    )
    ModelVersion.objects.create(
        name="elsewhere",
        artifact_path="/x",
        training_run=TrainingRun.objects.create(recipe="dpo", project=world["other_project"]),
    )

    body = _client(world["researcher"]).get("/api/training/models/").json()
    by_name = {item["name"]: item for item in body["results"]}
    assert set(by_name) == {"sft-1", "rm-1"}
    assert by_name["rm-1"]["lineage"] == ["rm-1", "sft-1", "/models/tiny"]
    assert by_name["rm-1"]["eval_results"] == {"eval_accuracy": 0.9}
    assert by_name["rm-1"]["project"] == world["project"].pk
    rewards = _client(world["researcher"]).get("/api/training/models/?kind=reward").json()
    assert [item["name"] for item in rewards["results"]] == ["rm-1"]
    nul = _client(world["researcher"]).get("/api/training/models/?kind=%00")
    assert nul.status_code == 200 and nul.json()["results"] == []
    detail = _client(world["researcher"]).get(f"/api/training/models/{reward.pk}/")
    assert detail.status_code == 200 and detail.json()["parent"] == base.pk
    assert _client(world["outsider"]).get(f"/api/training/models/{reward.pk}/").status_code == 404
    assert len(_client(world["staff"]).get("/api/training/models/").json()["results"]) == 3
