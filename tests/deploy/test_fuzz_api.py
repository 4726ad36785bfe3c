"""Fuzzed API payloads: every operation in the OpenAPI schema answers a bad request with a 4xx.

Schemathesis reads the OpenAPI schema (drf-spectacular's generator, as /api/schema/ serves
it) and generates requests for each operation, both conforming ones and ones that break
the schema (wrong types, missing fields, out-of-range numbers, odd strings). Path
parameters mostly point at real rows of a small world (a project with items, a live lease,
a dataset, a run, a model) so that requests get past the 404 and reach validation. Requests
are sent in-process to the WSGI application as a staff researcher (who may call every
operation). Checked for each request:
- the answer is never a 5xx;
- a 4xx carries a JSON object saying what is wrong (`detail`, or per-field messages);
- a 4xx wrote nothing: the row count of every table of the project's apps is unchanged.
Each request runs in a savepoint that is rolled back, so every request sees the same world.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.apps import apps
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode

from annotation import services
from annotation.models import DatasetVersion, Membership, Round
from tests.factories import add_member, make_items, make_project, make_user
from training.models import ModelVersion, TrainingRun

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=int(os.environ.get("PREFLOOP_FUZZ_EXAMPLES", "40")),
    deadline=None,
    database=None,  # the checkout is shared: keep no example database in it
    suppress_health_check=list(HealthCheck),
)
REAL_ROW_MOSTLY = st.sampled_from([True, True, True, False])
APPS = ("annotation", "training", "evaluation", "auth", "authtoken", "django_celery_beat")


def _schema() -> schemathesis.BaseSchema:
    from drf_spectacular.generators import SchemaGenerator

    document = SchemaGenerator().get_schema(request=None, public=True)
    return schemathesis.openapi.from_dict(document)


SCHEMA = _schema()
OPERATIONS = sorted(
    (result.ok().method.upper(), result.ok().path) for result in SCHEMA.get_all_operations()
)


@pytest.fixture
def world(db, tmp_path, settings):
    """Return the ids path parameters point at, and a staff researcher's token."""
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project(name="fuzz", ask_rationale=True, ask_confidence=True, ask_strength=True)
    staff = make_user("fuzz-staff", staff=True)
    annotator = make_user("fuzz-annotator")
    add_member(project, staff, Membership.Role.RESEARCHER)
    add_member(project, annotator)
    round_ = Round.objects.create(project=project, number=1)
    items = make_items(project, 3, round_=round_)
    done = services.assignment_next(project_id=project.pk, user=annotator)
    services.judgment_submit(assignment_id=done.pk, user=annotator, choice="A")
    lease = services.assignment_next(project_id=project.pk, user=staff)
    folder = tmp_path / "dataset-v1"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
    (folder / "train.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    dataset = DatasetVersion.objects.create(
        project=project,
        version=1,
        status=DatasetVersion.Status.READY,
        content_hash="0" * 64,
        path=str(folder),
    )
    run = TrainingRun.objects.create(
        recipe="reward", project=project, dataset_version=dataset, status="queued"
    )
    model = ModelVersion.objects.create(
        name="fuzz-model", artifact_path=str(tmp_path / "model"), training_run=run
    )
    return {
        "token": Token.objects.create(user=staff).key,
        "ids": {
            "project_id": [project.pk],
            "assignment_id": [lease.pk, done.pk],
            "item_id": [i.pk for i in items],
            "user_id": [annotator.pk, staff.pk],
            "version": [dataset.version],
            "name": ["train.jsonl", "manifest.json"],
            "number": [round_.number],
            "run_id": [run.pk],
            "version_id": [model.pk],
        },
    }


@pytest.fixture
def wsgi_app():
    """Return the WSGI app; requests must not close the test transaction's connection."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def _counts() -> dict[str, int]:
    return {
        model._meta.label: model._default_manager.count()
        for label in APPS
        for model in apps.get_app_config(label).get_models()
    }


def _explains(body) -> bool:
    if not isinstance(body, dict) or not body:
        return False
    return "detail" in body or all(isinstance(v, list | dict | str) for v in body.values())


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_operation_answers_bad_requests_with_a_4xx_and_writes_nothing(
    method, path, world, wsgi_app
):
    operation = SCHEMA[path][method]
    cases = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @FUZZ
    @given(case=cases, data=st.data())
    def check(case, data):
        for name in list(case.path_parameters or {}):
            real = world["ids"].get(name)
            # mostly a real row, so validation is reached; sometimes what was generated
            if real and data.draw(REAL_ROW_MOSTLY, label=f"{name} is a real row"):
                case.path_parameters[name] = data.draw(st.sampled_from(real), label=name)
        with transaction.atomic():
            before = _counts()
            response = case.call(app=wsgi_app, headers={"Authorization": f"Token {world['token']}"})
            status = response.status_code
            assert status < 500, f"{case.as_curl_command()}\n{response.text[:3000]}"
            if 400 <= status < 500:
                assert _counts() == before, case.as_curl_command()
                if status not in (404, 405) and "json" in response.headers.get("Content-Type", ""):
                    assert _explains(response.json()), (case.as_curl_command(), response.text)
            transaction.set_rollback(True)

    check()


# ---- the annotators' hot path, by hand: submit with any body ------------------------------

ODD_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["A", "B", "tie", "both_bad", "slightly", "much", "", "a\x00b", "\ud800"]),
)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ODD_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=3),
    max_leaves=6,
)
SUBMIT_FIELDS = [
    "idempotency_key",
    "choice",
    "ranking",
    "strength",
    "confidence",
    "rationale",
    "time_spent_ms",
]
SUBMIT_BODY = st.one_of(
    st.fixed_dictionaries(
        {"choice": st.sampled_from(["A", "B", "tie"])},
        optional={
            "idempotency_key": st.one_of(st.uuids().map(str), ODD_TEXT),
            "strength": st.sampled_from(["", "slightly", "much"]),
            "confidence": st.integers(0, 6),
            "rationale": st.text(max_size=30),
            "time_spent_ms": st.integers(-1, 10**9),
        },
    ),
    st.dictionaries(st.sampled_from([*SUBMIT_FIELDS, "other"]), ANY_JSON, max_size=5),
    ANY_JSON,
)


def _as_bytes(body) -> bytes:
    import json

    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


@FUZZ
@given(body=SUBMIT_BODY)
def test_submit_answers_any_body_without_a_5xx_and_replays_exactly(world, body):
    from rest_framework.test import APIClient

    from annotation.models import Assignment, Judgment

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {world['token']}")
    lease_id = world["ids"]["assignment_id"][0]
    with transaction.atomic():
        assert Assignment.objects.get(pk=lease_id).status == Assignment.Status.LEASED
        before = _counts()
        url = f"/api/assignments/{lease_id}/submit/"
        first = client.post(url, _as_bytes(body), content_type="application/json")
        assert first.status_code < 500, first.content[:2000]
        if first.status_code >= 400:
            assert _counts() == before
            assert _explains(first.json()), first.content
        else:
            assert first.status_code == 201 and first.json()["replayed"] is False
            assert Judgment.objects.count() == before["annotation.Judgment"] + 1
            after = _counts()
            again = client.post(url, _as_bytes(body), content_type="application/json")
            if body.get("idempotency_key"):
                # the same key again: the first judgment, nothing new
                assert again.status_code == 200, again.content
                assert again.json() == {**first.json(), "replayed": True}
            else:
                assert again.status_code == 409 and again.json()["code"] == "already_submitted"
            assert _counts() == after
        transaction.set_rollback(True)
