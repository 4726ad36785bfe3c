"""RLHF PPO recipe: a trainable policy, a frozen reference, a frozen reward, a separate critic.

TRL 1.16 has no PPO trainer, so this module owns one. One *update* is:

1. take the next ``rollout_batch_size`` prompts (left-padded) and sample one response each
   from the policy with the recorded sampling settings, keeping the exact sampled token ids;
2. score the rollout without gradients: old log-probs (policy), reference log-probs, values,
   and the sequence score (reward model or Python function; the reward model reads text
   decoded and re-encoded with its own tokenizer, the policy's actions are never re-encoded);
3. shape per-token rewards: -beta * KL on every action, the (transformed) score once on the
   last valid action; GAE(gamma, lambda) over the valid actions; whiten the advantages;
4. run ``num_ppo_epochs`` epochs of shuffled mini-batches (gradient accumulation over
   micro-batches) with the clipped policy loss, the clipped value loss and an optional
   entropy bonus; clip gradient norms;
5. update the KL controller, log, and at update boundaries write checkpoints.

Guards against reward hacking (``ppo_guards``): PPO-ptx, an ensemble reward with an
uncertainty penalty, a KL budget and early stopping on a held-out judge; with a KL budget or a
judge, ``final/`` holds the weights they chose (the last under the budget, the best judged),
not necessarily the last. A reward model version's frozen calibration (``reward_calibration``)
replaces normalising on the fly; the run records which normalisation it used.

Log-probs are always those of the distribution actually sampled from (temperature, top-k,
top-p applied to the logits), so the ratio is exactly 1 before the first optimizer step.

Checkpoints: ``checkpoint-N/`` is an inference checkpoint (``from_pretrained`` loads the
policy, tokenizer and generation config) with ``ppo_state/`` beside it holding what a resume
needs (critic, optimizers, schedulers, KL controller, score statistics, RNG states, update
step and data position). ``final/`` holds the last policy.

No Django here. Formulas carry their source. The recipe by job: ``ppo_config`` (settings),
``ppo_models`` (critic, rewards, loading), ``ppo_rollout`` (sampling and log-probs),
``ppo_core`` (the maths), ``ppo_trainer`` (updates), ``ppo_checkpoint`` (save and resume);
this module runs a whole job (``train``) and keeps the names other code imports.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from training.trainers.ppo_config import RECIPE, SAMPLES_FILE, STATE_DIR, VALUE_HEAD_FILE, Config
from training.trainers.ppo_models import (
    FunctionReward,
    ModelReward,
    RewardFn,
    ValueModel,
    load_models,
    reward_normalisation_record,
)
from training.trainers.ppo_rollout import (
    Generation,
    Rollout,
    generate_responses,
    sequence_logprob_sums,
)
from training.trainers.ppo_trainer import PPOTrainer
from training.trainers.provenance import write_run_json

__all__ = [
    "RECIPE",
    "SAMPLES_FILE",
    "STATE_DIR",
    "VALUE_HEAD_FILE",
    "Config",
    "FunctionReward",
    "Generation",
    "ModelReward",
    "PPOTrainer",
    "RewardFn",
    "Rollout",
    "ValueModel",
    "generate_responses",
    "load_models",
    "sequence_logprob_sums",
    "train",
]


def train(
    config: Config,
    dataset_dir: Path,
    output_dir: Path,
    logger: Any = None,
) -> dict[str, Any]:
    """Run PPO on the prompts of a snapshot; write checkpoints and final/; return final metrics.

    ``logger`` is a ``RunLogger`` (or anything with ``log(metrics, step=...)``); None makes a
    RunLogger writing metrics.jsonl and progress.json into ``output_dir``.
    """
    from training.trainers.checkpoints import newest_complete_checkpoint
    from training.trainers.common import start_run
    from training.trainers.data import DatasetError, load_prompts, load_sft

    dataset_dir, output_dir, logger = start_run(RECIPE, config, dataset_dir, output_dir, logger)
    splits = load_prompts(dataset_dir)
    train_prompts = list(splits.train["prompt"])
    eval_prompts = list(splits.validation["prompt"]) if splits.validation is not None else []
    ptx_rows = None
    if config.ptx_coef:
        try:  # the preference export's chosen answers (deduplicated) are the demonstrations
            ptx_rows = list(load_sft(dataset_dir).train)
        except DatasetError as exc:
            from training.trainers.common import ConfigError

            raise ConfigError(f"ptx_coef needs demonstrations: {exc}") from exc
    models = load_models(config)
    normalisation = reward_normalisation_record(config)
    trainer = PPOTrainer(
        config,
        policy=models["policy"],
        tokenizer=models["tokenizer"],
        reward=models["reward"],
        value_model=models["value_model"],
        reference=models["reference"],
        train_prompts=train_prompts,
        eval_prompts=eval_prompts,
        output_dir=output_dir,
        logger=logger,
        judge=models["judge"],
        ptx_rows=ptx_rows,
    )
    if hasattr(logger, "event"):
        logger.event("value_init", value_init=models["value_init"])
        logger.event("reward_normalisation", **normalisation)
    checkpoint = config.resume_from_checkpoint or (
        (newest_complete_checkpoint(output_dir) or (None,))[0] if config.resume else None
    )
    if checkpoint:
        trainer.load_checkpoint(checkpoint)
        if hasattr(logger, "event"):
            logger.event("resume", checkpoint=str(checkpoint), update=trainer.update_step)

    started = time.perf_counter()
    start_step = trainer.update_step
    last = trainer.train()
    guards = trainer.guards_finish(stopped=bool(trainer.guard.stop_reason))
    seconds = time.perf_counter() - started
    metrics: dict[str, Any] = {
        "global_step": trainer.update_step,
        "updates": trainer.update_step,
        "episodes": trainer.episodes,
        "kl_coef": trainer.kl_controller.value,
        "train_runtime": seconds,
        "seconds_per_update": seconds / max(1, trainer.update_step - start_step),
        **{f"last_{k}": v for k, v in last.items()},
    }
    if trainer.guards_on:
        metrics["final_update"] = guards["final_update"]
        if guards["best_judge_score"] is not None:
            metrics["judge_best_score"] = guards["best_judge_score"]
    if config.evaluate_at_end and trainer.eval_prompts:
        result = trainer.evaluate(trainer.eval_prompts)
        metrics["eval_score_mean"] = result["score_mean"]
        metrics["eval_length_mean"] = result["length_mean"]
        metrics["eval_eos_fraction"] = result["eos_fraction"]

    final_dir = output_dir / "final"
    if trainer.accelerator.is_main_process:
        trainer.save_policy(final_dir)
    if hasattr(logger, "event"):
        logger.event("final", **metrics)
    if hasattr(logger, "finish"):
        logger.finish(**{k: v for k, v in metrics.items() if isinstance(v, int | float)})
    if trainer.accelerator.is_main_process:
        write_run_json(
            output_dir,
            config,
            dataset_dir,
            config.seeds(),
            recipe=RECIPE,
            status="finished",
            sampling=config.sampling_settings(),
            value_init=models["value_init"],
            reward_normalisation=normalisation,
            guards=guards,
            final_dir=str(final_dir),
            final_metrics=metrics,
        )
    return metrics
