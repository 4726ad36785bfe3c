"""Bring your own model: register policies and reward models, then validate them off the request.

Three ways in:

- staff register a transformers folder under the deployment's roots (``ARTIFACT_ROOT`` and
  ``PREFLOOP_MODEL_ROOTS``, checked by ``config_policy.path_check``), in place;
- a project's researchers register a version one of the project's runs produced: they name
  it, and it is validated like any other (its content hashes recorded) before it is used again;
- a project's researchers upload an archive (.tar.gz, .tgz, .tar or .zip), unpacked into the
  project's own folder ``ARTIFACT_ROOT/models/project-<id>/`` (``training.registry_uploads``).
  Only regular files and folders are taken: absolute names, ``..``, links and device files
  refuse the archive, and so do more than ``PREFLOOP_MODEL_UNPACKED_MAX_BYTES`` once unpacked.

A request is checked at once for what is cheap to know (folder under a root and holding a
config.json, name free, kind known, archive safe); a refusal is a 400 (413 past a size limit)
naming the field, and nothing is saved or left on disk. A registered version starts
``pending``; the validation job (``model_version_validate``, a Celery task) loads it without
remote code, checks its kind (a causal LM for a policy, a one-output sequence classifier for a
reward model), requires a chat template or the declared prompt format ``plain``, and records
parameter count, dtype, architecture and sha256 hashes of weights, tokenizer files and chat
template. The version is then ``ready`` or ``failed`` with the reason; only a ready version is
usable (``config_policy.model_version_usable``).
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from annotation import access
from annotation.errors import Conflict, Forbidden, NotFound, ServiceError
from training import config_policy, selectors
from training.models import ModelVersion

# Kinds registered from weights (endpoint policies are declared: generation/endpoints.py).
WEIGHT_KINDS = (ModelVersion.Kind.POLICY, ModelVersion.Kind.REWARD)
# How prompts are laid out for the model: its tokenizer's own chat template, or HH-RLHF's
# plain "Human: / Assistant:" layout (training/trainers/chat_templates.py PLAIN_CHAT_TEMPLATE,
# which the recipes give any tokenizer without a template).
PROMPT_FORMATS = {
    "chat_template": "the tokenizer's own chat template (required in the folder)",
    "plain": "plain Human:/Assistant: text, for a tokenizer without a chat template",
}
DEFAULT_PROMPT_FORMAT = "chat_template"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
    "chat_template.json",
)
CHUNK = 1 << 20

Progress = Callable[[str], None]


class InvalidRegistration(ServiceError):
    """A registration the server refuses before saving anything; ``field`` names the culprit."""

    code = "invalid_model"

    def __init__(self, message: str, *, field: str, status: int | None = None):
        super().__init__(f"{field}: {message}", status=status)
        self.field = field


class ModelCheckFailed(Exception):
    """The validation job's verdict on a folder that is not a usable model of its kind."""


# --------------------------------------------------------------------------- cheap checks


def _check_name(name: Any, *, keep: ModelVersion | None = None) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidRegistration(
            "1 to 200 letters, digits, '.', '_' or '-', starting with a letter or digit.",
            field="name",
        )
    taken = ModelVersion.objects.filter(name=name)
    if keep is not None:
        taken = taken.exclude(pk=keep.pk)
    if taken.exists():
        raise InvalidRegistration(f"a model version named {name!r} exists already.", field="name")
    return name


def _check_kind(kind: Any) -> str:
    if kind not in WEIGHT_KINDS:
        raise InvalidRegistration(
            "choose policy or reward (a policy behind an endpoint is registered with "
            "POST /api/training/models/endpoint/).",
            field="kind",
        )
    return kind


def _check_prompt_format(value: Any) -> str:
    value = value or DEFAULT_PROMPT_FORMAT
    if value not in PROMPT_FORMATS:
        raise InvalidRegistration(
            f"choose one of: {', '.join(PROMPT_FORMATS)}.", field="prompt_format"
        )
    return value


def _check_model_folder(folder: Path, *, field: str) -> None:
    if not folder.is_dir():
        raise InvalidRegistration("no such folder.", field=field)
    if not (folder / "config.json").is_file():
        raise InvalidRegistration(
            "no config.json in the folder: not a transformers model folder.", field=field
        )


def _create(**fields) -> ModelVersion:
    try:
        with transaction.atomic():
            return ModelVersion.objects.create(
                status=ModelVersion.Status.PENDING, validation_error="", **fields
            )
    except IntegrityError as exc:  # a name taken since the check
        raise InvalidRegistration(
            f"a model version named {fields['name']!r} exists already.", field="name"
        ) from exc


# --------------------------------------------------------------------------- registering


def model_version_register_folder(
    *,
    name: Any,
    kind: Any,
    path: Any,
    project=None,
    prompt_format: Any = "",
    enqueue: bool = True,
) -> ModelVersion:
    """Register a folder under the model roots in place (staff and the server only)."""
    name, kind = _check_name(name), _check_kind(kind)
    prompt_format = _check_prompt_format(prompt_format)
    try:
        folder = Path(config_policy.path_check(value=path, field="path"))
    except config_policy.InvalidTrainingConfig as exc:
        raise InvalidRegistration(exc.message.removeprefix("path: "), field="path") from exc
    _check_model_folder(folder, field="path")
    version = _create(
        name=name,
        kind=kind,
        artifact_path=str(folder),
        project=project,
        source=ModelVersion.Source.FOLDER,
        validation={"prompt_format": prompt_format},
    )
    if enqueue:
        model_version_validation_enqueue(version=version)
    return version


def model_version_register_run(
    *, version: ModelVersion, name: Any, prompt_format: Any = "", enqueue: bool = True
) -> ModelVersion:
    """Name a version a training run produced and validate it (usable again once it passed)."""
    if version.source != ModelVersion.Source.RUN or version.training_run_id is None:
        raise InvalidRegistration(
            "only a version a training run produced is registered this way; re-validate "
            "uploads and folders instead.",
            field="version_id",
        )
    name = _check_name(name, keep=version)
    prompt_format = _check_prompt_format(prompt_format)
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if locked.status == ModelVersion.Status.VALIDATING:
            raise Conflict("The version is being validated; wait for the result.")
        locked.name = name
        locked.status = ModelVersion.Status.PENDING
        locked.validation = {"prompt_format": prompt_format}
        locked.validation_error = ""
        try:
            with transaction.atomic():
                locked.save(update_fields=["name", "status", "validation", "validation_error"])
        except IntegrityError as exc:
            raise InvalidRegistration(
                f"a model version named {name!r} exists already.", field="name"
            ) from exc
        if enqueue:
            model_version_validation_enqueue(version=locked)
    return locked


def model_version_revalidate(*, version: ModelVersion, enqueue: bool = True) -> ModelVersion:
    """Validate a registered version again (e.g. after its folder was fixed)."""
    if version.kind == ModelVersion.Kind.ENDPOINT:
        raise InvalidRegistration(
            "a policy behind an endpoint has no weights here to validate.", field="version_id"
        )
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if locked.status == ModelVersion.Status.VALIDATING:
            raise Conflict("The version is being validated; wait for the result.")
        prompt_format = (locked.validation or {}).get("prompt_format", DEFAULT_PROMPT_FORMAT)
        locked.status = ModelVersion.Status.PENDING
        locked.validation = {"prompt_format": prompt_format}
        locked.validation_error = ""
        locked.save(update_fields=["status", "validation", "validation_error"])
        if enqueue:
            model_version_validation_enqueue(version=locked)
    return locked


def model_version_validation_enqueue(*, version: ModelVersion) -> None:
    """Send the version's validation task once the current transaction commits."""
    from training.tasks import validate_model_version

    version_id = version.pk
    transaction.on_commit(lambda: validate_model_version.delay(version_id))


# --------------------------------------------------------------------------- validation


def model_version_validate(*, version_id: int, progress: Progress | None = None):
    """Validate a pending version and record the verdict; a decided one is left alone.

    Returns the version, or None if it does not exist.
    """
    say = progress or (lambda message: None)
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().filter(pk=version_id).first()
        if version is None:
            return None
        if version.status not in (ModelVersion.Status.PENDING, ModelVersion.Status.VALIDATING):
            return version
        version.status = ModelVersion.Status.VALIDATING
        version.save(update_fields=["status"])

    prompt_format = (version.validation or {}).get("prompt_format", DEFAULT_PROMPT_FORMAT)
    say(f"validating model version {version.pk} ({version.name}, {version.kind})")
    try:
        folder = config_policy.path_check(value=version.artifact_path, field="artifact_path")
        record = model_folder_inspect(
            Path(folder), kind=version.kind, prompt_format=prompt_format, progress=say
        )
    except (ModelCheckFailed, config_policy.InvalidTrainingConfig) as exc:
        message = str(exc) if isinstance(exc, ModelCheckFailed) else exc.message
        say(f"failed: {message}")
        return _verdict(
            version_id,
            status=ModelVersion.Status.FAILED,
            validation={"prompt_format": prompt_format},
            error=config_policy.paths_redact(message, keep=version.artifact_path),
        )
    say(f"ready: {record['parameters']} parameters, {record['dtype']}, {record['architecture']}")
    return _verdict(version_id, status=ModelVersion.Status.READY, validation=record, error="")


def _verdict(version_id: int, *, status: str, validation: dict, error: str) -> ModelVersion:
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().get(pk=version_id)
        version.status = status
        version.validation = validation
        version.validation_error = error
        version.save(update_fields=["status", "validation", "validation_error"])
    return version


def model_version_validation_fail(*, version_id: int, error: str) -> None:
    """Mark a version failed when its validation task itself crashed (the task's hook)."""
    ModelVersion.objects.filter(
        pk=version_id,
        status__in=[ModelVersion.Status.PENDING, ModelVersion.Status.VALIDATING],
    ).update(
        status=ModelVersion.Status.FAILED,
        validation_error=config_policy.paths_redact(f"The validation job crashed: {error}"),
    )


def model_version_for_registry(*, user, version_id: int) -> ModelVersion:
    """Return a version the user may manage (staff: any), else NotFound / Forbidden."""
    version = selectors.model_version_list(user=user).filter(pk=version_id).first()
    if version is None:
        raise NotFound("No such model version.")
    if user.is_staff:
        return version
    project_id = selectors.model_version_project_id(version=version)
    if project_id is None or not access.user_can_manage(project_id=project_id, user=user):
        raise Forbidden("Only the project's researchers may do this.")
    return version


# --------------------------------------------------------------------------- inspecting


def _architecture_names(mapping) -> set[str]:
    names = set()
    for value in mapping.values():
        names.update(value if isinstance(value, list | tuple) else [value])
    return names


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _combined(files: dict[str, str]) -> str | None:
    """Return one hash of a set of files: sha256 over their sorted names and hashes."""
    if not files:
        return None
    lines = "".join(f"{name}\t{digest}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelCheckFailed(f"{path.name} is not readable JSON ({exc}).") from exc
    if not isinstance(data, dict):
        raise ModelCheckFailed(f"{path.name} does not hold a JSON object.")
    return data


def model_folder_inspect(
    folder: Path, *, kind: str, prompt_format: str, progress: Progress | None = None
) -> dict[str, Any]:
    """Return the validation record of a model folder; raise ModelCheckFailed on a bad one."""
    import transformers
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )
    from transformers.utils import logging as hf_logging

    say = progress or (lambda message: None)
    # One line per stage from `say`, not the library's progress bars.
    hf_logging.disable_progress_bar()
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise ModelCheckFailed("the folder holds no config.json.")

    say("reading config.json")
    raw_config = _read_json(folder / "config.json")
    tokenizer_path = folder / "tokenizer_config.json"
    tokenizer_config = _read_json(tokenizer_path) if tokenizer_path.is_file() else {}
    for name, data in (("config.json", raw_config), ("tokenizer_config.json", tokenizer_config)):
        if data.get("auto_map"):
            raise ModelCheckFailed(
                f"{name} asks for the model's own code (auto_map); models are loaded without "
                "remote code, so use an architecture transformers ships."
            )
    load = {"trust_remote_code": False, "local_files_only": True}
    try:
        config = AutoConfig.from_pretrained(str(folder), **load)
    except Exception as exc:  # untrusted input: any loader error is the folder's fault
        raise ModelCheckFailed(f"config.json does not load: {type(exc).__name__}: {exc}") from exc
    architectures = list(getattr(config, "architectures", None) or [])
    if not architectures:
        raise ModelCheckFailed("config.json names no architecture ('architectures' is empty).")
    architecture = architectures[0]
    if kind == ModelVersion.Kind.POLICY:
        model_class = AutoModelForCausalLM
        if architecture not in _architecture_names(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
            raise ModelCheckFailed(
                f"kind policy needs a causal language model; the folder holds a {architecture}."
            )
    else:
        model_class = AutoModelForSequenceClassification
        if architecture not in _architecture_names(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES):
            raise ModelCheckFailed(
                "kind reward needs a sequence classifier with one output; the folder holds a "
                f"{architecture}."
            )
        if config.num_labels != 1:
            raise ModelCheckFailed(
                f"kind reward needs a sequence classifier with one output; this one has "
                f"{config.num_labels} (num_labels)."
            )

    say(f"loading the weights of {architecture}")
    try:
        model, info = model_class.from_pretrained(
            str(folder), dtype="auto", output_loading_info=True, **load
        )
    except Exception as exc:  # untrusted input: any loader error is the folder's fault
        raise ModelCheckFailed(f"the weights do not load: {type(exc).__name__}: {exc}") from exc
    missing = sorted(info.get("missing_keys") or [])
    mismatched = info.get("mismatched_keys") or []
    if missing or mismatched:
        shown = ", ".join(str(k) for k in [*missing, *mismatched][:5])
        raise ModelCheckFailed(
            f"the weights do not fit {architecture}: missing or reshaped {shown}."
        )
    parameters = sum(p.numel() for p in model.parameters())
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    del model
    gc.collect()

    say("loading the tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **load)
    except Exception as exc:  # untrusted input
        raise ModelCheckFailed(f"the tokenizer does not load: {type(exc).__name__}: {exc}") from exc
    template = getattr(tokenizer, "chat_template", None)
    if template:
        try:
            tokenizer.apply_chat_template(
                [{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # a template is code in a sandbox; a broken one is an error
            raise ModelCheckFailed(
                f"the chat template does not render: {type(exc).__name__}: {exc}"
            ) from exc
    elif prompt_format == DEFAULT_PROMPT_FORMAT:
        raise ModelCheckFailed(
            "the tokenizer has no chat template; add one, or register the model with "
            "prompt_format plain (Human:/Assistant: text)."
        )

    say("hashing weights and tokenizer files")
    weights, tokenizer_files = {}, {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(folder).as_posix()
        if path.name in WEIGHT_INDEXES or path.name.endswith(WEIGHT_SUFFIXES):
            weights[relative] = _sha256(path)
        elif path.name in TOKENIZER_FILES:
            tokenizer_files[relative] = _sha256(path)
    if not weights:
        raise ModelCheckFailed("no weight files (.safetensors or .bin) in the folder.")
    if isinstance(template, dict):
        template_text = json.dumps(template, sort_keys=True)
    else:
        template_text = template or ""
    return {
        "prompt_format": prompt_format,
        "architecture": architecture,
        "model_type": getattr(config, "model_type", ""),
        "num_labels": config.num_labels if kind == ModelVersion.Kind.REWARD else None,
        "parameters": parameters,
        "dtype": dtype,
        "hashes": {
            "weights": _combined(weights),
            "tokenizer": _combined(tokenizer_files),
            "chat_template": (
                hashlib.sha256(template_text.encode()).hexdigest() if template_text else None
            ),
        },
        "files": {"weights": weights, "tokenizer": tokenizer_files},
        "transformers": transformers.__version__,
        "validated_at": timezone.now().isoformat(),
    }
