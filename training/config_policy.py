"""What a training config may name: one set of rules for the API, `manage.py train` and the loop.

A config reaches a training worker, which imports code, reads folders and writes
checkpoints with the rights of the deployment. So:

- reward functions are named by a key of ``PREFLOOP_REWARD_FUNCTIONS`` (declared by the
  deployment); the import path is looked up here and written into the file the training CLI
  reads, so no request ever supplies one;
- a non-staff caller names models, tokenizers and checkpoints by ids (``ModelVersion``,
  ``TrainingRun``) of the project the run belongs to, resolved here to their folders;
- staff and the server itself (caller ``None``) may give absolute paths, which must resolve,
  symlinks followed, inside the artefact root or one of ``PREFLOOP_MODEL_ROOTS``;
- ``trl_args`` takes only the harmless keys of the recipe (nothing that moves output,
  rotates checkpoints, reaches the hub or passes keyword arguments to a loader).

Refusals are ``InvalidTrainingConfig`` (400) naming the field; they never echo a server path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from annotation.errors import NotFound, ServiceError
from training.alarms import stop_on_alarm_check

# Path field of the recipe configs -> the id field a non-staff caller gives instead.
MODEL_ID_FIELDS = {
    "tokenizer_name_or_path": "tokenizer_model_id",
    "reference_model_path": "reference_model_id",
    "reward_model_path": "reward_model_id",
    "value_model_path": "value_model_id",
    "judge_reward_model_path": "judge_reward_model_id",
}
# List-of-paths fields -> the list of ids a non-staff caller gives instead.
MODEL_ID_LIST_FIELDS = {"reward_model_paths": "reward_model_ids"}
RUN_ID_FIELDS = {"resume_from_checkpoint": "resume_from_run_id"}
# model_name_or_path is named by the request's base_model_id, not by a config field.
PATH_FIELDS = ("model_name_or_path", *MODEL_ID_FIELDS, *MODEL_ID_LIST_FIELDS, *RUN_ID_FIELDS)

# TrainingArguments knobs that change only the optimisation, never files, hub or code.
_COMMON_TRL_ARGS = frozenset(
    {
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "data_seed",
        "eval_steps",
        "gradient_accumulation_steps",
        "learning_rate",
        "logging_first_step",
        "logging_steps",
        "lr_scheduler_type",
        "max_grad_norm",
        "max_steps",
        "num_train_epochs",
        "per_device_eval_batch_size",
        "per_device_train_batch_size",
        "save_steps",
        "seed",
        "warmup_steps",
        "weight_decay",
    }
)
_SAMPLING_TRL_ARGS = frozenset(
    {
        "beta",
        "epsilon",
        "epsilon_high",
        "max_completion_length",
        "min_p",
        "num_generations",
        "num_iterations",
        "repetition_penalty",
        "temperature",
        "top_k",
        "top_p",
    }
)
# Keys the recipe passes to its TRL config itself are left out: giving them twice would fail.
TRL_ARGS_ALLOWED: dict[str, frozenset[str]] = {
    "sft": _COMMON_TRL_ARGS | {"label_smoothing_factor", "neftune_noise_alpha"},
    "reward": _COMMON_TRL_ARGS,
    "dpo": _COMMON_TRL_ARGS | {"ld_alpha", "truncation_mode", "use_weighting"},
    "grpo": _COMMON_TRL_ARGS
    | _SAMPLING_TRL_ARGS
    | {
        "generation_batch_size",
        "loss_type",
        "mask_truncated_completions",
        "reward_weights",
        "scale_rewards",
        "steps_per_generation",
    },
    "rloo": _COMMON_TRL_ARGS | _SAMPLING_TRL_ARGS | {"normalize_advantages", "reward_clip_range"},
    "ppo": frozenset(),  # PPO has its own trainer: every knob is a config field
}

# Ready `accelerate launch` configs a run names by file stem (never by path).
ACCELERATE_CONFIG_DIR = Path(__file__).resolve().parent / "accelerate"

SERVER_PATH = "<server path>"
# An absolute POSIX path inside free text (a log line, an exception message).
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~/-])/[^\s'\"`,;:()\[\]{}<>|=]+")


class InvalidTrainingConfig(ServiceError):
    """A training request the server refuses to run; ``field`` names the culprit."""

    code = "invalid_config"

    def __init__(self, message: str, *, field: str = "", **kwargs):
        super().__init__(message, **kwargs)
        self.field = field


def _refuse(field: str, message: str) -> InvalidTrainingConfig:
    return InvalidTrainingConfig(f"{field}: {message}", field=field)


# --------------------------------------------------------------------------- reward functions


def reward_function_registry() -> dict[str, str]:
    """Return the deployment's reward functions: name -> ``module:function``."""
    return dict(settings.PREFLOOP_REWARD_FUNCTIONS)


def reward_function_resolve(*, name: Any, field: str = "config.reward_function") -> str:
    """Return the import path registered under ``name``; refuse anything else."""
    registry = reward_function_registry()
    if not isinstance(name, str) or name not in registry:
        known = ", ".join(sorted(registry)) or "none"
        raise _refuse(
            field,
            f"not a registered reward function; choose one of: {known} "
            "(the deployment lists them in PREFLOOP_REWARD_FUNCTIONS).",
        )
    return registry[name]


# --------------------------------------------------------------------------- accelerate configs


def accelerate_config_names() -> list[str]:
    """Return the names of the accelerate configs shipped in training/accelerate/."""
    return sorted(path.stem for path in ACCELERATE_CONFIG_DIR.glob("*.yaml"))


def accelerate_config_path(*, name: Any, field: str = "config.accelerate_config") -> Path:
    """Return the file of the accelerate config named ``name``; refuse any other value."""
    names = accelerate_config_names()
    if not isinstance(name, str) or name not in names:
        raise _refuse(field, f"not a known accelerate config; choose one of: {', '.join(names)}.")
    return ACCELERATE_CONFIG_DIR / f"{name}.yaml"


# --------------------------------------------------------------------------- paths


def training_roots() -> list[Path]:
    """Return the folders (resolved) under which every model, checkpoint and dataset must lie."""
    roots = [settings.ARTIFACT_ROOT, *settings.PREFLOOP_MODEL_ROOTS]
    output_root = settings.TRAINING_OUTPUT_ROOT
    if output_root:
        roots.append(output_root)
    return [Path(os.path.realpath(root)) for root in roots if root]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def path_check(*, value: Any, field: str) -> str:
    """Return ``value`` resolved (symlinks followed) if it lies under a training root.

    Refused: relative paths, any '..' part, and anything that resolves outside the roots.
    """
    if not isinstance(value, str) or not value.strip():
        raise _refuse(field, "expected a folder path.")
    if "\x00" in value:
        raise _refuse(field, "not a valid path.")
    pure = PurePosixPath(value)
    if not pure.is_absolute():
        raise _refuse(field, "give an absolute path under the artefact or model roots.")
    if ".." in pure.parts:
        raise _refuse(field, "'..' is not allowed in a path.")
    real = Path(os.path.realpath(value))
    if not any(_inside(real, root) for root in training_roots()):
        raise _refuse(
            field,
            "outside the artefact and model roots (symlinks are followed); "
            "see PREFLOOP_MODEL_ROOTS.",
        )
    return str(real)


def _model_alias(value: Any) -> bool:
    from training.trainers.model_paths import MODEL_ALIASES

    return isinstance(value, str) and value.lower() in MODEL_ALIASES


# --------------------------------------------------------------------------- ids


def _is_trusted(user) -> bool:
    """Return whether the caller may give server paths (staff, or the server itself)."""
    return user is None or bool(getattr(user, "is_staff", False))


def _parse_id(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _refuse(field, "expected a positive integer id.")
    return value


def model_version_for_run(*, user, project, version_id: Any, field: str):
    """Return the ModelVersion ``version_id`` if the caller may train project ``project`` from it.

    Staff and the server may name any version; others only one of the run's own project.
    """
    from training import selectors
    from training.models import ModelVersion

    version_id = _parse_id(version_id, field)
    if _is_trusted(user):
        version = ModelVersion.objects.filter(pk=version_id).first()
    else:
        version = selectors.model_version_list(user=user).filter(pk=version_id).first()
    if version is None:
        raise NotFound(f"{field}: no such model version.")
    if not _is_trusted(user) and (
        project is None or selectors.model_version_project_id(version=version) != project.pk
    ):
        raise _refuse(field, "the model version belongs to another project.")
    model_version_usable(version=version, field=field)
    return version


def model_version_usable(*, version, field: str) -> None:
    """Refuse a model version whose validation has not passed (the one rule of "usable")."""
    if version.status == "ready":
        return
    if version.status == "failed":
        detail = f"failed validation: {version.validation_error or 'no reason recorded'}"
    else:
        detail = f"is {version.status}: usable once its validation passed"
    raise _refuse(field, f"model version {version.name!r} {detail}")


def training_run_for_run(*, user, project, run_id: Any, field: str):
    """Return the TrainingRun ``run_id`` if the caller may build on it in project ``project``."""
    from training import selectors
    from training.models import TrainingRun

    run_id = _parse_id(run_id, field)
    if _is_trusted(user):
        run = TrainingRun.objects.filter(pk=run_id).first()
    else:
        run = selectors.training_run_get(user=user, run_id=run_id)
    if run is None:
        raise NotFound(f"{field}: no such training run.")
    if not _is_trusted(user) and (project is None or run.project_id != project.pk):
        raise _refuse(field, "the training run belongs to another project.")
    return run


def model_version_folder(*, version, field: str) -> str:
    """Return the folder of a registered model, checked against the roots like any path."""
    if version.kind == "endpoint":
        raise _refuse(field, "a policy behind an endpoint has no weights here to train from.")
    model_version_usable(version=version, field=field)
    return path_check(value=version.artifact_path, field=field)


# --------------------------------------------------------------------------- the config


def _check_trl_args(recipe: str, trl_args: Any) -> None:
    if not isinstance(trl_args, dict):
        raise _refuse("config.trl_args", "expected an object of TRL argument names to values.")
    allowed = TRL_ARGS_ALLOWED.get(recipe, frozenset())
    for key in sorted(trl_args):
        field = f"config.trl_args.{key}"
        if key not in allowed:
            listed = ", ".join(sorted(allowed)) or "none"
            raise _refuse(field, f"not an allowed TRL argument for {recipe}; allowed: {listed}.")
        value = trl_args[key]
        scalar = value is None or isinstance(value, bool | int | float | str)
        numbers = isinstance(value, list) and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        )
        if not (scalar or numbers):
            raise _refuse(field, "expected a number, a string, a boolean or a list of numbers.")


def training_config_resolve(
    *, recipe: str, config: Any, user=None, project=None, run_folder: str = ""
) -> dict[str, Any]:
    """Return the config with ids resolved to checked folders; refuse what the caller may not name.

    ``user`` None is the server itself (the loop, management commands): trusted like staff.
    The reward function stays a registry name; ``training_config_for_cli`` resolves it.
    """
    if not isinstance(config, dict):
        raise _refuse("config", "expected a JSON object of field names to values.")
    config = dict(config)
    if "resume" in config:
        raise _refuse("config.resume", "set by the runner, not by the config.")
    if "stop_on_alarm" in config:
        problem = stop_on_alarm_check(config["stop_on_alarm"])
        if problem:
            raise _refuse("config.stop_on_alarm", problem)
    if "trl_args" in config:
        _check_trl_args(recipe, config["trl_args"])
    if config.get("reward_function"):
        reward_function_resolve(name=config["reward_function"])
    if "accelerate_config" in config:
        accelerate_config_path(name=config["accelerate_config"])

    trusted = _is_trusted(user)
    for path_field, id_field in MODEL_ID_LIST_FIELDS.items():
        _resolve_path_list(config, path_field, id_field, user=user, project=project)
    for path_field in PATH_FIELDS:
        if path_field in MODEL_ID_LIST_FIELDS:
            continue
        id_field = MODEL_ID_FIELDS.get(path_field) or RUN_ID_FIELDS.get(path_field)
        given_id = config.pop(id_field, None) if id_field else None
        value = config.get(path_field)
        if given_id is not None and value:
            raise _refuse(f"config.{id_field}", f"give {id_field} or {path_field}, not both.")
        if given_id is not None:
            field = f"config.{id_field}"
            if path_field in RUN_ID_FIELDS:
                config[path_field] = _run_checkpoint(user, project, given_id, field)
            else:
                version = model_version_for_run(
                    user=user, project=project, version_id=given_id, field=field
                )
                config[path_field] = model_version_folder(version=version, field=field)
            continue
        if not value:
            continue
        field = f"config.{path_field}"
        if path_field != "resume_from_checkpoint" and _model_alias(value):
            continue
        if not trusted:
            instead = f"{id_field} (an id of this project)" if id_field else "base_model_id"
            raise _refuse(field, f"server paths are for staff; give {instead}.")
        config[path_field] = path_check(value=value, field=field)
    return config


def _resolve_path_list(config: dict, path_field: str, id_field: str, *, user, project) -> None:
    """Resolve a list of model ids (or, for trusted callers, paths) to checked folders."""
    given_ids = config.pop(id_field, None)
    values = config.get(path_field)
    if given_ids is not None and values:
        raise _refuse(f"config.{id_field}", f"give {id_field} or {path_field}, not both.")
    if given_ids is not None:
        field = f"config.{id_field}"
        if not isinstance(given_ids, list) or not given_ids:
            raise _refuse(field, "expected a non-empty list of model version ids.")
        folders = []
        for index, version_id in enumerate(given_ids):
            item = f"{field}[{index}]"
            version = model_version_for_run(
                user=user, project=project, version_id=version_id, field=item
            )
            folders.append(model_version_folder(version=version, field=item))
        config[path_field] = folders
        return
    if not values:
        return
    field = f"config.{path_field}"
    if not _is_trusted(user):
        raise _refuse(field, f"server paths are for staff; give {id_field} (ids of this project).")
    if not isinstance(values, list):
        raise _refuse(field, "expected a list of folder paths.")
    config[path_field] = [
        path_check(value=value, field=f"{field}[{index}]") for index, value in enumerate(values)
    ]


def _run_checkpoint(user, project, run_id: Any, field: str) -> str:
    from training.trainers.checkpoints import newest_complete_checkpoint

    run = training_run_for_run(user=user, project=project, run_id=run_id, field=field)
    found = newest_complete_checkpoint(run.output_dir) if run.output_dir else None
    if found is None:
        raise _refuse(field, f"training run {run.pk} has no complete checkpoint.")
    return path_check(value=found[0], field=field)


def training_config_for_cli(*, config: dict[str, Any]) -> dict[str, Any]:
    """Return the config the training CLI reads: the reward function's registered import path."""
    config = dict(config)
    # The launcher's and the supervisor's settings, not the CLI's (the supervisor passes the
    # first to accelerate launch and acts on the second itself).
    config.pop("accelerate_config", None)
    config.pop("stop_on_alarm", None)
    if config.get("reward_function"):
        config["reward_function"] = reward_function_resolve(name=config["reward_function"])
    return config


# --------------------------------------------------------------------------- what callers see


def paths_redact(text: str, *, keep: str | Path = "") -> str:
    """Replace every absolute path in ``text`` outside the folder ``keep`` by a placeholder."""
    if not text:
        return text
    keep_root = os.path.normpath(str(keep)) if keep else ""

    def replace(match: re.Match) -> str:
        path = match.group(0).rstrip(".")  # a full stop after a path ends the sentence
        trailing = match.group(0)[len(path) :]
        normal = os.path.normpath(path)
        inside = normal == keep_root or normal.startswith(keep_root + os.sep)
        if keep_root and inside and ".." not in PurePosixPath(path).parts:
            return match.group(0)
        return SERVER_PATH + trailing

    return _ABSOLUTE_PATH.sub(replace, text)
