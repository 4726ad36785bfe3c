"""What every generation backend shares: sampling settings, candidate seeds, the interface.

No Django. A backend returns, for each prompt, K candidates
``{text, model_name, checkpoint_id, generation_config}``; the generation config records
everything needed to make the candidate again (seed 004 §4.1).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

Prompt = str | list[dict]
Candidate = dict


@dataclass
class GenerationSettings:
    """Sampling settings; recorded on every candidate."""

    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass (1 = off)."})
    top_k: int = field(default=0, metadata={"help": "Top-k cut-off (0 = off)."})
    max_new_tokens: int = field(default=32, metadata={"help": "Longest answer in tokens."})
    stop: list[str] = field(default_factory=list, metadata={"help": "Extra stop strings."})
    seed: int = field(default=0, metadata={"help": "Base seed; candidate seeds derive from it."})
    batch_size: int = field(default=32, metadata={"help": "Prompts per generate() call."})
    batch_tokens: int = field(
        default=4096,
        metadata={
            "help": "Most prompt tokens per generate() call, padding included: long prompts "
            "go in smaller batches, as their prefill costs the most."
        },
    )


class GenerationError(Exception):
    """Generation failed as a whole (an endpoint that does not answer, times out, or garbles)."""


@runtime_checkable
class GenerationBackend(Protocol):
    """Anything that samples K candidates per prompt and records how each was made."""

    def generate(
        self,
        prompts: list[Prompt],
        *,
        k: int,
        settings: GenerationSettings,
        model_name: str = "",
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Candidate]]:
        """Return k candidates for each prompt, in prompt order; raise GenerationError."""
        ...


def messages_of(prompt: Prompt) -> list[dict]:
    """Return a prompt as chat messages (a text prompt is one user turn)."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def candidate_seed(base_seed: int, prompt: Prompt, j: int) -> int:
    """Return the seed of the j-th candidate for a prompt: stable across runs and batches."""
    key = f"{base_seed}:{prompt!r}:{j}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


def settings_dict(settings: GenerationSettings) -> dict:
    """Return the settings as a plain dict (for configs and run records)."""
    return asdict(settings)
