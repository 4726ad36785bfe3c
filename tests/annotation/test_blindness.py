"""Annotators cannot tell gold or repeats from primary items; skips are budgeted; time on task
is measured on the server; equally-filled items are served in a per-annotator order."""

import random
import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from annotation import services
from annotation.models import Assignment, Item, Judgment, Membership, Project
from tests.factories import (
    add_member,
    make_items,
    make_project,
    make_user,
    submit_and_next,
    token_client,
)

pytestmark = pytest.mark.django_db

NO_SKIP_BUDGET = {"max_skips_in_row": 0, "max_skip_fraction": 1.0}


def _client(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _skip(client, assignment_id: int):
    response = client.post(
        f"/api/assignments/{assignment_id}/skip/", {"reason": "unclear"}, format="json"
    )
    assert response.status_code == 200, response.content
    return response


def _submit(client, assignment: Assignment, **body):
    body.setdefault("choice", "A")
    response = client.post(f"/api/assignments/{assignment.pk}/submit/", body, format="json")
    assert response.status_code == 201, response.content
    return response


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_after_skipping_the_last_primary_item_next_serves_nothing(seed):
    # Given a project with gold items mixed in at half the served items,
    project = make_project(overlap=1, gold_rate=0.5, repeat_rate=0.2, **NO_SKIP_BUDGET)
    primary = make_items(project, 6)
    make_items(project, 8, gold=["A"] * 8)
    harvester = make_user()
    add_member(project, harvester)
    client = _client(harvester)
    rng = random.Random(seed)
    # when an annotator skips every item they are served until none is served,
    served = []
    while (
        a := services.assignment_next(project_id=project.pk, user=harvester, rng=rng)
    ) is not None:
        served.append(a.kind)
        _skip(client, a.pk)
    # then every primary item was skipped, and once the last one was, nothing more comes:
    skipped_primary = Assignment.objects.filter(
        annotator=harvester, kind=Assignment.Kind.PRIMARY, status=Assignment.Status.SKIPPED
    )
    assert skipped_primary.count() == len(primary)
    assert served[-1] == Assignment.Kind.PRIMARY
    for _ in range(30):
        assert services.assignment_next(project_id=project.pk, user=harvester, rng=rng) is None
        assert client.post(f"/api/projects/{project.pk}/next/").status_code == 204
    # and the gold pool was not harvested.
    gold_seen = Assignment.objects.filter(annotator=harvester, kind=Assignment.Kind.GOLD).count()
    assert gold_seen < 8


def test_progress_moves_the_same_way_for_gold_repeat_and_primary_items():
    project = make_project(overlap=1, gold_rate=0.25, repeat_rate=0.4, repeat_min_gap=1)
    make_items(project, 16)
    make_items(project, 6, gold=["A"] * 6)
    annotator = make_user()
    add_member(project, annotator)
    client = _client(annotator)
    rng = random.Random(4)
    moves: dict[str, set] = {}
    while (
        a := services.assignment_next(project_id=project.pk, user=annotator, rng=rng)
    ) is not None:
        before = client.get(f"/api/projects/{project.pk}/progress/").json()
        _submit(client, a)
        after = client.get(f"/api/projects/{project.pk}/progress/").json()
        move = tuple(sorted((key, after[key] - before[key]) for key in after))
        moves.setdefault(a.kind, set()).add(move)
    assert set(moves) == {"primary", "gold", "repeat"}, "every kind was served"
    # Each submit moves the annotator's view the same way, whatever the kind.
    assert len(set().union(*moves.values())) == 1, moves
    (only,) = set().union(*moves.values())
    assert dict(only)["my_judgments"] == 1


def test_every_kind_of_item_is_served_by_the_same_statements():
    # Were gold or repeats served by more statements than primary items, the annotator's
    # next item would take longer to arrive when it is gold or a repeat: a timing tell.
    project = make_project(overlap=1, gold_rate=0.2, repeat_rate=0.2, repeat_min_gap=1)
    make_items(project, 60)
    make_items(project, 30, gold=["A"] * 30)
    annotator = make_user()
    add_member(project, annotator)
    client = token_client(annotator)
    served = client.post(f"/api/projects/{project.pk}/next/").json()
    statements: dict[str, Counter] = {}
    for n in range(40):
        with CaptureQueriesContext(connection) as captured:
            served = submit_and_next(client, served, n)
        kind = Assignment.objects.get(pk=served["assignment_id"]).kind
        # The periodic sweep of overdue leases runs whatever is served next.
        sent = [
            q["sql"]
            for q in captured.captured_queries
            if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
            and '"lease_expires" <' not in q["sql"]
        ]
        statements.setdefault(kind, Counter())[len(sent)] += 1
    assert set(statements) == {"primary", "gold", "repeat"}, statements
    # A primary item served after a gold or repeat draw found none takes one more statement;
    # the usual count is the same for every kind, and gold and repeats never take more.
    usual = statements["primary"].most_common(1)[0][0]
    assert set(statements["gold"]) == {usual} and set(statements["repeat"]) == {usual}, statements


@pytest.mark.django_db(transaction=True)
def test_people_at_work_together_are_served_equally_filled_items_in_different_orders():
    project = make_project(overlap=3)
    items = make_items(project, services.SHUFFLE_WINDOW + 6)
    alice, bob = make_user(), make_user()
    add_member(project, alice)
    add_member(project, bob)
    orders = {alice.pk: [], bob.pk: []}
    for _ in range(10):
        for user in (alice, bob):
            a = services.assignment_next(project_id=project.pk, user=user)
            orders[user.pk].append(a.item_id)
            services.judgment_submit(assignment_id=a.pk, user=user, choice="A")
    # Each is served the equally-filled items in an order of their own, not the id order
    # everybody shared (which had everyone walk the items in step).
    for order in orders.values():
        assert order != sorted(order)
    assert set(orders[alice.pk]) | set(orders[bob.pk]) <= {item.pk for item in items}
    # The order is the annotator's own and stable: a lease that ran out is served again first.
    a = services.assignment_next(project_id=project.pk, user=alice)
    Assignment.objects.filter(pk=a.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))
    assert services.assignment_next(project_id=project.pk, user=alice).item_id == a.item_id
    # Items held by claims in flight are passed over, even every one of those first in line:
    # then next still serves an item rather than say "done".
    carol = make_user()
    add_member(project, carol)
    first_in_line = list(
        Item.objects.filter(project=project, n_taken__lt=3)
        .order_by("n_taken", "id")
        .values_list("id", flat=True)[: services.SHUFFLE_WINDOW]
    )
    held, release = threading.Event(), threading.Event()

    def hold_rows():
        try:
            with transaction.atomic():
                list(Item.objects.select_for_update().filter(pk__in=first_in_line))
                held.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_rows)
    holder.start()
    assert held.wait(30)
    try:
        served = services.assignment_next(project_id=project.pk, user=carol)
    finally:
        release.set()
        holder.join()
    assert served is not None and served.item_id not in first_in_line


def test_next_answers_429_after_too_many_skips_in_a_row_until_a_researcher_resumes():
    project = make_project(overlap=1, max_skips_in_row=3, max_skip_fraction=1.0)
    make_items(project, 10)
    annotator, researcher = make_user(), make_user()
    add_member(project, annotator)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    client = _client(annotator)
    # A submit in between starts the count again.
    _skip(client, client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"])
    _skip(client, client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"])
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
    _submit(client, Assignment.objects.get(pk=aid))
    for _ in range(3):
        _skip(client, client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"])
    leased = Assignment.objects.filter(annotator=annotator).count()
    response = client.post(f"/api/projects/{project.pk}/next/")
    assert response.status_code == 429
    assert response.json()["code"] == "skip_budget"
    assert "3 items in a row" in response.json()["detail"]
    assert Assignment.objects.filter(annotator=annotator).count() == leased
    membership = Membership.objects.get(project=project, user=annotator)
    assert membership.flagged and "3 skips in a row" in membership.status_reason
    # A researcher's resume lifts it.
    resume = _client(researcher).post(
        f"/api/qc/projects/{project.pk}/annotators/{annotator.pk}/resume/", {}, format="json"
    )
    assert resume.status_code == 200, resume.content
    assert client.post(f"/api/projects/{project.pk}/next/").status_code == 200


def test_next_answers_429_once_skips_exceed_the_share_of_served_items():
    project = make_project(
        overlap=1, max_skips_in_row=0, max_skip_fraction=0.25, skip_fraction_min_served=8
    )
    make_items(project, 20)
    annotator = make_user()
    add_member(project, annotator)
    client = _client(annotator)
    # Three skips among the first seven items are not judged yet (fewer than 8 served) ...
    for index in range(7):
        aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]
        if index < 3:
            _skip(client, aid)
        else:
            _submit(client, Assignment.objects.get(pk=aid))
    response = client.post(f"/api/projects/{project.pk}/next/")
    assert response.status_code == 200
    # ... but at 8 served, 3 skips are more than a quarter, whatever was done since.
    _submit(client, Assignment.objects.get(pk=response.json()["assignment_id"]))
    response = client.post(f"/api/projects/{project.pk}/next/")
    assert response.status_code == 429, response.content
    body = response.json()
    assert body["code"] == "skip_budget" and "3 of the 8 items" in body["detail"]


def test_server_measures_time_on_task_from_the_lease():
    project = make_project()
    make_items(project, 2)
    annotator = make_user()
    add_member(project, annotator)
    a = services.assignment_next(project_id=project.pk, user=annotator)
    Assignment.objects.filter(pk=a.pk).update(leased_at=timezone.now() - timedelta(seconds=40))
    # The client leaves out its own figure: the server's is there all the same.
    judgment_id = _submit(_client(annotator), a).json()["judgment_id"]
    judgment = Judgment.objects.get(pk=judgment_id)
    assert judgment.time_spent_ms is None
    assert 40_000 <= judgment.server_time_ms < 60_000


def test_an_item_leased_ahead_is_timed_from_the_annotators_previous_submit():
    first, second = make_project(), make_project()
    make_items(first, 2)
    make_items(second, 2)
    annotator = make_user()
    add_member(first, annotator)
    add_member(second, annotator)
    client = _client(annotator)
    ahead = services.assignment_next(project_id=second.pk, user=annotator)
    Assignment.objects.filter(pk=ahead.pk).update(leased_at=timezone.now() - timedelta(seconds=90))
    current = services.assignment_next(project_id=first.pk, user=annotator)
    Assignment.objects.filter(pk=current.pk).update(
        leased_at=timezone.now() - timedelta(seconds=60)
    )
    _submit(client, current)
    judgment_id = _submit(client, ahead).json()["judgment_id"]
    # Timed from the submit in the first project, not from its lease 90 s ago.
    assert Judgment.objects.get(pk=judgment_id).server_time_ms < 30_000
    assert Judgment.objects.get(assignment=current).server_time_ms >= 60_000


def test_the_skip_budget_is_a_project_setting_checked_on_creation():
    staff = make_user(staff=True)
    client = _client(staff)
    body = {"name": "budgeted", "max_skip_fraction": 1.5, "max_skips_in_row": 4}
    response = client.post("/api/projects/", body, format="json")
    assert response.status_code == 400 and "max_skip_fraction" in response.json()
    assert not Project.objects.filter(name="budgeted").exists()
    body["max_skip_fraction"] = 0.1
    response = client.post("/api/projects/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["max_skip_fraction"] == 0.1
    project = Project.objects.get(name="budgeted")
    assert (project.max_skip_fraction, project.max_skips_in_row) == (0.1, 4)
