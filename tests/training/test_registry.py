"""Bring your own model: registering folders, uploads and run versions, and their validation.

Validation loads the real tiny models of tests/training/conftest.py (built from a config);
one test runs it on a real Celery worker, the others call the job's service in the test.
Every expected figure (parameter count, dtype, file hashes) is computed here from the folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import stat
import tarfile
import uuid
import zipfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from annotation.models import Membership
from tests.celery_worker import Worker
from tests.factories import add_member, make_project, make_user
from tests.training import test_runs_support as support
from tests.training.test_runs_support import make_dataset_version, reward_config, wait_for
from training import registry
from training.generation.base import GenerationError, GenerationSettings
from training.generation.endpoints import candidates_generate
from training.models import ModelVersion, TrainingRun

training_settings = support.training_settings
reward_snapshot = support.reward_snapshot


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _parameters_and_dtype(folder: Path, kind: str) -> tuple[int, str]:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cls = AutoModelForCausalLM if kind == "policy" else AutoModelForSequenceClassification
    model = cls.from_pretrained(str(folder))
    first = next(model.parameters())
    return sum(p.numel() for p in model.parameters()), str(first.dtype).removeprefix("torch.")


def _tar_gz(folder: Path, *, top: str = "my-model") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(str(folder), arcname=top)
    return buffer.getvalue()


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        config = b'{"architectures": ["GPT2LMHeadModel"]}'
        info = tarfile.TarInfo("config.json")
        info.size = len(config)
        archive.addfile(info, io.BytesIO(config))
        member.size = len(data) if member.isfile() else 0
        archive.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return buffer.getvalue()


def _copy(folder: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


def _files_under(root: Path) -> list[Path]:
    return list(root.rglob("*")) if root.exists() else []


@pytest.fixture
def world(db, settings, tmp_path):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project, other = make_project(name="mine"), make_project(name="theirs")
    researcher, outsider, staff = make_user(), make_user(), make_user(staff=True)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    add_member(other, outsider, Membership.Role.RESEARCHER)
    return {
        "project": project,
        "other": other,
        "researcher": researcher,
        "outsider": outsider,
        "staff": staff,
        "models_root": Path(settings.ARTIFACT_ROOT) / "models",
    }


def _upload(world, data: bytes, *, name="uploaded", kind="policy", file_name="m.tar.gz", **extra):
    body = {"file": SimpleUploadedFile(file_name, data), "name": name, "kind": kind, **extra}
    url = f"/api/training/projects/{world['project'].pk}/models/upload/"
    return _client(world["researcher"]).post(url, body, format="multipart")


# --------------------------------------------------------------------------- a real worker


@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_staff_register_a_folder_and_a_real_worker_validates_it(
    settings, tiny_policy_dir, tiny_reward_dir, tmp_path
):
    import redis

    # given a worker on the queue the validation task is routed to (the CPU workers' queue)
    broker = settings.CELERY_BROKER_URL
    queue = registry_queue()
    redis.Redis.from_url(broker).delete(queue)
    staff = make_user(staff=True)
    policy = _copy(tiny_policy_dir, tmp_path, "policy")
    reward = _copy(tiny_reward_dir, tmp_path, "reward-as-policy")
    worker = Worker(
        queue=queue, broker_url=broker, log_path=tmp_path / "worker.log", name="validate"
    )
    try:
        # when staff register a policy folder, and a reward model's folder as a policy
        client = _client(staff)
        good = client.post(
            "/api/training/models/folder/",
            {"name": "byo-policy", "kind": "policy", "path": str(policy)},
            format="json",
        )
        wrong = client.post(
            "/api/training/models/folder/",
            {"name": "byo-wrong", "kind": "policy", "path": str(reward)},
            format="json",
        )
        assert good.status_code == 202, good.content
        assert wrong.status_code == 202, wrong.content
        assert good.json()["status"] == "pending"

        # then the worker decides both
        def decided(version_id):
            return ModelVersion.objects.filter(
                pk=version_id, status__in=["ready", "failed"]
            ).first()

        ready = wait_for(
            lambda: decided(good.json()["id"]), timeout=240, what=f"validation\n{worker.text()}"
        )
        failed = wait_for(lambda: decided(wrong.json()["id"]), timeout=120, what="validation")
    finally:
        worker.stop()
        redis.Redis.from_url(broker).delete(queue)

    assert ready.status == "ready", ready.validation_error + worker.text()[-2000:]
    parameters, dtype = _parameters_and_dtype(policy, "policy")
    assert ready.validation["parameters"] == parameters
    assert ready.validation["dtype"] == dtype
    assert ready.validation["architecture"] == "GPT2LMHeadModel"
    weights = ready.validation["files"]["weights"]
    assert weights == {"model.safetensors": _sha256(policy / "model.safetensors")}
    assert ready.validation["files"]["tokenizer"]["tokenizer.json"] == _sha256(
        policy / "tokenizer.json"
    )
    template = json.loads((policy / "tokenizer_config.json").read_text()).get("chat_template")
    template = template or (policy / "chat_template.jinja").read_text()
    assert (
        ready.validation["hashes"]["chat_template"] == hashlib.sha256(template.encode()).hexdigest()
    )
    assert ready.artifact_path == str(policy.resolve())
    assert failed.status == "failed"
    assert "causal language model" in failed.validation_error
    assert "GPT2ForSequenceClassification" in failed.validation_error
    # and the API shows the verdict
    shown = _client(staff).get(f"/api/training/models/{ready.pk}/").json()
    assert shown["status"] == "ready" and shown["source"] == "folder"
    assert shown["validation"]["parameters"] == parameters


def registry_queue() -> str:
    """Return the queue the validation task is sent to (where the CPU workers listen)."""
    from training.tasks import validate_model_version

    return validate_model_version.queue


# --------------------------------------------------------------------------- folders


def test_a_researcher_may_not_register_a_folder(world, tiny_policy_dir):
    response = _client(world["researcher"]).post(
        "/api/training/models/folder/",
        {
            "name": "sneaky",
            "kind": "policy",
            "path": str(tiny_policy_dir),
            "project_id": world["project"].pk,
        },
        format="json",
    )
    assert response.status_code == 403
    assert not ModelVersion.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "policy", "path": "/etc"}, "path"),
        ({"kind": "policy", "path": "relative/folder"}, "path"),
        ({"kind": "endpoint", "path": "{policy}"}, "kind"),
        ({"kind": "policy", "path": "{policy}/../policy"}, "path"),
        ({"kind": "policy", "path": "{empty}"}, "path"),
        ({"kind": "policy", "path": "{policy}", "prompt_format": "yaml"}, "prompt_format"),
        ({"kind": "policy", "path": "{policy}", "name": "a/b"}, "name"),
    ],
)
def test_a_bad_folder_registration_is_a_400_naming_the_field(
    world, tiny_policy_dir, tmp_path, body, field
):
    (tmp_path / "empty").mkdir()
    body = {"name": "x", **body}
    body["path"] = body["path"].format(policy=tiny_policy_dir, empty=tmp_path / "empty")
    response = _client(world["staff"]).post("/api/training/models/folder/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in json.dumps(response.json())
    assert not ModelVersion.objects.exists()


def test_a_taken_name_is_a_400_and_nothing_is_saved(world, tiny_policy_dir):
    ModelVersion.objects.create(name="taken", artifact_path=str(tiny_policy_dir))
    response = _client(world["staff"]).post(
        "/api/training/models/folder/",
        {"name": "taken", "kind": "policy", "path": str(tiny_policy_dir)},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["field"] == "name"
    assert ModelVersion.objects.count() == 1


# --------------------------------------------------------------------------- uploads


def test_a_researcher_uploads_a_tiny_policy_and_it_is_validated(world, tiny_policy_dir):
    response = _upload(world, _tar_gz(tiny_policy_dir), name="uploaded-policy")
    assert response.status_code == 202, response.content
    version = ModelVersion.objects.get(pk=response.json()["id"])
    assert version.status == "pending" and version.source == "upload"
    folder = Path(version.artifact_path)
    assert folder.parent == world["models_root"] / f"project-{world['project'].pk}"
    assert _sha256(folder / "model.safetensors") == _sha256(tiny_policy_dir / "model.safetensors")
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".upload")]

    version = registry.model_version_validate(version_id=version.pk)

    assert version.status == "ready", version.validation_error
    parameters, dtype = _parameters_and_dtype(tiny_policy_dir, "policy")
    assert (version.validation["parameters"], version.validation["dtype"]) == (parameters, dtype)
    assert version.validation["files"]["weights"]["model.safetensors"] == _sha256(
        tiny_policy_dir / "model.safetensors"
    )
    assert version.validation["prompt_format"] == "chat_template"


def test_a_zip_upload_of_a_reward_model_is_validated(world, tiny_reward_dir):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(tiny_reward_dir.iterdir()):
            archive.write(path, arcname=path.name)
    response = _upload(world, buffer.getvalue(), name="zipped-rm", kind="reward", file_name="r.zip")
    assert response.status_code == 202, response.content

    version = registry.model_version_validate(version_id=response.json()["id"])

    assert version.status == "ready", version.validation_error
    assert version.validation["num_labels"] == 1
    assert version.validation["parameters"] == _parameters_and_dtype(tiny_reward_dir, "reward")[0]


@pytest.mark.parametrize(
    ("folder", "kind", "error"),
    [
        ("reward", "policy", "causal language model"),
        ("policy", "reward", "sequence classifier with one output"),
    ],
)
def test_the_wrong_kind_fails_validation_with_a_clear_error(
    world, tiny_policy_dir, tiny_reward_dir, folder, kind, error
):
    source = tiny_policy_dir if folder == "policy" else tiny_reward_dir
    response = _upload(world, _tar_gz(source), kind=kind)
    assert response.status_code == 202

    version = registry.model_version_validate(version_id=response.json()["id"])

    assert version.status == "failed"
    assert error in version.validation_error
    assert "parameters" not in version.validation


def test_a_two_output_classifier_is_not_a_reward_model(world, tiny_reward_dir, tmp_path):
    folder = _copy(tiny_reward_dir, tmp_path, "two-labels")
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {"0": "LABEL_0", "1": "LABEL_1"}
    config["label2id"] = {"LABEL_0": 0, "LABEL_1": 1}
    (folder / "config.json").write_text(json.dumps(config))
    version = registry.model_version_register_folder(
        name="two-heads", kind="reward", path=str(folder), enqueue=False
    )
    version = registry.model_version_validate(version_id=version.pk)
    assert version.status == "failed"
    assert "one output" in version.validation_error and "2" in version.validation_error


def test_a_config_asking_for_remote_code_is_refused(world, tiny_policy_dir, tmp_path):
    folder = _copy(tiny_policy_dir, tmp_path, "remote")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    response = _upload(world, _tar_gz(folder))
    assert response.status_code == 202

    version = registry.model_version_validate(version_id=response.json()["id"])

    assert version.status == "failed"
    assert "remote code" in version.validation_error


def test_no_chat_template_fails_unless_the_plain_prompt_format_is_declared(
    world, tiny_policy_dir, tmp_path
):
    folder = _copy(tiny_policy_dir, tmp_path, "no-template")
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    strict = registry.model_version_register_folder(
        name="strict", kind="policy", path=str(folder), enqueue=False
    )
    plain = registry.model_version_register_folder(
        name="plain", kind="policy", path=str(folder), prompt_format="plain", enqueue=False
    )
    strict = registry.model_version_validate(version_id=strict.pk)
    plain = registry.model_version_validate(version_id=plain.pk)

    assert strict.status == "failed" and "chat template" in strict.validation_error
    assert plain.status == "ready", plain.validation_error
    assert plain.validation["prompt_format"] == "plain"
    assert plain.validation["hashes"]["chat_template"] is None


def _symlink(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = "/etc/passwd"
    return info


def _device(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    info.devmajor, info.devminor = 1, 3
    return info


@pytest.mark.parametrize(
    ("member", "said"),
    [
        (tarfile.TarInfo("../escaped.txt"), "'..'"),
        (tarfile.TarInfo("my-model/../../escaped.txt"), "'..'"),
        (tarfile.TarInfo("/tmp/escaped.txt"), "absolute"),
        (_symlink("tokenizer.json"), "link"),
        (_device("null"), "device"),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink", "device"],
)
def test_an_unsafe_archive_is_refused_and_nothing_is_written(world, tmp_path, member, said):
    response = _upload(world, _tar_with(member, b"pwned"))
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == "file" and said in body["detail"]
    assert not ModelVersion.objects.exists()
    assert _files_under(world["models_root"]) == []
    assert not (Path(world["models_root"]).parent / "escaped.txt").exists()
    assert not Path("/tmp/escaped.txt").exists()


def test_a_zip_with_dotdot_is_refused_and_nothing_is_written(world):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("../escaped.txt", "pwned")
    response = _upload(world, buffer.getvalue(), file_name="m.zip")
    assert response.status_code == 400 and "'..'" in response.json()["detail"]
    assert _files_under(world["models_root"]) == []
    assert not ModelVersion.objects.exists()


def test_a_zip_with_a_symlink_is_refused(world):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("config.json", "{}")
        link = zipfile.ZipInfo("tokenizer.json")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    response = _upload(world, buffer.getvalue(), file_name="m.zip")
    assert response.status_code == 400 and "link" in response.json()["detail"]
    assert _files_under(world["models_root"]) == []


def test_size_limits_refuse_the_upload_with_a_413(world, settings, tiny_policy_dir):
    data = _tar_gz(tiny_policy_dir)
    unpacked = sum(p.stat().st_size for p in tiny_policy_dir.iterdir())
    settings.PREFLOOP_MODEL_UNPACKED_MAX_BYTES = unpacked - 1
    response = _upload(world, data)
    assert response.status_code == 413
    assert "PREFLOOP_MODEL_UNPACKED_MAX_BYTES" in response.json()["detail"]

    settings.PREFLOOP_MODEL_UPLOAD_MAX_BYTES = len(data) - 1
    response = _upload(world, data)
    assert response.status_code == 413
    assert "PREFLOOP_MODEL_UPLOAD_MAX_BYTES" in response.json()["detail"]
    assert _files_under(world["models_root"]) == []
    assert not ModelVersion.objects.exists()


def test_a_body_declared_past_the_limit_is_a_413(world, settings):
    settings.PREFLOOP_MODEL_UPLOAD_MAX_BYTES = 1000
    response = _upload(world, b"0" * (1 << 21))
    assert response.status_code == 413 and response.json()["field"] == "file"
    assert _files_under(world["models_root"]) == []


@pytest.mark.parametrize(
    ("data", "file_name", "said"),
    [
        (b"not an archive", "m.tar.gz", "tar archive"),
        (b"PK not really", "m.zip", "zip archive"),
        (b"{}", "config.json", "archive named"),
    ],
)
def test_a_file_that_is_no_archive_is_a_400(world, data, file_name, said):
    response = _upload(world, data, file_name=file_name)
    assert response.status_code == 400 and said in response.json()["detail"]
    assert _files_under(world["models_root"]) == []


def test_an_archive_without_config_json_is_a_400(world, tmp_path):
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "weights.bin").write_bytes(b"0")
    response = _upload(world, _tar_gz(tmp_path / "loose"))
    assert response.status_code == 400 and "config.json" in response.json()["detail"]
    assert _files_under(world["models_root"]) == []


def test_another_projects_ids_are_refused(world, tiny_policy_dir, tmp_path):
    theirs_run = TrainingRun.objects.create(
        recipe="sft", project=world["other"], status="succeeded"
    )
    theirs = ModelVersion.objects.create(
        name="theirs", artifact_path=str(tiny_policy_dir), training_run=theirs_run
    )
    client = _client(world["researcher"])
    upload = client.post(
        f"/api/training/projects/{world['other'].pk}/models/upload/",
        {
            "file": SimpleUploadedFile("m.tar.gz", _tar_gz(tiny_policy_dir)),
            "name": "in",
            "kind": "policy",
        },
        format="multipart",
    )
    renamed = client.post(
        f"/api/training/models/{theirs.pk}/register/", {"name": "mine"}, format="json"
    )
    again = client.post(f"/api/training/models/{theirs.pk}/validate/")
    assert (upload.status_code, renamed.status_code, again.status_code) == (404, 404, 404)
    theirs.refresh_from_db()
    assert (theirs.name, theirs.status) == ("theirs", "ready")
    assert _files_under(world["models_root"]) == []


# --------------------------------------------------------------------------- run versions


def _run_version(world, tiny_policy_dir, tmp_path) -> ModelVersion:
    run = TrainingRun.objects.create(recipe="sft", project=world["project"], status="succeeded")
    return ModelVersion.objects.create(
        name=f"sft-run-{run.pk}",
        artifact_path=str(_copy(tiny_policy_dir, tmp_path, f"run-{run.pk}")),
        training_run=run,
    )


def test_a_researcher_names_a_run_version_and_it_is_validated(world, tiny_policy_dir, tmp_path):
    version = _run_version(world, tiny_policy_dir, tmp_path)
    response = _client(world["researcher"]).post(
        f"/api/training/models/{version.pk}/register/", {"name": "my-sft-v1"}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "pending" and response.json()["name"] == "my-sft-v1"

    version = registry.model_version_validate(version_id=version.pk)

    assert version.status == "ready", version.validation_error
    assert version.name == "my-sft-v1" and version.source == "run"
    assert version.validation["hashes"]["weights"]


def test_only_run_versions_are_named_this_way(world, tiny_policy_dir):
    version = ModelVersion.objects.create(
        name="folder-one",
        artifact_path=str(tiny_policy_dir),
        project=world["project"],
        source="folder",
    )
    response = _client(world["researcher"]).post(
        f"/api/training/models/{version.pk}/register/", {"name": "renamed"}, format="json"
    )
    assert response.status_code == 400 and response.json()["field"] == "version_id"
    version.refresh_from_db()
    assert version.name == "folder-one"


# --------------------------------------------------------------------------- usable


@pytest.fixture
def dataset(world, reward_snapshot, training_settings):
    return make_dataset_version(world["project"], reward_snapshot)


def test_a_version_trains_only_once_it_is_ready(world, dataset, tiny_reward_dir, monkeypatch):
    from training import tasks

    monkeypatch.setattr(tasks.run_training, "delay", lambda run_id: None)
    response = _upload(world, _tar_gz(tiny_reward_dir), name="rm-base", kind="reward")
    version_id = response.json()["id"]
    config = reward_config(tiny_reward_dir)
    del config["model_name_or_path"]
    payload = {
        "recipe": "reward",
        "config": config,
        "dataset_version_id": dataset.pk,
        "base_model_id": version_id,
    }
    client = _client(world["researcher"])

    pending = client.post("/api/training/runs/", payload, format="json")
    assert pending.status_code == 400
    assert pending.json()["field"] == "base_model_id" and "pending" in pending.json()["detail"]
    assert not TrainingRun.objects.exists()

    registry.model_version_validate(version_id=version_id)
    ready = client.post("/api/training/runs/", payload, format="json")
    assert ready.status_code == 201, ready.content


def test_a_failed_version_does_not_train_and_says_why(world, dataset, tiny_policy_dir):
    response = _upload(world, _tar_gz(tiny_policy_dir), name="policy-as-rm", kind="reward")
    version = registry.model_version_validate(version_id=response.json()["id"])
    assert version.status == "failed"
    answer = _client(world["researcher"]).post(
        "/api/training/runs/",
        {
            "recipe": "reward",
            "config": {"max_steps": 1},
            "dataset_version_id": dataset.pk,
            "base_model_id": version.pk,
        },
        format="json",
    )
    assert answer.status_code == 400
    assert "failed validation" in answer.json()["detail"]
    assert "sequence classifier" in answer.json()["detail"]


def test_a_version_generates_only_once_it_is_ready(world, tiny_policy_dir):
    response = _upload(world, _tar_gz(tiny_policy_dir), name="gen-policy")
    version = ModelVersion.objects.get(pk=response.json()["id"])
    settings = GenerationSettings(max_new_tokens=4, batch_size=2)

    with pytest.raises(GenerationError, match="pending"):
        candidates_generate(
            model_version=version, prompts=["What is 1 + 2?"], k=1, settings=settings
        )

    version = registry.model_version_validate(version_id=version.pk)
    out = candidates_generate(
        model_version=version, prompts=["What is 1 + 2?"], k=2, settings=settings
    )
    assert len(out) == 1 and len(out[0]) == 2


def test_revalidating_sees_a_changed_folder(world, tiny_policy_dir, tmp_path):
    folder = _copy(tiny_policy_dir, tmp_path, "changing")
    version = registry.model_version_register_folder(
        name="changing", kind="policy", path=str(folder), enqueue=False
    )
    first = registry.model_version_validate(version_id=version.pk)
    assert first.status == "ready"
    (folder / "model.safetensors").unlink()

    response = _client(world["staff"]).post(f"/api/training/models/{version.pk}/validate/")
    assert response.status_code == 202 and response.json()["status"] == "pending"
    second = registry.model_version_validate(version_id=version.pk)

    assert second.status == "failed"
    assert "weights" in second.validation_error


# --------------------------------------------------------------------------- the command


def test_the_command_registers_and_validates_a_folder(db, tiny_policy_dir, tmp_path, capsys):
    folder = _copy(tiny_policy_dir, tmp_path, f"cmd-{uuid.uuid4().hex[:6]}")
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "models",
        "register",
        "--kind",
        "policy",
        "--name",
        "cmd-policy",
        "--path",
        str(folder),
        stdout=out,
        stderr=err,
    )
    version = ModelVersion.objects.get(name="cmd-policy")
    assert version.status == "ready" and version.source == "folder"
    assert f"{version.validation['parameters']} parameters" in out.getvalue()
    assert "loading the weights" in err.getvalue() and "\r" not in err.getvalue()

    listing = io.StringIO()
    call_command("models", "list", "--json", stdout=listing)
    record = json.loads(listing.getvalue().splitlines()[0])
    assert record["status"] == "ready" and record["validation"]["parameters"]

    with pytest.raises(CommandError, match="outside the artefact and model roots"):
        call_command(
            "models",
            "register",
            "--kind",
            "policy",
            "--name",
            "etc",
            "--path",
            "/etc",
            stdout=io.StringIO(),
        )
    with pytest.raises(CommandError, match="failed validation"):
        call_command(
            "models",
            "register",
            "--kind",
            "reward",
            "--name",
            "cmd-wrong",
            "--path",
            str(folder),
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert ModelVersion.objects.get(name="cmd-wrong").status == "failed"

    # validating again by name sees a folder that changed since
    (folder / "model.safetensors").unlink()
    with pytest.raises(CommandError, match="failed validation"):
        call_command("models", "validate", "cmd-policy", stdout=io.StringIO(), stderr=io.StringIO())
    version.refresh_from_db()
    assert version.status == "failed" and "weights" in version.validation_error
    with pytest.raises(CommandError, match="No model version"):
        call_command("models", "validate", "nope", stdout=io.StringIO())
