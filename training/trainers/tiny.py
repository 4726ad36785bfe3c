"""Build hub-free tiny models for tests and demos: a locally trained tokenizer, tiny GPT-2s."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from training.trainers.chat_templates import CHAT_TEMPLATE

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS)


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
