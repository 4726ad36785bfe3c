"""Rounds from any policy (training.rounds): generation jobs over the prompt pool.

Policies are real tiny GPT-2s; one job runs in a real Celery worker on the gpu queue, one
against a real `transformers serve` process (the `served_policy` fixture), and the failing
endpoint is a loopback port nothing listens on.
"""

from __future__ import annotations

import io
import json
import time

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from annotation import services as annotation_services
from annotation.imports import content_hash, items_import
from annotation.models import Candidate, Item, Membership, Prompt, Round
from annotation.prompt_pool import prompt_pool_import
from tests.celery_worker import Worker
from tests.factories import add_member, make_project, make_user
from tests.training.conftest import free_port
from training import loop, rounds
from training.generation.endpoints import model_version_endpoint_create
from training.models import GenerationJob, ModelVersion

CHAT = [
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 3+4?"}],
    [{"role": "user", "content": "What is 5+5?"}],
]
TEXTS = [f"What is {a} + {a + 1}?" for a in range(6)]


def pool(project, *, texts=TEXTS, chat=CHAT, eval_fraction=0.0):
    rows = [{"prompt": t} for t in texts] + [{"messages": m} for m in chat]
    stream = io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())
    return prompt_pool_import(project=project, stream=stream, eval_fraction=eval_fraction)


def policy(project, path, name: str, **fields) -> ModelVersion:
    return ModelVersion.objects.create(
        name=name, artifact_path=str(path), project=project, **fields
    )


def researcher_client(project) -> APIClient:
    user = make_user()
    add_member(project, user, Membership.Role.RESEARCHER)
    client = APIClient()
    client.force_authenticate(user)
    return client


def import_round_one(project) -> Round:
    """Round 1 imported from a file: answers of no registered policy."""
    rows = [
        {"prompt": f"Imported question {i}?", "candidates": [f"yes {i}", f"no {i}"]}
        for i in range(3)
    ]
    stream = io.StringIO("\n".join(json.dumps(r) for r in rows))
    report = items_import(project=project, stream=stream)
    return Round.objects.get(pk=report.round_id)


def items_of(round_: Round) -> list[Item]:
    return list(
        Item.objects.filter(round=round_).select_related("prompt").prefetch_related("slots")
    )


def candidates_by_position(item: Item) -> list[Candidate]:
    return [slot.candidate for slot in item.slots.order_by("position").select_related("candidate")]


# --------------------------------------------------------------------------- refused early


@pytest.mark.django_db
def test_bad_requests_are_refused_naming_the_field_and_nothing_is_queued(tmp_path):
    project = make_project(k=2)
    client = researcher_client(project)
    url = f"/api/training/projects/{project.pk}/generation-jobs/"
    ready = policy(project, tmp_path, "ready-policy")
    other = policy(make_project(), tmp_path, "elsewhere-policy")
    pending = policy(project, tmp_path, "pending-policy", status=ModelVersion.Status.PENDING)
    reward = policy(project, tmp_path, "a-reward-model", kind=ModelVersion.Kind.REWARD)

    def post(**body):
        return client.post(url, {"n_prompts": 2, **body}, format="json")

    # an empty pool first
    response = post(policies=[ready.pk])
    assert response.status_code == 400, response.content
    assert (
        response.json()["field"] == "n_prompts" and "no train prompts" in response.json()["detail"]
    )
    pool(project, texts=TEXTS[:3], chat=[])
    cases = [
        ({"policies": [999_999]}, "policies[0]", "no model version 999999 in this project"),
        ({"policies": [other.pk]}, "policies[0]", "in this project"),
        ({"policies": [pending.pk]}, "policies[0]", "usable once its validation passed"),
        ({"policies": [reward.pk]}, "policies[0]", "reward model"),
        ({"policies": [ready.pk], "n_prompts": 4}, "n_prompts", "holds 3 prompt(s)"),
        ({"policies": [ready.pk], "purpose": "eval"}, "n_prompts", "no eval prompts"),
        ({"policies": [ready.pk], "mode": "side_by_side"}, "policies", "one policy per candidate"),
        ({"policies": [ready.pk, ready.pk], "mode": "side_by_side"}, "policies", "twice"),
        ({"policies": [ready.pk], "sampling": [{"temperature": 0}]}, "sampling[0].temperature", ""),
        ({"policies": [ready.pk], "sampling": [{"model_path": "/x"}]}, "sampling[0]", "unknown"),
        ({"policies": [ready.pk], "sampling": [{}, {}, {}]}, "sampling", "one per candidate"),
    ]
    for body, field, words in cases:
        response = post(**body)
        assert response.status_code == 400, (body, response.content)
        assert response.json()["field"] == field, (body, response.json())
        assert words in response.json()["detail"], (body, response.json())
    assert not GenerationJob.objects.exists()
    assert not Round.objects.filter(project=project).exists()


@pytest.mark.django_db
def test_annotators_and_other_researchers_cannot_generate_or_read_jobs(tmp_path):
    project = make_project(k=2)
    pool(project)
    ready = policy(project, tmp_path, "p")
    job = rounds.generation_job_create(
        project=project, user=None, policies=[ready.pk], n_prompts=2, enqueue=False
    )
    annotator = make_user()
    add_member(project, annotator)
    outsider = make_user()
    add_member(make_project(), outsider, Membership.Role.RESEARCHER)
    for user, expected in ((annotator, 403), (outsider, 404)):
        client = APIClient()
        client.force_authenticate(user)
        base = f"/api/training/projects/{project.pk}/generation-jobs/"
        assert (
            client.post(base, {"policies": [ready.pk], "n_prompts": 2}, format="json").status_code
            == expected
        )
        assert client.get(base).status_code == expected
        assert client.get(f"{base}{job.pk}/").status_code == expected
    assert GenerationJob.objects.count() == 1


# --------------------------------------------------------------------------- a real worker


def _wait(predicate, timeout: float, what: str, worker: Worker):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; worker log:\n{worker.text()[-4000:]}")


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_real_gpu_worker_generates_k_samples_after_an_imported_round(tiny_policy_dir, tmp_path):
    import redis

    redis.Redis.from_url(django_settings.CELERY_BROKER_URL).flushdb()
    # Given a project whose round 1 was imported (no policy), a pool of text and chat prompts
    project = make_project(name="rounds worker", k=2)
    round1 = import_round_one(project)
    pool(project)
    version = policy(project, tiny_policy_dir, "tiny-worker-policy")
    client = researcher_client(project)
    annotator = make_user()
    add_member(project, annotator)
    worker = Worker(
        queue="gpu",
        broker_url=django_settings.CELERY_BROKER_URL,
        log_path=tmp_path / "worker.log",
        name="rounds-gpu",
    )
    try:
        # When a researcher asks for 2 samples per prompt with a temperature per candidate
        response = client.post(
            f"/api/training/projects/{project.pk}/generation-jobs/",
            {
                "policies": [version.pk],
                "mode": "k_samples",
                "n_prompts": 8,
                "sampling": [
                    {"temperature": 0.7, "max_new_tokens": 8},
                    {"temperature": 1.3, "max_new_tokens": 8},
                ],
                "seed": 5,
                "source_key": "worker-test",
            },
            format="json",
        )
        assert response.status_code == 202, response.content
        job_id = response.json()["id"]
        assert response.json()["status"] == "queued"
        status_url = response.json()["status_url"]

        def finished():
            body = client.get(status_url).json()
            return body if body["status"] in ("succeeded", "failed") else None

        done = _wait(finished, 300, "the generation job", worker)
    finally:
        worker.stop()

    # Then the worker opened round 2 from the policy, with every prompt's two answers
    assert done["status"] == "succeeded", done["error"]
    assert done["progress"] == 1.0 and done["round_number"] == 2
    assert "training.tasks.run_generation_job" in worker.text()  # the worker ran it
    job = GenerationJob.objects.get(pk=job_id)
    round2 = job.round
    assert round2.model_version_id == version.pk and round2.purpose == "train"
    assert round1.items.count() == 3  # the imported round is untouched
    items = items_of(round2)
    assert len(items) == job.n_items == done["n_items"] > 0
    pool_hashes = set(
        Prompt.objects.filter(project=project, in_pool=True).values_list("content_hash", flat=True)
    )
    for item in items:
        assert item.prompt.content_hash in pool_hashes
        cands = candidates_by_position(item)
        assert len({c.text for c in cands}) == 2
        assert [c.generation_config["temperature"] for c in cands] == [0.7, 1.3]
        assert {c.model_name for c in cands} == {"tiny-worker-policy"}
    # chat prompts reached the policy as messages and the items keep them
    assert any(item.prompt.messages in CHAT for item in items)
    # the same request again returns the first job
    again = client.post(
        f"/api/training/projects/{project.pk}/generation-jobs/",
        {"policies": [version.pk], "n_prompts": 8, "source_key": "worker-test"},
        format="json",
    )
    assert again.json()["id"] == job_id and GenerationJob.objects.count() == 1
    # and the round is served to the project's annotators
    served = annotation_services.assignment_next(project_id=project.pk, user=annotator)
    assert served is not None


# --------------------------------------------------------------------------- in process


@pytest.mark.django_db
def test_side_by_side_puts_one_answer_of_each_policy_in_every_item(tiny_policy_dir):
    project = make_project(k=2)
    pool(project)
    new = policy(project, tiny_policy_dir, "policy-new")
    base = policy(project, tiny_policy_dir, "policy-base")
    job = rounds.generation_job_create(
        project=project,
        user=None,
        policies=[new.pk, base.pk],
        mode="side_by_side",
        n_prompts=6,
        sampling=[{"temperature": 1.0, "max_new_tokens": 8}],
        seed=2,
        enqueue=False,
    )

    job = rounds.generation_job_run(job_id=job.pk)

    assert job.status == "succeeded", job.error
    items = items_of(job.round)
    assert len(items) == job.n_items > 0
    for item in items:
        cands = candidates_by_position(item)
        assert [c.model_name for c in cands] == ["policy-new", "policy-base"]
        # each answer is linked to the registered version that wrote it
        assert [c.policy_version_id for c in cands] == [new.pk, base.pk]
        assert cands[0].text != cands[1].text
    # the items importer draws each annotator's display order: model names never reach them
    assert job.round.model_version_id == new.pk


@pytest.mark.django_db
def test_an_eval_round_draws_only_the_pools_eval_split(tiny_policy_dir):
    project = make_project(k=2)
    texts = [f"Question number {i}?" for i in range(30)]
    pool(project, texts=texts, chat=[], eval_fraction=0.3)
    eval_hashes = set(
        Prompt.objects.filter(project=project, split="eval").values_list("content_hash", flat=True)
    )
    assert 0 < len(eval_hashes) < 30
    version = policy(project, tiny_policy_dir, "eval-policy")
    job = rounds.generation_job_create(
        project=project,
        user=None,
        policies=[version.pk],
        n_prompts=len(eval_hashes),
        sampling=[{"temperature": 1.2, "max_new_tokens": 8}],
        purpose="eval",
        enqueue=False,
    )
    job = rounds.generation_job_run(job_id=job.pk)
    assert job.status == "succeeded", job.error
    assert job.round.purpose == "eval"
    assert {i.prompt.content_hash for i in items_of(job.round)} <= eval_hashes
    # and the loop's fresh prompts never come from the eval split
    settings = loop.LoopSettings(path="dpo", prompt_source="pool", n_prompts=30, seed=1)
    chosen = loop.prompts_select(project=project, settings=settings)
    assert chosen and {content_hash(p) for p in chosen}.isdisjoint(eval_hashes)


@pytest.fixture
def endpoints(settings, served_policy):
    base_url, model = served_policy
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        "local-serve": {"base_url": base_url, "models": [model], "timeout_seconds": 60},
        "down": {"base_url": f"http://127.0.0.1:{free_port()}", "models": ["m"], "retries": 0},
    }
    return model


@pytest.mark.django_db
def test_a_round_from_an_endpoint_policy_over_http(endpoints):
    project = make_project(k=2)
    import_round_one(project)
    pool(project)
    version = model_version_endpoint_create(
        name="served-policy", endpoint="local-serve", model=endpoints, project=project
    )
    job = rounds.generation_job_create(
        project=project,
        user=None,
        policies=[version.pk],
        n_prompts=4,
        sampling=[{"temperature": 1.0, "max_new_tokens": 6}],
        seed=9,
        enqueue=False,
    )

    job = rounds.generation_job_run(job_id=job.pk)

    assert job.status == "succeeded", job.error
    assert job.round.number == 2
    cands = [c for item in items_of(job.round) for c in candidates_by_position(item)]
    assert cands
    for cand in cands:
        assert cand.model_name == "served-policy"
        body = cand.generation_config["request"]["body"]
        assert body["model"] == endpoints and body["max_tokens"] == 6
        assert isinstance(body["messages"], list)


@pytest.mark.django_db
def test_an_endpoint_that_does_not_answer_fails_the_job_and_opens_no_round(endpoints):
    project = make_project(k=2)
    pool(project)
    annotator = make_user()
    add_member(project, annotator)
    version = model_version_endpoint_create(
        name="down-policy", endpoint="down", model="m", project=project
    )
    job = rounds.generation_job_create(
        project=project, user=None, policies=[version.pk], n_prompts=3, enqueue=False
    )

    job = rounds.generation_job_run(job_id=job.pk)

    assert job.status == "failed" and job.round is None
    assert "does not answer" in job.error
    assert not Round.objects.filter(project=project).exists()
    assert not Candidate.objects.filter(prompt__project=project).exists()
    assert annotation_services.assignment_next(project_id=project.pk, user=annotator) is None
    # running it again (a redelivered task) leaves it failed
    assert rounds.generation_job_run(job_id=job.pk).status == "failed"


@pytest.mark.django_db
def test_generate_round_command_runs_here_or_names_the_problem(tiny_policy_dir):
    project = make_project(k=2)
    pool(project)
    version = policy(project, tiny_policy_dir, "command-policy")
    out = io.StringIO()
    call_command(
        "generate_round",
        "--project",
        str(project.pk),
        "--policy",
        str(version.pk),
        "--n-prompts",
        "3",
        "--temperature",
        "1.1",
        "--max-new-tokens",
        "8",
        "--sync",
        stdout=out,
    )
    assert "round 1 with" in out.getvalue()
    job = GenerationJob.objects.get(project=project)
    assert job.status == "succeeded" and job.round.items.exists()
    with pytest.raises(CommandError, match=r"policies\[0\]: no model version 999999"):
        call_command(
            "generate_round", "--project", str(project.pk), "--policy", "999999", "--n-prompts", "1"
        )
    with pytest.raises(CommandError, match="holds 8 prompt"):
        call_command(
            "generate_round",
            "--project",
            str(project.pk),
            "--policy",
            str(version.pk),
            "--n-prompts",
            "50",
        )


@pytest.mark.django_db
def test_a_policy_folder_that_does_not_load_fails_the_job_without_showing_the_path(tmp_path):
    project = make_project(k=2)
    pool(project)
    broken = tmp_path / "broken-policy"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    version = policy(project, broken, "broken-policy")
    job = rounds.generation_job_create(
        project=project, user=None, policies=[version.pk], n_prompts=2, enqueue=False
    )

    job = rounds.generation_job_run(job_id=job.pk)

    assert job.status == "failed" and job.error
    assert str(tmp_path) not in job.error
    assert not Round.objects.filter(project=project).exists()


@pytest.mark.django_db
def test_the_loop_asks_for_a_pool_when_it_has_no_prompts_for_the_next_round(tmp_path):
    from annotation.errors import ServiceError

    project = make_project(k=2)
    import_round_one(project)  # prompts of an imported round are not in the pool
    version = policy(project, tmp_path, "loop-policy")
    settings = loop.LoopSettings(path="dpo", prompt_source="pool", n_prompts=4)
    with pytest.raises(ServiceError, match="import prompts into its pool"):
        loop.generate_round_now(
            project_id=project.pk,
            model_version_id=version.pk,
            source_key="empty-pool:gen",
            settings=settings.to_dict(),
        )
    assert Round.objects.filter(project=project).count() == 1
