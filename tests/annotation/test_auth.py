"""Token authentication in one query: who may call, and which label source they get."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from annotation import services
from annotation.models import Assignment, Judgment, LabelSource
from tests.factories import add_member, make_items, make_project, make_user, token_client

pytestmark = pytest.mark.django_db


def _label_one(client, project) -> Judgment:
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    response = client.post(
        f"/api/assignments/{aid}/submit/", {"choice": "A", "idempotency_key": "k"}, format="json"
    )
    assert response.status_code == 201, response.content
    return Judgment.objects.get(pk=response.json()["judgment_id"])


def test_wrong_token_and_inactive_user_are_refused_and_write_nothing():
    project = make_project()
    user = make_user()
    add_member(project, user)
    make_items(project, 2)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    response = client.post(f"/api/projects/{project.pk}/next/")
    assert response.status_code == 401 and response.json()["detail"] == "Invalid token."
    client = token_client(user)
    user.is_active = False
    user.save(update_fields=["is_active"])
    response = client.post(f"/api/projects/{project.pk}/next/")
    assert response.status_code == 401 and "inactive" in response.json()["detail"]
    assert not Assignment.objects.exists()


def test_token_caller_is_the_token_owner():
    project = make_project()
    alice, bob = make_user(), make_user()
    add_member(project, alice)
    add_member(project, bob)
    make_items(project, 2)
    judgment = _label_one(token_client(bob), project)
    assert judgment.annotator_id == bob.pk and judgment.source == LabelSource.HUMAN


@pytest.mark.parametrize("source", [LabelSource.SIMULATED, LabelSource.AI])
def test_machine_accounts_label_as_machines_by_token_and_by_session(source):
    project = make_project()
    make_items(project, 2)
    key = services.simulated_annotator_ensure(project=project, username="bot", source=source)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert _label_one(client, project).source == source
    # Session (or any non-token) authentication finds the group with its own query.
    session = APIClient()
    session.force_login(Token.objects.get(key=key).user)
    aid = session.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    response = session.post(f"/api/assignments/{aid}/submit/", {"choice": "B"}, format="json")
    assert Judgment.objects.get(pk=response.json()["judgment_id"]).source == source


def test_query_budget_with_token_authentication():
    # Counts the authentication query too (not the savepoints of the test's transaction).
    project = make_project(overlap=2)
    user = make_user()
    add_member(project, user)
    make_items(project, 3)
    client = token_client(user)
    with CaptureQueriesContext(connection) as next_queries:
        aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    with CaptureQueriesContext(connection) as submit_queries:
        body = {"choice": "A", "idempotency_key": "q"}
        response = client.post(f"/api/assignments/{aid}/submit/", body, format="json")
    assert response.status_code == 201
    assert len(_statements(next_queries)) <= 5, _statements(next_queries)
    assert len(_statements(submit_queries)) <= 3, _statements(submit_queries)


def test_query_budget_of_submit_returning_the_next_item():
    # One round trip costs fewer statements than the submit and the next it replaces (3 + 5).
    project = make_project(overlap=2)
    user = make_user()
    add_member(project, user)
    make_items(project, 3)
    client = token_client(user)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    with CaptureQueriesContext(connection) as queries:
        body = {"choice": "A", "idempotency_key": "q", "next": True}
        response = client.post(f"/api/assignments/{aid}/submit/", body, format="json")
    assert response.status_code == 201 and response.json()["next"] is not None
    # Token, assignment lock, judgment record, claim (with its lease and payload): the
    # overdue-lease sweep runs once every LEASE_SWEEP_EVERY claims, and ran for the first.
    assert len(_statements(queries)) <= 4, _statements(queries)


def _statements(captured) -> list[str]:
    return [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]
