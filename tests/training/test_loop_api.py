"""The loop's API: settings, timeline and actions for the project's researchers only; ids of
another project, in the URL or in the body, find nothing and change nothing; "run the next
step" queues a tick that a real Celery worker runs and records on the loop."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from annotation.models import Membership, Round
from tests.celery_worker import Worker
from tests.factories import add_member, make_items, make_project, make_user
from tests.training.test_runs_support import wait_for
from training.loop import control
from training.models import Loop, LoopEvent, ModelVersion, TrainingRun

pytestmark = pytest.mark.filterwarnings("ignore:No directory at")  # whitenoise, no collectstatic


@pytest.fixture
def world(db, tmp_path):
    """Project P with a researcher, a reviewer and a policy; project Q with its own researcher."""
    project, other = make_project(name="P"), make_project(name="Q")
    users = {
        "researcher": make_user(),
        "reviewer": make_user(),
        "annotator": make_user(),
        "other_researcher": make_user(),
    }
    add_member(project, users["researcher"], Membership.Role.RESEARCHER)
    add_member(project, users["reviewer"], Membership.Role.REVIEWER)
    add_member(project, users["annotator"])
    add_member(other, users["other_researcher"], Membership.Role.RESEARCHER)
    run = TrainingRun.objects.create(recipe="dpo", project=project, status="succeeded")
    policy = ModelVersion.objects.create(
        name="p-policy", artifact_path=str(tmp_path), training_run=run
    )
    theirs = ModelVersion.objects.create(
        name="q-policy", kind="reward", artifact_path=str(tmp_path), project=other
    )
    return project, other, users, policy, theirs


def _client(user=None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def _loop_url(project, action: str = "") -> str:
    return f"/api/training/projects/{project.pk}/loop/{action + '/' if action else ''}"


@pytest.mark.django_db
def test_researchers_read_and_save_the_settings_others_are_turned_away(world):
    project, _, users, *_ = world
    researcher = _client(users["researcher"])

    empty = researcher.get(_loop_url(project))
    assert empty.status_code == 200
    assert empty.json()["has_loop"] is False

    saved = researcher.put(
        _loop_url(project), {"settings": {"path": "dpo"}, "every_seconds": 60}, format="json"
    )
    assert saved.status_code == 200, saved.json()
    body = saved.json()
    assert body["has_loop"] and body["settings"]["path"] == "dpo"
    assert body["settings"]["prompt_source"] == "pool"
    assert body["settings"]["sources"] == ["human"]
    assert body["every_seconds"] == 60

    for role, status in (("reviewer", 403), ("annotator", 403), ("other_researcher", 404)):
        client = _client(users[role])
        assert client.get(_loop_url(project)).status_code == status, role
        assert client.get(_loop_url(project, "timeline")).status_code == status, role
        put = client.put(_loop_url(project), {"settings": {"path": "rm_ppo"}}, format="json")
        assert put.status_code == status, role
        assert client.post(_loop_url(project, "pause")).status_code == status, role
    assert _client().get(_loop_url(project)).status_code in (401, 403)
    assert Loop.objects.get(project=project).config["path"] == "dpo"
    assert not Loop.objects.get(project=project).paused


@pytest.mark.django_db
def test_bad_settings_are_a_400_naming_the_field_and_save_nothing(world):
    project, _, users, _, theirs = world
    researcher = _client(users["researcher"])

    no_path = researcher.put(_loop_url(project), {"settings": {"n_prompts": 4}}, format="json")
    assert no_path.status_code == 400
    assert no_path.json()["field"] == "path"

    by_path = researcher.put(
        _loop_url(project),
        {"settings": {"path": "dpo", "dpo": {"reference_model_path": "/etc"}}},
        format="json",
    )
    assert by_path.status_code == 400
    assert by_path.json()["field"] == "dpo.reference_model_path"
    assert "/etc" not in by_path.content.decode()

    # Another project's model in the body is not found, as if it did not exist
    theirs_id = researcher.put(
        _loop_url(project),
        {"settings": {"path": "rm_ppo", "ppo": {"reward_model_id": theirs.pk}}},
        format="json",
    )
    assert theirs_id.status_code == 404
    assert "q-policy" not in theirs_id.content.decode()
    assert not Loop.objects.filter(project=project).exists()


@pytest.mark.django_db
def test_pause_resume_and_step_follow_the_loop_state(world):
    project, _, users, *_ = world
    researcher = _client(users["researcher"])

    # No loop yet: nothing to pause or step
    assert researcher.post(_loop_url(project, "step")).status_code == 409
    assert researcher.post(_loop_url(project, "pause")).status_code == 409
    control.loop_create(project=project, settings={"path": "dpo"})

    paused = researcher.post(_loop_url(project, "pause"))
    assert paused.status_code == 200 and paused.json()["paused"] is True
    refused = researcher.post(_loop_url(project, "step"))
    assert refused.status_code == 409 and "paused" in refused.json()["detail"]
    resumed = researcher.post(_loop_url(project, "resume"))
    assert resumed.json()["paused"] is False


@pytest.mark.django_db
def test_the_timeline_lists_each_round_with_its_steps(world):
    project, _, users, policy, _ = world
    round1 = Round.objects.create(project=project, number=1, model_version=policy)
    make_items(project, 2, round_=round1)
    control.loop_create(project=project, settings={"path": "dpo"})

    body = _client(users["researcher"]).get(_loop_url(project, "timeline")).json()

    assert [it["key"] for it in body["iterations"]] == [f"loop-{project.pk}-r1"]
    first = body["iterations"][0]["steps"][0]
    assert first["kind"] == "round" and first["status"] == "open" and first["active"]
    assert first["progress"] == 0.0
    assert body["active"] is True


@pytest.mark.django_db
def test_promote_and_reject_by_the_versions_researchers_with_a_reason(world):
    project, other, users, policy, theirs = world
    url = f"/api/training/models/{policy.pk}/"
    researcher = _client(users["researcher"])

    no_reason = researcher.post(url + "promote/", {}, format="json")
    assert no_reason.status_code == 400 and "reason" in no_reason.json()["detail"]
    wrong_project = researcher.post(
        url + "promote/", {"reason": "good", "project_id": other.pk}, format="json"
    )
    assert wrong_project.status_code == 400 and wrong_project.json()["field"] == "project_id"
    for role, status in (("other_researcher", 404), ("reviewer", 403), ("annotator", 403)):
        answer = _client(users[role]).post(url + "reject/", {"reason": "x"}, format="json")
        assert answer.status_code == status, role
    policy.refresh_from_db()
    assert policy.promotion == ""
    # A version of another project, named from this researcher's side, is not found
    assert (
        researcher.post(f"/api/training/models/{theirs.pk}/promote/", {"reason": "x"}).status_code
        == 404
    )

    promoted = researcher.post(url + "promote/", {"reason": "wins on the eval prompts"})
    assert promoted.status_code == 200
    policy.refresh_from_db()
    assert policy.promotion == "promoted" and policy.promoted_by == users["researcher"]
    rejected = researcher.post(url + "reject/", {"reason": "too long", "project_id": project.pk})
    assert rejected.status_code == 200
    policy.refresh_from_db()
    assert policy.promotion == "rejected" and policy.promotion_reason == "too long"


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_next_step_queues_a_tick_that_a_real_worker_runs_and_records(world, tmp_path):
    import redis

    project, _, users, policy, _ = world
    round1 = Round.objects.create(project=project, number=1, model_version=policy)
    make_items(project, 2, round_=round1)
    control.loop_create(project=project, settings={"path": "dpo"})
    broker = django_settings.CELERY_BROKER_URL
    redis.Redis.from_url(broker).delete("default")

    answer = _client(users["researcher"]).post(_loop_url(project, "step"), {}, format="json")
    assert answer.status_code == 202
    worker = Worker(
        queue="default", broker_url=broker, log_path=tmp_path / "worker.log", name=uuid.uuid4().hex
    )
    try:
        found = wait_for(
            lambda: Loop.objects.filter(project=project, last_tick_at__isnull=False).first(),
            timeout=120,
            interval=0.5,
            what="the worker to run the tick",
        )
    finally:
        worker.stop()
    assert found.last_tick_status == "done", worker.text()[-3000:]
    assert found.last_steps[0]["name"] == "wait"
    event = LoopEvent.objects.get(loop=found)
    assert (event.step, event.status, event.round_id) == ("wait", "waiting", round1.pk)
    assert event.duration_seconds is not None
