"""Imports do bounded work per request: size limits with a 413, flat memory, large files queued.

The gzip bombs are real: one gzip member repeated (RFC 1952 section 2.2 lets a file hold many
members, read back as one stream), so a 4 MB upload decompresses to gigabytes. Memory is the
peak resident set of this process (VmHWM, reset through /proc/self/clear_refs) while the
endpoint answers: it grows by a few megabytes, not by the size of the file or the line.
Large uploads are imported by a real Celery worker (tests/celery_worker.py) whose progress
the status endpoint shows.
"""

from __future__ import annotations

import gzip
import json
import re
import time
import uuid
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from annotation.models import (
    Candidate,
    ImportJob,
    Item,
    ItemCandidate,
    Judgment,
    Membership,
    Prompt,
    Round,
)
from tests.factories import add_member, make_project, make_user

MiB = 2**20
TABLES = (Prompt, Candidate, Item, ItemCandidate, Judgment, Round, ImportJob)
# Growth of the peak resident set allowed while one import request is answered (measured:
# 12-13 MiB for the bombs, 17-32 MiB for the 1 GiB line, which holds one 16 MiB line).
MEMORY_BOUND = 48 * MiB


def _counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in TABLES}


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M)[1])


def _peak_growth(call):
    """Return (call's result, how far the peak resident set rose above the current one)."""
    Path("/proc/self/clear_refs").write_text("5")  # peak := current resident set
    before = _status_kib("VmRSS")
    result = call()
    return result, (_status_kib("VmHWM") - before) * 1024


def _warm_up(client, project) -> None:
    """Send each endpoint a small file: a process's first request loads modules (~65 MiB)."""
    tiny = gzip.compress(b"{}\n")
    _post(client, f"/api/projects/{project.pk}/import/", "warm.jsonl.gz", tiny)
    _post(client, f"/api/projects/{project.pk}/import/", "warm.csv.gz", tiny)
    url = f"/api/projects/{project.pk}/import-preferences/"
    _post(client, url, "warm.jsonl.gz", tiny, format="hh")


def _bomb(chunk: bytes, times: int) -> bytes:
    """Return a gzip file that decompresses to chunk repeated `times` times."""
    return gzip.compress(chunk, compresslevel=6) * times


@pytest.fixture
def researcher_client(db):
    project = make_project(name="limits")
    researcher = make_user("limits-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    client = APIClient()
    client.force_authenticate(researcher)
    return project, client


def _post(client, url: str, name: str, data: bytes, **fields):
    upload = SimpleUploadedFile(name, data, content_type="application/octet-stream")
    return client.post(url, {"file": upload, **fields}, format="multipart")


def _row(i: int, prompt: str | None = None) -> dict:
    return {"id": f"r{i}", "prompt": prompt or f"question {i}?", "candidates": [f"a{i}", f"b{i}"]}


@pytest.mark.django_db
def test_a_gzip_bomb_answers_413_naming_the_limit_writes_nothing_and_memory_stays_flat(
    researcher_client, settings
):
    project, client = researcher_client
    settings.IMPORT_MAX_BYTES = 256 * MiB
    # 64 MiB of 1 MiB JSON lines, as one gzip member repeated 64 times: 4 GiB decompressed.
    line = (json.dumps(_row(0, prompt="x" * (MiB - 100))) + "\n").encode()
    bomb = _bomb(line * 64, 64)
    assert len(bomb) < 8 * MiB and len(line) * 64 * 64 > 3.99 * 2**30
    _warm_up(client, project)
    before = _counts()
    for url, fields in (
        (f"/api/projects/{project.pk}/import/", {}),
        (f"/api/projects/{project.pk}/import-preferences/", {"format": "ranking"}),
    ):
        response, growth = _peak_growth(
            lambda url=url, fields=fields: _post(client, url, "bomb.jsonl.gz", bomb, **fields)
        )
        assert response.status_code == 413, response.content
        body = response.json()
        assert body["code"] == "too_large" and body["field"] == "file"
        assert body["limit_bytes"] == 256 * MiB
        assert "256 MiB" in body["detail"] and "decompressed" in body["detail"]
        assert growth < MEMORY_BOUND, f"peak memory grew by {growth / MiB:.0f} MiB"
    assert _counts() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("endpoint", "name", "fields"),
    [
        ("import", "line.jsonl.gz", {}),
        ("import", "line.csv.gz", {}),
        ("import-preferences", "line.jsonl.gz", {"format": "hh"}),
    ],
)
def test_a_one_gigabyte_line_answers_413_naming_the_line_limit_with_flat_memory(
    researcher_client, endpoint, name, fields
):
    project, client = researcher_client
    # A valid first line, then one line of 1 GiB without an end (16 members of 64 MiB).
    first = b"id,prompt,candidate_1,candidate_2\n" if ".csv" in name else b"\n"
    bomb = gzip.compress(first) + _bomb(b"x" * (64 * MiB), 16)
    _warm_up(client, project)
    before = _counts()
    url = f"/api/projects/{project.pk}/{endpoint}/"
    response, growth = _peak_growth(lambda: _post(client, url, name, bomb, **fields))
    assert response.status_code == 413, response.content
    body = response.json()
    assert body["limit_bytes"] == 16 * MiB
    assert body["detail"].startswith("Line 2 is longer than 16 MiB")
    assert growth < MEMORY_BOUND, f"peak memory grew by {growth / MiB:.0f} MiB"
    assert _counts() == before


@pytest.mark.django_db
def test_an_upload_above_the_cap_is_refused_before_it_is_read(researcher_client, settings):
    project, client = researcher_client
    settings.IMPORT_MAX_UPLOAD_BYTES = 1 * MiB
    data = b"\n".join(json.dumps(_row(i)).encode() for i in range(40_000))
    assert len(data) > 2 * MiB
    before = _counts()
    response = _post(client, f"/api/projects/{project.pk}/import/", "big.jsonl", data)
    assert response.status_code == 413
    assert response.json()["limit_bytes"] == MiB and "1 MiB" in response.json()["detail"]
    assert _counts() == before


@pytest.mark.django_db
def test_files_within_the_limits_still_import(researcher_client, settings):
    project, client = researcher_client
    settings.IMPORT_MAX_LINE_BYTES = 200
    rows = [_row(i) for i in range(30)]
    data = gzip.compress("\n".join(json.dumps(r) for r in rows).encode())
    response = _post(client, f"/api/projects/{project.pk}/import/", "ok.jsonl.gz", data)
    assert response.status_code == 201, response.content
    assert response.json()["items_created"] == 30
    # One byte of line over the limit is refused.
    long_row = json.dumps(_row(99, prompt="y" * 200)).encode()
    response = _post(client, f"/api/projects/{project.pk}/import/", "long.jsonl", long_row)
    assert (
        response.status_code == 413
        and "Line 1 is longer than 200 bytes" in response.json()["detail"]
    )


# ---- large uploads: a Celery task with progress -------------------------------------------


def _purge(broker_url: str, queue: str) -> None:
    import redis

    client = redis.Redis.from_url(broker_url)
    client.delete(queue, f"_kombu.binding.{queue}")


def _wait_for_job(client, url: str, timeout: float = 180) -> tuple[dict, list[dict]]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(url).json()
        seen.append(job)
        if job["status"] in ("succeeded", "failed"):
            return job, seen
        time.sleep(0.05)
    pytest.fail(f"the import job did not finish: {seen[-1]}")


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_large_upload_is_imported_by_a_worker_with_progress_and_every_bad_line(
    settings, tmp_path
):
    from tests.celery_worker import Worker

    project = make_project(name="large imports")
    researcher = make_user("large-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    client = APIClient()
    client.force_authenticate(researcher)
    settings.IMPORT_ASYNC_BYTES = 16 * 1024
    n = 6000
    rows = [_row(i) for i in range(n)]
    good = "\n".join(json.dumps(r) for r in rows).encode()
    assert len(gzip.compress(good)) > settings.IMPORT_ASYNC_BYTES
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    _purge(settings.CELERY_BROKER_URL, queue)
    worker = Worker(
        queue=queue,
        broker_url=settings.CELERY_BROKER_URL,
        log_path=tmp_path / "worker.log",
        name=f"import-{uuid.uuid4().hex[:8]}",
    )
    try:
        # A file with three bad lines: refused whole, every bad line on the job.
        bad_rows = [dict(r) for r in rows]
        for index in (4, 999, n - 1):
            bad_rows[index] = {"id": f"bad{index}", "prompt": "", "candidates": ["a"]}
        bad = "\n".join(json.dumps(r) for r in bad_rows).encode()
        response = _post(client, f"/api/projects/{project.pk}/import/", "bad.jsonl", bad)
        assert response.status_code == 202, response.content
        job, _ = _wait_for_job(client, response["Location"])
        assert job["status"] == "failed", (job, worker.text())
        assert job["total_bad"] == 3
        assert sorted({e["line"] for e in job["errors"]}) == [5, 1000, n]
        assert Item.objects.filter(project=project).count() == 0
        stored = ImportJob.objects.get(pk=job["id"]).path
        assert not Path(stored).exists()

        # A clean file: imported atomically, its progress visible while it runs.
        response = _post(
            client, f"/api/projects/{project.pk}/import/", "good.jsonl.gz", gzip.compress(good)
        )
        assert response.status_code == 202
        assert response.json()["status"] == "queued"
        job, seen = _wait_for_job(client, response["Location"])
        assert job["status"] == "succeeded", (job, worker.text())
        assert job["progress"] == 1.0 and job["phase"] == "done"
        assert job["report"]["items_created"] == n
        assert Item.objects.filter(project=project).count() == n
        progress = [s["progress"] for s in seen]
        assert progress == sorted(progress)
        assert any(0 < s["progress"] < 1 and s["status"] == "running" for s in seen), seen
        assert "path" not in job and str(tmp_path) not in json.dumps(job)
    finally:
        worker.stop()
