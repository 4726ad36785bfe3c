"""Console training pages: a form per recipe with only what a non-staff user may set, refusals
that name the field and write nothing, access by role, and a run started from the page that
is queued once, runs on a real Celery worker and shows its progress."""

from __future__ import annotations

import dataclasses
import re
import uuid

import pytest
from django.urls import reverse
from django.utils.html import escape

from annotation.models import DatasetVersion, Membership
from tests.celery_worker import Worker
from tests.factories import add_member, make_project, make_user
from tests.training.conftest import (  # noqa: F401  (session fixtures: tiny tokenizer and model)
    arithmetic_rows,
    tiny_reward_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from tests.training.test_runs_support import wait_for
from training import config_policy
from training.models import ModelVersion, Recipe, TrainingRun
from training.trainers import cli
from training.trainers.data import write_snapshot

RECIPES = [recipe for recipe, _label in Recipe.choices]


@pytest.fixture
def world(tmp_path, settings, tiny_reward_dir):  # noqa: F811
    """A project with a researcher, an annotator, a ready dataset version and a tiny model."""
    settings.TRAINING_OUTPUT_ROOT = str(tmp_path / "runs")
    project = make_project()
    researcher, annotator = make_user(), make_user()
    add_member(project, researcher, Membership.Role.RESEARCHER)
    add_member(project, annotator)
    snapshot = write_snapshot(
        tmp_path / "snapshot",
        {"train": arithmetic_rows(48), "validation": arithmetic_rows(8, seed=1)},
        {"n": 56},
    )
    dataset = DatasetVersion.objects.create(
        project=project, version=1, path=str(snapshot), status="ready", content_hash="f" * 64
    )
    model = ModelVersion.objects.create(
        name="tiny-rm",
        kind=ModelVersion.Kind.REWARD,
        artifact_path=str(tiny_reward_dir),
        dataset_version=dataset,
    )
    return project, researcher, annotator, dataset, model


def _new_url(project, recipe: str) -> str:
    return reverse("console:training-new", args=[project.pk, recipe])


def _input_names(html: str) -> set[str]:
    """Return the names of the training form's inputs, selects and text areas."""
    form = html[html.index('class="card console-form training-form"') :]
    form = form[: form.index("</form>")]
    found = re.findall(r'<(?:input|select|textarea)[^>]*\bname="([\w.]+)"', form)
    return set(found) - {"csrfmiddlewaretoken"}


@pytest.mark.django_db
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_form_offers_exactly_what_a_non_staff_user_may_set(client, world, recipe):
    project, researcher, *_ = world
    client.force_login(researcher)
    response = client.get(_new_url(project, recipe))
    assert response.status_code == 200
    html = response.content.decode()
    names = _input_names(html)
    config_cls, _train = cli.get_recipe(recipe)
    fields = {item.name: item for item in dataclasses.fields(config_cls)}
    # no server path and nothing the runner sets
    assert not names & {*config_policy.PATH_FIELDS, "resume"}
    # paths come back as ids of this project's models and runs
    for path_field, id_field in {
        **config_policy.MODEL_ID_FIELDS,
        **config_policy.MODEL_ID_LIST_FIELDS,
        **config_policy.RUN_ID_FIELDS,
    }.items():
        assert (id_field in names) == (path_field in fields)
    # trl_args only where the policy allows keys, and its help lists them
    allowed = config_policy.TRL_ARGS_ALLOWED[recipe]
    assert ("trl_args" in names) == bool(allowed)
    # every other field of the dataclass, with its help text
    expected = {
        name for name in fields if name not in (*config_policy.PATH_FIELDS, "resume", "trl_args")
    }
    assert expected <= names
    assert names - expected - {"trl_args"} == {
        "dataset_version_id",
        "base_model_id",
        *(config_policy.MODEL_ID_FIELDS[f] for f in fields if f in config_policy.MODEL_ID_FIELDS),
        *(
            config_policy.MODEL_ID_LIST_FIELDS[f]
            for f in fields
            if f in config_policy.MODEL_ID_LIST_FIELDS
        ),
        *(config_policy.RUN_ID_FIELDS[f] for f in fields if f in config_policy.RUN_ID_FIELDS),
    }
    for item in fields.values():
        if item.name in expected and item.metadata.get("help"):
            assert escape(item.metadata["help"]) in html, item.name
    # models and data are chosen among the project's own
    assert f'value="version:{world[4].pk}"' in html
    assert f'value="{world[3].pk}"' in html


def _post(client, project, model, dataset, recipe="dpo", **fields):
    data = {"dataset_version_id": dataset.pk, "base_model_id": f"version:{model.pk}", **fields}
    return client.post(_new_url(project, recipe), data)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("recipe", "fields", "named"),
    [
        ("dpo", {"beta": "-1"}, "beta"),  # the library's own check
        ("dpo", {"beta": "strong"}, "beta"),  # not a number
        ("reward", {"trl_args": '{"output_dir": "/etc"}'}, "trl_args"),  # not an allowed key
        ("reward", {"trl_args": "[1, 2]"}, "trl_args"),  # not an object
        ("ppo", {"reward_function": "os:system"}, "reward_function"),  # not a registered name
        ("sft", {"max_steps": "0"}, "max_steps"),
        ("grpo", {"use_lora": "maybe"}, "use_lora"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_and_nothing_is_created(
    client, world, recipe, fields, named
):
    project, researcher, _annotator, dataset, model = world
    client.force_login(researcher)
    response = _post(client, project, model, dataset, recipe, **fields)
    assert response.status_code == 400
    html = response.content.decode()
    assert f'data-field="{named}"' in html, html[html.find("field-error") - 200 :][:800]
    assert TrainingRun.objects.count() == 0


@pytest.mark.django_db
def test_ppo_ensemble_and_judge_are_picked_among_the_projects_reward_models(client, world):
    project, researcher, _annotator, dataset, reward_model = world
    policy = ModelVersion.objects.create(
        name="tiny-policy", artifact_path=reward_model.artifact_path, dataset_version=dataset
    )
    pending = ModelVersion.objects.create(
        name="pending-rm",
        kind="reward",
        artifact_path="/tmp",
        dataset_version=dataset,
        status=ModelVersion.Status.PENDING,
    )
    client.force_login(researcher)
    html = client.get(_new_url(project, "ppo")).content.decode()
    ensemble = html[html.index('name="reward_model_ids"') :]
    ensemble = ensemble[: ensemble.index("</select>")]
    judge = html[html.index('name="judge_reward_model_id"') :]
    judge = judge[: judge.index("</select>")]
    for select in (ensemble, judge):
        assert f'value="{reward_model.pk}"' in select
        assert f'value="{policy.pk}"' not in select  # a policy is no reward model
        assert f'value="{pending.pk}"' not in select  # not usable until validated

    # picking a policy is refused by the form, naming the field
    response = _post(
        client,
        project,
        policy,
        dataset,
        "ppo",
        reward_function="demo",
        reward_model_ids=[policy.pk],
    )
    assert response.status_code == 400
    assert 'data-field="reward_model_ids"' in response.content.decode()
    assert TrainingRun.objects.count() == 0


@pytest.mark.django_db
def test_another_projects_model_or_data_cannot_be_chosen(client, world):
    project, researcher, _annotator, dataset, _model = world
    other = make_project()
    other_dataset = DatasetVersion.objects.create(
        project=other, version=1, path=dataset.path, status="ready", content_hash="e" * 64
    )
    other_model = ModelVersion.objects.create(
        name="other-rm", kind="reward", artifact_path="/tmp", dataset_version=other_dataset
    )
    client.force_login(researcher)
    response = _post(client, project, other_model, dataset)
    assert response.status_code == 400 and 'data-field="base_model_id"' in response.content.decode()
    response = _post(client, project, _model, other_dataset)
    assert response.status_code == 400
    assert 'data-field="dataset_version_id"' in response.content.decode()
    assert TrainingRun.objects.count() == 0


@pytest.mark.django_db
def test_annotators_get_403_and_other_projects_researchers_404(client, world):
    project, _researcher, annotator, dataset, model = world
    stranger = make_user()
    add_member(make_project(), stranger, Membership.Role.RESEARCHER)
    run = TrainingRun.objects.create(recipe="reward", project=project, dataset_version=dataset)
    urls = [
        reverse("console:training", args=[project.pk]),
        reverse("console:training-runs", args=[project.pk]),
        _new_url(project, "reward"),
        reverse("console:training-run", args=[project.pk, run.pk]),
        reverse("console:training-run-live", args=[project.pk, run.pk]),
    ]
    posts = [
        reverse("console:training-run-cancel", args=[project.pk, run.pk]),
        reverse("console:training-run-resume", args=[project.pk, run.pk]),
    ]
    for user, code in ((annotator, 403), (stranger, 404)):
        client.force_login(user)
        for url in urls:
            assert client.get(url).status_code == code, url
        assert _post(client, project, model, dataset, "reward").status_code == code
        for url in posts:
            assert client.post(url).status_code == code, url
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.QUEUED
    assert TrainingRun.objects.count() == 1


@pytest.mark.django_db
def test_the_log_shows_no_server_path_outside_the_run_folder(client, world):
    project, researcher, _annotator, dataset, _model = world
    run = TrainingRun.objects.create(
        recipe="reward",
        project=project,
        dataset_version=dataset,
        status=TrainingRun.Status.FAILED,
        output_dir="/srv/prefloop/runs/run-9",
        log_tail="loading /srv/prefloop/models/secret-base\nsaved /srv/prefloop/runs/run-9/ckpt",
        error="OSError: /home/deploy/.cache/x missing",
        config={"model_name_or_path": "/srv/prefloop/models/secret-base", "beta": 0.1},
    )
    client.force_login(researcher)
    html = client.get(reverse("console:training-run", args=[project.pk, run.pk])).content.decode()
    assert "/srv/prefloop/models" not in html and "/home/deploy" not in html
    assert "/srv/prefloop/runs/run-9/ckpt" in html  # inside the run's own folder
    assert escape(config_policy.SERVER_PATH) in html


def _purge(broker_url: str, queue: str) -> None:
    import redis

    redis.Redis.from_url(broker_url).delete(queue)


def _queued_messages(broker_url: str, queue: str) -> int:
    import redis

    return redis.Redis.from_url(broker_url).llen(queue)


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_started_from_the_page_is_queued_once_and_shows_its_progress(
    client, world, settings, tmp_path
):
    project, researcher, _annotator, dataset, model = world
    broker = settings.CELERY_BROKER_URL
    _purge(broker, "gpu")
    client.force_login(researcher)
    # when the researcher fills in the reward-model form and presses Start
    response = _post(
        client,
        project,
        model,
        dataset,
        "reward",
        max_steps="6",
        logging_steps="2",
        save_steps="3",
        max_length="64",
        per_device_train_batch_size="8",
        learning_rate="0.001",
    )
    # then one run exists, queued by exactly one broker message
    assert response.status_code == 302, response.content.decode()[:3000]
    run = TrainingRun.objects.get()
    assert response["Location"] == reverse("console:training-run", args=[project.pk, run.pk])
    assert run.status == TrainingRun.Status.QUEUED and run.created_by == researcher
    assert run.config["max_steps"] == 6 and "beta" not in run.config
    assert _queued_messages(broker, "gpu") == 1
    runs_page = client.get(reverse("console:training-runs", args=[project.pk])).content.decode()
    assert f'data-run="{run.pk}" data-status="queued"' in runs_page

    # and a real worker runs it; the polled partial follows it to the end
    worker = Worker(
        queue="gpu", broker_url=broker, log_path=tmp_path / "worker.log", name=uuid.uuid4().hex
    )
    live_url = reverse("console:training-run-live", args=[project.pk, run.pk])
    try:
        finished = wait_for(
            lambda: (r := client.get(live_url)).status_code == 286 and r,
            timeout=300,
            interval=1.0,
            what="the run to end",
        )
    finally:
        worker.stop()
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error + worker.text()[-3000:]
    assert run.attempts == 1
    html = finished.content.decode()
    assert "data-run-status>succeeded<" in html
    assert 'value="100"' in html and re.search(r"data-step>6 / 6<", html)
    assert "hx-trigger" not in html  # polling stops with the run
    runs_page = client.get(reverse("console:training-runs", args=[project.pk])).content.decode()
    assert f'data-run="{run.pk}" data-status="succeeded"' in runs_page


@pytest.mark.django_db
def test_cancel_and_resume_buttons_go_through_the_training_services(client, world):
    project, researcher, _annotator, dataset, _model = world
    run = TrainingRun.objects.create(recipe="reward", project=project, dataset_version=dataset)
    client.force_login(researcher)
    page_url = reverse("console:training-run", args=[project.pk, run.pk])
    page = client.get(page_url).content.decode()
    cancel_url = reverse("console:training-run-cancel", args=[project.pk, run.pk])
    resume_url = reverse("console:training-run-resume", args=[project.pk, run.pk])
    assert f'action="{cancel_url}"' in page and f'action="{resume_url}"' not in page
    # when the researcher cancels the queued run
    assert client.post(cancel_url)["Location"] == page_url
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.CANCELLED and run.finished_at is not None
    page = client.get(page_url).content.decode()
    assert f'action="{resume_url}"' in page and f'action="{cancel_url}"' not in page
    assert f"Run {run.pk} cancelled." in page
    # then resumes it: queued again, its end cleared
    client.post(resume_url)
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.QUEUED and run.finished_at is None
    # a finished run cannot be resumed; the page says why and changes nothing
    TrainingRun.objects.filter(pk=run.pk).update(status=TrainingRun.Status.SUCCEEDED)
    page = client.post(resume_url, follow=True).content.decode()
    assert "already succeeded" in page
    assert TrainingRun.objects.get(pk=run.pk).status == TrainingRun.Status.SUCCEEDED
