"""PPO on the demo domain: SFT -> reward model from simulated preferences -> PPO, scored exactly.

1. SFT a tiny GPT-2 (~0.8M parameters) on demonstrations that are 40% wrong and 25% rude
   (``training.demo.imperfect_sft_corpus``) with Prefloop's SFT recipe;
2. sample two answers per training prompt from the SFT policy, let a simulated annotator
   label each pair (Bradley-Terry on ``demo.true_reward``), and train a reward model with the
   reward recipe (initialised from the SFT policy, as in InstructGPT);
3. run the PPO recipe against that reward model;
4. answer held-out questions (operand pairs never seen in training) with the SFT and PPO
   policies and print the true reward of each with prompt-clustered bootstrap 95% CIs, the
   paired difference, a win rate judged by the true reward, the reward model's own scores
   (to spot over-optimisation), KL(PPO || SFT) against the target, and seconds per update.

    .venv/bin/python benchmarks/ppo_bench.py                 # ~10-20 min on 2 busy CPU cores
    .venv/bin/python benchmarks/ppo_bench.py --quick         # ~3 min, smaller everything
    .venv/bin/python benchmarks/ppo_bench.py --oracle        # also PPO on the true reward

Results are printed and written to ``<out>/results.json``.

Reference run (``--oracle``, defaults, seed 0; 2 CPU cores shared, load 8-13; 0.84M-parameter
GPT-2; SFT 431 s, reward model 109 s, PPO 60 updates x 64 prompts at ~4.6 s/update):
reward model held-out pairwise accuracy against the true preference 0.859 (447 pairs).
Held-out questions, 16 samples each, true reward [95% CI over prompts]:
SFT -0.786 [-0.875, -0.688]; PPO on the reward model -0.510 [-0.591, -0.426] (gain +0.276
[+0.198, +0.358], win rate 0.81, W/T/L 360/60/60, KL to SFT 2.26 nats mean, 3.31 P95,
target 3); PPO on the true reward -0.494 [-0.697, -0.246]. On training questions the
reward-model policy gains +0.264 (politeness; correctness stays at 0.30) while the
true-reward policy gains +1.212 (correctness 0.31 -> 0.75): the reward model learned style,
not arithmetic.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MAX_NEW_TOKENS = 16


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a shared CPU)"
    )
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--sft-rows", type=int, default=8000)
    parser.add_argument("--sft-steps", type=int, default=1200)
    parser.add_argument("--sft-lr", type=float, default=2e-3)
    parser.add_argument("--rm-pairs", type=int, default=3000, help="labelled training pairs")
    parser.add_argument("--rm-epochs", type=float, default=2.0)
    parser.add_argument("--annotator-noise", type=float, default=0.3, help="BT temperature")
    parser.add_argument("--ppo-updates", type=int, default=60)
    parser.add_argument("--ppo-batch", type=int, default=64, help="prompts per update")
    parser.add_argument("--ppo-lr", type=float, default=1e-4)
    parser.add_argument("--kl-coef", type=float, default=0.05)
    parser.add_argument("--target-kl", type=float, default=3.0)
    parser.add_argument("--eval-samples", type=int, default=16, help="samples per question")
    parser.add_argument("--oracle", action="store_true", help="also run PPO on the true reward")
    parser.add_argument("--quick", action="store_true", help="small settings for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_layer, args.n_embd = 2, 64
        args.sft_rows, args.sft_steps, args.sft_lr = 4000, 500, 3e-3
        args.rm_pairs, args.rm_epochs = 1000, 2.0
        args.ppo_updates, args.eval_samples = 20, 8
        args.ppo_lr = 3e-4
    return args


def bootstrap_ci(
    per_prompt: dict[str, list[float]], *, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Return (mean, low, high): a 95% percentile CI resampling prompts, not samples."""
    import numpy as np

    keys = sorted(per_prompt)
    sums = np.array([sum(per_prompt[k]) for k in keys])
    counts = np.array([len(per_prompt[k]) for k in keys])
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    replicates = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    low, high = np.quantile(replicates, [0.025, 0.975])
    return float(sums.sum() / counts.sum()), float(low), float(high)


def by_prompt(prompts: list[str], values: list[float]) -> dict[str, list[float]]:
    grouped: dict[str, list[float]] = {}
    for prompt, value in zip(prompts, values, strict=True):
        grouped.setdefault(prompt, []).append(value)
    return grouped


def train_sft(args, work: Path, tokenizer_dir: Path) -> Path:
    from transformers import AutoTokenizer

    from training import demo
    from training.trainers import sft
    from training.trainers.data import write_snapshot
    from training.trainers.run_log import RunLogger
    from training.trainers.tiny import build_tiny_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    init = build_tiny_causal_lm(
        tokenizer,
        work / "init",
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        n_head=4,
        n_positions=64,
        seed=args.seed,
    )
    data = write_snapshot(
        work / "sft_data", {"train": demo.imperfect_sft_corpus(args.sft_rows, args.seed)}
    )
    config = sft.Config(
        model_name_or_path=str(init),
        max_steps=args.sft_steps,
        per_device_train_batch_size=32,
        learning_rate=args.sft_lr,
        lr_scheduler_type="constant",
        max_length=64,
        # Length-grouped batches hold one answer style each (length follows style) and
        # the model then never learns to read the operands: loss 1.1 vs 0.6 here.
        group_by_length=False,
        save_steps=10**6,
        logging_steps=100,
        evaluate_at_end=False,
        seed=args.seed,
    )
    sft.train(config, data, work / "sft", RunLogger(work / "sft", echo=False))
    return work / "sft" / "final"


def preference_rows(model, tokenizer, prompts: list[str], *, noise: float, seed: int):
    """Return preference rows on two SFT samples per prompt, labelled by a simulated annotator."""
    from training import demo
    from training.trainers import ppo

    first = ppo.generate_responses(
        model, tokenizer, [chat(p) for p in prompts], max_new_tokens=MAX_NEW_TOKENS, seed=seed
    )
    second = ppo.generate_responses(
        model, tokenizer, [chat(p) for p in prompts], max_new_tokens=MAX_NEW_TOKENS, seed=seed + 1
    )
    rng = random.Random(seed)
    rows = []
    for prompt, a, b in zip(prompts, first.texts, second.texts, strict=True):
        if a == b:
            continue
        label = demo.simulated_preference(prompt, a, b, rng, noise)
        chosen, rejected = (a, b) if label == "a" else (b, a)
        rows.append(
            {
                "prompt": chat(prompt),
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
    return rows


def train_reward_model(args, work: Path, sft_dir: Path) -> tuple[Path, dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training import demo
    from training.trainers import reward
    from training.trainers.data import write_snapshot
    from training.trainers.run_log import RunLogger

    tokenizer = AutoTokenizer.from_pretrained(str(sft_dir))
    model = AutoModelForCausalLM.from_pretrained(str(sft_dir)).eval()
    train_prompts = demo.generate_prompts(args.rm_pairs, args.seed, "train")
    held_prompts = demo.generate_prompts(600, args.seed, "held_out")
    train_rows = preference_rows(
        model, tokenizer, train_prompts, noise=args.annotator_noise, seed=args.seed + 10
    )
    # Held-out pairs are labelled by a noise-free annotator: accuracy against the truth.
    held_rows = preference_rows(model, tokenizer, held_prompts, noise=0.0, seed=args.seed + 20)
    held_rows = [
        r
        for r in held_rows
        if demo.true_reward(r["prompt"], r["chosen"][0]["content"])
        != demo.true_reward(r["prompt"], r["rejected"][0]["content"])
    ]
    data = write_snapshot(work / "rm_data", {"train": train_rows, "validation": held_rows})
    config = reward.Config(
        model_name_or_path=str(sft_dir),
        num_train_epochs=args.rm_epochs,
        per_device_train_batch_size=32,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        max_length=64,
        save_steps=10**6,
        logging_steps=50,
        evaluate_at_end=False,
        seed=args.seed,
    )
    reward.train(config, data, work / "rm", RunLogger(work / "rm", echo=False))
    rm_dir = work / "rm" / "final"
    scorer = reward.RewardScorer(rm_dir, batch_size=64)
    accuracy = reward.pairwise_accuracy(scorer, held_rows)
    return rm_dir, {
        "train_pairs": len(train_rows),
        "held_out_pairs": len(held_rows),
        "held_out_accuracy_vs_truth": accuracy["accuracy"],
    }


def run_ppo(args, work: Path, name: str, sft_dir: Path, **reward_settings) -> tuple[Path, dict]:
    from training import demo
    from training.trainers import ppo
    from training.trainers.data import write_snapshot
    from training.trainers.run_log import RunLogger

    prompts = write_snapshot(
        work / "ppo_prompts",
        {
            "train": [{"prompt": chat(p.prompt)} for p in demo.problems_in("train")],
            "validation": [{"prompt": chat(p.prompt)} for p in demo.problems_in("held_out")],
        },
    )
    config = ppo.Config(
        model_name_or_path=str(sft_dir),
        max_steps=args.ppo_updates,
        rollout_batch_size=args.ppo_batch,
        per_device_train_batch_size=16,
        learning_rate=args.ppo_lr,
        value_learning_rate=1e-3,
        kl_coef=args.kl_coef,
        target_kl=args.target_kl,
        kl_horizon=1000,
        normalize_score=True,
        max_new_tokens=MAX_NEW_TOKENS,
        max_length=64,
        save_steps=10**6,
        evaluate_at_end=False,
        seed=args.seed,
        **reward_settings,
    )
    out = work / name
    metrics = ppo.train(config, prompts, out, RunLogger(out, echo=False))
    return out / "final", metrics


def evaluate(args, sft_dir: Path, policies: dict[str, Path], rm_dir: Path | None) -> dict:
    """Score SFT and each PPO policy on held-out and training questions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evaluation.stats.winrate import win_rate
    from training import demo
    from training.trainers import ppo

    tokenizer = AutoTokenizer.from_pretrained(str(sft_dir))
    models = {"sft": AutoModelForCausalLM.from_pretrained(str(sft_dir)).eval()}
    for name, path in policies.items():
        models[name] = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    scorer = None
    if rm_dir is not None:
        from training.trainers.reward import RewardScorer

        scorer = RewardScorer(rm_dir, batch_size=64)

    results: dict = {}
    for split, n in (("held_out", args.eval_samples), ("train", max(2, args.eval_samples // 4))):
        questions = [p.prompt for p in demo.problems_in(split)]
        prompts = questions * n
        generations, rewards = {}, {}
        for name, model in models.items():
            generation = ppo.generate_responses(
                model, tokenizer, [chat(p) for p in prompts], max_new_tokens=MAX_NEW_TOKENS, seed=7
            )
            generations[name] = generation
            rewards[name] = [
                demo.true_reward(p, t) for p, t in zip(prompts, generation.texts, strict=True)
            ]
            mean, low, high = bootstrap_ci(by_prompt(prompts, rewards[name]))
            row = {
                "true_reward": mean,
                "ci95": [low, high],
                "correct": statistics.fmean(
                    demo.stated_answer(t) == demo.parse_prompt(p).answer
                    for p, t in zip(prompts, generation.texts, strict=True)
                ),
                "rude": statistics.fmean("Ugh" in t for t in generation.texts),
                "polite": statistics.fmean(t.startswith("Sure!") for t in generation.texts),
                "length_tokens": float(generation.masks.lengths.float().mean()),
                "eos_fraction": float(generation.masks.ended.float().mean()),
                "examples": generation.texts[:4],
            }
            if scorer is not None:
                completions = [[{"role": "assistant", "content": t}] for t in generation.texts]
                row["rm_score"] = statistics.fmean(
                    scorer.score([chat(p) for p in prompts], completions)
                )
            if name != "sft":
                kl = ppo.sequence_logprob_sums(model, generation) - ppo.sequence_logprob_sums(
                    models["sft"], generation
                )
                row["kl_to_sft_mean"] = float(kl.mean())
                row["kl_to_sft_p95"] = float(kl.quantile(0.95))
                diff = [a - b for a, b in zip(rewards[name], rewards["sft"], strict=True)]
                row["gain_over_sft"] = bootstrap_ci(by_prompt(prompts, diff))
                outcomes = [
                    "win" if a > b else "loss" if a < b else "tie"
                    for a, b in zip(rewards[name], rewards["sft"], strict=True)
                ]
                wr = win_rate(outcomes, prompts, n_boot=2000, seed=0)
                row["win_rate_vs_sft"] = {
                    "wins": wr.wins,
                    "ties": wr.ties,
                    "losses": wr.losses,
                    "win_rate": wr.win_rate,
                    "ci95": [wr.ci_low, wr.ci_high],
                }
            results.setdefault(split, {})[name] = row
    return results


def main(argv: list[str] | None = None) -> int:
    import torch

    from training import demo
    from training.trainers.common import set_quiet_offline_env
    from training.trainers.tiny import train_tokenizer

    args = parse_args(argv)
    set_quiet_offline_env()
    torch.set_num_threads(args.threads)
    work = args.out or Path(tempfile.mkdtemp(prefix="ppo_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    print(f"work folder: {work}", flush=True)

    started = time.perf_counter()
    train_tokenizer(
        demo.tokenizer_training_texts(), work / "tokenizer", vocab_size=1000, min_frequency=1
    )
    sft_dir = train_sft(args, work, work / "tokenizer")
    timings["sft_s"] = time.perf_counter() - started
    print(f"SFT done in {timings['sft_s']:.0f} s", flush=True)

    started = time.perf_counter()
    rm_dir, rm_info = train_reward_model(args, work, sft_dir)
    timings["reward_model_s"] = time.perf_counter() - started
    print(f"reward model done in {timings['reward_model_s']:.0f} s: {rm_info}", flush=True)

    policies, ppo_metrics = {}, {}
    started = time.perf_counter()
    policies["ppo_rm"], ppo_metrics["ppo_rm"] = run_ppo(
        args, work, "ppo_rm", sft_dir, reward_model_path=str(rm_dir)
    )
    timings["ppo_rm_s"] = time.perf_counter() - started
    print(f"PPO (reward model) done in {timings['ppo_rm_s']:.0f} s", flush=True)
    if args.oracle:
        started = time.perf_counter()
        policies["ppo_true"], ppo_metrics["ppo_true"] = run_ppo(
            args, work, "ppo_true", sft_dir, reward_function="training.demo:true_reward"
        )
        timings["ppo_true_s"] = time.perf_counter() - started

    results = evaluate(args, sft_dir, policies, rm_dir)
    summary = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "reward_model": rm_info,
        "ppo": {
            name: {
                k: m[k]
                for k in (
                    "updates",
                    "seconds_per_update",
                    "kl_coef",
                    "last_kl/seq_mean",
                    "last_kl/seq_p95",
                    "last_score/raw_mean",
                    "last_value/explained_variance",
                )
                if k in m
            }
            for name, m in ppo_metrics.items()
        },
        "eval": results,
        "timings_s": timings,
    }
    (work / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary, args)
    return 0


def print_summary(summary: dict, args) -> None:
    print()
    print(f"reward model: {summary['reward_model']}")
    for name, info in summary["ppo"].items():
        print(
            f"{name}: {info['updates']} updates, {info['seconds_per_update']:.2f} s/update, "
            f"last rollout KL/seq {info['last_kl/seq_mean']:.2f} (target {args.target_kl}), "
            f"final beta {info['kl_coef']:.4f}"
        )
    for split, rows in summary["eval"].items():
        print(f"\n{split} questions: true reward (95% CI, prompts resampled)")
        header = f"{'policy':10} {'reward':>7} {'CI95':>17} {'correct':>8} {'rude':>6}"
        print(header + f" {'polite':>7} {'len':>5} {'RM':>7} {'KL':>6} {'KLp95':>6}")
        for name, row in rows.items():
            low, high = row["ci95"]
            line = (
                f"{name:10} {row['true_reward']:7.3f} [{low:7.3f}, {high:7.3f}] "
                f"{row['correct']:8.3f} {row['rude']:6.3f} {row['polite']:7.3f} "
                f"{row['length_tokens']:5.1f} {row.get('rm_score', float('nan')):7.3f} "
                f"{row.get('kl_to_sft_mean', 0.0):6.2f} {row.get('kl_to_sft_p95', 0.0):6.2f}"
            )
            print(line)
        for name, row in rows.items():
            if name == "sft":
                continue
            mean, low, high = row["gain_over_sft"]
            wr = row["win_rate_vs_sft"]
            print(
                f"  {name} - sft: {mean:+.3f} [{low:+.3f}, {high:+.3f}]; win rate "
                f"{wr['win_rate']:.3f} [{wr['ci95'][0]:.3f}, {wr['ci95'][1]:.3f}] "
                f"(W/T/L {wr['wins']}/{wr['ties']}/{wr['losses']})"
            )
            print(f"  {name} samples: {row['examples']}")
    print(f"\ntimings (s): {summary['timings_s']}")


if __name__ == "__main__":
    sys.exit(main())
