"""Prefetch: the item after the current one, held under its own lease for the annotator page."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from annotation.models import Assignment, Item
from tests.factories import add_member, make_items, make_project, make_user, token_client


def _annotator(project):
    user = make_user()
    add_member(project, user)
    return user, token_client(user)


@pytest.mark.django_db
def test_prefetch_holds_another_item_under_its_own_lease_and_submit_serves_it_next():
    # Given an annotator with a current item and three more left
    project = make_project(overlap=1)
    user, client = _annotator(project)
    make_items(project, 4, models=("secret-model-x", "secret-model-y"))
    current = client.post(f"/api/projects/{project.pk}/next/").json()

    # When the page prefetches twice
    ahead = client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json")
    again = client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json").json()

    # Then one other item is held ahead, the same both times, and `next` keeps the current one
    assert ahead.status_code == 200, ahead.content
    ahead = ahead.json()
    assert again["assignment_id"] == ahead["assignment_id"] != current["assignment_id"]
    held = Assignment.objects.get(pk=ahead["assignment_id"])
    assert held.ahead and held.status == Assignment.Status.LEASED
    assert held.item_id != Assignment.objects.get(pk=current["assignment_id"]).item_id
    assert "secret-model" not in str(ahead)
    nxt = client.post(f"/api/projects/{project.pk}/next/").json()
    assert nxt["assignment_id"] == current["assignment_id"]
    assert Assignment.objects.filter(status=Assignment.Status.LEASED).count() == 2

    # When the current item is submitted asking for the next and the one after it
    body = {"choice": "A", "idempotency_key": "p1", "next": True, "ahead": True}
    response = client.post(f"/api/assignments/{current['assignment_id']}/submit/", body, "json")

    # Then the held item is the next one (no longer ahead) and a fourth item is held ahead
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["next"]["assignment_id"] == ahead["assignment_id"]
    assert not Assignment.objects.get(pk=ahead["assignment_id"]).ahead
    new_ahead = Assignment.objects.get(pk=answer["ahead"]["assignment_id"])
    assert new_ahead.ahead and new_ahead.status == Assignment.Status.LEASED
    items = set(Assignment.objects.filter(annotator=user).values_list("item_id", flat=True))
    assert len(items) == 3
    # and a replay returns the same two
    replay = client.post(f"/api/assignments/{current['assignment_id']}/submit/", body, "json")
    assert replay.status_code == 200
    assert replay.json()["next"]["assignment_id"] == answer["next"]["assignment_id"]
    assert replay.json()["ahead"]["assignment_id"] == answer["ahead"]["assignment_id"]


@pytest.mark.django_db
def test_the_database_refuses_a_second_item_held_ahead():
    project = make_project(overlap=1)
    user, client = _annotator(project)
    make_items(project, 3)
    client.post(f"/api/projects/{project.pk}/next/")
    held = client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json").json()
    held = Assignment.objects.get(pk=held["assignment_id"])
    other = Item.objects.exclude(assignments__annotator=user).first()
    with pytest.raises(IntegrityError), transaction.atomic():
        Assignment.objects.create(
            project=project,
            item=other,
            annotator=user,
            display_order=[0, 1],
            lease_expires=held.lease_expires,
            ahead=True,
        )


@pytest.mark.django_db
def test_release_gives_the_held_item_to_another_annotator():
    # Given two items, overlap 1: the first annotator has one and holds the other ahead
    project = make_project(overlap=1)
    _, client = _annotator(project)
    make_items(project, 2)
    current = client.post(f"/api/projects/{project.pk}/next/").json()
    held = client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json").json()
    other_user, other = _annotator(project)
    assert other.post(f"/api/projects/{project.pk}/next/").status_code == 204

    # When someone else tries to release it, or the annotator tries to release the current one
    stranger = other.post(f"/api/assignments/{held['assignment_id']}/release/")
    not_ahead = client.post(f"/api/assignments/{current['assignment_id']}/release/")

    # Then nothing changes
    assert stranger.status_code == 404
    assert not_ahead.status_code == 409 and not_ahead.json()["code"] == "not_ahead"
    assert Assignment.objects.filter(status=Assignment.Status.LEASED).count() == 2

    # When the annotator leaves the page (release, twice: a beacon may be repeated)
    released = client.post(f"/api/assignments/{held['assignment_id']}/release/")
    twice = client.post(f"/api/assignments/{held['assignment_id']}/release/")

    # Then the item goes back and the other annotator is served it
    assert released.status_code == 200 and released.json()["status"] == "expired"
    assert twice.status_code == 200
    theirs = other.post(f"/api/projects/{project.pk}/next/").json()
    got = Assignment.objects.get(pk=theirs["assignment_id"])
    assert got.item_id == Assignment.objects.get(pk=held["assignment_id"]).item_id
    assert got.annotator_id == other_user.pk


@pytest.mark.django_db
def test_heartbeat_renews_and_expiry_returns_the_held_item():
    project = make_project(overlap=1, lease_seconds=60)
    _, client = _annotator(project)
    make_items(project, 2)
    client.post(f"/api/projects/{project.pk}/next/")
    held = client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json").json()
    aid = held["assignment_id"]
    Assignment.objects.filter(pk=aid).update(lease_expires=timezone.now() + timedelta(seconds=5))
    beat = client.post(f"/api/assignments/{aid}/heartbeat/")
    assert beat.status_code == 200
    assert Assignment.objects.get(pk=aid).lease_expires > timezone.now() + timedelta(seconds=50)

    # When the held lease runs out, another annotator gets its item
    Assignment.objects.filter(pk=aid).update(lease_expires=timezone.now() - timedelta(seconds=1))
    _, other = _annotator(project)
    theirs = other.post(f"/api/projects/{project.pk}/next/").json()
    assert Assignment.objects.get(pk=aid).status == Assignment.Status.EXPIRED
    assert (
        Assignment.objects.get(pk=theirs["assignment_id"]).item_id
        == Assignment.objects.get(pk=aid).item_id
    )


@pytest.mark.django_db
def test_gold_is_not_held_ahead_once_no_primary_work_remains():
    # Given one primary item (now current) and gold: no primary work remains beyond it
    project = make_project(overlap=1, gold_rate=0.0)
    _, client = _annotator(project)
    make_items(project, 1)
    make_items(project, 2, gold=["A", "B"])
    first = client.post(f"/api/projects/{project.pk}/next/").json()
    assert not Assignment.objects.get(pk=first["assignment_id"]).item.is_gold
    project.gold_rate = 1.0
    project.save(update_fields=["gold_rate"])

    # Then the prefetch answers 204 (done), as `next` would, instead of revealing a gold item
    response = client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json")
    assert response.status_code == 204
    assert Assignment.objects.filter(ahead=True).count() == 0


@pytest.mark.django_db
def test_next_serves_the_held_item_when_the_current_one_is_gone():
    project = make_project(overlap=1)
    _, client = _annotator(project)
    make_items(project, 3)
    current = client.post(f"/api/projects/{project.pk}/next/").json()
    held = client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json").json()
    client.post(f"/api/assignments/{current['assignment_id']}/skip/", {"reason": "unsure"})
    nxt = client.post(f"/api/projects/{project.pk}/next/").json()
    assert nxt["assignment_id"] == held["assignment_id"]
    assert not Assignment.objects.get(pk=held["assignment_id"]).ahead


@pytest.mark.django_db
def test_prefetch_checks_membership_and_input():
    project = make_project(overlap=1)
    make_items(project, 2)
    _, stranger = _annotator(make_project())
    assert stranger.post(f"/api/projects/{project.pk}/prefetch/").status_code == 404
    _, client = _annotator(project)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    bad = client.post(
        f"/api/assignments/{aid}/submit/", {"choice": "A", "ahead": True}, format="json"
    )
    assert bad.status_code == 400 and "ahead" in bad.json()
    assert not Assignment.objects.filter(status=Assignment.Status.SUBMITTED).exists()


@pytest.mark.django_db
def test_the_skip_that_spends_the_budget_gives_the_held_item_back():
    # Given an annotator allowed two skips in a row, with an item held ahead
    project = make_project(overlap=1, max_skips_in_row=2)
    user, client = _annotator(project)
    make_items(project, 5)
    first = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    skip = {"reason": "unclear"}
    assert client.post(f"/api/assignments/{first}/skip/", skip, format="json").status_code == 200
    second = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    held = client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json").json()

    # When the second skip spends the budget
    assert client.post(f"/api/assignments/{second}/skip/", skip, format="json").status_code == 200

    # Then the held item is not served past the budget: it went back, and next answers 429
    assert Assignment.objects.get(pk=held["assignment_id"]).status == Assignment.Status.EXPIRED
    assert client.post(f"/api/projects/{project.pk}/next/").status_code == 429
    assert (
        client.post(f"/api/projects/{project.pk}/prefetch/", {}, format="json").status_code == 429
    )
    assert not Assignment.objects.filter(annotator=user, status=Assignment.Status.LEASED).exists()
