"""The serving statements read a bounded number of rows, however long the annotator's history.

Each statement `next` sends is run again under EXPLAIN ANALYZE (in a savepoint, rolled back)
and the rows its plan touched are counted: rows each node returned or filtered out, times its
loops. Statistics are taken while the annotator had no assignment yet, as on a new project or
in a prepared statement's generic plan: the plan must not depend on them being fresh.
"""

import pytest
from django.db import connection
from django.utils import timezone

from annotation.models import Assignment, Item, ItemCandidate, Membership
from annotation.serving import SHUFFLE_WINDOW
from tests.factories import (
    add_member,
    make_items,
    make_project,
    make_user,
    submit_and_next,
    token_client,
)
from tests.plans import statements_explained

pytestmark = pytest.mark.django_db

HISTORY = 400
REPEATED = 40


def _statements_of_next(client, project, *, generic: bool) -> list[tuple[str, int, bool]]:
    """POST next; return (statement, rows its plan touched, generic plan?) for each statement
    it ran."""
    with statements_explained(generic=generic) as touched:
        response = client.post(f"/api/projects/{project.pk}/next/")
    assert response.status_code == 200, response.content
    return touched


def _annotator_with_history(**project_fields):
    project = make_project(overlap=3, **project_fields)
    items = make_items(project, HISTORY + 2 * SHUFFLE_WINDOW, gold=["A"] * 30)
    user = make_user()
    add_member(project, user)
    with connection.cursor() as cursor:
        cursor.execute('ANALYZE "annotation_assignment"')
    now = timezone.now()
    # The annotator has labelled HISTORY primary items and ten gold ones...
    done = items[30 : 30 + HISTORY] + items[:10]
    Assignment.objects.bulk_create(
        Assignment(
            project=project,
            item=item,
            annotator=user,
            kind=Assignment.Kind.GOLD if item.is_gold else Assignment.Kind.PRIMARY,
            status=Assignment.Status.SUBMITTED,
            display_order=[0, 1],
            seq=seq,
            lease_expires=now,
            finished_at=now,
        )
        for seq, item in enumerate(done)
    )
    # ...and was shown REPEATED of their first primary items again.
    firsts = Assignment.objects.filter(project=project, annotator=user, kind="primary")
    Assignment.objects.bulk_create(
        Assignment(
            project=project,
            item_id=first.item_id,
            annotator=user,
            kind=Assignment.Kind.REPEAT,
            repeat_of=first,
            status=Assignment.Status.SUBMITTED,
            display_order=[1, 0],
            seq=len(done) + n,
            lease_expires=now,
            finished_at=now,
        )
        for n, first in enumerate(firsts.order_by("seq")[:REPEATED])
    )
    Item.objects.filter(pk__in=[item.pk for item in done]).update(n_taken=1)
    Membership.objects.filter(project=project, user=user).update(
        judgment_count=len(done) + REPEATED
    )
    return project, token_client(user)


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("primary", {"gold_rate": 0.0, "repeat_rate": 0.0}),
        ("gold", {"gold_rate": 1.0, "repeat_rate": 0.0}),
        ("repeat", {"gold_rate": 0.0, "repeat_rate": 1.0, "repeat_min_gap": 5}),
    ],
)
def test_each_claim_touches_a_bounded_number_of_rows_after_hundreds_of_judgments(
    kind, fields, generic
):
    # Given an annotator with 450 judgments (40 of them repeats), and statistics from before
    # they had any
    project, client = _annotator_with_history(**fields)

    # When they ask for the next item (a primary, gold or repeat claim)
    touched = _statements_of_next(client, project, generic=generic)

    # Then no statement touched more rows than one pass over the project's candidate slots
    # (a planner may scan a small table) and a few times the claim's window, where a join
    # over the annotator's history touched their 450 rows once per item considered
    bound = ItemCandidate.objects.filter(item__project=project).count() + 8 * SHUFFLE_WINDOW
    assert max(rows for _, rows, _ in touched) <= bound, f"{kind}: rows touched {touched}"
    claims = [t for t in touched if t[0].startswith(("WITH c AS", 'UPDATE "annotation_item"'))]
    assert claims and all(prepared == generic for *_, prepared in claims), touched


def test_the_serving_statements_run_on_their_generic_plans_from_the_first_call():
    # PostgreSQL would plan each prepared statement afresh for its first five calls on a
    # connection; gold and repeat claims, drawn once in twenty items, would then be planned
    # on nearly every call and take longer to serve than primary items.
    project = make_project(overlap=3, gold_rate=0.3, repeat_rate=0.3, repeat_min_gap=1)
    make_items(project, 40, gold=["A"] * 10)
    user = make_user()
    add_member(project, user)
    client = token_client(user)
    served = client.post(f"/api/projects/{project.pk}/next/").json()
    for n in range(12):
        served = submit_and_next(client, served, n)
    kinds = set(Assignment.objects.filter(annotator=user).values_list("kind", flat=True))
    assert kinds == {"primary", "gold", "repeat"}, kinds
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        plans = cursor.fetchall()
    claims = [p for p in plans if 'INSERT INTO "annotation_assignment"' in p[0]]
    assert len(claims) >= 3, plans  # the primary, gold and repeat claims
    assert all(custom == 0 and generic >= 1 for _, generic, custom in plans), plans
