"""Sample candidates from a local policy folder with transformers, batched with left padding.

The default backend: it runs in the `gpu` worker. Prompts go through the model's chat template
and are batched, padded on the left so that every row's answer starts at the same column.
Batches are formed in order of prompt length, at most `settings.batch_size` prompts and
`settings.batch_tokens` padded prompt tokens each: a short prompt is not padded to the longest
of the list (multi-turn chat prompts vary tenfold), and the few long prompts, whose prefill
costs the most, go in small batches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from training.generation.base import (
    Candidate,
    GenerationSettings,
    Prompt,
    candidate_seed,
    messages_of,
)


class TransformersBackend:
    """Generate with `model.generate` from a transformers folder (no remote code)."""

    name = "transformers"

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
        """Return k candidates for each prompt; candidates of a prompt use distinct seeds."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model_path = self.model_path
        from training.trainers.chat_templates import prepare_tokenizer

        # The recipes' own preparation: a folder registered with the plain prompt format has
        # no chat template and gets the plain Human:/Assistant: one it was trained with.
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(model_path))
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(model_path)
        model.eval()
        template = tokenizer.chat_template or ""
        template_hash = hashlib.sha256(template.encode()).hexdigest()[:16]
        base_config = {
            "backend": self.name,
            "template": f"sha256:{template_hash}",
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "top_k": settings.top_k,
            "max_new_tokens": settings.max_new_tokens,
            "stop": list(settings.stop),
            "do_sample": True,
        }
        texts = [
            tokenizer.apply_chat_template(
                messages_of(p), tokenize=False, add_generation_prompt=True
            )
            for p in prompts
        ]
        out: list[list[Candidate]] = [[] for _ in prompts]
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        order = sorted(range(len(prompts)), key=lambda i: (-lengths[i], i))
        batches = length_batches([lengths[i] for i in order], settings)
        for j in range(k):
            for start, end in batches:
                batch = order[start:end]
                # One seed per (prompt, j) would need one generate() call each; instead seed
                # the batch from its first member and record the batch layout with it.
                seeds = [candidate_seed(settings.seed, prompts[i], j) for i in batch]
                torch.manual_seed(seeds[0])
                enc = tokenizer(
                    [texts[i] for i in batch],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=False,
                )
                with torch.no_grad():
                    generated = model.generate(
                        **enc,
                        do_sample=True,
                        temperature=settings.temperature,
                        top_p=settings.top_p,
                        top_k=settings.top_k or None,
                        max_new_tokens=settings.max_new_tokens,
                        pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id,
                        stop_strings=settings.stop or None,
                        tokenizer=tokenizer if settings.stop else None,
                    )
                new_tokens = generated[:, enc["input_ids"].shape[1] :]
                for row, i in enumerate(batch):
                    text = tokenizer.decode(new_tokens[row], skip_special_tokens=True).strip()
                    count, finish = _new_token_count(
                        new_tokens[row].tolist(), tokenizer.eos_token_id, tokenizer.pad_token_id
                    )
                    out[i].append(
                        {
                            "text": text,
                            "model_name": model_name,
                            "checkpoint_id": model_path,
                            "generation_config": {
                                **base_config,
                                "seed": seeds[0],
                                # [first position, size, row] in the length order
                                "batch": [start, len(batch), row],
                                "k": k,
                                # the same shape as an OpenAI-compatible server's reply
                                "response": {
                                    "finish_reason": finish,
                                    "usage": {"completion_tokens": count},
                                },
                            },
                        }
                    )
                if progress is not None:
                    progress(len(batch))
        return out


def length_batches(lengths: list[int], settings: GenerationSettings) -> list[tuple[int, int]]:
    """Return [start, end) slices of prompts sorted longest first, within the batch limits."""
    slices, start = [], 0
    while start < len(lengths):
        # The first prompt is the batch's longest: every row is padded to it.
        size = min(settings.batch_size, max(1, settings.batch_tokens // max(lengths[start], 1)))
        slices.append((start, min(start + size, len(lengths))))
        start += size
    return slices


def _new_token_count(tokens: list[int], eos_id, pad_id) -> tuple[int, str]:
    """Return (tokens generated, "stop" or "length"): up to the first EOS, padding excluded."""
    if eos_id in tokens:
        return tokens.index(eos_id) + 1, "stop"
    generated = [t for t in tokens if t != pad_id]
    return len(generated), "length" if len(generated) == len(tokens) else "stop"


def generate_candidates(
    model_path: str | Path,
    prompts: list[Prompt],
    *,
    k: int,
    settings: GenerationSettings | None = None,
    model_name: str = "",
    progress: Callable[[int], None] | None = None,
) -> list[list[Candidate]]:
    """Return, for each prompt, k candidates `{text, model_name, checkpoint_id, generation_config}`.

    Candidates of one prompt are sampled with distinct seeds; identical texts are kept (the
    caller decides how to handle duplicates) so that the result is exactly reproducible.
    """
    return TransformersBackend(model_path).generate(
        prompts,
        k=k,
        settings=settings or GenerationSettings(),
        model_name=model_name,
        progress=progress,
    )
