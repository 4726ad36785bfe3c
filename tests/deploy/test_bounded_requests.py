"""Bounded work per request: list page sizes, bootstrap caps, cached live agreement, safe CSV.

Every list endpoint answers at most `MAX_PAGE_SIZE` rows however large ``?limit=`` is; the
agreement API refuses ``n_boot`` above its cap with a 400 naming it, and serves repeated live
requests from the cache until a label arrives; dashboard CSVs never start a text cell with a
formula character, while numbers stay numbers.
"""

from __future__ import annotations

import csv
import io

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from annotation.models import Assignment, DatasetVersion, Judgment, Membership, Project, Round
from annotation.pagination import MAX_PAGE_SIZE
from config.console.dashboard.csv_export import FORMULA_START
from config.console.dashboard.panel import Panel
from evaluation.apis import MAX_BOOT
from tests.factories import add_member, make_items, make_project, make_user
from training.models import ModelVersion, TrainingRun

pytestmark = pytest.mark.django_db

ROWS = MAX_PAGE_SIZE + 5


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _rows(response) -> list:
    body = response.json()
    return body["results"] if isinstance(body, dict) else body


# ---- every list endpoint has a maximum page size ----------------------------------------


def _projects(staff, project):
    Project.objects.bulk_create(Project(name=f"bulk {i:04d}") for i in range(ROWS))
    return "/api/projects/", Project.objects.count()


def _rounds(staff, project):
    Round.objects.bulk_create(Round(project=project, number=n) for n in range(1, ROWS + 1))
    return f"/api/projects/{project.pk}/rounds/", ROWS


def _datasets(staff, project):
    DatasetVersion.objects.bulk_create(
        DatasetVersion(project=project, version=v, policies={}) for v in range(1, ROWS + 1)
    )
    return f"/api/projects/{project.pk}/datasets/", ROWS


def _runs(staff, project):
    TrainingRun.objects.bulk_create(
        TrainingRun(recipe="sft", project=project, dataset_path="/data/x") for _ in range(ROWS)
    )
    return "/api/training/runs/", ROWS


def _models(staff, project):
    ModelVersion.objects.bulk_create(
        ModelVersion(name=f"m{i}", artifact_path=f"/models/m{i}") for i in range(ROWS)
    )
    return "/api/training/models/", ROWS


def _annotators(staff, project):
    from django.contrib.auth import get_user_model

    users = get_user_model().objects.bulk_create(
        get_user_model()(username=f"bulk-annotator-{i}") for i in range(ROWS)
    )
    Membership.objects.bulk_create(Membership(project=project, user=user) for user in users)
    return f"/api/qc/projects/{project.pk}/annotators/", ROWS + 1


@pytest.mark.parametrize("build", [_projects, _rounds, _datasets, _runs, _models, _annotators])
def test_every_list_endpoint_answers_at_most_the_maximum_page_size(build):
    staff = make_user("list-staff", staff=True)
    project = make_project(name="a lister")
    add_member(project, staff, Membership.Role.RESEARCHER)
    url, total = build(staff, project)
    client = _client(staff)
    # Asking for everything gets one bounded page, and the way to the next.
    response = client.get(url, {"limit": 10**9})
    assert response.status_code == 200, response.content
    rows = _rows(response)
    assert len(rows) == MAX_PAGE_SIZE
    body = response.json()
    if isinstance(body, dict):
        assert body["count"] == total and f"limit={MAX_PAGE_SIZE}" in body["next"]
    else:
        assert response["X-Total-Count"] == str(total)
        assert response["X-Page-Limit"] == str(MAX_PAGE_SIZE)
        assert 'rel="next"' in response["Link"]
    # Without a limit the default page is smaller still; the pages together hold every row.
    assert len(_rows(client.get(url))) <= MAX_PAGE_SIZE
    rest = _rows(client.get(url, {"limit": MAX_PAGE_SIZE, "offset": MAX_PAGE_SIZE}))
    key = "id" if "id" in rows[0] else "user_id"
    ids = [row[key] for row in rows] + [row[key] for row in rest]
    assert len(set(ids)) == total


# ---- n_boot capped, live agreement cached ------------------------------------------------


@pytest.fixture
def labelled():
    project = make_project(overlap=3)
    researcher = make_user("agree-res")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    annotators = [make_user(f"agree{i}") for i in range(3)]
    items = make_items(project, 6)
    for i, item in enumerate(items):
        for j, user in enumerate(annotators):
            _judge(project, user, item, "A" if (i + j) % 4 else "B")
    return project, researcher, annotators, items


def _judge(project, user, item, choice):
    assignment = Assignment.objects.create(
        project=project,
        item=item,
        annotator=user,
        display_order=[0, 1],
        status=Assignment.Status.SUBMITTED,
        lease_expires=timezone.now(),
    )
    return Judgment.objects.create(
        project=project, item=item, assignment=assignment, annotator=user, choice=choice
    )


def test_n_boot_above_the_cap_is_refused_naming_the_cap(labelled):
    project, researcher, _, _ = labelled
    client = _client(researcher)
    url = f"/api/qc/projects/{project.pk}/agreement/"
    for value in (10**9, MAX_BOOT + 1):
        response = client.get(url, {"live": "true", "n_boot": value})
        assert response.status_code == 400
        assert str(MAX_BOOT) in " ".join(response.json()["n_boot"])
    response = client.get(url, {"live": "true", "n_boot": 20, "seed": -1})
    assert response.status_code == 400 and "seed" in response.json()
    assert client.get(url, {"live": "true", "n_boot": MAX_BOOT // 100}).status_code == 200


def test_live_agreement_is_served_from_the_cache_until_a_label_arrives(labelled):
    project, researcher, _, items = labelled
    client = _client(researcher)
    url = f"/api/qc/projects/{project.pk}/agreement/"
    params = {"live": "true", "n_boot": 50, "seed": 3}

    with CaptureQueriesContext(connection) as first_queries:
        first = client.get(url, params).json()
    with CaptureQueriesContext(connection) as second_queries:
        second = client.get(url, params).json()
    assert second == first
    # The repeat reads no label: only the permission check and the labels' fingerprint.
    label_reads = [
        q["sql"] for q in second_queries.captured_queries if "choice" in q["sql"].lower()
    ]
    assert not label_reads, label_reads
    assert len(second_queries) < len(first_queries)

    # A new label: the next request computes afresh and counts it.
    before = first["report"]["by_source"]["human"]["n_judgments"]
    extra = make_user("agree-late")
    _judge(project, extra, items[0], "B")
    third = client.get(url, params).json()
    assert third["report"]["by_source"]["human"]["n_judgments"] == before + 1
    # A label flagged by QC leaves the figures too, without a new label arriving.
    Judgment.objects.filter(annotator=extra).update(qc_flag="paused")
    fourth = client.get(url, params).json()
    assert fourth["report"]["by_source"]["human"]["n_judgments"] == before


# ---- CSV cells that a spreadsheet would run -----------------------------------------------


def test_panel_csv_escapes_formula_text_and_keeps_numbers():
    panel = Panel(
        key="t",
        title="t",
        columns=["=name", "value"],
        rows=[
            ['=HYPERLINK("http://x")', -0.5],
            ["+1+2", -3],
            ["-cmd", 2.5e-7],
            ["@SUM(A1)", 0],
            ["\tx", None],
            ["\r=1", float("nan")],
            ["-0.5", "+7"],
            ["plain", "a=b"],
            [["-list"], {"k": "-v"}],
        ],
    )
    rows = list(csv.reader(io.StringIO(panel.as_csv(), newline="")))
    assert rows[0] == ["'=name", "value"]
    assert rows[1:] == [
        ['\'=HYPERLINK("http://x")', "-0.5"],
        ["'+1+2", "-3"],
        ["'-cmd", "2.5e-07"],
        ["'@SUM(A1)", "0"],
        ["'\tx", ""],
        ["'\r=1", ""],
        ["-0.5", "+7"],
        ["plain", "a=b"],
        ['["-list"]', '{"k": "-v"}'],
    ]


def test_dashboard_csv_download_escapes_a_formula_in_a_project_name(client):
    staff = make_user("csv-staff", staff=True)
    project = make_project(name="=cmd|' /C calc'!A0")
    client.force_login(staff)
    response = client.get("/dashboard/", {"format": "csv", "chart": "projects"})
    assert response.status_code == 200
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    row = next(r for r in rows[1:] if r[0] == str(project.pk))
    assert row[1] == "'=cmd|' /C calc'!A0"
    assert all(not cell.startswith(FORMULA_START) for r in rows for cell in r)
