"""No acknowledged judgment is deleted by accident: deletes are refused, users deactivated,
projects and rounds archived, and the admin shows judgments read-only."""

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from annotation.models import Assignment, Item, Judgment, Membership, Round
from tests.factories import add_member, make_items, make_project, make_user, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def labelled():
    """A project with one acknowledged judgment by an annotator who has a token."""
    project = make_project(overlap=2)
    annotator, researcher = make_user(), make_user()
    add_member(project, annotator)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    make_items(project, 3)
    client = token_client(annotator)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    response = client.post(
        f"/api/assignments/{aid}/submit/", {"choice": "A", "idempotency_key": "k"}, format="json"
    )
    assert response.status_code == 201
    judgment = Judgment.objects.get(pk=response.json()["judgment_id"])
    return project, annotator, researcher, judgment, client


def _staff_client() -> Client:
    client = Client()
    client.force_login(make_user(staff=True))
    return client


def _survives(judgment: Judgment) -> None:
    kept = Judgment.objects.get(pk=judgment.pk)
    assert (kept.annotator_id, kept.item_id, kept.assignment_id, kept.choice) == (
        judgment.annotator_id,
        judgment.item_id,
        judgment.assignment_id,
        judgment.choice,
    )


def test_deleting_anything_that_holds_a_judgment_is_refused(labelled):
    project, annotator, _, judgment, _ = labelled
    holders = [
        annotator,
        project,
        Round.objects.get(project=project),
        Item.objects.get(pk=judgment.item_id),
        Assignment.objects.get(pk=judgment.assignment_id),
    ]
    for holder in holders:
        with pytest.raises(ProtectedError), transaction.atomic():
            holder.delete()
    _survives(judgment)


def test_admin_refuses_to_delete_a_user_project_or_round_with_judgments(labelled):
    project, annotator, _, judgment, _ = labelled
    client = _staff_client()
    round_ = Round.objects.get(project=project)
    for url in (
        f"/admin/auth/user/{annotator.pk}/delete/",
        f"/admin/annotation/project/{project.pk}/delete/",
        f"/admin/annotation/round/{round_.pk}/delete/",
    ):
        response = client.post(url, {"post": "yes"})
        assert response.status_code == 200, url  # the "cannot delete" page, not a redirect
        assert "<title>Cannot delete" in response.content.decode()
    assert get_user_model().objects.filter(pk=annotator.pk).exists()
    _survives(judgment)


def test_admin_deactivates_a_user_who_keeps_their_judgments(labelled):
    project, annotator, _, judgment, client = labelled
    response = _staff_client().post(
        "/admin/auth/user/", {"action": "deactivate_users", "_selected_action": [annotator.pk]}
    )
    assert response.status_code == 302
    annotator.refresh_from_db()
    assert not annotator.is_active
    assert client.post(f"/api/projects/{project.pk}/next/").status_code == 401
    assert not Token.objects.filter(user=annotator).exists()
    _survives(judgment)


def test_admin_shows_judgments_read_only(labelled):
    *_, judgment, _ = labelled
    client = _staff_client()
    base = "/admin/annotation/judgment/"
    assert client.get(base).status_code == 200
    page = client.get(f"{base}{judgment.pk}/change/")
    assert page.status_code == 200 and b"View judgment" in page.content
    assert b'name="_save"' not in page.content
    other = "B" if judgment.choice == "A" else "A"
    assert client.post(f"{base}{judgment.pk}/change/", {"choice": other}).status_code == 403
    assert client.post(f"{base}{judgment.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get(f"{base}add/").status_code == 403
    response = client.post(base, {"action": "delete_selected", "_selected_action": [judgment.pk]})
    assert response.status_code in (200, 302)
    _survives(judgment)


def test_archived_project_is_hidden_from_annotators_and_readable_to_researchers(labelled):
    project, annotator, researcher, judgment, client = labelled
    response = _staff_client().post(
        "/admin/annotation/project/",
        {"action": "archive_projects", "_selected_action": [project.pk]},
    )
    assert response.status_code == 302
    project.refresh_from_db()
    assert project.archived
    # Annotators: not listed, not served, no task page.
    assert client.get("/api/projects/").json() == []
    assert client.post(f"/api/projects/{project.pk}/next/").status_code == 404
    assert client.get(f"/api/projects/{project.pk}/progress/").status_code == 404
    web = Client()
    web.force_login(annotator)
    assert project.name not in web.get("/").content.decode()
    assert web.get(f"/annotate/{project.pk}/").status_code == 404
    # Researchers: listed, readable, exportable.
    api = APIClient()
    api.force_authenticate(researcher)
    assert [p["id"] for p in api.get("/api/projects/").json()] == [project.pk]
    body = {"name": "archived", "sync": True, "policy": {"split": {"train": 1.0}, "hf": False}}
    export = api.post(f"/api/projects/{project.pk}/datasets/", body, format="json")
    assert export.status_code == 201, export.content
    assert export.json()["split_counts"]["train"] == 1
    _survives(judgment)


def test_archived_round_is_closed_for_good(labelled):
    project, _, _, judgment, client = labelled
    round_ = Round.objects.get(project=project)
    client.post(f"/api/projects/{project.pk}/next/")  # a live lease on another item
    response = _staff_client().post(
        "/admin/annotation/round/", {"action": "archive_rounds", "_selected_action": [round_.pk]}
    )
    assert response.status_code == 302
    round_.refresh_from_db()
    assert round_.archived and round_.status == Round.Status.CLOSED
    with pytest.raises(IntegrityError), transaction.atomic():
        Round.objects.filter(pk=round_.pk).update(status=Round.Status.OPEN)
    _survives(judgment)
