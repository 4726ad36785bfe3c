"""Real parallel clients on PostgreSQL: exact overlap, no double-serve, nothing lost."""

import random
import threading
import uuid
from collections import Counter, defaultdict

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from annotation.models import Assignment, Item, Judgment
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db(transaction=True)

N_ANNOTATORS = 20
N_ITEMS = 300
OVERLAP = 3


def _expire_some_leases(stop: threading.Event, rng: random.Random, expired: list[int]) -> None:
    """Backdate random live leases while the clients run, as if their holders walked away."""
    try:
        while not stop.wait(0.05):
            live = list(
                Assignment.objects.filter(status=Assignment.Status.LEASED).values_list(
                    "id", flat=True
                )[:50]
            )
            if live:
                victim = rng.choice(live)
                Assignment.objects.filter(pk=victim, status=Assignment.Status.LEASED).update(
                    lease_expires=timezone.now() - timezone.timedelta(seconds=1)
                )
                expired.append(victim)
    finally:
        connection.close()


def _annotate(token: str, project_id: int, seed: int, log: dict, errors: list) -> None:
    rng = random.Random(seed)
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    try:
        while True:
            r = client.post(f"/api/projects/{project_id}/next/")
            if r.status_code == 204:
                break
            if r.status_code != 200:
                errors.append(("next", r.status_code, r.content[:200]))
                break
            payload = r.json()
            aid = payload["assignment_id"]
            key = str(uuid.uuid4())
            body = {"choice": rng.choice(["A", "B", "tie"]), "idempotency_key": key}
            attempts = 2 if rng.random() < 0.3 else 1  # a client that lost the first response
            ids = set()
            for _ in range(attempts):
                s = client.post(
                    f"/api/assignments/{aid}/submit/", body, content_type="application/json"
                )
                if s.status_code in (200, 201):
                    ids.add(s.json()["judgment_id"])
                elif s.status_code == 409 and s.json()["code"] == "lease_expired":
                    log["expired"].append(aid)
                    break
                else:
                    errors.append(("submit", s.status_code, s.content[:200]))
            if len(ids) > 1:
                errors.append(("retry made a second judgment", aid, ids))
            log["accepted"].extend(ids)
            log["served"].append((payload["assignment_id"], token))
    finally:
        connections.close_all()


def test_twenty_parallel_annotators_fill_every_item_exactly_to_overlap():
    # Given 300 items with overlap 3 and 20 annotators hammering next/submit in parallel,
    # with retried submits and leases expiring under them
    project = make_project(overlap=OVERLAP, lease_seconds=600)
    make_items(project, N_ITEMS)
    tokens = []
    for _ in range(N_ANNOTATORS):
        user = make_user()
        add_member(project, user)
        tokens.append(Token.objects.create(user=user).key)
    log: dict = defaultdict(list)
    errors: list = []
    expired_by_chaos: list[int] = []
    stop = threading.Event()
    chaos = threading.Thread(
        target=_expire_some_leases, args=(stop, random.Random(1), expired_by_chaos)
    )
    workers = [
        threading.Thread(target=_annotate, args=(t, project.pk, i, log, errors))
        for i, t in enumerate(tokens)
    ]
    chaos.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
    stop.set()
    chaos.join()

    # Then nothing went wrong on the wire
    assert errors == []
    assert expired_by_chaos, "the test did not expire any lease"
    # every item has exactly `overlap` judgments, from different people
    per_item = Counter(Judgment.objects.values_list("item_id", flat=True))
    assert len(per_item) == N_ITEMS
    assert set(per_item.values()) == {OVERLAP}
    pairs = list(Judgment.objects.values_list("item_id", "annotator_id"))
    assert len(pairs) == len(set(pairs)), "an annotator judged the same item twice"
    # no judgment that a client saw accepted is missing, and none is duplicated
    stored = set(Judgment.objects.values_list("id", flat=True))
    assert set(log["accepted"]) == stored
    assert Judgment.objects.count() == N_ITEMS * OVERLAP
    # and the serving counters agree with the rows
    assert set(Item.objects.values_list("n_taken", "n_done")) == {(OVERLAP, OVERLAP)}
    assert not Assignment.objects.filter(status=Assignment.Status.LEASED).exists()
