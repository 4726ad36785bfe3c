#!/usr/bin/env bash
# Check a GPU host in minutes: short SFT, reward, DPO and PPO runs on tiny models built here
# (and, given the folder of a small causal LM such as a converted SmolLM2-135M-Instruct, a
# 20-step DPO with LoRA on it), each on the GPU, printing seconds, peak GPU memory and
# tokens/s per recipe. Installs nothing; uses the project's .venv (or $PYTHON).
#
#   scripts/gpu_check.sh [--model /models/SmolLM2-135M-Instruct]
#
# Without a CUDA device it says so and exits 0, so CI may call it anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-.venv/bin/python}"
MODEL_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL_DIR="${2:?--model needs a folder}"; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -n "$MODEL_DIR" ] && [ ! -f "$MODEL_DIR/config.json" ]; then
  echo "gpu_check: $MODEL_DIR has no config.json (a transformers model folder is expected)" >&2
  exit 2
fi

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA device visible to torch; nothing to check on this machine."
  exit 0
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_DATASETS_DISABLE_PROGRESS_BARS=1
exec "$PYTHON" - "$MODEL_DIR" <<'PY'
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from training.trainers import dpo, ppo, reward, sft
from training.trainers.data import write_snapshot
from training.trainers.tiny import build_tiny_causal_lm, build_tiny_reward_model, train_tokenizer

model_dir = sys.argv[1]
work = Path(tempfile.mkdtemp(prefix="prefloop-gpu-check-"))
rng = random.Random(0)


def pairs(n):
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        rows.append(
            {
                "prompt": f"What is {a} + {b}?",
                "chosen": f" {a} + {b} = {a + b}.",
                "rejected": rng.choice([" I don't know.", " No idea.", " Ask later."]),
            }
        )
    return rows


rows = pairs(256)
tokenizer = train_tokenizer(
    [r["prompt"] + r["chosen"] + r["rejected"] for r in rows], work / "tok", vocab_size=400
)
policy = build_tiny_causal_lm(tokenizer, work / "policy", n_layer=2, n_embd=64, n_head=2)
scorer = build_tiny_reward_model(tokenizer, work / "rm", n_layer=2, n_embd=64, n_head=2)
prefs = write_snapshot(work / "prefs", {"train": rows})
prompts = write_snapshot(work / "prompts", {"train": [{"prompt": r["prompt"]} for r in rows]})


def tokens_of(tok, rows, keys):
    """Return the mean number of tokens of a row's texts (what one example costs)."""
    total = sum(len(tok(row[k])["input_ids"]) for row in rows for k in keys)
    return total / len(rows)


def check(name, train, config, data, per_row_tokens, rows_seen):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    started = time.perf_counter()
    train(config, data, work / f"out-{name}", None)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20
    tokens = per_row_tokens * rows_seen
    print(f"{name:<10} {seconds:8.1f} s  {peak:9.0f} MiB peak  {tokens / seconds:10.0f} tokens/s")


print(f"gpu_check on {torch.cuda.get_device_name(0)} (torch {torch.__version__})")
print("recipe      seconds   peak GPU memory   tokens/s (tokens of the examples trained on)")
steps, batch = 20, 8
pair_tokens = tokens_of(tokenizer, rows, ("prompt", "chosen", "rejected"))
common = {"max_steps": steps, "per_device_train_batch_size": batch, "logging_steps": 5}
common["save_steps"] = steps
check(
    "sft",
    sft.train,
    sft.Config(model_name_or_path=str(policy), **common),
    prefs,
    tokens_of(tokenizer, rows, ("prompt", "chosen")),
    steps * batch,
)
check(
    "reward",
    reward.train,
    reward.Config(model_name_or_path=str(scorer), **common),
    prefs,
    pair_tokens,
    steps * batch,
)
check(
    "dpo",
    dpo.train,
    dpo.Config(model_name_or_path=str(policy), **common),
    prefs,
    pair_tokens,
    steps * batch,
)
ppo_config = ppo.Config(
    model_name_or_path=str(policy),
    reward_function="training.demo:true_reward",
    rollout_batch_size=16,
    per_device_train_batch_size=8,
    max_new_tokens=16,
    max_steps=4,
    num_ppo_epochs=1,
    save_steps=4,
)
check(
    "ppo",
    ppo.train,
    ppo_config,
    prompts,
    tokens_of(tokenizer, rows, ("prompt",)) + 16,
    4 * 16,
)
if model_dir:
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(model_dir)
    check(
        "dpo-lora",
        dpo.train,
        dpo.Config(
            model_name_or_path=model_dir,
            use_lora=True,
            max_steps=20,
            per_device_train_batch_size=4,
            logging_steps=5,
            save_steps=20,
            max_length=256,
        ),
        prefs,
        tokens_of(own, rows, ("prompt", "chosen", "rejected")),
        20 * 4,
    )
print(f"outputs in {work}")
PY
