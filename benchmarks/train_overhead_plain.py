"""Plain-TRL half of the training-overhead benchmark: a tiny reward model and DPO, no Prefloop.

``build_setup(workdir)`` makes everything both halves share: a byte-level BPE tokenizer,
a tiny GPT-2 policy and reward model (built from configs, saved to folders), a dataset
snapshot (train.jsonl / validation.jsonl of synthetic preference pairs) and the settings,
both as Prefloop recipe configs (``setup.prefloop_configs``, for ``python -m
training.trainers.cli`` / the Celery path) and as the equivalent TRL arguments. The
functions below then train with TRL alone and time each run end to end (load, train,
evaluate, save), the same work the recipes do.

    .venv/bin/python benchmarks/train_overhead_plain.py [--workdir DIR] [--pairs 256]

This file imports nothing from Prefloop on purpose.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>' }}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclass
class Setup:
    """Folders and settings shared by the plain-TRL and the Prefloop halves."""

    workdir: Path
    tokenizer_dir: Path
    policy_dir: Path
    reward_dir: Path
    snapshot_dir: Path
    seed: int = 42
    max_steps: int = 32
    batch_size: int = 8
    max_length: int = 128
    reward_lr: float = 1e-3
    dpo_lr: float = 1e-4
    beta: float = 0.1
    logging_steps: int = 4
    save_steps: int = 16
    prefloop_configs: dict[str, dict] = field(default_factory=dict)


def preference_rows(n: int, seed: int) -> list[dict]:
    """Return synthetic pairs: a correct sum is chosen over a refusal."""
    rng = random.Random(seed)
    refusals = ["I don't know.", "No idea.", "Ask someone else.", "Maybe later."]
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append(
            {
                "prompt": f"Q: What is {a} + {b}?\nA:",
                "chosen": f" {a} + {b} = {a + b}.",
                "rejected": f" {rng.choice(refusals)}",
            }
        )
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def build_setup(workdir: Path, *, n_train: int = 256, n_validation: int = 32, seed: int = 42):
    """Build tokenizer, tiny policy (4x128) and reward model (2x128), snapshot and configs."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        GPT2Config,
        GPT2ForSequenceClassification,
        GPT2LMHeadModel,
        PreTrainedTokenizerFast,
    )

    workdir = Path(workdir)
    snapshot = workdir / "snapshot"
    snapshot.mkdir(parents=True, exist_ok=True)
    train_rows = preference_rows(n_train, seed)
    _write_jsonl(snapshot / "train.jsonl", train_rows)
    _write_jsonl(snapshot / "validation.jsonl", preference_rows(n_validation, seed + 1))

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        [r["prompt"] + r["chosen"] for r in train_rows]
        + [r["prompt"] + r["rejected"] for r in train_rows],
        trainer=trainers.BpeTrainer(
            vocab_size=1024,
            min_frequency=2,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(workdir / "tokenizer"))

    def gpt2_config(n_layer: int, **extra) -> GPT2Config:
        return GPT2Config(
            vocab_size=len(tokenizer),
            n_positions=512,
            n_embd=128,
            n_layer=n_layer,
            n_head=4,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **extra,
        )

    torch.manual_seed(seed)
    policy = GPT2LMHeadModel(gpt2_config(4))
    policy.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    policy.save_pretrained(str(workdir / "policy"))
    tokenizer.save_pretrained(str(workdir / "policy"))
    torch.manual_seed(seed)
    reward_model = GPT2ForSequenceClassification(gpt2_config(2, num_labels=1))
    reward_model.save_pretrained(str(workdir / "reward_model"))
    tokenizer.save_pretrained(str(workdir / "reward_model"))

    setup = Setup(
        workdir=workdir,
        tokenizer_dir=workdir / "tokenizer",
        policy_dir=workdir / "policy",
        reward_dir=workdir / "reward_model",
        snapshot_dir=snapshot,
        seed=seed,
    )
    shared = {
        "seed": setup.seed,
        "max_steps": setup.max_steps,
        "per_device_train_batch_size": setup.batch_size,
        "per_device_eval_batch_size": setup.batch_size,
        "max_length": setup.max_length,
        "logging_steps": setup.logging_steps,
        "save_steps": setup.save_steps,
    }
    setup.prefloop_configs = {
        "reward": {
            **shared,
            "model_name_or_path": str(setup.reward_dir),
            "learning_rate": setup.reward_lr,
            "group_by_length": False,  # plain TRL samples at random
        },
        "dpo": {
            **shared,
            "model_name_or_path": str(setup.policy_dir),
            "learning_rate": setup.dpo_lr,
            "beta": setup.beta,
            "loss_type": "sigmoid",
            "label_smoothing": 0.0,
        },
    }
    return setup


def _common_args(setup: Setup, output_dir: Path, learning_rate: float) -> dict:
    return {
        "output_dir": str(output_dir),
        "seed": setup.seed,
        "data_seed": setup.seed,
        "max_steps": setup.max_steps,
        "learning_rate": learning_rate,
        "per_device_train_batch_size": setup.batch_size,
        "per_device_eval_batch_size": setup.batch_size,
        "logging_steps": setup.logging_steps,
        "save_strategy": "steps",
        "save_steps": setup.save_steps,
        "save_total_limit": 2,
        "bf16": False,
        "activation_checkpointing": False,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "report_to": "none",
        "disable_tqdm": True,
    }


def _splits(setup: Setup):
    from datasets import load_dataset

    files = {
        "train": str(setup.snapshot_dir / "train.jsonl"),
        "validation": str(setup.snapshot_dir / "validation.jsonl"),
    }
    return load_dataset("json", data_files=files)


def run_plain_reward(setup: Setup, output_dir: Path) -> dict:
    """Train, evaluate and save the reward model with TRL alone; return timing and metrics."""
    from transformers import AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    started = time.perf_counter()
    data = _splits(setup)
    tokenizer = AutoTokenizer.from_pretrained(str(setup.reward_dir))
    args = RewardConfig(
        **_common_args(setup, output_dir, setup.reward_lr), max_length=setup.max_length
    )
    trainer = RewardTrainer(
        model=str(setup.reward_dir),
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        processing_class=tokenizer,
    )
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(str(output_dir / "final"))
    return {"seconds": time.perf_counter() - started, "eval_accuracy": metrics["eval_accuracy"]}


def run_plain_dpo(setup: Setup, output_dir: Path) -> dict:
    """Train, evaluate and save DPO with TRL alone; return timing and metrics."""
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    started = time.perf_counter()
    data = _splits(setup)
    tokenizer = AutoTokenizer.from_pretrained(str(setup.policy_dir))
    args = DPOConfig(
        **_common_args(setup, output_dir, setup.dpo_lr),
        max_length=setup.max_length,
        beta=setup.beta,
        loss_type=["sigmoid"],
    )
    trainer = DPOTrainer(
        model=str(setup.policy_dir),
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        processing_class=tokenizer,
    )
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(str(output_dir / "final"))
    return {
        "seconds": time.perf_counter() - started,
        "eval_rewards/accuracies": metrics["eval_rewards/accuracies"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--pairs", type=int, default=256)
    args = parser.parse_args(argv)

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="overhead_plain_"))
    started = time.perf_counter()
    setup = build_setup(workdir, n_train=args.pairs)
    setup_seconds = time.perf_counter() - started
    reward = run_plain_reward(setup, workdir / "plain_reward")
    dpo = run_plain_dpo(setup, workdir / "plain_dpo")
    result = {
        "torch_threads": torch.get_num_threads(),
        "setup_seconds": round(setup_seconds, 2),
        "reward_seconds": round(reward["seconds"], 2),
        "reward_eval_accuracy": reward["eval_accuracy"],
        "dpo_seconds": round(dpo["seconds"], 2),
        "dpo_eval_reward_accuracy": dpo["eval_rewards/accuracies"],
        "max_steps": setup.max_steps,
        "workdir": str(workdir),
    }
    print(f"plain TRL reward model: {reward['seconds']:.1f} s wall ({setup.max_steps} steps)")
    print(f"plain TRL DPO:          {dpo['seconds']:.1f} s wall ({setup.max_steps} steps)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
