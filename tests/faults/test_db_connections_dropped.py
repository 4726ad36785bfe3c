"""PostgreSQL connections dropped under annotators: retryable errors, and no label lost.

gunicorn (the deployed config, persistent connections with health checks) serves the API
on the test database. Annotator threads label every item over HTTP with the simulation's
ApiClient, which retries 502/503/504 and connection errors with the same body (and so the
same idempotency key). Meanwhile a chaos thread keeps terminating every backend of the test
database that serves a request (`pg_terminate_backend`), the way a failover or a restarted
PgBouncer would. Checked at the end:
- the chaos hit requests: annotators saw retryable 503s with code "retry", and no 500;
- every annotator finished without an error after retrying;
- every item has exactly `overlap` judgments, and each annotator at most one per item;
- every judgment id a 2xx acknowledged exists, and every stored judgment was acknowledged
  (nothing lost, nothing made twice); leases and counters agree with the judgments.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

import psycopg
import pytest
from django.db import connection
from django.db.models import Count

from annotation.models import Assignment, Item, Judgment
from annotation.services import simulated_annotator_ensure
from annotation.simulation import ApiClient
from evaluation.models import QualityPolicy
from tests.factories import make_items, make_project
from tests.faults.support import Gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

N_ANNOTATORS = 6
N_ITEMS = 40
OVERLAP = 3


@dataclass
class Tally:
    acknowledged: list[int] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    retry_codes: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


def _annotate(base_url: str, token: str, project_id: int, seed: int, tally: Tally) -> None:
    """Label until the project has nothing left for this annotator; record every answer."""
    rng = random.Random(seed)
    api = ApiClient(base_url, token, retries=12)

    def record(response, *args, **kwargs):
        tally.statuses[response.status_code] += 1
        if response.status_code == 503:
            tally.retry_codes[response.json().get("code")] += 1

    api.session.hooks["response"].append(record)
    while True:
        served = api.post(f"/api/projects/{project_id}/next/")
        if served.status_code == 204:
            return
        if served.status_code != 200:
            tally.errors.append(f"next: {served.status_code} {served.text[:300]}")
            return
        assignment_id = served.json()["assignment_id"]
        body = {"choice": rng.choice(["A", "B"]), "idempotency_key": uuid.uuid4().hex}
        submitted = api.post(f"/api/assignments/{assignment_id}/submit/", body)
        if submitted.status_code in (200, 201):
            tally.acknowledged.append(submitted.json()["judgment_id"])
        else:
            tally.errors.append(f"submit: {submitted.status_code} {submitted.text[:300]}")
            return


class Chaos(threading.Thread):
    """Terminate the test database's client backends a few times a second until stopped."""

    def __init__(self, dbname: str, spare_pid: int, seed: int = 0):
        super().__init__(daemon=True)
        self.dbname, self.spare_pid = dbname, spare_pid
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.terminated = 0

    def run(self) -> None:
        with psycopg.connect(
            host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid() AND pid <> %s"
                    " AND backend_type = 'client backend'",
                    (self.dbname, self.spare_pid),
                ).fetchall()
                self.terminated += sum(1 for (killed,) in rows if killed)
                self.stop.wait(self.rng.uniform(0.1, 0.4))


def test_dropped_connections_become_retries_and_no_label_is_lost(tmp_path):
    # given a project of 40 items, overlap 3, six machine annotators with API tokens
    project = make_project(name="chaos", overlap=OVERLAP, lease_seconds=600)
    # random clicks: keep quality control from pausing anyone, this is about the database
    QualityPolicy.objects.create(project=project, enabled=False)
    make_items(project, N_ITEMS)
    tokens = [
        simulated_annotator_ensure(project=project, username=f"chaos-{i}")
        for i in range(N_ANNOTATORS)
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        own_pid = cursor.fetchone()[0]
    server = Gunicorn(tmp_path / "gunicorn.log")
    chaos = Chaos(connection.settings_dict["NAME"], spare_pid=own_pid)
    tallies = [Tally() for _ in tokens]
    try:
        # when they all label while the chaos thread keeps dropping connections
        chaos.start()
        threads = [
            threading.Thread(target=_annotate, args=(server.url, token, project.pk, i, tally))
            for i, (token, tally) in enumerate(zip(tokens, tallies, strict=True))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        assert not any(t.is_alive() for t in threads), "an annotator hung"
    finally:
        chaos.stop.set()
        chaos.join(timeout=30)
        server.stop()
    connection.close()  # our own backend was spared, but start clean anyway

    # then the drops surfaced as retryable 503s, never as 500s, and everyone finished
    statuses = sum((t.statuses for t in tallies), Counter())
    codes = sum((t.retry_codes for t in tallies), Counter())
    print(f"backends terminated: {chaos.terminated}; answers: {dict(statuses)}")
    assert chaos.terminated > 0
    assert statuses[503] > 0, (statuses, chaos.terminated)
    assert set(codes) == {"retry"}, codes
    assert not [s for s in statuses if s >= 500 and s != 503], (statuses, server.text()[-3000:])
    assert [t.errors for t in tallies] == [[]] * N_ANNOTATORS

    # and every item has exactly `overlap` judgments, each acknowledged once, none missing
    acknowledged = [j for t in tallies for j in t.acknowledged]
    stored = set(Judgment.objects.filter(project=project).values_list("id", flat=True))
    assert len(acknowledged) == len(set(acknowledged)) == N_ITEMS * OVERLAP
    assert set(acknowledged) == stored
    per_item = Counter(Judgment.objects.filter(project=project).values_list("item_id", flat=True))
    assert sorted(per_item.values()) == [OVERLAP] * N_ITEMS
    assert not (
        Judgment.objects.values("item_id", "annotator_id").annotate(n=Count("id")).filter(n__gt=1)
    )
    assert set(Item.objects.filter(project=project).values_list("n_done", "n_taken")) == {
        (OVERLAP, OVERLAP)
    }
    assert not Assignment.objects.filter(project=project, status=Assignment.Status.LEASED)
