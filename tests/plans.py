"""Plans of the statements a piece of code sends: each is run again under EXPLAIN ANALYZE (in
a savepoint, rolled back) and the rows its plan touched are counted."""

import contextlib
import json

import psycopg
from django.db import connection


def rows_touched(plan: dict) -> int:
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
    return own * loops + sum(rows_touched(child) for child in plan.get("Plans", []))


def explained(raw, sql: str, params, *, generic: bool) -> tuple[dict, bool]:
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


@contextlib.contextmanager
def statements_explained(*, generic: bool = False):
    """Collect (statement, rows its plan touched, generic plan?) for each statement run
    inside the block."""
    touched: list[tuple[str, int, bool]] = []

    def explain_first(execute, sql, params, many, context):
        if not many and sql.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH", "INSERT")):
            plan, prepared = explained(context["cursor"], sql, params or [], generic=generic)
            touched.append((" ".join(sql.split())[:80], rows_touched(plan), prepared))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(explain_first):
        yield touched
