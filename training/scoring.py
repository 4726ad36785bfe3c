"""Score answers with a trained reward model from a local folder (no Django)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=4)
def _load(path: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path)
    model.eval()
    return tokenizer, model


def reward_scores(model_path: str | Path, prompt: str, answers: list[str]) -> list[float]:
    """Return the reward model's score of each answer to a prompt (chat template if any)."""
    import torch

    tokenizer, model = _load(str(model_path))
    if getattr(tokenizer, "chat_template", None):
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": a}],
                tokenize=False,
            )
            for a in answers
        ]
    else:
        texts = [f"{prompt}\n{a}" for a in answers]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer(
        texts,
        return_tensors="pt",
        padding=True,
        truncation=True,
        max_length=512,
        add_special_tokens=False,
    )
    with torch.no_grad():
        logits = model(**enc).logits
    return [float(x) for x in logits[:, 0]]
