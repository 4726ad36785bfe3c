"""CPU per call of the serving path's hand-written SELECTs against the ORM query they replace.

Creates its own PostgreSQL database, migrates it, serves one item, then times (Python CPU,
best of five runs of N calls, inside one transaction as on the serving path) each plain
SELECT of the serving path (`annotation/serving.py`, the payload of
`annotation/selectors.py`) next to the ORM queryset that sends the same statement,
checks both return the same rows, and drops the database.

    .venv/bin/python benchmarks/serving_sql_bench.py --calls 3000

Measured 2026-12-02 on the shared 2-core machine (load average 5-6), three runs: the ORM
version costs more Python CPU per call than the whole hand-written one, 0.8 to 1.6 ms more
each, against the 12 ms per judgment that issue #2 budgets for the server:

    live lease                        hand-written 195-274 us   ORM 1220-1345 us
    membership lock with its project  hand-written 213-264 us   ORM 1688-1862 us
    overdue leases                    hand-written 137-214 us   ORM  767-1152 us
    assignment payload                hand-written 110 us       ORM 1054 us

So every one of them stays hand-written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SERVER = "postgres://postgres@127.0.0.1:5432"


def _setup_django(db_name: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.local"
    os.environ["DATABASE_URL"] = f"{SERVER}/{db_name}"
    os.environ["DJANGO_DEBUG"] = "0"
    import django

    django.setup()


def per_call_us(fn, calls: int) -> float:
    """Return the best of five mean Python CPU times of `fn`, in microseconds."""
    for _ in range(min(calls, 200)):
        fn()
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - start) / calls * 1e6)
    return best


def measure(calls: int) -> list[tuple[str, float, float]]:
    """Return (statement, hand-written us, ORM us) for each plain SELECT of serving."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from annotation import selectors, serving
    from annotation.models import Assignment, ItemCandidate, Membership, Project
    from tests.factories import make_items

    project = Project.objects.create(name="sql bench")
    user = get_user_model().objects.create_user(username="sql-bench")
    Membership.objects.create(project=project, user=user)
    make_items(project, 20)
    with transaction.atomic():
        live = serving.assignment_next(project_id=project.pk, user=user)
    pid, uid, now = project.pk, user.pk, live.leased_at

    def live_raw():
        return serving._live_assignment(project_id=pid, user=user)

    def live_orm():
        leased = Assignment.objects.filter(
            project_id=pid, annotator_id=uid, status=Assignment.Status.LEASED
        )
        return leased.order_by("-id").first()

    def lock_raw():
        return serving._membership_for_update(project_id=pid, user=user)

    def lock_orm():
        locked = Membership.objects.select_related("project").select_for_update(of=("self",))
        return locked.filter(project_id=pid, user_id=uid).first()

    overdue_params = [pid, Assignment.Status.LEASED, connection.ops.adapt_datetimefield_value(now)]

    def overdue_raw():
        with connection.cursor() as cursor:
            cursor.execute(serving._overdue_sql(connection.vendor), overdue_params)
            return cursor.fetchall()

    def overdue_orm():
        overdue = Assignment.objects.filter(
            project_id=pid, status=Assignment.Status.LEASED, lease_expires__lt=now
        ).select_for_update(skip_locked=True)
        return list(overdue.values_list("id", "item_id", "kind")[: serving.EXPIRY_BATCH])

    payload_params = [live.item_id]

    def payload_raw():
        with connection.cursor() as cursor:
            cursor.execute(selectors._payload_sql(), payload_params)
            return cursor.fetchall()

    def payload_orm():
        shown = ItemCandidate.objects.filter(item_id=live.item_id)
        fields = ("position", "candidate__text", "item__prompt__text", "item__prompt__messages")
        return list(shown.values_list(*fields))

    rows = []
    with transaction.atomic():
        for name, raw, orm in (
            ("live lease", live_raw, live_orm),
            ("membership lock with its project", lock_raw, lock_orm),
            ("overdue leases", overdue_raw, overdue_orm),
            ("assignment payload", payload_raw, payload_orm),
        ):
            first, second = raw(), orm()
            if isinstance(first, list):  # the driver returns JSON as text, the ORM decoded
                same = [r[:3] for r in first] == [r[:3] for r in second]
            else:
                same = first.pk == second.pk
            assert same, f"{name}: the two statements disagree"
            rows.append((name, per_call_us(raw, calls), per_call_us(orm, calls)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--db", default="prefloop_bench_sql")
    args = parser.parse_args()

    import psycopg

    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.db}"')
    try:
        _setup_django(args.db)
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0)
        for name, raw, orm in measure(args.calls):
            print(f"{name:34} hand-written {raw:6.0f} us  ORM {orm:6.0f} us  ({orm - raw:+.0f} us)")
        connections.close_all()
    finally:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
