"""Ids of another project's objects, in the URL, the query string or the body, get nothing.

Two projects: A, where the callers work, and B, whose objects they name. Each row of
`CASES` is one request that names something of B from inside A: a round number only B has,
B's dataset version, run, model version, item, assignment or annotator. Every row is sent
as a researcher, a reviewer and an annotator of A and as a user with no membership at all,
each inside a savepoint that is rolled back. Checked for each:
- a refusal (403 or 404; a 400 only if its message names the field), never a 2xx or 5xx;
  rows marked `listing` may answer 2xx (a list filtered to what the caller may see);
- nothing of B in the answer (distinctive strings planted in B's rows);
- nothing created or changed: every row of the project's apps reads the same afterwards.

A new endpoint that takes an id gets a row here (and its URL a rule in url_access.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from urllib.parse import parse_qs, urlsplit

import pytest
from django.apps import apps
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client
from django.urls import resolve

from annotation import services
from annotation.models import DatasetVersion, ImportJob, Item, Membership, Round
from evaluation.models import AnnotatorAssessment
from tests.factories import add_member, make_items, make_project, make_user
from training.models import GenerationJob, ModelVersion, TrainingRun

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at"),  # whitenoise, no collectstatic
]

APPS = ("annotation", "training", "evaluation", "authtoken", "django_celery_beat")
ROLES = ("researcher", "reviewer", "annotator", "nobody")
# A round number, and a dataset version number, that only project B has.
B_ROUND = 7
B_VERSION = 2
# Planted in B's rows; none may reach a caller from A.
B_SECRETS = (
    "b-model-secret-6121",
    "b-run-secret-7310",
    "b-dataset-secret-4402",
    "b-prompt-secret-9904",
    "b-annotator-secret-5518",
    "b-rationale-secret-2290",
)


@dataclass
class World:
    a: object = None
    b: object = None
    users: dict = field(default_factory=dict)
    a_dataset: object = None
    a_model: object = None
    b_dataset: object = None
    b_run: object = None
    b_model: object = None
    b_item: object = None
    b_lease: object = None
    b_annotator: object = None
    b_import_job: object = None
    b_generation_job: object = None


@pytest.fixture
def world(db, tmp_path, settings) -> World:
    """Project A with a member of each role; project B with one object of every kind."""
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    w = World()
    w.a = make_project(name="project A")
    w.b = make_project(name="project B", ask_rationale=True)
    w.users = {
        "researcher": make_user("a-researcher"),
        "reviewer": make_user("a-reviewer"),
        "annotator": make_user("a-annotator"),
        "nobody": make_user("no-member"),
    }
    add_member(w.a, w.users["researcher"], Membership.Role.RESEARCHER)
    add_member(w.a, w.users["reviewer"], Membership.Role.REVIEWER)
    add_member(w.a, w.users["annotator"])
    a_round = Round.objects.create(project=w.a, number=1)
    make_items(w.a, 2, round_=a_round)

    # B: a round number A lacks, items with a label and a live lease, QC rows.
    b_researcher = make_user("b-researcher")
    w.b_annotator = make_user(B_SECRETS[4])
    add_member(w.b, b_researcher, Membership.Role.RESEARCHER)
    add_member(w.b, w.b_annotator)
    b_round = Round.objects.create(project=w.b, number=B_ROUND)
    items = make_items(w.b, 3, round_=b_round, models=(B_SECRETS[0], "b-baseline"))
    Item.objects.filter(pk=items[0].pk).update(needs_review=True)
    items[0].prompt.text = B_SECRETS[3]
    items[0].prompt.save(update_fields=["text"])
    first = services.assignment_next(project_id=w.b.pk, user=w.b_annotator)
    services.judgment_submit(
        assignment_id=first.pk, user=w.b_annotator, choice="A", rationale=B_SECRETS[5]
    )
    w.b_item = first.item
    w.b_lease = services.assignment_next(project_id=w.b.pk, user=w.b_annotator)
    AnnotatorAssessment.objects.create(
        project=w.b, annotator=w.b_annotator, verdict="pass", reasons=[B_SECRETS[4]]
    )
    w.b_import_job = ImportJob.objects.create(
        project=w.b, kind=ImportJob.Kind.ITEMS, file_name=f"{B_SECRETS[3]}.jsonl"
    )
    w.b_generation_job = GenerationJob.objects.create(
        project=w.b, source_key="b-generation-job", request={"note": B_SECRETS[0]}
    )

    # Datasets, a run and the model it made: A's are the ones A may use.
    w.a_dataset = _dataset(tmp_path, w.a, 1, "a-dataset")
    w.b_dataset = _dataset(tmp_path, w.b, B_VERSION, B_SECRETS[2])
    (tmp_path / "a-model").mkdir()
    (tmp_path / "a-model" / "config.json").write_text("{}")
    w.a_model = ModelVersion.objects.create(
        name="a-model", artifact_path=str(tmp_path / "a-model"), dataset_version=w.a_dataset
    )
    w.b_run = TrainingRun.objects.create(
        recipe="reward",
        project=w.b,
        dataset_version=w.b_dataset,
        config={"note": B_SECRETS[1]},
        status=TrainingRun.Status.QUEUED,
    )
    w.b_model = ModelVersion.objects.create(
        name=B_SECRETS[0],
        kind=ModelVersion.Kind.REWARD,
        artifact_path=str(tmp_path / "b-model"),
        training_run=w.b_run,
        dataset_version=w.b_dataset,
    )
    return w


def _dataset(tmp_path, project, version: int, name: str) -> DatasetVersion:
    folder = tmp_path / f"dataset-{project.pk}-{version}"
    folder.mkdir()
    (folder / "manifest.json").write_text(f'{{"name": "{name}"}}')
    (folder / "train.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    return DatasetVersion.objects.create(
        project=project,
        version=version,
        name=name,
        status=DatasetVersion.Status.READY,
        content_hash="0" * 64,
        path=str(folder),
    )


# --- the table -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One request naming B's object from inside A."""

    name: str
    method: str
    path: Callable[[World], str]
    body: Callable[[World], dict] | None = None
    # json (API), multipart (file uploads) or form (web pages)
    encoding: str = "json"
    # The field that names B's object: a 400 must say which field is wrong.
    field: str = ""
    # A filtered list or page: a 2xx is fine when nothing of B is in it.
    listing: bool = False


def _items_file() -> SimpleUploadedFile:
    line = b'{"prompt": "new prompt", "candidates": [{"text": "x"}, {"text": "y"}]}\n'
    return SimpleUploadedFile("items.jsonl", line)


def _preferences_file() -> SimpleUploadedFile:
    return SimpleUploadedFile("prefs.jsonl", b'{"prompt": "p", "chosen": "a", "rejected": "b"}\n')


def _model_archive() -> SimpleUploadedFile:
    """Return a .tar.gz holding a config.json (enough to be unpacked and registered)."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = b'{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}'
        info = tarfile.TarInfo("config.json")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return SimpleUploadedFile("model.tar.gz", buffer.getvalue())


def _run_body(**ids) -> Callable[[World], dict]:
    """Return a training run request naming the given objects (callables of the world)."""
    return lambda w: {"recipe": "reward", "config": {}, **{k: f(w) for k, f in ids.items()}}


A = attrgetter("a.pk")
B = attrgetter("b.pk")
A_DATASET = attrgetter("a_dataset.pk")
B_DATASET = attrgetter("b_dataset.pk")

CASES = [
    # --- ids in the body ---
    Case(
        "import items into B's round number",
        "POST",
        lambda w: f"/api/projects/{w.a.pk}/import/",
        lambda w: {"file": _items_file(), "round": str(B_ROUND)},
        encoding="multipart",
        field="round",
    ),
    Case(
        "import preferences into B's round number",
        "POST",
        lambda w: f"/api/projects/{w.a.pk}/import-preferences/",
        lambda w: {"file": _preferences_file(), "format": "trl", "round": str(B_ROUND)},
        encoding="multipart",
        field="round",
    ),
    Case(
        "export with B's round numbers",
        "POST",
        lambda w: f"/api/projects/{w.a.pk}/datasets/",
        lambda w: {"name": "x", "policy": {"rounds": [B_ROUND]}},
        field="rounds",
    ),
    Case(
        "train A's project on B's dataset",
        "POST",
        lambda w: "/api/training/runs/",
        _run_body(project_id=A, dataset_version_id=B_DATASET),
        field="dataset_version_id",
    ),
    Case(
        "train on B's dataset",
        "POST",
        lambda w: "/api/training/runs/",
        _run_body(dataset_version_id=B_DATASET),
        field="dataset_version_id",
    ),
    Case(
        "train B's project on A's dataset",
        "POST",
        lambda w: "/api/training/runs/",
        _run_body(project_id=B, dataset_version_id=A_DATASET),
        field="project_id",
    ),
    Case(
        "train from B's model",
        "POST",
        lambda w: "/api/training/runs/",
        _run_body(
            project_id=A, dataset_version_id=A_DATASET, base_model_id=attrgetter("b_model.pk")
        ),
        field="base_model_id",
    ),
    *[
        Case(
            f"train with B's model as config.{name}",
            "POST",
            lambda w: "/api/training/runs/",
            lambda w, name=name: {
                "recipe": "ppo",
                "config": {name: w.b_model.pk},
                "project_id": w.a.pk,
                "dataset_version_id": w.a_dataset.pk,
                "base_model_id": w.a_model.pk,
            },
            field=name,
        )
        for name in (
            "tokenizer_model_id",
            "reference_model_id",
            "reward_model_id",
            "value_model_id",
        )
    ],
    Case(
        "register an endpoint policy in B",
        "POST",
        lambda w: "/api/training/models/endpoint/",
        lambda w: {"project_id": w.b.pk, "name": "e", "endpoint": "x", "model": "m"},
    ),
    Case(
        "resume from B's run",
        "POST",
        lambda w: "/api/training/runs/",
        lambda w: {
            "recipe": "reward",
            "config": {"resume_from_run_id": w.b_run.pk},
            "project_id": w.a.pk,
            "dataset_version_id": w.a_dataset.pk,
            "base_model_id": w.a_model.pk,
        },
        field="resume_from_run_id",
    ),
    *[
        Case(
            f"move A's QC policy to B by {name}",
            "PATCH",
            lambda w: f"/api/qc/projects/{w.a.pk}/policy/",
            lambda w, name=name: {name: w.b.pk, "enabled": False},
            field=name,
        )
        for name in ("project", "project_id", "id")
    ],
    # --- ids in the query string ---
    Case(
        "agreement of B's round number",
        "GET",
        lambda w: f"/api/qc/projects/{w.a.pk}/agreement/?round={B_ROUND}&live=true&n_boot=5",
    ),
    Case(
        "labels of B's round number",
        "GET",
        lambda w: f"/api/qc/projects/{w.a.pk}/labels/?round={B_ROUND}",
    ),
    Case(
        "runs filtered to project B",
        "GET",
        lambda w: f"/api/training/runs/?project={w.b.pk}",
        listing=True,
    ),
    Case("reward models", "GET", lambda w: "/api/training/models/?kind=reward", listing=True),
    Case(
        "dashboard of A showing B's run",
        "GET",
        lambda w: f"/dashboard/projects/{w.a.pk}/training/?run={w.b_run.pk}",
        listing=True,
    ),
    Case(
        "dashboard of A showing B's reward model",
        "GET",
        lambda w: f"/dashboard/projects/{w.a.pk}/reward-models/?rm={w.b_model.pk}",
        listing=True,
    ),
    Case(
        "dashboard of A showing the samples of B's model version",
        "GET",
        lambda w: f"/dashboard/projects/{w.a.pk}/models/?policy={w.b_model.pk}",
    ),
    Case(
        "dashboard of A at B's round number",
        "GET",
        lambda w: f"/dashboard/projects/{w.a.pk}/?round={B_ROUND}",
        listing=True,
    ),
    # --- ids in the URL, under A's project or alone ---
    Case(
        "close B's round number",
        "POST",
        lambda w: f"/api/projects/{w.a.pk}/rounds/{B_ROUND}/close/",
    ),
    Case(
        "B's dataset version number",
        "GET",
        lambda w: f"/api/projects/{w.a.pk}/datasets/{B_VERSION}/",
    ),
    Case(
        "B's dataset file",
        "GET",
        lambda w: f"/api/projects/{w.a.pk}/datasets/{B_VERSION}/files/manifest.json",
    ),
    Case(
        "B's import job",
        "GET",
        lambda w: f"/api/projects/{w.a.pk}/imports/{w.b_import_job.pk}/",
    ),
    Case(
        "B's annotator's assessments",
        "GET",
        lambda w: f"/api/qc/projects/{w.a.pk}/annotators/{w.b_annotator.pk}/assessments/",
    ),
    Case(
        "resume B's annotator",
        "POST",
        lambda w: f"/api/qc/projects/{w.a.pk}/annotators/{w.b_annotator.pk}/resume/",
        lambda w: {"note": "back"},
    ),
    Case("review B's item", "GET", lambda w: f"/api/qc/items/{w.b_item.pk}/"),
    Case(
        "adjudicate B's item",
        "POST",
        lambda w: f"/api/qc/items/{w.b_item.pk}/adjudications/",
        lambda w: {"choice": "B", "note": "B wins"},
    ),
    Case(
        "submit on B's lease",
        "POST",
        lambda w: f"/api/assignments/{w.b_lease.pk}/submit/",
        lambda w: {"choice": "A", "idempotency_key": "k1"},
    ),
    Case(
        "skip B's lease",
        "POST",
        lambda w: f"/api/assignments/{w.b_lease.pk}/skip/",
        lambda w: {"reason": "unreadable"},
    ),
    Case("heartbeat on B's lease", "POST", lambda w: f"/api/assignments/{w.b_lease.pk}/heartbeat/"),
    Case("release B's lease", "POST", lambda w: f"/api/assignments/{w.b_lease.pk}/release/"),
    Case(
        "skip B's lease from A's task page",
        "POST",
        lambda w: f"/projects/{w.a.pk}/annotate/{w.b_lease.pk}/skip/",
        lambda w: {"reason": "unreadable"},
        encoding="form",
    ),
    Case("B's run", "GET", lambda w: f"/api/training/runs/{w.b_run.pk}/"),
    Case("cancel B's run", "POST", lambda w: f"/api/training/runs/{w.b_run.pk}/cancel/"),
    Case("resume B's run", "POST", lambda w: f"/api/training/runs/{w.b_run.pk}/resume/"),
    Case("B's model version", "GET", lambda w: f"/api/training/models/{w.b_model.pk}/"),
    # Rounds generated from policies: B's policy named in A's request, B's job under A.
    Case(
        "generate A's round from B's policy",
        "POST",
        lambda w: f"/api/training/projects/{w.a.pk}/generation-jobs/",
        lambda w: {"policies": [w.b_model.pk], "n_prompts": 1},
        field="policies",
    ),
    Case(
        "B's generation job under A",
        "GET",
        lambda w: f"/api/training/projects/{w.a.pk}/generation-jobs/{w.b_generation_job.pk}/",
    ),
    Case(
        "A's generation jobs",
        "GET",
        lambda w: f"/api/training/projects/{w.a.pk}/generation-jobs/",
        listing=True,
    ),
    Case(
        "B's generation jobs",
        "GET",
        lambda w: f"/api/training/projects/{w.b.pk}/generation-jobs/",
    ),
    Case(
        "B's generation job in A's pool page",
        "GET",
        lambda w: f"/console/projects/{w.a.pk}/pool/jobs/{w.b_generation_job.pk}/",
    ),
    Case(
        "generate a round from B's policy on A's pool page",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/pool/generate/",
        lambda w: {
            "policies": [w.b_model.pk],
            "mode": "k_samples",
            "n_prompts": 1,
            "temperature": 1.0,
            "max_new_tokens": 8,
            "purpose": "train",
        },
        encoding="form",
        field="policies",
    ),
    # The registry: an upload into B, B's run version named or validated, a folder for B.
    Case(
        "upload a model into B",
        "POST",
        lambda w: f"/api/training/projects/{w.b.pk}/models/upload/",
        lambda w: {"file": _model_archive(), "name": "into-b", "kind": "policy"},
        encoding="multipart",
    ),
    Case(
        "name B's run version",
        "POST",
        lambda w: f"/api/training/models/{w.b_model.pk}/register/",
        lambda w: {"name": "mine-now"},
    ),
    Case("validate B's model", "POST", lambda w: f"/api/training/models/{w.b_model.pk}/validate/"),
    Case(
        "register a folder for B",
        "POST",
        lambda w: "/api/training/models/folder/",
        lambda w: {
            "name": "f",
            "kind": "policy",
            "path": w.a_model.artifact_path,
            "project_id": w.b.pk,
        },
        field="project_id",
    ),
    Case("B's run on the dashboard", "GET", lambda w: f"/dashboard/runs/{w.b_run.pk}/"),
    # The console names B's objects inside A's project URL.
    Case(
        "B's dataset in A's console",
        "GET",
        lambda w: f"/console/projects/{w.a.pk}/datasets/{B_VERSION}/",
    ),
    Case(
        "B's dataset file in A's console",
        "GET",
        lambda w: f"/console/projects/{w.a.pk}/datasets/{B_VERSION}/files/manifest.json",
    ),
    Case(
        "B's import job in A's console",
        "GET",
        lambda w: f"/console/projects/{w.a.pk}/data/imports/{w.b_import_job.pk}/",
    ),
    Case(
        "pause B's annotator from A's console",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/members/{w.b_annotator.pk}/pause/",
        lambda w: {"reason": "too fast"},
        encoding="form",
    ),
    Case(
        "resume B's annotator from A's console",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/members/{w.b_annotator.pk}/resume/",
        lambda w: {"reason": "fine"},
        encoding="form",
    ),
    Case(
        "verdict on B's item from A's console",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/review/items/{w.b_item.pk}/verdict/",
        lambda w: {"choice": "A", "note": "A wins"},
        encoding="form",
    ),
    Case(
        "B's run in A's console",
        "GET",
        lambda w: f"/console/projects/{w.a.pk}/training/runs/{w.b_run.pk}/",
    ),
    Case(
        "B's run progress in A's console",
        "GET",
        lambda w: f"/console/projects/{w.a.pk}/training/runs/{w.b_run.pk}/live/",
    ),
    Case(
        "cancel B's run from A's console",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/training/runs/{w.b_run.pk}/cancel/",
        encoding="form",
    ),
    Case(
        "resume B's run from A's console",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/training/runs/{w.b_run.pk}/resume/",
        encoding="form",
    ),
    Case(
        "name B's run version from A's console",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/models/{w.b_model.pk}/register/",
        lambda w: {f"v{w.b_model.pk}-name": "mine-now", f"v{w.b_model.pk}-prompt_format": "plain"},
        encoding="form",
    ),
    Case(
        "validate B's model from A's console",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/models/{w.b_model.pk}/validate/",
        encoding="form",
    ),
    # The loop: B's project in the URL, B's models in A's loop settings and decisions.
    Case("B's loop", "GET", lambda w: f"/api/training/projects/{w.b.pk}/loop/"),
    Case("B's loop timeline", "GET", lambda w: f"/api/training/projects/{w.b.pk}/loop/timeline/"),
    Case(
        "save B's loop settings",
        "PUT",
        lambda w: f"/api/training/projects/{w.b.pk}/loop/",
        lambda w: {"settings": {"path": "dpo"}},
    ),
    Case("step B's loop", "POST", lambda w: f"/api/training/projects/{w.b.pk}/loop/step/"),
    Case("pause B's loop", "POST", lambda w: f"/api/training/projects/{w.b.pk}/loop/pause/"),
    Case("resume B's loop", "POST", lambda w: f"/api/training/projects/{w.b.pk}/loop/resume/"),
    *[
        Case(
            f"A's loop with B's model as {recipe}.{name}",
            "PUT",
            lambda w: f"/api/training/projects/{w.a.pk}/loop/",
            lambda w, recipe=recipe, name=name: {
                "settings": {"path": "rm_ppo", recipe: {name: w.b_model.pk}}
            },
            field=name,
        )
        for recipe, name in (("ppo", "reward_model_id"), ("dpo", "reference_model_id"))
    ],
    *[
        Case(
            f"{action} B's model",
            "POST",
            lambda w, action=action: f"/api/training/models/{w.b_model.pk}/{action}/",
            lambda w: {"reason": "it is better"},
        )
        for action in ("promote", "reject")
    ],
    *[
        Case(
            f"{action} A's model naming project B",
            "POST",
            lambda w, action=action: f"/api/training/models/{w.a_model.pk}/{action}/",
            lambda w: {"reason": "it is better", "project_id": w.b.pk},
            field="project_id",
        )
        for action in ("promote", "reject")
    ],
    *[
        Case(
            f"{action} B's model from A's loop page",
            "POST",
            lambda w, action=action: (
                f"/console/projects/{w.a.pk}/loop/models/{w.b_model.pk}/{action}/"
            ),
            lambda w: {"reason": "it is better"},
            encoding="form",
        )
        for action in ("promote", "reject")
    ],
    Case(
        "cancel B's run from A's loop page",
        "POST",
        lambda w: f"/console/projects/{w.a.pk}/loop/runs/{w.b_run.pk}/cancel/",
        encoding="form",
    ),
]


# --- checking ------------------------------------------------------------------------------
def _snapshot() -> dict[str, list]:
    """Return every row of the project's apps, so any change shows up."""
    return {
        model._meta.label: list(model._default_manager.order_by("pk").values())
        for label in APPS
        for model in apps.get_app_config(label).get_models()
    }


def _send(client: Client, case: Case, w: World):
    path = case.path(w)
    if case.method == "GET":
        return client.get(path)
    body = case.body(w) if case.body else {}
    if case.method in ("PATCH", "PUT"):
        send = client.patch if case.method == "PATCH" else client.put
        return send(path, data=body, content_type="application/json")
    if case.encoding == "json":
        return client.post(path, data=body, content_type="application/json")
    return client.post(path, data=body)  # multipart, as browsers and uploads send it


def _text(response) -> str:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode("utf-8", "replace")
    return response.content.decode("utf-8", "replace")


def _names(text: str, field: str) -> bool:
    """Return whether an error message names the field (`dataset_version_id` or in words)."""
    words = field.removesuffix("_id").replace("_", " ")
    return bool(field) and (field in text or words in text.lower())


def _problems(case: Case, role: str, w: World) -> list[str]:
    client = Client()
    client.force_login(w.users[role])
    with transaction.atomic():
        before = _snapshot()
        response = _send(client, case, w)
        text = _text(response)
        changed = [label for label, rows in _snapshot().items() if before[label] != rows]
        transaction.set_rollback(True)
    status = response.status_code
    where = f"{case.name} as {role}: {case.method} {case.path(w)} -> {status}"
    problems = []
    if status >= 500:
        problems.append(f"{where}: server error")
    elif 200 <= status < 300 and not case.listing:
        problems.append(f"{where}: let in ({text[:200]})")
    elif status == 400 and not _names(text, case.field):
        problems.append(f"{where}: a 400 that does not name {case.field or 'the id'}: {text[:200]}")
    elif 300 <= status < 400:
        problems.append(f"{where}: redirected to {response.get('Location')} instead of refused")
    leaked = [s for s in B_SECRETS if s in text]
    if leaked:
        problems.append(f"{where}: shows {leaked}")
    if changed:
        problems.append(f"{where}: changed {changed}")
    return problems


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_naming_another_projects_object_gets_nothing(world, case):
    problems = [p for role in ROLES for p in _problems(case, role, world)]
    assert not problems, "\n".join(problems)


# The same requests naming A's own objects go through for A's researcher, so the refusals
# above come from the ids, not from a request that could never work.
CONTROLS = [
    Case(
        "import items into A's round",
        "POST",
        lambda w: f"/api/projects/{w.a.pk}/import/",
        lambda w: {"file": _items_file(), "round": "1"},
        encoding="multipart",
    ),
    Case(
        "import preferences into A's round",
        "POST",
        lambda w: f"/api/projects/{w.a.pk}/import-preferences/",
        lambda w: {"file": _preferences_file(), "format": "trl", "round": "1"},
        encoding="multipart",
    ),
    Case(
        "export with A's round numbers",
        "POST",
        lambda w: f"/api/projects/{w.a.pk}/datasets/",
        lambda w: {"name": "x", "policy": {"rounds": [1]}},
    ),
    Case(
        "train A's project on A's dataset",
        "POST",
        lambda w: "/api/training/runs/",
        _run_body(
            project_id=A, dataset_version_id=A_DATASET, base_model_id=attrgetter("a_model.pk")
        ),
    ),
    Case(
        "agreement of A's round", "GET", lambda w: f"/api/qc/projects/{w.a.pk}/agreement/?round=1"
    ),
    Case("labels of A's round", "GET", lambda w: f"/api/qc/projects/{w.a.pk}/labels/?round=1"),
    Case(
        "A's loop with A's model as ppo.reward_model_id",
        "PUT",
        lambda w: f"/api/training/projects/{w.a.pk}/loop/",
        lambda w: {"settings": {"path": "rm_ppo", "ppo": {"reward_model_id": w.a_model.pk}}},
    ),
    Case(
        "promote A's model naming project A",
        "POST",
        lambda w: f"/api/training/models/{w.a_model.pk}/promote/",
        lambda w: {"reason": "it is better", "project_id": w.a.pk},
    ),
]


@pytest.mark.parametrize("case", CONTROLS, ids=[c.name for c in CONTROLS])
def test_the_same_request_naming_own_objects_goes_through(world, case):
    client = Client()
    client.force_login(world.users["researcher"])
    with transaction.atomic():
        response = _send(client, case, world)
        transaction.set_rollback(True)
    assert 200 <= response.status_code < 300, _text(response)[:500]


# --- the table covers every id an endpoint takes -------------------------------------------
# Inputs that name something yet need no row, and why.
NOT_OBJECT_IDS = {
    # Logging in names one's own account.
    ("POST", "api-token", "username"),
    # Researchers add any account to their own project by name; nothing of B changes.
    ("POST", "api-members", "username"),
}
ID_NAME = re.compile(r"(^|_)id$|^(round|rounds|number|version|project|run|rm|username)$")


def _url_name(path: str) -> str:
    return resolve(urlsplit(path).path).view_name


def _schema_inputs() -> list[tuple[str, str, str]]:
    """Return (method, URL name, input name) of every id-like body field and query parameter."""
    from drf_spectacular.generators import SchemaGenerator

    document = SchemaGenerator().get_schema(request=None, public=True)
    components = document["components"]["schemas"]
    found = []
    for template, operations in document["paths"].items():
        name = _url_name(re.sub(r"\{[^}]+\}", "1", template))
        for method, operation in operations.items():
            inputs = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
            for content in operation.get("requestBody", {}).get("content", {}).values():
                schema = content.get("schema", {})
                if "$ref" in schema:
                    schema = components[schema["$ref"].rsplit("/", 1)[1]]
                inputs += list(schema.get("properties", {}))
            found += [(method.upper(), name, i) for i in inputs if ID_NAME.search(i)]
    return found


def test_every_id_an_endpoint_takes_has_a_row(world):
    from tests.deploy.test_permissions import routes

    covered_urls = {_url_name(c.path(world)) for c in CASES}
    object_kwargs = {"assignment_id", "number", "version", "item_id", "user_id", "run_id"}
    object_kwargs |= {"version_id", "job_id"}
    missing = [
        r.name
        for r in routes()
        if r.named and not r.name.startswith("admin:") and set(r.kwargs) & object_kwargs
    ]
    missing = sorted(set(missing) - covered_urls)
    assert not missing, f"add a row to CASES naming B's object in: {missing}"

    named = set()
    for c in CASES:
        url = _url_name(c.path(w := world))
        body = c.body(w) if c.body else {}
        config = body.get("config") if isinstance(body, dict) else None
        keys = [*body, *(config or {}), *(body.get("policy") or {})] if body else []
        keys += list(parse_qs(urlsplit(c.path(w)).query))
        named |= {(c.method, url, key) for key in keys}
    uncovered = sorted(
        entry for entry in _schema_inputs() if entry not in NOT_OBJECT_IDS and entry not in named
    )
    assert not uncovered, f"add a row to CASES naming B's object by: {uncovered}"
