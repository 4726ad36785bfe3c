"""The serving statements read a bounded number of rows, however long the annotator's history.

Each statement `next` sends is run again under EXPLAIN ANALYZE (in a savepoint, rolled back)
and the rows its plan touched are counted: rows each node returned or filtered out, times its
loops. Statistics are taken while the annotator had no assignment yet, as on a new project or
in a prepared statement's generic plan: the plan must not depend on them being fresh.
"""

import json

import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from annotation.models import Assignment, Item, ItemCandidate, Membership
from annotation.serving import SHUFFLE_WINDOW
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db

HISTORY = 400


def _rows_touched(plan: dict) -> int:
    """Rows read or made by the plan's nodes; a bitmap index scan's entries are counted by
    the heap scan above it, as the rows it fetched."""
    loops = plan.get("Actual Loops", 1)
    if plan["Node Type"] == "Bitmap Index Scan":
        return 0
    own = plan.get("Actual Rows", 0) + sum(
        plan.get(key, 0)
        for key in (
            "Rows Removed by Filter",
            "Rows Removed by Join Filter",
            "Rows Removed by Index Recheck",
        )
    )
    return own * loops + sum(_rows_touched(child) for child in plan.get("Plans", []))


def _explained(raw, sql: str, params, *, generic: bool) -> tuple[dict, bool]:
    """EXPLAIN ANALYZE the statement in a savepoint (undone); return its plan and whether it
    was a generic plan. `generic` plans it as a prepared statement's generic plan, as
    PostgreSQL runs the serving statements after their first five calls, where PostgreSQL
    can type every parameter from the statement alone (it cannot for some IN lists)."""
    # Values inlined by the client: the serving cursor binds on the server, and EXECUTE's
    # arguments are then typed from the prepared statement.
    raw = psycopg.ClientCursor(raw.connection)
    raw.execute("SAVEPOINT plan_probe")
    prepared = False
    try:
        if generic:
            numbered = sql
            for n in range(1, sql.count("%s") + 1):
                numbered = numbered.replace("%s", f"${n}", 1)
            try:
                raw.execute(f"PREPARE plan_probe AS {numbered}")
                prepared = True
            except psycopg.errors.IndeterminateDatatype:
                raw.execute("ROLLBACK TO SAVEPOINT plan_probe")
        if prepared:
            raw.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            values = ", ".join(["%s"] * len(params))
            raw.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE plan_probe({values})", params)
        else:
            raw.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        found = raw.fetchone()[0]
    finally:
        raw.execute("ROLLBACK TO SAVEPOINT plan_probe")
        if prepared:
            raw.execute("DEALLOCATE plan_probe")
    (plan,) = json.loads(found) if isinstance(found, str) else found
    return plan["Plan"], prepared


def _statements_of_next(client, project, *, generic: bool) -> list[tuple[str, int, bool]]:
    """POST next; return (statement, rows its plan touched, generic plan?) for each statement
    it ran."""
    touched = []

    def explain_first(execute, sql, params, many, context):
        if not many and sql.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH", "INSERT")):
            plan, prepared = _explained(context["cursor"], sql, params or [], generic=generic)
            touched.append((" ".join(sql.split())[:80], _rows_touched(plan), prepared))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(explain_first):
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
    # The annotator has labelled HISTORY primary items and ten gold ones.
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
    Item.objects.filter(pk__in=[item.pk for item in done]).update(n_taken=1)
    Membership.objects.filter(project=project, user=user).update(judgment_count=len(done))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return project, client


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
    # Given an annotator with 410 judgments, and statistics from before they had any
    project, client = _annotator_with_history(**fields)

    # When they ask for the next item (a primary, gold or repeat claim)
    touched = _statements_of_next(client, project, generic=generic)

    # Then no statement touched more rows than one pass over the project's candidate slots
    # (a planner may scan a small table) and a few times the claim's window, where a join
    # over the annotator's history touched their 410 rows once per item considered
    bound = ItemCandidate.objects.filter(item__project=project).count() + 8 * SHUFFLE_WINDOW
    assert max(rows for _, rows, _ in touched) <= bound, f"{kind}: rows touched {touched}"
    claims = [t for t in touched if t[0].startswith(("WITH c AS", 'UPDATE "annotation_item"'))]
    if kind != "repeat":
        assert claims and all(prepared == generic for *_, prepared in claims), touched
