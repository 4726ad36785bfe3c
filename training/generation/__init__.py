"""Sample K candidate answers per prompt, recording how each was made, behind one interface.

Backends (each `GenerationBackend`): `transformers` (local folder, batched with left padding;
the default), `openai` (any OpenAI-compatible server), `vllm` (offline engine, GPU images).
This package's top level imports no Django; `training.generation.endpoints` picks the backend
of a `ModelVersion` and holds the deployment's endpoint policies.
"""

from training.generation.base import (
    GenerationBackend,
    GenerationError,
    GenerationSettings,
    candidate_seed,
    settings_dict,
)
from training.generation.transformers import TransformersBackend, generate_candidates

__all__ = [
    "GenerationBackend",
    "GenerationError",
    "GenerationSettings",
    "TransformersBackend",
    "candidate_seed",
    "generate_candidates",
    "settings_dict",
]
