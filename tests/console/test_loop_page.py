"""Console loop page: the timeline with each step's status, progress and error (escaped), the
actions as POST forms through the loop services, and a settings form that names the refused
field and saves nothing when it refuses."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from annotation.models import DatasetVersion, Membership, Round
from tests.factories import add_member, make_items, make_project, make_user
from training.loop import control
from training.models import Loop, ModelVersion, PolicyEvaluation, TrainingRun

pytestmark = [pytest.mark.django_db, pytest.mark.filterwarnings("ignore:No directory at")]

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def world(tmp_path):
    """A project with a researcher, a reviewer, and one loop iteration part way through."""
    project = make_project(k=2, overlap=1)
    researcher, reviewer = make_user(), make_user()
    add_member(project, researcher, Membership.Role.RESEARCHER)
    add_member(project, reviewer, Membership.Role.REVIEWER)
    base = ModelVersion.objects.create(name="base", artifact_path=str(tmp_path), project=project)
    round1 = Round.objects.create(project=project, number=1, model_version=base)
    make_items(project, 3, round_=round1)
    key = f"loop-{project.pk}-r1"
    dataset = DatasetVersion.objects.create(
        project=project, version=1, name=key, status="ready", content_hash="a" * 64
    )
    running = TrainingRun.objects.create(
        recipe="reward", project=project, dataset_version=dataset, status="running", progress=0.4
    )
    failed = TrainingRun.objects.create(
        recipe="dpo",
        project=project,
        dataset_version=dataset,
        status="succeeded",
        error=f"warning: {HOSTILE}",
    )
    policy = ModelVersion.objects.create(
        name="policy-r1",
        artifact_path=str(tmp_path),
        training_run=failed,
        dataset_version=dataset,
        parent=base,
    )
    PolicyEvaluation.objects.create(
        policy=policy,
        opponent=base,
        judge_kind="reward_model",
        judge=f"judge {HOSTILE}",
        wins=5,
        ties=1,
        losses=2,
        win_rate=0.69,
        ci_low=0.52,
        ci_high=0.85,
        n_prompts=8,
    )
    return project, researcher, reviewer, running, policy


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _url(name: str, project, *args) -> str:
    return reverse(f"console:{name}", args=[project.pk, *args])


def test_the_page_shows_the_timeline_with_progress_links_and_escaped_text(world):
    project, researcher, _, running, policy = world
    control.loop_create(project=project, settings={"path": "dpo"})

    page = _client(researcher).get(_url("loop", project)).content.decode()

    assert 'data-step="round"' in page
    assert 'data-step="export"' in page
    assert page.count('data-step="train"') == 2
    assert 'data-step="evaluate"' in page
    assert 'data-step="gate"' in page
    assert _url("training-run", project, running.pk) in page
    assert "40%" in page
    assert _url("loop-run-cancel", project, running.pk) in page
    assert _url("loop-promote", project, policy.pk) in page
    assert "0.69 [0.52, 0.85]" in page
    # Texts from runs and judges are escaped, never markup
    assert HOSTILE not in page
    assert "&lt;script&gt;" in page
    # the live fragment is what htmx polls
    live = _client(researcher).get(_url("loop-live", project)).content.decode()
    assert 'data-step="gate"' in live
    assert "<html" not in live


def test_only_the_projects_researchers_reach_the_page(world):
    project, _, reviewer, _, _ = world
    outsider = make_user()

    assert _client(reviewer).get(_url("loop", project)).status_code == 403
    assert _client(outsider).get(_url("loop", project)).status_code == 404


def test_settings_without_a_path_are_refused_naming_it_and_nothing_is_saved(world):
    project, researcher, *_ = world
    client = _client(researcher)
    form = {"path": "", "n_prompts": "8", "k": "2", "prompt_source": "pool", "hard_mining": ""}
    form |= {"random_share": "0.5", "min_new_judgments": "0", "sources": ["human"]}
    form |= {"aggregation": "majority", "seed": "0"}

    refused = client.post(_url("loop-settings", project), form)

    assert refused.status_code == 400
    assert 'data-field="path"' in refused.content.decode()
    assert not Loop.objects.filter(project=project).exists()

    bad_json = client.post(_url("loop-settings", project), form | {"path": "dpo", "dpo": "{"})
    assert bad_json.status_code == 400
    assert 'data-field="dpo"' in bad_json.content.decode()
    assert not Loop.objects.filter(project=project).exists()

    saved = client.post(_url("loop-settings", project), form | {"path": "dpo", "dpo": "{}"})
    assert saved.status_code == 302
    found = Loop.objects.get(project=project)
    assert found.config["path"] == "dpo"
    assert found.config["sources"] == ["human"]
    assert found.config["n_prompts"] == 8
    # A choice left out of the post keeps its default; a given one is saved.
    assert found.config["train_rounds"] == "all"
    newest = form | {"path": "dpo", "dpo": "{}", "train_rounds": "newest"}
    assert client.post(_url("loop-settings", project), newest).status_code == 302
    assert Loop.objects.get(project=project).config["train_rounds"] == "newest"
    wrong = client.post(_url("loop-settings", project), newest | {"train_rounds": "latest"})
    assert wrong.status_code == 400 and 'data-field="train_rounds"' in wrong.content.decode()


def test_the_actions_pause_resume_cancel_promote_and_reject(world):
    project, researcher, _, running, policy = world
    control.loop_create(project=project, settings={"path": "dpo"})
    client = _client(researcher)

    client.post(_url("loop-pause", project))
    assert Loop.objects.get(project=project).paused
    page = client.get(_url("loop", project)).content.decode()
    assert 'data-action="resume"' in page
    client.post(_url("loop-resume", project))
    assert not Loop.objects.get(project=project).paused

    client.post(_url("loop-run-cancel", project, running.pk))
    running.refresh_from_db()
    assert running.status == "cancelled"

    # A decision without a reason is refused with a message; nothing changes
    response = client.post(_url("loop-reject", project, policy.pk), {"reason": ""}, follow=True)
    assert "reason" in response.content.decode()
    policy.refresh_from_db()
    assert policy.promotion == ""
    client.post(_url("loop-reject", project, policy.pk), {"reason": "too long <b>answers</b>"})
    policy.refresh_from_db()
    assert policy.promotion == "rejected"
    assert policy.promoted_by == researcher
    page = client.get(_url("loop", project)).content.decode()
    assert "too long &lt;b&gt;answers&lt;/b&gt;" in page
    client.post(_url("loop-promote", project, policy.pk), {"reason": "read them again"})
    policy.refresh_from_db()
    assert policy.promotion == "promoted"


def test_ids_of_another_project_are_not_found(world, tmp_path):
    project, researcher, *_ = world
    other = make_project()
    theirs = ModelVersion.objects.create(name="theirs", artifact_path=str(tmp_path), project=other)
    client = _client(researcher)

    response = client.post(_url("loop-promote", project, theirs.pk), {"reason": "mine now"})

    assert response.status_code == 404
    theirs.refresh_from_db()
    assert theirs.promotion == ""
