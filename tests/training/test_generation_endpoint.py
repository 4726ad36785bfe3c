"""Policies behind an OpenAI-compatible endpoint, against a real `transformers serve` process.

The test starts `transformers serve` on a loopback port with its own tiny GPT-2 (built from a
config in seconds, no hub), declares it as an endpoint in settings, registers a policy by
endpoint and model name through the API, and generates a round from it through the loop's
own round builder. Endpoints that misbehave are served by tests/training/test_generation_faults.py.
"""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from annotation import services as annotation_services
from annotation.models import Candidate, Item, Membership, Round
from tests.factories import add_member, make_project, make_user
from tests.training.conftest import free_port as _free_port
from training import loop
from training.generation import GenerationError, GenerationSettings
from training.generation.endpoints import candidates_generate, model_version_endpoint_create
from training.models import ModelVersion
from training.processes import child_env


@pytest.fixture
def endpoints(settings, served_policy, monkeypatch):
    base_url, model = served_policy
    monkeypatch.setenv("HF_SERVE_BEARER", "not-a-real-key-but-secret")
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        "local-serve": {
            "base_url": base_url,
            "models": [model],
            "api_key_env": "HF_SERVE_BEARER",
            "concurrency": 4,
            "timeout_seconds": 60,
            "retries": 1,
        },
        "down": {"base_url": f"http://127.0.0.1:{_free_port()}", "models": ["m"], "retries": 0},
    }
    return model


def _researcher(project):
    user = make_user()
    add_member(project, user, Membership.Role.RESEARCHER)
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.django_db
def test_researchers_pick_a_declared_endpoint_and_model_by_name(endpoints):
    project = make_project()
    client = _researcher(project)

    listed = client.get("/api/training/generation-endpoints/")
    assert listed.status_code == 200
    assert {"name": "local-serve", "models": [endpoints]} in listed.json()
    assert (
        "base_url" not in json.dumps(listed.json()) and "127.0.0.1" not in listed.content.decode()
    )

    body = {"project_id": project.pk, "name": "served-v1", "endpoint": "local-serve"}
    unknown_endpoint = client.post(
        "/api/training/models/endpoint/", {**body, "model": endpoints, "endpoint": "nope"}
    )
    assert unknown_endpoint.status_code == 400
    assert unknown_endpoint.json()["field"] == "endpoint"
    unknown_model = client.post("/api/training/models/endpoint/", {**body, "model": "gpt-9"})
    assert unknown_model.status_code == 400 and unknown_model.json()["field"] == "model"
    url_instead = client.post(
        "/api/training/models/endpoint/",
        {**body, "endpoint": "http://10.0.0.1:8000", "model": endpoints},
    )
    assert url_instead.status_code == 400 and url_instead.json()["field"] == "endpoint"
    assert not ModelVersion.objects.exists()

    created = client.post("/api/training/models/endpoint/", {**body, "model": endpoints})
    assert created.status_code == 201, created.content
    version = ModelVersion.objects.get(pk=created.json()["id"])
    assert (version.kind, version.endpoint_name, version.endpoint_model) == (
        "endpoint",
        "local-serve",
        endpoints,
    )
    # the project's researchers see it; the key is nowhere in the row or the answer
    assert client.get(f"/api/training/models/{version.pk}/").status_code == 200
    assert "not-a-real-key" not in created.content.decode()
    again = client.post("/api/training/models/endpoint/", {**body, "model": endpoints})
    assert again.status_code == 409 and ModelVersion.objects.count() == 1

    # a researcher of another project cannot register for this one
    other = _researcher(make_project())
    refused = other.post(
        "/api/training/models/endpoint/", {**body, "name": "x", "model": endpoints}
    )
    assert refused.status_code == 404


@pytest.mark.django_db
def test_candidates_come_from_the_served_policy_with_their_exact_request(endpoints):
    version = model_version_endpoint_create(
        name="served", endpoint="local-serve", model=endpoints, project=make_project()
    )
    prompts = ["What is 1 + 2?", [{"role": "user", "content": "What is 3 + 4?"}]]
    settings = GenerationSettings(temperature=1.0, top_p=0.9, max_new_tokens=6, seed=2)
    done = []
    out = candidates_generate(
        model_version=version, prompts=prompts, k=3, settings=settings, progress=done.append
    )
    assert [len(row) for row in out] == [3, 3] and sum(done) == 6
    cand = out[1][2]
    config = cand["generation_config"]
    assert cand["model_name"] == "served"
    assert config["backend"] == "openai" and config["endpoint"] == "local-serve"
    assert config["request"]["path"] == "/v1/chat/completions"
    assert config["request"]["body"] == {
        "model": endpoints,
        "messages": prompts[1],
        "temperature": 1.0,
        "top_p": 0.9,
        "max_tokens": 6,
        "seed": config["seed"],
    }
    # the server really generated: it reports the tokens it produced for this request
    assert 0 < config["response"]["usage"]["completion_tokens"] <= 6
    assert len({c["generation_config"]["seed"] for c in out[0]}) == 3
    assert "not-a-real-key" not in json.dumps(out)


@pytest.mark.django_db
def test_the_loop_builds_a_round_from_an_endpoint_policy(endpoints):
    project = make_project(k=2)
    version = model_version_endpoint_create(
        name="served-round", endpoint="local-serve", model=endpoints, project=project
    )
    settings = loop.LoopSettings(
        path="dpo", seed=4, mix_previous=False, generation={"temperature": 1.0, "max_new_tokens": 8}
    )
    prompts = [f"What is {a} + {a}?" for a in range(4)]

    round_ = loop.round_generate(
        project=project,
        model_version=version,
        prompts=prompts,
        settings=settings,
        source_key="endpoint-test:gen",
    )

    items = Item.objects.filter(round=round_)
    assert items.exists()
    for cand in Candidate.objects.filter(slots__item__in=items):
        assert cand.model_name == "served-round"
        assert cand.policy_version_id == version.pk
        assert cand.generation_config["request"]["body"]["model"] == endpoints
        assert "not-a-real-key" not in json.dumps(cand.generation_config)


@pytest.mark.django_db
def test_an_endpoint_that_does_not_answer_leaves_no_round_to_annotate(endpoints):
    project = make_project(k=2)
    annotator = make_user()
    add_member(project, annotator)
    version = model_version_endpoint_create(
        name="down-policy", endpoint="down", model="m", project=project
    )
    settings = loop.LoopSettings(
        path="dpo", seed=1, mix_previous=False, generation={"max_new_tokens": 4}
    )

    with pytest.raises(GenerationError, match=r"endpoint 'down': the server does not answer"):
        loop.round_generate(
            project=project,
            model_version=version,
            prompts=["a", "b", "c"],
            settings=settings,
            source_key="down:gen",
        )

    round_ = Round.objects.get(project=project, source_key="down:gen")
    assert not round_.items.exists() and not Candidate.objects.filter(prompt__project=project)
    assert annotation_services.assignment_next(project_id=project.pk, user=annotator) is None


@pytest.mark.django_db
def test_an_endpoint_policy_is_refused_as_a_training_base(endpoints):
    from training.config_policy import InvalidTrainingConfig, model_version_folder

    version = model_version_endpoint_create(name="e", endpoint="local-serve", model=endpoints)
    with pytest.raises(InvalidTrainingConfig, match="base_model_id: a policy behind an endpoint"):
        model_version_folder(version=version, field="base_model_id")


def test_the_endpoint_key_never_reaches_a_training_process(settings, monkeypatch):
    # given keys under names the training environment would otherwise pass on
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        "a": {"base_url": "http://127.0.0.1:1", "models": ["m"], "api_key_env": "HF_SERVE_BEARER"},
        "b": {"base_url": "http://127.0.0.1:1", "models": ["m"], "api_key_env": "GEN_BEARER"},
    }
    settings.PREFLOOP_TRAINING_ENV_PASSTHROUGH = ["GEN_BEARER", "GEN_HARMLESS"]
    monkeypatch.setenv("HF_SERVE_BEARER", "k1")
    monkeypatch.setenv("GEN_BEARER", "k2")
    monkeypatch.setenv("GEN_HARMLESS", "ok")
    monkeypatch.setenv("HF_HOME", "/tmp/hf")

    env = child_env()

    assert "HF_SERVE_BEARER" not in env and "GEN_BEARER" not in env
    assert env["GEN_HARMLESS"] == "ok" and env["HF_HOME"] == "/tmp/hf"


@pytest.mark.django_db
def test_a_missing_key_variable_is_named_before_any_request(settings, monkeypatch):
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        "hosted": {
            "base_url": "https://api.example.org",
            "models": ["m"],
            "api_key_env": "HOSTED_KEY",
        }
    }
    monkeypatch.delenv("HOSTED_KEY", raising=False)
    version = model_version_endpoint_create(name="hosted", endpoint="hosted", model="m")
    with pytest.raises(GenerationError, match="HOSTED_KEY holding its key is not set"):
        candidates_generate(
            model_version=version, prompts=["a"], k=1, settings=GenerationSettings()
        )


@pytest.mark.parametrize(
    ("endpoints", "problem"),
    [
        ({"x": {"base_url": "file:///etc", "models": ["m"]}}, r"base_url must be an http\(s\) URL"),
        ({"x": {"base_url": "http://h", "models": []}}, "models must be a non-empty list"),
        ({"x": {"base_url": "http://h", "models": ["m"], "api_key": "sk-1"}}, "unknown key"),
        ({"x": {"base_url": "http://h", "models": ["m"], "concurrency": 0}}, "concurrency >= 1"),
    ],
)
def test_malformed_endpoint_settings_fail_the_system_check(settings, endpoints, problem):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.PREFLOOP_GENERATION_ENDPOINTS = endpoints
    with pytest.raises(SystemCheckError, match=problem):
        call_command("check")
