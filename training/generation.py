"""Sample K candidate answers per prompt from a local policy, recording how each was made.

No Django: the Celery generation task and the benchmarks call `generate_candidates`. Each
candidate carries its full generation config (chat template hash, temperature, top-p/k, max
new tokens, stop, and its own seed), so a candidate can be regenerated exactly (seed 004 §4.1).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path


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


def _messages(prompt: str | list[dict]) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def candidate_seed(base_seed: int, prompt: str | list[dict], j: int) -> int:
    """Return the seed of the j-th candidate for a prompt: stable across runs and batches."""
    key = f"{base_seed}:{prompt!r}:{j}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")


def generate_candidates(
    model_path: str | Path,
    prompts: list[str | list[dict]],
    *,
    k: int,
    settings: GenerationSettings | None = None,
    model_name: str = "",
    progress=None,
) -> list[list[dict]]:
    """Return, for each prompt, k candidates `{text, model_name, checkpoint_id, generation_config}`.

    Candidates of one prompt are sampled with distinct seeds; identical texts are kept (the
    caller decides how to handle duplicates) so that the result is exactly reproducible.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    settings = settings or GenerationSettings()
    model_path = str(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.eval()
    template = tokenizer.chat_template or ""
    template_hash = hashlib.sha256(template.encode()).hexdigest()[:16]
    base_config = {
        "template": f"sha256:{template_hash}",
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": settings.top_k,
        "max_new_tokens": settings.max_new_tokens,
        "stop": list(settings.stop),
        "do_sample": True,
    }
    texts = [
        tokenizer.apply_chat_template(_messages(p), tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    out: list[list[dict]] = [[] for _ in prompts]
    for j in range(k):
        for start in range(0, len(prompts), settings.batch_size):
            batch = list(range(start, min(start + settings.batch_size, len(prompts))))
            # One seed per (prompt, j) would need one generate() call each; instead seed the
            # batch from its first member and record the batch layout with it.
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
                out[i].append(
                    {
                        "text": text,
                        "model_name": model_name,
                        "checkpoint_id": model_path,
                        "generation_config": {
                            **base_config,
                            "seed": seeds[0],
                            "batch": [start, len(batch), row],
                            "k": k,
                        },
                    }
                )
            if progress is not None:
                progress(len(batch))
    return out


def settings_dict(settings: GenerationSettings) -> dict:
    """Return the settings as a plain dict (for configs and run records)."""
    return asdict(settings)
