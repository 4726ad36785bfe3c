"""The researcher console: who reaches each page, bad input refused by field, and the writes.

Every console URL is tried by an anonymous visitor (login page), an annotator of the project
(403), a researcher of another project (404) and, for creating projects, a researcher who is
not staff (403); afterwards nothing in the database has changed. Each form's bad values are
refused with a 400 that names the field, and nothing is written.
"""

from __future__ import annotations

import io
import json

import pytest
from django.test import Client

from annotation import access, exports
from annotation.models import (
    Adjudication,
    DatasetVersion,
    ImportJob,
    Item,
    Judgment,
    Membership,
    Project,
    TaskKind,
)
from evaluation.models import AnnotatorAssessment
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _artifacts(tmp_path, settings):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"


def _client(user=None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _state() -> dict:
    """Return everything a console write could change."""
    return {
        "projects": list(Project.objects.order_by("pk").values_list("pk", "name", "archived")),
        "members": list(
            Membership.objects.order_by("pk").values_list(
                "pk", "role", "status", "status_reason", "skip_count"
            )
        ),
        "items": list(Item.objects.order_by("pk").values_list("pk", "needs_review")),
        "judgments": Judgment.objects.count(),
        "datasets": DatasetVersion.objects.count(),
        "imports": ImportJob.objects.count(),
        "adjudications": Adjudication.objects.count(),
        "assessments": AnnotatorAssessment.objects.count(),
    }


def _world():
    project = make_project(name="console project")
    researcher = make_user("console-researcher", staff=True)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    annotator = make_user("console-annotator")
    add_member(project, annotator)
    other = make_project(name="other project")
    stranger = make_user("other-researcher")
    add_member(other, stranger, Membership.Role.RESEARCHER)
    (item,) = make_items(project, 1)
    for user, choice in ((researcher, "A"), (annotator, "B")):
        Judgment.objects.create(project=project, item=item, annotator=user, choice=choice)
    Item.objects.filter(pk=item.pk).update(needs_review=True)
    dv = exports.dataset_version_export(
        project=project, policy={"hf": False, "split": {"train": 1.0}}
    )
    return project, researcher, annotator, stranger, item, dv


def _urls(project, annotator, item, dv) -> list[tuple[str, str, dict]]:
    p = f"/console/projects/{project.pk}"
    return [
        ("get", f"{p}/", {}),
        ("get", f"{p}/live/", {}),
        ("post", f"{p}/archive/", {"archived": "1"}),
        ("post", f"{p}/members/", {"username": annotator.username, "role": "researcher"}),
        ("post", f"{p}/members/{annotator.pk}/pause/", {"reason": "because"}),
        ("post", f"{p}/members/{annotator.pk}/resume/", {"note": "ok"}),
        ("get", f"{p}/data/", {}),
        ("post", f"{p}/data/import/", {"kind": "items", "format": "jsonl"}),
        ("get", f"{p}/data/imports/1/", {}),
        ("post", f"{p}/data/export/", {"format": "trl"}),
        ("get", f"{p}/datasets/{dv.version}/", {}),
        ("get", f"{p}/datasets/{dv.version}/files/train.jsonl", {}),
        ("get", f"{p}/review/", {}),
        ("post", f"{p}/review/refresh/", {}),
        ("post", f"{p}/review/items/{item.pk}/verdict/", {"choice": "A"}),
    ]


def test_outsiders_get_login_403_or_404_on_every_console_url_and_nothing_changes():
    project, _researcher, annotator, stranger, item, dv = _world()
    urls = _urls(project, annotator, item, dv)
    before = _state()
    for method, url, data in urls:
        # anonymous: the login page
        response = getattr(_client(), method)(url, data)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url
        # an annotator of the project: 403 (the project exists for them, the page does not)
        response = getattr(_client(annotator), method)(url, data)
        assert response.status_code == 403, (url, response.status_code)
        # a researcher of another project: 404, as if the project did not exist
        response = getattr(_client(stranger), method)(url, data)
        assert response.status_code == 404, (url, response.status_code)
    assert _client().get("/console/").status_code == 302
    assert _client(annotator).get("/console/").status_code == 403
    listing = _client(stranger).get("/console/")
    assert listing.status_code == 200 and b"console project" not in listing.content
    new = {"name": "made by a non-staff researcher", "task_kind": "pairwise", "k": 2}
    assert _client(stranger).post("/console/projects/new/", new).status_code == 403
    assert _client(stranger).get("/console/projects/new/").status_code == 403
    assert _state() == before


def test_a_reviewer_reaches_the_review_queue_but_no_researcher_page():
    project, _researcher, _annotator, _stranger, _item, _dv = _world()
    reviewer = make_user("console-reviewer")
    add_member(project, reviewer, Membership.Role.REVIEWER)
    client = _client(reviewer)
    listing = client.get("/console/").content.decode()
    assert "console project" in listing and f"/console/projects/{project.pk}/data/" not in listing
    assert client.get(f"/console/projects/{project.pk}/review/").status_code == 200
    assert client.get(f"/console/projects/{project.pk}/data/").status_code == 403
    assert client.get(f"/console/projects/{project.pk}/").status_code == 403


def _refused(response, field: str) -> None:
    assert response.status_code == 400, response.status_code
    assert f'data-field="{field}"'.encode() in response.content or (
        f"{field}:".encode() in response.content
    ), response.content.decode()[:3000]


PROJECT = {
    "name": "new one",
    "task_kind": "pairwise",
    "k": "2",
    "overlap": "3",
    "gold_rate": "0",
    "repeat_rate": "0",
    "repeat_min_gap": "5",
    "lease_seconds": "300",
    "max_skip_fraction": "0.2",
    "max_skips_in_row": "10",
    "skip_fraction_min_served": "20",
    "max_text_chars": "100000",
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "console project"}, "name"),  # taken
        ({"k": "3"}, "k"),  # pairwise has k = 2
        ({"gold_rate": "1.5"}, "gold_rate"),
        ({"lease_seconds": "5"}, "lease_seconds"),
        ({"task_kind": "essay"}, "task_kind"),
        ({"overlap": "many"}, "overlap"),
    ],
)
def test_project_form_refuses_a_bad_setting_by_name(change, field):
    _project, researcher, *_ = _world()
    before = _state()
    response = _client(researcher).post("/console/projects/new/", {**PROJECT, **change})
    _refused(response, field)
    assert _state() == before


def test_project_form_shows_every_setting_with_its_help_and_creates_through_the_service():
    _project, researcher, *_ = _world()
    client = _client(researcher)
    page = client.get("/console/projects/new/").content.decode()
    for name in ("rubric", "overlap", "gold_rate", "lease_seconds", "ask_confidence"):
        help_text = str(Project._meta.get_field(name).help_text)
        assert help_text and help_text.replace("'", "&#x27;") in page, name
    response = client.post("/console/projects/new/", {**PROJECT, "allow_tie": "on"})
    created = Project.objects.get(name="new one")
    assert response.status_code == 302 and response["Location"].endswith(f"/{created.pk}/")
    assert access.user_can_manage(project_id=created.pk, user=researcher)


def test_member_pause_resume_and_archive_forms_refuse_bad_values_and_keep_the_record():
    project, researcher, annotator, *_ = _world()
    client = _client(researcher)
    p = f"/console/projects/{project.pk}"
    before = _state()
    _refused(client.post(f"{p}/members/", {"username": "nobody", "role": "annotator"}), "username")
    _refused(client.post(f"{p}/members/", {"username": annotator.username, "role": "boss"}), "role")
    _refused(client.post(f"{p}/members/{annotator.pk}/pause/", {"reason": ""}), "reason")
    _refused(client.post(f"{p}/members/{annotator.pk}/resume/", {"note": "x" * 2001}), "note")
    _refused(client.post(f"{p}/archive/", {"archived": "maybe"}), "archived")
    assert client.post(f"{p}/members/999999/pause/", {"reason": "x"}).status_code == 404
    assert _state() == before

    # pause with a reason: the annotator is told, and the record names who and why
    Membership.objects.filter(user=annotator).update(skip_count=7, skips_in_row=3)
    response = client.post(f"{p}/members/{annotator.pk}/pause/", {"reason": "too fast"})
    assert response.status_code == 302
    membership = Membership.objects.get(project=project, user=annotator)
    assert membership.status == "paused" and "too fast" in membership.status_reason
    record = AnnotatorAssessment.objects.get(project=project, annotator=annotator)
    assert (record.verdict, record.trigger, record.reasons) == ("pause", "manual", ["too fast"])
    assert record.created_by == researcher
    # resume: through the QC service, so the skip budget is cleared and "resumed" is recorded
    assert client.post(f"{p}/members/{annotator.pk}/resume/", {"note": "talked"}).status_code == 302
    membership.refresh_from_db()
    assert (membership.status, membership.skip_count, membership.skips_in_row) == ("active", 0, 0)
    assert AnnotatorAssessment.objects.filter(annotator=annotator, verdict="resumed").exists()

    # add by username with a role
    newcomer = make_user("newcomer")
    client.post(f"{p}/members/", {"username": "newcomer", "role": "reviewer"})
    assert Membership.objects.get(project=project, user=newcomer).role == "reviewer"

    # archive: gone for annotators, still readable and exportable for the researcher
    assert client.post(f"{p}/archive/", {"archived": "1"}).status_code == 302
    assert not access.project_list_for_user(user=annotator).filter(pk=project.pk).exists()
    assert client.get(f"{p}/data/").status_code == 200


def _upload(client, project, content: bytes, name="items.jsonl", **fields):
    data = {"kind": "items", "format": "jsonl", **fields}
    data["file"] = io.BytesIO(content)
    data["file"].name = name
    return client.post(f"/console/projects/{project.pk}/data/import/", data)


def _line(i: int) -> str:
    return json.dumps({"id": f"q{i}", "prompt": f"Question {i}?", "candidates": [f"a{i}", f"b{i}"]})


def test_import_reports_every_bad_line_imports_a_good_file_and_refuses_bad_fields():
    project, researcher, *_ = _world()
    client = _client(researcher)
    before = _state()
    bad = "\n".join([_line(1), '{"prompt": "x", "candidates": ["only one"]}', "{not json"])
    response = _upload(client, project, bad.encode())
    assert response.status_code == 400
    text = response.content.decode()
    assert "2 bad line(s); nothing was imported." in text
    assert "expected 2 candidates, got 1" in text and "bad JSON" in text
    _refused(_upload(client, project, _line(1).encode(), format="hh"), "format")
    _refused(_upload(client, project, _line(1).encode(), kind="everything"), "kind")
    response = client.post(f"/console/projects/{project.pk}/data/import/", {"kind": "items"})
    _refused(response, "file")
    assert _state() == before

    response = _upload(client, project, "\n".join(_line(i) for i in range(3)).encode())
    assert response.status_code == 201
    assert 'data-report="items_created">3<' in response.content.decode()
    assert Item.objects.filter(project=project).count() == 1 + 3


def test_a_large_import_is_queued_and_its_page_shows_the_job(settings):
    project, researcher, *_ = _world()
    settings.IMPORT_ASYNC_BYTES = 10
    response = _upload(_client(researcher), project, _line(1).encode())
    assert response.status_code == 202
    job = ImportJob.objects.get(project=project)
    assert f'hx-get="/console/projects/{project.pk}/data/imports/{job.pk}/"' in (
        response.content.decode()
    )
    page = _client(researcher).get(f"/console/projects/{project.pk}/data/imports/{job.pk}/")
    assert page.status_code == 200 and b"Queued" in page.content
    assert job.path.encode() not in page.content


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"min_agreement": "2"}, "min_agreement"),
        ({"format": "parquet"}, "format"),
        ({"train": "0.5"}, "train"),  # the shares do not sum to 1
        ({"format": "hh", "ties": "soft"}, "format"),
        ({"min_votes": "0"}, "min_votes"),
        ({"sources": "robots"}, "sources"),
    ],
)
def test_export_form_refuses_a_bad_policy_by_field(change, field):
    project, researcher, *_ = _world()
    before = _state()
    data = {"format": "trl", "aggregation": "per_judgment", "ties": "drop", "both_bad": "drop"}
    data.update(min_agreement="0", min_votes="1", sources="human", seed="0")
    data.update(train="0.9", validation="0.05", test="0.05")
    response = _client(researcher).post(
        f"/console/projects/{project.pk}/data/export/", {**data, **change}
    )
    _refused(response, field)
    assert _state() == before


def test_export_creates_a_version_whose_page_lists_the_manifest_and_downloads():
    project, researcher, *_, dv = _world()
    client = _client(researcher)
    data = {"format": "trl", "aggregation": "majority", "ties": "drop", "both_bad": "drop"}
    data.update(min_agreement="0", min_votes="1", sources="human", seed="0", train="1")
    data.update(validation="0", test="0", adjudicated_wins="on", name="for DPO")
    response = client.post(f"/console/projects/{project.pk}/data/export/", data)
    new = DatasetVersion.objects.get(project=project, name="for DPO")
    assert response["Location"].endswith(f"/datasets/{new.version}/")
    assert new.policies["adjudicated_wins"] is True and new.policies["aggregation"] == "majority"
    page = client.get(response["Location"]).content.decode()
    assert "Building the snapshot" in page and "hx-get" in page
    # the snapshot the worker would build: built here, then the page lists its files
    page = client.get(f"/console/projects/{project.pk}/datasets/{dv.version}/").content.decode()
    assert 'data-file="train.jsonl"' in page and 'data-file="manifest.json"' in page
    assert "content_hash" in page
    download = client.get(f"/console/projects/{project.pk}/datasets/{dv.version}/files/train.jsonl")
    assert download.status_code == 200
    rows = [json.loads(line) for line in b"".join(download.streaming_content).splitlines()]
    assert rows and set(rows[0]) >= {"prompt", "chosen", "rejected"}
    missing = client.get(f"/console/projects/{project.pk}/datasets/{dv.version}/files/../x")
    assert missing.status_code == 404


def test_review_lists_labels_with_trust_and_stores_a_verdict_through_the_service():
    project, researcher, annotator, _, item, _ = _world()
    client = _client(researcher)
    page = client.get(f"/console/projects/{project.pk}/review/").content.decode()
    assert f'data-item="{item.pk}"' in page
    assert annotator.username in page and "0.50" in page  # trust without gold answers
    assert "model-0" not in page  # answers carry no model names
    url = f"/console/projects/{project.pk}/review/items/{item.pk}/verdict/"
    before = _state()
    _refused(client.post(url, {}), "choice")
    _refused(client.post(url, {"choice": "C"}), "choice")
    assert _state() == before
    assert client.post(url, {"choice": "B", "note": "B is right"}).status_code == 302
    verdict = Adjudication.objects.get(item=item)
    assert (verdict.choice, verdict.reviewer, verdict.note) == ("B", researcher, "B is right")
    item.refresh_from_db()
    assert item.needs_review is False


def test_a_ranking_verdict_with_a_gap_is_refused_by_the_rank_field():
    project = make_project(name="ranked", task_kind=TaskKind.RANKING, k=3)
    researcher = make_user("rank-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    (item,) = make_items(project, 1)
    url = f"/console/projects/{project.pk}/review/items/{item.pk}/verdict/"
    client = _client(researcher)
    _refused(client.post(url, {"rank_0": "1", "rank_1": "3", "rank_2": "3"}), "rank_0")
    _refused(client.post(url, {"rank_0": "1", "rank_1": "9", "rank_2": "2"}), "rank_1")
    assert not Adjudication.objects.exists()
    assert client.post(url, {"rank_0": "2", "rank_1": "1", "rank_2": "3"}).status_code == 302
    assert Adjudication.objects.get(item=item).ranking == [2, 1, 3]
