"""Importing prompts + K candidates (annotation.imports.items_import): dedup, bad lines, gzip."""

import gzip
import io
import json

import pytest
from django.core.management import call_command

from annotation.imports import ImportFailed, items_import
from annotation.models import Candidate, Item, Prompt
from tests.factories import make_project

pytestmark = pytest.mark.django_db


def _jsonl(rows) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())


def test_duplicate_prompts_and_responses_are_reported_with_examples():
    project = make_project()
    rows = [
        {"prompt": "Q1", "candidates": ["a", "b"]},
        {"prompt": " Q1 ", "candidates": ["a", "c"]},
        {"prompt": "Q2", "candidates": ["a", "b"]},
    ]
    report = items_import(project=project, stream=_jsonl(rows))
    assert report.items_created == 3 and report.prompts_created == 2
    assert report.dedup["prompt"]["duplicates"] == 1
    assert report.dedup["prompt"]["examples"][0]["where"] == "line 2"
    assert report.dedup["response"]["duplicates"] == 1  # "a" again under Q1
    assert Candidate.objects.filter(text="a").count() == 2  # one per prompt


def test_bad_lines_are_all_reported_and_nothing_is_written():
    project = make_project()
    rows = [
        {"prompt": "ok", "candidates": ["a", "b"]},
        {"prompt": "", "candidates": ["a", "b"]},
        {"prompt": "x", "candidates": ["a"]},
        {"prompt": "ok", "candidates": ["b", "a"]},
    ]
    with pytest.raises(ImportFailed) as caught:
        items_import(project=project, stream=_jsonl(rows))
    assert sorted({line for line, _ in caught.value.errors}) == [2, 3, 4]
    assert not Prompt.objects.exists() and not Item.objects.exists()


def test_import_items_command_reads_gzip(tmp_path):
    project = make_project()
    path = tmp_path / "items.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps({"prompt": "Q", "candidates": ["a", "b"]}) + "\n")
    out = io.StringIO()
    call_command("import_items", project.name, str(path), stdout=out)
    assert "imported 1 item(s)" in out.getvalue()
    assert Item.objects.filter(project=project).count() == 1
