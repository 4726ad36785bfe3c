"""Checking a request for a generated round, before anything is queued.

A request names the project's own ready policies by id, a mode (`MODES`), a prompt count and
per-candidate sampling settings within `SAMPLING_LIMITS`; each refusal is an
`InvalidGenerationRequest` (400) naming the field. `training.rounds.generation_job_create`
runs these checks and queues the job; its run reads the checked `GenerationRequest` back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from annotation.errors import ServiceError
from annotation.models import Project
from training import config_policy
from training.models import ModelVersion

MODES = ("k_samples", "side_by_side")
MAX_PROMPTS = 10_000
# Sampling settings a request may give per candidate, and their allowed ranges.
SAMPLING_LIMITS: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.01, 5.0),
    "top_p": (float, 0.01, 1.0),
    "top_k": (int, 0, 1000),
    "max_new_tokens": (int, 1, 4096),
    "batch_size": (int, 1, 256),
    "batch_tokens": (int, 64, 1_000_000),
}


class InvalidGenerationRequest(ServiceError):
    """A generation request refused before anything is queued; `field` names the culprit."""

    code = "invalid_generation"

    def __init__(self, message: str, *, field: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _policy_check(*, project: Project, version_id: Any, index: int) -> ModelVersion:
    from training.selectors import model_version_project_id

    field = f"policies[{index}]"
    if isinstance(version_id, bool) or not isinstance(version_id, int) or version_id < 1:
        raise InvalidGenerationRequest("expected a positive integer id.", field=field)
    version = (
        ModelVersion.objects.select_related("training_run", "dataset_version")
        .filter(pk=version_id)
        .first()
    )
    # Another project's version reads exactly as an unknown one: nothing leaks about it.
    if version is None or model_version_project_id(version=version) != project.pk:
        raise InvalidGenerationRequest(
            f"no model version {version_id} in this project.", field=field
        )
    if version.kind == ModelVersion.Kind.REWARD:
        raise InvalidGenerationRequest(
            f"{version.name!r} is a reward model; pick a policy.", field=field
        )
    config_policy.model_version_usable(version=version, field=field)
    return version


def sampling_check(sampling: Any, *, n_candidates: int) -> list[dict]:
    """Return one settings dict per candidate (0 or 1 given: shared); 400 naming the field."""
    if sampling is None:
        sampling = []
    if not isinstance(sampling, list):
        raise InvalidGenerationRequest("give a list of settings objects.", field="sampling")
    if len(sampling) not in (0, 1, n_candidates):
        raise InvalidGenerationRequest(
            f"give 1 settings object for every candidate or {n_candidates} (one per "
            f"candidate), not {len(sampling)}.",
            field="sampling",
        )
    clean = []
    for i, entry in enumerate(sampling):
        where = f"sampling[{i}]"
        if not isinstance(entry, dict):
            raise InvalidGenerationRequest("must be an object.", field=where)
        unknown = set(entry) - set(SAMPLING_LIMITS)
        if unknown:
            raise InvalidGenerationRequest(
                f"unknown setting(s) {', '.join(sorted(unknown))}; known: "
                f"{', '.join(SAMPLING_LIMITS)}.",
                field=where,
            )
        values = {}
        for name, value in entry.items():
            kind, low, high = SAMPLING_LIMITS[name]
            number_ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not number_ok or (kind is int and not float(value).is_integer()):
                raise InvalidGenerationRequest("expected a number.", field=f"{where}.{name}")
            if not low <= value <= high:
                raise InvalidGenerationRequest(
                    f"must be between {low:g} and {high:g}.", field=f"{where}.{name}"
                )
            values[name] = kind(value)
        clean.append(values)
    if len(clean) <= 1:
        clean = [dict(clean[0]) if clean else {} for _ in range(n_candidates)]
    return clean


@dataclass(frozen=True)
class GenerationRequest:
    """A checked request: what the job's run reads back from `GenerationJob.request`."""

    mode: str
    policies: list[int]
    n_prompts: int
    sampling: list[dict]
    seed: int
    purpose: str
