"""Submit with `"next": true`: the judgment and the next assignment in one round trip."""

import threading
import uuid
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from annotation.models import Assignment, Item, Judgment, Membership
from tests.factories import add_member, make_items, make_project, make_user, token_client


def _submit(client, aid: int, key: str, **extra):
    body = {"choice": "A", "idempotency_key": key, "next": True, **extra}
    return client.post(f"/api/assignments/{aid}/submit/", body, format="json")


@pytest.mark.django_db
def test_submit_returns_the_next_assignment_as_next_would_serve_it():
    # Given an annotator with two items left
    project = make_project(overlap=1)
    user = make_user()
    add_member(project, user)
    make_items(project, 2, models=("secret-model-x", "secret-model-y"))
    client = token_client(user)
    first = client.post(f"/api/projects/{project.pk}/next/").json()

    # When they submit the first with next: true
    response = _submit(client, first["assignment_id"], "k1")

    # Then the judgment is recorded and the answer carries the other item, leased to them
    assert response.status_code == 201, response.content
    body = response.json()
    assert Judgment.objects.get(pk=body["judgment_id"]).assignment_id == first["assignment_id"]
    following = body["next"]
    live = Assignment.objects.get(status=Assignment.Status.LEASED)
    assert following["assignment_id"] == live.pk and live.annotator_id == user.pk
    assert live.item_id != Assignment.objects.get(pk=first["assignment_id"]).item_id
    assert set(following) == set(first)
    assert "secret-model" not in response.content.decode()
    # and `next` now serves that very assignment
    again = client.post(f"/api/projects/{project.pk}/next/").json()
    assert again["assignment_id"] == following["assignment_id"]


@pytest.mark.django_db
def test_next_is_null_when_nothing_is_left_and_without_the_flag_the_answer_is_unchanged():
    project = make_project(overlap=1)
    user = make_user()
    add_member(project, user)
    make_items(project, 2)
    client = token_client(user)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    plain = client.post(
        f"/api/assignments/{aid}/submit/", {"choice": "B", "idempotency_key": "p"}, format="json"
    )
    assert plain.status_code == 201 and "next" not in plain.json()
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    last = _submit(client, aid, "last")
    assert last.status_code == 201 and last.json()["next"] is None
    assert "next_error" not in last.json()
    assert not Assignment.objects.filter(status=Assignment.Status.LEASED).exists()


@pytest.mark.django_db
def test_replay_returns_the_first_answers_next_while_its_lease_is_live_then_what_next_serves():
    # Given a submit with next: true whose answer the client lost
    project = make_project(overlap=1, lease_seconds=60)
    user = make_user()
    add_member(project, user)
    make_items(project, 4)
    client = token_client(user)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    first = _submit(client, aid, "same").json()

    # When it sends the same submit again, it gets the same judgment and the same next item
    replay = _submit(client, aid, "same")
    assert replay.status_code == 200
    assert replay.json()["replayed"] is True
    assert replay.json()["judgment_id"] == first["judgment_id"]
    assert replay.json()["next"]["assignment_id"] == first["next"]["assignment_id"]
    assert Assignment.objects.filter(status=Assignment.Status.LEASED).count() == 1

    # When that lease has run out, a replay gets what next serves now: a fresh lease
    Assignment.objects.filter(pk=first["next"]["assignment_id"]).update(
        lease_expires=timezone.now() - timedelta(seconds=1)
    )
    late = _submit(client, aid, "same").json()
    assert late["judgment_id"] == first["judgment_id"]
    assert late["next"]["assignment_id"] != first["next"]["assignment_id"]
    assert Assignment.objects.get(pk=first["next"]["assignment_id"]).status == "expired"
    live = Assignment.objects.get(status=Assignment.Status.LEASED)
    assert late["next"]["assignment_id"] == live.pk
    assert Judgment.objects.count() == 1


@pytest.mark.django_db
def test_paused_annotator_keeps_the_judgment_and_gets_no_next_item():
    project = make_project(overlap=1)
    user = make_user()
    membership = add_member(project, user)
    make_items(project, 3)
    client = token_client(user)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    Membership.objects.filter(pk=membership.pk).update(status=Membership.Status.PAUSED)
    response = _submit(client, aid, "k")
    assert response.status_code == 201
    body = response.json()
    assert body["next"] is None and body["next_error"]["code"] == "paused"
    assert Judgment.objects.filter(pk=body["judgment_id"]).exists()
    assert not Assignment.objects.filter(status=Assignment.Status.LEASED).exists()


@pytest.mark.django_db
def test_a_next_flag_that_is_not_a_boolean_is_refused_naming_it_and_writes_nothing():
    project = make_project(overlap=1)
    user = make_user()
    add_member(project, user)
    make_items(project, 2)
    client = token_client(user)
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    response = _submit(client, aid, "k", next="soon")
    assert response.status_code == 400 and "next" in response.json()
    assert not Judgment.objects.exists()
    assert Assignment.objects.get(pk=aid).status == Assignment.Status.LEASED


def _annotate(token: str, project_id: int, seed: int, log: dict, errors: list) -> None:
    """Loop submit(next: true) from one first `next`, replaying ~30 % of the submits."""
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    try:
        r = client.post(f"/api/projects/{project_id}/next/")
        payload = r.json() if r.status_code == 200 else None
        n = seed
        while payload is not None:
            aid = payload["assignment_id"]
            log["served"].append((aid, token))
            body = {"choice": "AB"[n % 2], "idempotency_key": str(uuid.uuid4()), "next": True}
            answers = []
            for _ in range(2 if n % 3 == 0 else 1):  # a client that lost the first answer
                s = client.post(
                    f"/api/assignments/{aid}/submit/", body, content_type="application/json"
                )
                if s.status_code not in (200, 201):
                    errors.append(("submit", s.status_code, s.content[:200]))
                    return
                answers.append(s.json())
            ids = {a["judgment_id"] for a in answers}
            following = {a["next"]["assignment_id"] if a["next"] else None for a in answers}
            if len(ids) != 1 or len(following) != 1:
                errors.append(("replay differs", aid, answers))
            log["accepted"].extend(ids)
            payload = answers[0]["next"]
            n += 1
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_twenty_parallel_one_round_trip_clients_never_double_serve_or_lose_a_judgment():
    # Given 200 items with overlap 3 and 20 annotators looping submit(next: true) in parallel
    n_items, overlap = 200, 3
    project = make_project(overlap=overlap, lease_seconds=600)
    make_items(project, n_items)
    tokens = []
    for _ in range(20):
        user = make_user()
        add_member(project, user)
        tokens.append(Token.objects.create(user=user).key)
    log: dict = defaultdict(list)
    errors: list = []
    workers = [
        threading.Thread(target=_annotate, args=(t, project.pk, i, log, errors))
        for i, t in enumerate(tokens)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)

    # Then every item was judged exactly `overlap` times by different people, nothing the
    # clients saw accepted is missing or doubled, and every served assignment was distinct
    assert errors == []
    per_item = Counter(Judgment.objects.values_list("item_id", flat=True))
    assert len(per_item) == n_items and set(per_item.values()) == {overlap}
    pairs = list(Judgment.objects.values_list("item_id", "annotator_id"))
    assert len(pairs) == len(set(pairs))
    assert set(log["accepted"]) == set(Judgment.objects.values_list("id", flat=True))
    assert len(log["served"]) == len(set(log["served"])) == n_items * overlap
    assert set(Item.objects.values_list("n_taken", "n_done")) == {(overlap, overlap)}
    assert not Assignment.objects.filter(status=Assignment.Status.LEASED).exists()
