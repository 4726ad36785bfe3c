"""Console prompt pool page: counts, upload (every bad line, nothing written), escaped prompts,
the "generate a round" form refusing what the API refuses, and a job's live fragment."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from annotation.models import Membership, Prompt
from tests.factories import add_member, make_project, make_user
from tests.training.conftest import (  # noqa: F401  (session fixtures: tiny tokenizer and policy)
    tiny_policy_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from training import rounds
from training.models import GenerationJob, ModelVersion

pytestmark = [pytest.mark.django_db, pytest.mark.filterwarnings("ignore:No directory at")]

XSS = '<script>alert("pool")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def world(tmp_path):
    project = make_project(name="pool page", k=2)
    researcher, annotator = make_user(), make_user()
    add_member(project, researcher, Membership.Role.RESEARCHER)
    add_member(project, annotator)
    policy = ModelVersion.objects.create(
        name="page-policy", artifact_path=str(tmp_path), project=project
    )
    ModelVersion.objects.create(
        name="not-validated",
        artifact_path=str(tmp_path),
        project=project,
        status=ModelVersion.Status.PENDING,
    )
    client = Client()
    client.force_login(researcher)
    return project, client, annotator, policy


def _upload(client, project, lines: list, *, htmx: bool = False, fraction: str = "0"):
    body = "".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines)
    headers = {"HX-Request": "true"} if htmx else {}
    return client.post(
        reverse("console:pool-import", args=[project.pk]),
        {"file": SimpleUploadedFile("pool.jsonl", body.encode()), "eval_fraction": fraction},
        headers=headers,
    )


def test_upload_shows_counts_and_the_page_escapes_prompts(world):
    project, client, _, _ = world
    response = _upload(
        client,
        project,
        [
            {"prompt": XSS, "tags": ["<b>tag</b>"]},
            {"messages": [{"role": "user", "content": "chat <i>turn</i>"}]},
            {"prompt": "plain"},
        ],
        htmx=True,
    )
    assert response.status_code == 201
    assert 'data-report="added">3<' in response.content.decode()
    page = client.get(reverse("console:pool", args=[project.pk])).content.decode()
    assert 'data-count="total">3<' in page and 'data-count="train">3<' in page
    assert XSS not in page and "&lt;script&gt;alert(&quot;pool&quot;)&lt;/script&gt;" in page
    assert "<b>tag</b>" not in page and "&lt;b&gt;tag&lt;/b&gt;" in page
    assert "chat &lt;i&gt;turn&lt;/i&gt;" in page
    # the nav links the page
    assert f'href="{reverse("console:pool", args=[project.pk])}"' in page


def test_bad_lines_are_all_listed_and_nothing_is_imported(world):
    project, client, _, _ = world
    response = _upload(
        client, project, [{"prompt": "fine"}, "{oops", {"prompt": "x", "extra": XSS}], htmx=True
    )
    assert response.status_code == 400
    text = response.content.decode()
    assert "2 bad line(s); nothing was imported." in text
    assert "<td>2</td>" in text and "<td>3</td>" in text
    assert XSS not in text
    assert not Prompt.objects.filter(project=project).exists()
    # a bad eval fraction is refused on its field, without htmx too (the whole page)
    response = _upload(client, project, [{"prompt": "fine"}], fraction="2")
    assert response.status_code == 400
    assert 'data-field="eval_fraction"' in response.content.decode()
    assert not Prompt.objects.filter(project=project).exists()


def test_generate_form_offers_ready_policies_and_refuses_on_the_named_field(world):
    project, client, _, policy = world
    page = client.get(reverse("console:pool", args=[project.pk])).content.decode()
    assert "page-policy" in page and "not-validated" not in page
    url = reverse("console:pool-generate", args=[project.pk])
    form = {
        "policies": [policy.pk],
        "mode": "k_samples",
        "n_prompts": 5,
        "temperature": 1.0,
        "max_new_tokens": 8,
        "purpose": "train",
    }
    # an empty pool: refused on n_prompts, nothing queued
    response = client.post(url, form)
    assert response.status_code == 400
    assert 'data-field="n_prompts"' in response.content.decode()
    assert "no train prompts" in response.content.decode()
    _upload(client, project, [{"prompt": f"question {i}"} for i in range(6)])
    response = client.post(url, {**form, "temperature": 9})
    assert response.status_code == 400 and 'data-field="temperature"' in response.content.decode()
    response = client.post(url, {**form, "mode": "side_by_side"})
    assert response.status_code == 400 and 'data-field="policies"' in response.content.decode()
    assert not GenerationJob.objects.exists()
    # a good request queues one job (the broker is not needed: the test sends no task)
    response = client.post(url, form, headers={"HX-Request": "true"})
    assert response.status_code == 202
    job = GenerationJob.objects.get(project=project)
    assert f'data-job="{job.pk}"' in response.content.decode()
    assert "hx-get" in response.content.decode()


def test_job_fragment_polls_while_queued_and_stops_when_done(world, tiny_policy_dir):  # noqa: F811
    project, client, _, _ = world
    _upload(client, project, [{"prompt": f"What is {i} + {i}?"} for i in range(4)])
    policy = ModelVersion.objects.create(
        name="tiny-page-policy", artifact_path=str(tiny_policy_dir), project=project
    )
    job = rounds.generation_job_create(
        project=project,
        user=None,
        policies=[policy.pk],
        n_prompts=3,
        sampling=[{"temperature": 1.2, "max_new_tokens": 8}],
        enqueue=False,
    )
    url = reverse("console:pool-job", args=[project.pk, job.pk])
    live = client.get(url)
    assert live.status_code == 200 and "data-job-status>queued<" in live.content.decode()
    rounds.generation_job_run(job_id=job.pk)
    done = client.get(url)
    assert done.status_code == 286  # htmx stops polling
    assert "data-job-round>Round 1 is open" in done.content.decode()
    assert "hx-get" not in done.content.decode()


def test_annotators_and_other_researchers_never_reach_the_pool_pages(world):
    project, _, annotator, _ = world
    outsider = make_user()
    add_member(make_project(), outsider, Membership.Role.RESEARCHER)
    job = GenerationJob.objects.create(project=project, source_key="fragment-job")
    for user, expected in ((annotator, 403), (outsider, 404)):
        client = Client()
        client.force_login(user)
        assert client.get(reverse("console:pool", args=[project.pk])).status_code == expected
        assert _upload(client, project, [{"prompt": "sneaky"}]).status_code == expected
        generate = client.post(reverse("console:pool-generate", args=[project.pk]), {})
        assert generate.status_code == expected
        job_url = reverse("console:pool-job", args=[project.pk, job.pk])
        assert client.get(job_url).status_code == expected
    assert not Prompt.objects.filter(text="sneaky").exists()
