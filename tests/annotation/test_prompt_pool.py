"""The prompt pool (annotation.prompt_pool): import, dedup, the fixed eval split, the API."""

import gzip
import hashlib
import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from annotation.imports import ImportFailed, content_hash
from annotation.models import Item, Membership, Prompt
from annotation.prompt_pool import prompt_pool_draw, prompt_pool_import, split_of
from tests.factories import add_member, make_items, make_project, make_round, make_user

pytestmark = pytest.mark.django_db


def _jsonl(rows) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())


def _expected_split(payload, fraction: float) -> str:
    """The split by the definition: the first 32 bits of the sha256 of the normalised content."""
    if isinstance(payload, str):
        data = " ".join(payload.split())
    else:
        data = json.dumps([[m["role"], " ".join(m["content"].split())] for m in payload])
    bits = int(hashlib.sha256(data.encode()).hexdigest()[:8], 16)
    return "eval" if bits < fraction * 2**32 else "train"


def test_text_and_chat_prompts_join_the_pool_with_tags_and_ids():
    project = make_project()
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a prime."},
    ]
    rows = [
        {"prompt": "What is 2+2?", "tags": ["math", "easy"], "id": "q1"},
        {"messages": chat, "tags": ["chat"]},
    ]
    report = prompt_pool_import(project=project, stream=_jsonl(rows), eval_fraction=0.0)
    assert (report.added, report.train, report.eval) == (2, 2, 0)
    text = Prompt.objects.get(project=project, text="What is 2+2?")
    assert text.in_pool and text.tags == ["math", "easy"] and text.external_id == "q1"
    chat_prompt = Prompt.objects.get(project=project, content_hash=content_hash(chat))
    assert chat_prompt.messages == chat and chat_prompt.text == ""
    assert chat_prompt.in_pool and chat_prompt.split == "train"


def test_duplicates_in_the_file_and_in_the_pool_are_counted_not_added_twice():
    project = make_project()
    prompt_pool_import(project=project, stream=_jsonl([{"prompt": "A"}]), eval_fraction=0.0)
    rows = [
        {"prompt": "A", "tags": ["again"]},  # already in the pool: keeps its row, gains a tag
        {"prompt": "B"},
        {"prompt": "  B "},  # the same prompt once normalised
        {"messages": [{"role": "user", "content": "B"}]},  # chat: a different prompt
    ]
    report = prompt_pool_import(project=project, stream=_jsonl(rows), eval_fraction=0.0)
    assert report.added == 2
    assert report.already_in_pool == 1
    assert report.duplicates_in_file == 1
    assert Prompt.objects.filter(project=project, in_pool=True).count() == 3
    assert Prompt.objects.get(project=project, text="A").tags == ["again"]


def test_split_is_fixed_by_the_content_hash_whatever_else_is_imported():
    project = make_project()
    texts = [f"prompt number {i}" for i in range(200)]
    report = prompt_pool_import(
        project=project, stream=_jsonl([{"prompt": t} for t in texts[:120]]), eval_fraction=0.3
    )
    # Imported again in another order, with other prompts: every split stays as it was.
    first = dict(Prompt.objects.filter(project=project).values_list("text", "split"))
    shuffled = texts[120:] + list(reversed(texts[:120]))
    prompt_pool_import(
        project=project, stream=_jsonl([{"prompt": t} for t in shuffled]), eval_fraction=0.3
    )
    again = dict(Prompt.objects.filter(project=project).values_list("text", "split"))
    assert all(again[t] == first[t] for t in texts[:120])
    assert all(again[t] == _expected_split(t, 0.3) for t in texts)
    # the share is near the fraction asked (binomial sd of 200 draws at 0.3 is ~0.032)
    n_eval = sum(1 for t in texts if again[t] == "eval")
    assert 0.3 - 0.1 < n_eval / 200 < 0.3 + 0.1
    assert report.eval == sum(1 for t in texts[:120] if first[t] == "eval")
    # A second project with the same prompts splits them the same way.
    other = make_project(name="other")
    prompt_pool_import(
        project=other, stream=_jsonl([{"prompt": t} for t in texts]), eval_fraction=0.3
    )
    assert dict(Prompt.objects.filter(project=other).values_list("text", "split")) == again
    assert split_of(content_hash(texts[0]), eval_fraction=0.3) == again[texts[0]]


def test_a_prompt_a_round_already_used_joins_the_train_split():
    project = make_project()
    item = make_items(project, 1, round_=make_round(project))[0]
    text = item.prompt.text
    # With every new prompt going to eval, the one already answered in a round stays train.
    report = prompt_pool_import(
        project=project,
        stream=_jsonl([{"prompt": text}, {"prompt": "brand new"}]),
        eval_fraction=0.999999,
    )
    assert report.joined_from_rounds == 1 and report.added == 1
    assert (report.train, report.eval) == (1, 1)
    item.prompt.refresh_from_db()
    assert item.prompt.in_pool and item.prompt.split == "train"
    assert Prompt.objects.get(project=project, text="brand new").split == "eval"


def test_every_bad_line_is_reported_and_nothing_is_written():
    project = make_project()
    prompt_pool_import(project=project, stream=_jsonl([{"prompt": "kept"}]), eval_fraction=0.0)
    lines = [
        json.dumps({"prompt": "fine"}),
        "{not json",
        json.dumps({"prompt": ""}),
        json.dumps({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}),
        json.dumps({"messages": [{"role": "robot", "content": "y"}]}),
        json.dumps({"prompt": "t", "tags": "math"}),
        json.dumps({"prompt": "u", "candidates": ["a"]}),
        json.dumps({"prompt": "v", "id": "same"}),
        json.dumps({"prompt": "w", "id": "same"}),
    ]
    stream = io.BytesIO(("\n".join(lines) + "\n").encode())
    with pytest.raises(ImportFailed) as caught:
        prompt_pool_import(project=project, stream=stream)
    by_line = {}
    for line, message in caught.value.errors:
        by_line.setdefault(line, []).append(message)
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7, 9]
    assert "bad JSON" in by_line[2][0]
    assert "non-empty" in by_line[3][0]
    assert "exactly one" in by_line[4][0]
    assert "role" in by_line[5][0]
    assert "'tags'" in by_line[6][0]
    assert "candidates" in by_line[7][0]
    assert "'same'" in by_line[9][0]
    assert list(Prompt.objects.filter(project=project).values_list("text", flat=True)) == ["kept"]


def test_draw_takes_least_used_train_prompts_never_eval():
    project = make_project()
    texts = [f"p{i}" for i in range(40)]
    prompt_pool_import(project=project, stream=_jsonl([{"prompt": t} for t in texts]))
    train = set(Prompt.objects.filter(project=project, split="train").values_list("pk", flat=True))
    eval_ = set(Prompt.objects.filter(project=project, split="eval").values_list("pk", flat=True))
    assert train and eval_  # 40 prompts at 10%: both sides hold some (fixed by the hashes)
    used = Prompt.objects.filter(pk__in=train).order_by("pk")[:3]
    round_ = make_round(project)
    for prompt in used:
        Item.objects.create(project=project, round=round_, prompt=prompt)
    drawn = prompt_pool_draw(project=project, n=len(train) - 3, seed=1)
    assert {p.pk for p in drawn} == train - {p.pk for p in used}
    assert [p.pk for p in prompt_pool_draw(project=project, n=5, seed=1)] == [
        p.pk for p in drawn[:5]
    ]
    assert {p.pk for p in prompt_pool_draw(project=project, n=99, split="eval")} == eval_


def test_command_imports_gzip_and_lists_bad_lines(tmp_path):
    project = make_project()
    path = tmp_path / "pool.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps({"prompt": "one"}) + "\n" + json.dumps({"prompt": "two"}) + "\n")
    out = io.StringIO()
    call_command(
        "import_prompts",
        str(path),
        "--project",
        str(project.pk),
        "--eval-fraction",
        "0",
        "--no-progress",
        stdout=out,
    )
    assert "added: 2" in out.getvalue()
    assert Prompt.objects.filter(project=project, in_pool=True).count() == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "three"}\n{"text": "x"}\n')
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 bad line"):
        call_command("import_prompts", str(bad), "--project", str(project.pk), stderr=err)
    assert "line 2: unknown field(s): text" in err.getvalue()
    assert not Prompt.objects.filter(text="three").exists()
    with pytest.raises(CommandError, match="eval_fraction"):
        call_command(
            "import_prompts", str(path), "--project", str(project.pk), "--eval-fraction", "1.5"
        )


# --------------------------------------------------------------------------- the API


@pytest.fixture
def pool_project():
    project = make_project(name="pool api")
    researcher, annotator = make_user("pool-researcher"), make_user("pool-annotator")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    add_member(project, annotator)
    return project, researcher, annotator


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_api_imports_a_multipart_file_and_a_jsonl_body_then_lists_and_counts(pool_project):
    project, researcher, _ = pool_project
    client = _client(researcher)
    url = f"/api/projects/{project.pk}/prompts/import/"
    upload = SimpleUploadedFile(
        "pool.jsonl", b'{"prompt": "alpha", "tags": ["t1"]}\n{"prompt": "beta"}\n'
    )
    response = client.post(url, {"file": upload, "eval_fraction": "0"}, format="multipart")
    assert response.status_code == 201, response.content
    assert response.json()["added"] == 2 and response.json()["pool_train"] == 2
    body = b'{"messages": [{"role": "user", "content": "gamma"}], "tags": ["t1"]}\n'
    response = client.post(url + "?eval_fraction=0", data=body, content_type="application/jsonl")
    assert response.status_code == 201, response.content
    assert response.json()["added"] == 1

    listed = client.get(f"/api/projects/{project.pk}/prompts/?tag=t1")
    assert listed.status_code == 200
    assert listed["X-Total-Count"] == "2"
    assert {(p["text"], bool(p["messages"])) for p in listed.json()} == {
        ("alpha", False),
        ("", True),
    }
    assert client.get(f"/api/projects/{project.pk}/prompts/?split=eval").json() == []
    bad_split = client.get(f"/api/projects/{project.pk}/prompts/?split=test")
    assert bad_split.status_code == 400 and bad_split.json()["field"] == "split"
    nul_tag = client.get(f"/api/projects/{project.pk}/prompts/?split=eval&tag=%00")
    assert nul_tag.status_code == 400 and nul_tag.json()["field"] == "tag"
    counts = client.get(f"/api/projects/{project.pk}/prompts/counts/").json()
    assert counts == {"total": 3, "train": 3, "eval": 0, "tags": {"t1": 2}}


def test_api_refuses_bad_files_and_fields_naming_the_problem(pool_project):
    project, researcher, _ = pool_project
    client = _client(researcher)
    url = f"/api/projects/{project.pk}/prompts/import/"
    bad = SimpleUploadedFile("pool.jsonl", b'{"prompt": "ok"}\n{"prompt": 3}\n[]\n')
    response = client.post(url, {"file": bad}, format="multipart")
    assert response.status_code == 400
    assert [e["line"] for e in response.json()["errors"]] == [2, 3]
    response = client.post(
        url,
        {"file": SimpleUploadedFile("p.jsonl", b'{"prompt": "x"}\n'), "eval_fraction": "abc"},
        format="multipart",
    )
    assert response.status_code == 400 and response.json()["field"] == "eval_fraction"
    response = client.post(url, {"eval_fraction": "0.1"}, format="multipart")
    assert response.status_code == 400 and response.json()["field"] == "file"
    assert not Prompt.objects.filter(project=project).exists()


def test_api_refuses_a_pool_upload_past_the_limit(pool_project, settings):
    project, researcher, _ = pool_project
    settings.IMPORT_ASYNC_BYTES = 64
    body = "".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(10)).encode()
    response = _client(researcher).post(
        f"/api/projects/{project.pk}/prompts/import/", data=body, content_type="application/jsonl"
    )
    assert response.status_code == 413 and "import_prompts" in response.json()["detail"]
    assert not Prompt.objects.filter(project=project).exists()


def test_annotators_and_other_projects_researchers_never_reach_the_pool(pool_project):
    project, _, annotator = pool_project
    other_researcher = make_user("elsewhere-researcher")
    add_member(make_project(name="elsewhere"), other_researcher, Membership.Role.RESEARCHER)
    upload = b'{"prompt": "sneaky"}\n'
    for user, expected in ((annotator, 403), (other_researcher, 404)):
        client = _client(user)
        response = client.post(
            f"/api/projects/{project.pk}/prompts/import/",
            data=upload,
            content_type="application/jsonl",
        )
        assert response.status_code == expected
        assert client.get(f"/api/projects/{project.pk}/prompts/").status_code == expected
        assert client.get(f"/api/projects/{project.pk}/prompts/counts/").status_code == expected
    assert not Prompt.objects.filter(text="sneaky").exists()
