"""Which generation backend serves a model version, and the deployment's endpoint policies.

Policies of kind "endpoint" are named by an endpoint of PREFLOOP_GENERATION_ENDPOINTS and one
of its models, never by a URL from a request. The key is read from the environment variable
the deployment names, at call time: it is never stored in the database, never recorded on a
candidate, and never passed to training processes (training/processes.py drops it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction

from annotation.errors import Conflict, ServiceError
from training.generation.base import (
    Candidate,
    GenerationBackend,
    GenerationError,
    GenerationSettings,
    Prompt,
)
from training.generation.openai import EndpointClientSettings, OpenAICompatibleBackend
from training.models import ModelVersion

LOCAL_BACKENDS = ("transformers", "vllm")


class InvalidEndpoint(ServiceError):
    """A request names an endpoint or model the deployment does not declare; `field` names it."""

    code = "invalid_endpoint"

    def __init__(self, message: str, *, field: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class EndpointPolicy:
    """One OpenAI-compatible server the deployment lets researchers generate with."""

    name: str
    base_url: str
    models: tuple[str, ...]
    api_key_env: str = ""
    client: EndpointClientSettings = field(default_factory=EndpointClientSettings)


def generation_endpoints() -> dict[str, EndpointPolicy]:
    """Return the declared endpoints by name; raise ImproperlyConfigured on a malformed entry."""
    declared = settings.PREFLOOP_GENERATION_ENDPOINTS
    if not isinstance(declared, dict):
        raise ImproperlyConfigured("PREFLOOP_GENERATION_ENDPOINTS must be a JSON object.")
    policies = {}
    for name, entry in declared.items():
        where = f"PREFLOOP_GENERATION_ENDPOINTS[{name!r}]"
        if not isinstance(entry, dict):
            raise ImproperlyConfigured(f"{where} must be an object.")
        unknown = set(entry) - {
            "base_url",
            "models",
            "api_key_env",
            "concurrency",
            "timeout_seconds",
            "retries",
        }
        if unknown:
            raise ImproperlyConfigured(f"{where} has unknown key(s): {', '.join(sorted(unknown))}")
        url = entry.get("base_url", "")
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
            raise ImproperlyConfigured(f"{where}.base_url must be an http(s) URL.")
        models = entry.get("models")
        if (
            not isinstance(models, list)
            or not models
            or not all(isinstance(m, str) and m for m in models)
        ):
            raise ImproperlyConfigured(f"{where}.models must be a non-empty list of names.")
        defaults = EndpointClientSettings()
        try:
            client = EndpointClientSettings(
                concurrency=int(entry.get("concurrency", defaults.concurrency)),
                timeout_seconds=float(entry.get("timeout_seconds", defaults.timeout_seconds)),
                retries=int(entry.get("retries", defaults.retries)),
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from exc
        if client.concurrency < 1 or client.timeout_seconds <= 0 or client.retries < 0:
            raise ImproperlyConfigured(
                f"{where}: concurrency >= 1, timeout_seconds > 0 and retries >= 0 are needed."
            )
        policies[name] = EndpointPolicy(
            name=name,
            base_url=url,
            models=tuple(models),
            api_key_env=str(entry.get("api_key_env", "")),
            client=client,
        )
    return policies


def generation_endpoint_check(*, endpoint: str, model: str) -> EndpointPolicy:
    """Return the endpoint if it is declared and serves `model`; else 400 naming the field."""
    policies = generation_endpoints()
    policy = policies.get(endpoint)
    if policy is None:
        known = ", ".join(sorted(policies)) or "none are configured"
        raise InvalidEndpoint(f"no endpoint named {endpoint!r}; known: {known}.", field="endpoint")
    if model not in policy.models:
        raise InvalidEndpoint(
            f"endpoint {endpoint!r} serves no model {model!r}; it serves: "
            f"{', '.join(policy.models)}.",
            field="model",
        )
    return policy


def model_version_endpoint_create(
    *, name: str, endpoint: str, model: str, project=None
) -> ModelVersion:
    """Register a policy served by a declared endpoint, named by endpoint and model."""
    generation_endpoint_check(endpoint=endpoint, model=model)
    try:
        with transaction.atomic():
            return ModelVersion.objects.create(
                name=name,
                kind=ModelVersion.Kind.ENDPOINT,
                artifact_path="",
                endpoint_name=endpoint,
                endpoint_model=model,
                project=project,
                source=ModelVersion.Source.ENDPOINT,
            )
    except IntegrityError as exc:
        raise Conflict(f"name: a model version named {name!r} exists already.") from exc


def generation_backend_for(*, model_version: ModelVersion) -> GenerationBackend:
    """Return the backend that samples this model version."""
    if model_version.kind == ModelVersion.Kind.ENDPOINT:
        try:
            policy = generation_endpoint_check(
                endpoint=model_version.endpoint_name, model=model_version.endpoint_model
            )
        except InvalidEndpoint as exc:
            raise GenerationError(
                f"model version {model_version.name!r}: the deployment no longer declares it "
                f"({exc.message})"
            ) from exc
        api_key = ""
        if policy.api_key_env:
            api_key = os.environ.get(policy.api_key_env, "")
            if not api_key:
                raise GenerationError(
                    f"endpoint {policy.name!r}: the environment variable "
                    f"{policy.api_key_env} holding its key is not set in this worker"
                )
        return OpenAICompatibleBackend(
            endpoint=policy.name,
            base_url=policy.base_url,
            model=model_version.endpoint_model,
            api_key=api_key,
            client=policy.client,
        )
    local = settings.PREFLOOP_GENERATION_LOCAL_BACKEND
    if local == "vllm":
        from training.generation.vllm import VLLMBackend

        return VLLMBackend(model_version.artifact_path)
    if local != "transformers":
        raise ImproperlyConfigured(
            f"PREFLOOP_GENERATION_LOCAL_BACKEND must be one of {', '.join(LOCAL_BACKENDS)}."
        )
    from training.generation.transformers import TransformersBackend

    return TransformersBackend(model_version.artifact_path)


def candidates_generate(
    *,
    model_version: ModelVersion,
    prompts: list[Prompt],
    k: int,
    settings: GenerationSettings,
    progress: Callable[[int], None] | None = None,
) -> list[list[Candidate]]:
    """Return k candidates per prompt from the model version, through its backend."""
    from training.config_policy import InvalidTrainingConfig, model_version_usable

    try:
        model_version_usable(version=model_version, field="model_version")
    except InvalidTrainingConfig as exc:
        raise GenerationError(exc.message) from exc
    backend = generation_backend_for(model_version=model_version)
    return backend.generate(
        prompts, k=k, settings=settings, model_name=model_version.name, progress=progress
    )


def generation_settings_check(app_configs=None, **kwargs) -> list:
    """Report malformed generation settings when the server starts, not at the first round."""
    from django.core.checks import Error

    problems = []
    try:
        generation_endpoints()
    except ImproperlyConfigured as exc:
        problems.append(Error(str(exc), id="training.E001"))
    if settings.PREFLOOP_GENERATION_LOCAL_BACKEND not in LOCAL_BACKENDS:
        problems.append(
            Error(
                f"PREFLOOP_GENERATION_LOCAL_BACKEND must be one of {', '.join(LOCAL_BACKENDS)}.",
                id="training.E002",
            )
        )
    return problems
