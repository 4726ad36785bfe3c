"""Sample candidates from a local policy folder with vLLM's offline engine (GPU images only).

vLLM is not in requirements.txt: it needs a CUDA GPU. Install it in the GPU worker image
(`pip install vllm`) and set PREFLOOP_GENERATION_LOCAL_BACKEND=vllm; local policies are then
sampled with `vllm.LLM.chat`, one `SamplingParams` per candidate carrying its own seed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from training.generation.base import (
    Candidate,
    GenerationError,
    GenerationSettings,
    Prompt,
    candidate_seed,
    messages_of,
)


def vllm_available() -> bool:
    """Return whether vLLM is importable and a CUDA device is visible."""
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class VLLMBackend:
    """Generate with vLLM's offline `LLM` engine (continuous batching, paged attention)."""

    name = "vllm"

    def __init__(self, model_path: str | Path):
        self.model_path = str(model_path)

    def generate(
        self,
        prompts: list[Prompt],
        *,
        k: int,
        settings: GenerationSettings,
        model_name: str = "",
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Candidate]]:
        """Return k candidates for each prompt, each sampled with its own seed."""
        try:
            from vllm import LLM, SamplingParams
        except ImportError as exc:
            raise GenerationError(
                "the vllm backend is configured but vllm is not installed in this worker"
            ) from exc
        llm = LLM(model=self.model_path, trust_remote_code=False, seed=settings.seed)
        out: list[list[Candidate]] = [[] for _ in prompts]
        for j in range(k):
            seeds = [candidate_seed(settings.seed, p, j) for p in prompts]
            params = [
                SamplingParams(
                    n=1,
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    top_k=settings.top_k or -1,
                    max_tokens=settings.max_new_tokens,
                    stop=list(settings.stop) or None,
                    seed=seed,
                )
                for seed in seeds
            ]
            results = llm.chat([messages_of(p) for p in prompts], params, use_tqdm=False)
            for i, result in enumerate(results):
                out[i].append(
                    {
                        "text": result.outputs[0].text.strip(),
                        "model_name": model_name,
                        "checkpoint_id": self.model_path,
                        "generation_config": {
                            "backend": self.name,
                            "temperature": settings.temperature,
                            "top_p": settings.top_p,
                            "top_k": settings.top_k,
                            "max_new_tokens": settings.max_new_tokens,
                            "stop": list(settings.stop),
                            "seed": seeds[i],
                            "k": k,
                            "do_sample": True,
                        },
                    }
                )
            if progress is not None:
                progress(len(prompts))
        return out
