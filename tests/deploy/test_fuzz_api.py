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

The same operations are then fuzzed as an annotator of the project and as a researcher of
another project (`test_operation_as_a_role_...`). Path parameters always name the project's
rows (for the annotator, other people's assignments), and ids in JSON bodies mostly do too.
Whether a role may touch an operation comes from the URL table in tests/deploy/url_access.py.
Checked: never a 5xx; never a 2xx where the role may not touch; and nothing the role may not
see (the model, dataset, run, or for the outsider the project itself) in any answer.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.apps import apps
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from django.urls import Resolver404, resolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode

from annotation import services
from annotation.models import DatasetVersion, ImportJob, Membership, Round
from tests.deploy.url_access import GIVEAWAYS, rule_for
from tests.factories import add_member, make_items, make_project, make_user
from training.models import ModelVersion, TrainingRun

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=int(os.environ.get("PREFLOOP_FUZZ_EXAMPLES", "40")),
    deadline=None,
    database=None,  # the checkout is shared: keep no example database in it
    suppress_health_check=list(HealthCheck),
)
# Fewer examples per operation for each of the two roles: a refusal is reached early.
ROLE_FUZZ = settings(FUZZ, max_examples=int(os.environ.get("PREFLOOP_FUZZ_ROLE_EXAMPLES", "12")))
REAL_ROW_MOSTLY = st.sampled_from([True, True, True, False])
# Planted in the project's rows: names no annotator or outsider may read.
SECRET_PROJECT = "fuzz-secret-project-5150"
SECRET_MODEL = "fuzz-secret-model-8128"
SECRET_DATASET = "fuzz-secret-dataset-3141"
SECRET_RUN = "fuzz-secret-run-2236"
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
    project = make_project(
        name=SECRET_PROJECT, ask_rationale=True, ask_confidence=True, ask_strength=True
    )
    staff = make_user("fuzz-staff", staff=True)
    annotator = make_user("fuzz-annotator")
    colleague = make_user("fuzz-colleague")
    add_member(project, staff, Membership.Role.RESEARCHER)
    add_member(project, annotator)
    add_member(project, colleague)
    # A researcher of another project, which has nothing of its own.
    elsewhere = make_project(name="fuzz-elsewhere")
    other_researcher = make_user("fuzz-other-researcher")
    add_member(elsewhere, other_researcher, Membership.Role.RESEARCHER)
    round_ = Round.objects.create(project=project, number=1)
    items = make_items(project, 3, round_=round_, models=(SECRET_MODEL, "fuzz-baseline"))
    done = services.assignment_next(project_id=project.pk, user=annotator)
    services.judgment_submit(assignment_id=done.pk, user=annotator, choice="A")
    lease = services.assignment_next(project_id=project.pk, user=staff)
    colleague_done = services.assignment_next(project_id=project.pk, user=colleague)
    services.judgment_submit(assignment_id=colleague_done.pk, user=colleague, choice="B")
    colleague_lease = services.assignment_next(project_id=project.pk, user=colleague)
    folder = tmp_path / "dataset-v1"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
    (folder / "train.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    dataset = DatasetVersion.objects.create(
        project=project,
        version=1,
        name=SECRET_DATASET,
        status=DatasetVersion.Status.READY,
        content_hash="0" * 64,
        path=str(folder),
    )
    run = TrainingRun.objects.create(
        recipe="reward",
        project=project,
        dataset_version=dataset,
        status="queued",
        config={"note": SECRET_RUN},
    )
    model = ModelVersion.objects.create(
        name=SECRET_MODEL, artifact_path=str(tmp_path / "model"), training_run=run
    )
    job = ImportJob.objects.create(project=project, kind=ImportJob.Kind.ITEMS)
    p_ids = {
        "project_id": [project.pk],
        "job_id": [job.pk],
        "item_id": [i.pk for i in items],
        "user_id": [annotator.pk, colleague.pk],
        "version": [dataset.version],
        "name": ["train.jsonl", "manifest.json"],
        "number": [round_.number],
        "run_id": [run.pk],
        "version_id": [model.pk],
    }
    return {
        "token": Token.objects.create(user=staff).key,
        # Per role: its token, the ids its path parameters take, the ids its bodies take,
        # and what it must never read.
        "roles": {
            "annotator": {
                "token": Token.objects.create(user=annotator).key,
                "ids": {
                    **p_ids,
                    "assignment_id": [lease.pk, colleague_done.pk, colleague_lease.pk],
                },
                "secrets": (SECRET_MODEL, SECRET_DATASET, SECRET_RUN),
            },
            "other_researcher": {
                "token": Token.objects.create(user=other_researcher).key,
                "ids": {**p_ids, "assignment_id": [lease.pk, done.pk, colleague_lease.pk]},
                "secrets": (SECRET_PROJECT, SECRET_MODEL, SECRET_DATASET, SECRET_RUN),
            },
        },
        "body_ids": {
            "project_id": [project.pk, elsewhere.pk],
            "dataset_version_id": [dataset.pk],
            "base_model_id": [model.pk],
            "round": [round_.number],
            "username": [annotator.username, colleague.username],
        },
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
            "job_id": [job.pk],
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


def _may_touch(role: str, method: str, path: str, path_parameters: dict) -> bool:
    """Return whether the URL table lets the role use this method on this URL."""
    try:
        name = resolve(path).view_name
    except Resolver404:
        return False
    rule = rule_for(name)
    allowed = getattr(rule, method.lower(), None) if rule else None
    # Roles get only other people's assignments, which no one else may use.
    return bool(allowed) and role in allowed and "assignment_id" not in path_parameters


ROLES = ("annotator", "other_researcher")
ROLE_CASES = [(role, m, p) for role in ROLES for m, p in OPERATIONS]


@pytest.mark.parametrize(
    ("role", "method", "path"), ROLE_CASES, ids=[f"{r} {m} {p}" for r, m, p in ROLE_CASES]
)
def test_operation_as_a_role_never_lets_in_where_it_may_not_and_never_fails(
    role, method, path, world, wsgi_app
):
    operation = SCHEMA[path][method]
    me = world["roles"][role]
    cases = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @ROLE_FUZZ
    @given(case=cases, data=st.data())
    def check(case, data):
        # Path parameters always name the project's rows, so a 2xx means a door was open.
        for name in list(case.path_parameters or {}):
            if name in me["ids"]:
                case.path_parameters[name] = data.draw(st.sampled_from(me["ids"][name]), label=name)
        if isinstance(case.body, dict):
            for name, real in world["body_ids"].items():
                if name in case.body and data.draw(REAL_ROW_MOSTLY, label=f"{name} is real"):
                    case.body[name] = data.draw(st.sampled_from(real), label=name)
        allowed = _may_touch(role, method, case.formatted_path, case.path_parameters or {})
        with transaction.atomic():
            before = _counts()
            response = case.call(app=wsgi_app, headers={"Authorization": f"Token {me['token']}"})
            status = response.status_code
            where = f"as {role}: {status}\n{case.as_curl_command()}\n{response.text[:2000]}"
            assert status < 500, where
            if not allowed:
                assert not 200 <= status < 300, where
                assert _counts() == before, where
            leaked = [s for s in me["secrets"] if s in response.text]
            assert not leaked, f"{where}\nshows {leaked}"
            if path not in ("/api/schema/",):
                match = GIVEAWAYS.search(response.text)
                assert match is None, f"{where}\nshows {match.group(0)!r}"
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
