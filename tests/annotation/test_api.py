"""REST API: permissions, blind payloads, clear 4xx on bad input, query budgets."""

import io
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from annotation.models import Item, Judgment, Membership, Project
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def setup():
    project = make_project(overlap=2, ask_strength=True)
    annotator, researcher, outsider = make_user(), make_user(), make_user()
    add_member(project, annotator)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    make_items(project, 3, models=("gpt-secret", "llama-secret"))
    return project, annotator, researcher, outsider


def test_anonymous_is_refused_everywhere(setup):
    project, *_ = setup
    client = APIClient()
    for url in (f"/api/projects/{project.pk}/next/", f"/api/projects/{project.pk}/import/"):
        assert client.post(url).status_code in (401, 403)
    assert client.get("/api/projects/").status_code in (401, 403)


def test_outsider_sees_no_project_and_cannot_be_served(setup):
    project, _, _, outsider = setup
    client = _client(outsider)
    assert client.get("/api/projects/").json() == []
    assert client.get(f"/api/projects/{project.pk}/").status_code == 404
    assert client.post(f"/api/projects/{project.pk}/next/").status_code == 404


def test_annotator_cannot_import_or_manage_rounds(setup):
    project, annotator, *_ = setup
    client = _client(annotator)
    assert client.get(f"/api/projects/{project.pk}/rounds/").status_code == 403
    assert client.post(f"/api/projects/{project.pk}/import/").status_code == 403
    detail = client.get(f"/api/projects/{project.pk}/").json()
    assert "overlap" not in detail and "gold_rate" not in detail


def test_next_submit_round_trip_hides_identity(setup):
    project, annotator, *_ = setup
    client = _client(annotator)
    r = client.post(f"/api/projects/{project.pk}/next/")
    assert r.status_code == 200
    body = r.content.decode()
    for secret in ("secret", "ckpt", "gold", "temperature", "model"):
        assert secret not in body
    aid = r.json()["assignment_id"]
    s = client.post(
        f"/api/assignments/{aid}/submit/",
        {"choice": "B", "strength": "much", "idempotency_key": "x1", "time_spent_ms": 5300},
        format="json",
    )
    assert s.status_code == 201
    again = client.post(
        f"/api/assignments/{aid}/submit/", {"choice": "B", "idempotency_key": "x1"}, format="json"
    )
    assert again.status_code == 200 and again.json()["replayed"] is True
    j = Judgment.objects.get()
    assert (j.strength, j.time_spent_ms, j.shown_choice) == ("much", 5300, "B")


@pytest.mark.parametrize(
    "body, code",
    [
        ({"choice": "Z"}, "choice"),
        ({"choice": "A", "confidence": 4}, "choice_disabled"),
        ({"ranking": [1, 2]}, "choice"),
        ({"choice": "A", "strength": "enormous"}, "strength"),
    ],
)
def test_bad_submits_get_a_clear_4xx_and_write_nothing(setup, body, code):
    project, annotator, *_ = setup
    client = _client(annotator)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    r = client.post(f"/api/assignments/{aid}/submit/", body, format="json")
    assert r.status_code == 400
    assert r.json()["code"] == code and r.json()["detail"]
    assert Judgment.objects.count() == 0


def test_submit_with_bad_types_is_a_400(setup):
    project, annotator, *_ = setup
    client = _client(annotator)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    r = client.post(f"/api/assignments/{aid}/submit/", {"time_spent_ms": "soon"}, format="json")
    assert r.status_code == 400
    r = client.post(f"/api/assignments/{aid}/submit/", "not json", content_type="application/json")
    assert r.status_code == 400


def test_skip_and_heartbeat(setup):
    project, annotator, *_ = setup
    client = _client(annotator)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    assert client.post(f"/api/assignments/{aid}/heartbeat/").status_code == 200
    assert client.post(f"/api/assignments/{aid}/skip/", {}, format="json").status_code == 400
    r = client.post(f"/api/assignments/{aid}/skip/", {"reason": "offensive"}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "skipped"
    assert client.post(f"/api/assignments/{aid}/heartbeat/").status_code == 409


def test_progress_counts(setup):
    project, annotator, researcher, _ = setup
    client = _client(annotator)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    client.post(f"/api/assignments/{aid}/submit/", {"choice": "A"}, format="json")
    p = client.get(f"/api/projects/{project.pk}/progress/").json()
    assert p["items"] == 3 and p["judgments_needed"] == 6
    # Annotators see their own count and the project's in whole percent (1 of 6 -> 16%).
    assert p["my_judgments"] == 1 and p["fraction_complete"] == 0.16
    assert p["judgments_done"] == 1
    # Researchers see the live totals.
    p = _client(researcher).get(f"/api/projects/{project.pk}/progress/").json()
    assert p["judgments_done"] == 1 and p["my_judgments"] == 0


def test_researcher_imports_jsonl_atomically_with_every_bad_line_reported(setup):
    project, _, researcher, _ = setup
    client = _client(researcher)
    good = {
        "id": "g1",
        "prompt": "What is 2+2?",
        "candidates": [
            {"text": "4", "model_name": "m1", "generation_config": {"temperature": 0.7, "seed": 1}},
            {"text": "5", "model_name": "m2"},
        ],
    }
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps({"prompt": "x", "candidates": [{"text": "only one"}]}),
        json.dumps({**good, "id": "g2", "candidates": [{"text": "a"}, {"text": "a"}]}),
        json.dumps({**good, "id": "g1", "prompt": "other"}),
        json.dumps({**good, "id": "g3", "prompt": "y" * 200_000}),
    ]
    upload = io.BytesIO("\n".join(lines).encode())
    upload.name = "items.jsonl"
    before = Item.objects.count()
    r = client.post(f"/api/projects/{project.pk}/import/", {"file": upload}, format="multipart")
    assert r.status_code == 400
    bad_lines = sorted({e["line"] for e in r.json()["errors"]})
    assert bad_lines == [2, 3, 4, 5, 6]
    assert Item.objects.count() == before
    upload = io.BytesIO((json.dumps(good) + "\n").encode())
    upload.name = "items.jsonl"
    r = client.post(f"/api/projects/{project.pk}/import/", {"file": upload}, format="multipart")
    assert r.status_code == 201 and r.json()["items_created"] == 1
    assert Item.objects.count() == before + 1


def test_staff_creates_projects_and_constraints_are_checked():
    staff = make_user(staff=True)
    client = _client(staff)
    r = client.post("/api/projects/", {"name": "p", "task_kind": "pairwise", "k": 3}, format="json")
    assert r.status_code == 400
    r = client.post(
        "/api/projects/", {"name": "p", "task_kind": "ranking", "k": 4, "overlap": 2}, format="json"
    )
    assert r.status_code == 201
    assert Project.objects.get(name="p").memberships.get().role == "researcher"
    assert (
        _client(make_user()).post("/api/projects/", {"name": "q"}, format="json").status_code == 403
    )


def test_query_budget_of_next_and_submit(setup):
    # The serving path must not creep: count the queries of next and submit.
    project, annotator, *_ = setup
    client = _client(annotator)
    with CaptureQueriesContext(connection) as next_queries:
        aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    with CaptureQueriesContext(connection) as submit_queries:
        client.post(
            f"/api/assignments/{aid}/submit/",
            {"choice": "A", "idempotency_key": "q1"},
            format="json",
        )
    assert len(next_queries) <= 12, [q["sql"] for q in next_queries.captured_queries]
    assert len(submit_queries) <= 9, [q["sql"] for q in submit_queries.captured_queries]
