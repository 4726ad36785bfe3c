"""How close two training processes come to one: the first logged losses of SFT, reward, DPO.

Each recipe trains a tiny GPT-2 for a few steps with the training CLI, once as one process
with a global batch of 8 and once under ``accelerate launch`` with the shipped ``cpu_gloo``
config (two CPU processes over gloo, 4 rows each), with the same seed. The Trainer averages
the loss over processes before logging it and accelerate gives process i the i-th batch of
the same seeded order, so the logged losses differ only by float rounding. Printed per
recipe: both loss series and their largest relative difference (the tolerance the tests in
tests/training/test_multiprocess.py assert is 1e-4).

    .venv/bin/python benchmarks/multiprocess_match.py [--steps 3] [--workdir DIR]

SFT runs with dropout off: TRL's SFT keeps the model's dropout and each process draws its
own masks (see docs/DEPLOY.md). About two minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}.items():
    os.environ.setdefault(_key, _value)

CPU_GLOO = BASE / "training" / "accelerate" / "cpu_gloo.yaml"
GLOBAL_BATCH = 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build(workdir: Path) -> dict[str, Path]:
    """Tokenizer, a policy without dropout, a reward model and a preference snapshot."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.training.conftest import arithmetic_rows, tokenizer_corpus
    from training.trainers.data import write_snapshot
    from training.trainers.tiny import (
        build_tiny_causal_lm,
        build_tiny_reward_model,
        train_tokenizer,
    )

    train_tokenizer(tokenizer_corpus(), workdir / "tokenizer", vocab_size=400)
    tokenizer = AutoTokenizer.from_pretrained(str(workdir / "tokenizer"))
    policy = build_tiny_causal_lm(tokenizer, workdir / "policy", n_layer=2, n_embd=64, n_head=2)
    quiet = workdir / "policy-no-dropout"
    AutoModelForCausalLM.from_pretrained(
        policy, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    ).save_pretrained(quiet)
    tokenizer.save_pretrained(quiet)
    reward = build_tiny_reward_model(tokenizer, workdir / "reward", n_layer=2, n_embd=64, n_head=2)
    snapshot = write_snapshot(
        workdir / "snapshot",
        {"train": arithmetic_rows(64), "validation": arithmetic_rows(16, seed=1)},
        {"n": 80},
    )
    return {"policy": policy, "quiet_policy": quiet, "reward": reward, "snapshot": snapshot}


def train(recipe: str, config: dict, data: Path, out: Path, processes: int) -> list[float]:
    """Run the training CLI in ``processes`` processes; return its logged losses."""
    batch = GLOBAL_BATCH // processes
    config = {
        **config,
        "per_device_train_batch_size": batch,
        "per_device_eval_batch_size": batch,
    }
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(BASE), "PYTHONUNBUFFERED": "1"}
    prefix = [sys.executable]
    if processes > 1:
        env["ACCELERATE_USE_CPU"] = "true"  # as the supervisor sets it for use_cpu configs
        prefix += ["-m", "accelerate.commands.launch", "--config_file", str(CPU_GLOO)]
        prefix += ["--num_processes", str(processes), "--main_process_port", str(_free_port())]
    command = [*prefix, "-m", "training.trainers.cli", "--recipe", recipe]
    command += ["--config", str(out / "config.json"), "--data", str(data), "--out", str(out)]
    with (out / "train.log").open("w") as log:
        done = subprocess.run(command, cwd=BASE, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"{recipe} in {processes} process(es) failed; see {out / 'train.log'}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r and "train_loss" not in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="multiprocess-match-"))
    parts = build(workdir)
    common = {"max_steps": args.steps, "logging_steps": 1, "save_steps": args.steps, "seed": 7}
    recipes = {
        "sft": {"model_name_or_path": str(parts["quiet_policy"]), "learning_rate": 1e-3},
        "reward": {
            "model_name_or_path": str(parts["reward"]),
            "learning_rate": 1e-3,
            "max_length": 64,
        },
        "dpo": {"model_name_or_path": str(parts["policy"]), "learning_rate": 1e-3},
    }
    print(f"{'recipe':8} {'max rel diff':>12}  losses (1 process | 2 processes)  seconds")
    for recipe, config in recipes.items():
        started = time.monotonic()
        one = train(recipe, {**common, **config}, parts["snapshot"], workdir / f"{recipe}-1", 1)
        two = train(recipe, {**common, **config}, parts["snapshot"], workdir / f"{recipe}-2", 2)
        one, two = one[: args.steps], two[: args.steps]
        if len(one) != args.steps or len(two) != args.steps:
            sys.exit(f"{recipe}: expected {args.steps} logged losses, got {one} and {two}")
        worst = max(abs(a - b) / abs(a) for a, b in zip(one, two, strict=True))
        losses = " ".join(f"{a:.6f}" for a in one) + " | " + " ".join(f"{b:.6f}" for b in two)
        print(f"{recipe:8} {worst:12.2e}  {losses}  {time.monotonic() - started:.0f}")


if __name__ == "__main__":
    main()
