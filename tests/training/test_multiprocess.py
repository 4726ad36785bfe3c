"""Two training processes (accelerate, gloo on CPU) through the supervisor and the CLI.

Each recipe runs once as one process with a global batch of 8 and once as two processes of
4 each (the shipped ``cpu_gloo`` accelerate config) with the same seed. The Trainer averages
the loss over processes before logging it, and accelerate hands process i the i-th batch of
the same seeded order, so the first logged losses must agree to float rounding.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

import pytest
from kombu import Connection

from tests.celery_worker import Worker
from tests.training import test_runs_support as support
from tests.training.conftest import arithmetic_rows
from tests.training.test_celery_worker import purge
from tests.training.test_runs_support import reward_config, wait_for
from training import config_policy, services, supervisor
from training.config_policy import InvalidTrainingConfig
from training.models import ModelVersion, TrainingRun
from training.tasks import run_training

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

training_settings = support.training_settings
reward_snapshot = support.reward_snapshot
STEPS = 3
# Measured on 2 shared CPU cores: at most 9e-8 relative (float32 sums in another order).
LOSS_RTOL = 1e-4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _losses(run: TrainingRun) -> list[float]:
    text = Path(run.output_dir, "metrics.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r["loss"] for r in records if "loss" in r and "train_loss" not in r][:STEPS]


def _run(settings, recipe: str, config: dict, snapshot: Path, processes: int) -> TrainingRun:
    batch = 8 // processes
    config = {
        **config,
        "max_steps": STEPS,
        "logging_steps": 1,
        "save_steps": STEPS,
        "seed": 7,
        "per_device_train_batch_size": batch,
        "per_device_eval_batch_size": batch,
    }
    if processes == 2:
        config["accelerate_config"] = "cpu_gloo"
        # each run its own rendezvous port: other tests on this host may train at once
        settings.TRAINING_ACCELERATE_ARGS = ["--main_process_port", str(_free_port())]
    run = services.training_run_create(
        recipe=recipe, config=config, dataset_path=snapshot, enqueue=False
    )
    run = supervisor.training_run_execute(run_id=run.pk)
    log = Path(run.output_dir, "train.log").read_text()
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error + log[-3000:]
    assert ModelVersion.objects.filter(training_run=run).count() == 1
    if processes == 2:
        assert "accelerate.commands.launch --config_file" in log
        assert "cpu_gloo.yaml" in log
    return run


def _assert_same_losses(one: TrainingRun, two: TrainingRun) -> None:
    single, double = _losses(one), _losses(two)
    assert len(single) == len(double) == STEPS
    worst = max(abs(a - b) / abs(a) for a, b in zip(single, double, strict=True))
    # shown with -s (docs/DEPLOY.md quotes it; benchmarks/multiprocess_match.py prints it too)
    print(f"\n{one.recipe}: max relative loss difference, 2 vs 1 process: {worst:.2e}")
    for a, b in zip(single, double, strict=True):
        assert abs(a - b) <= LOSS_RTOL * abs(a), (single, double)


@pytest.mark.django_db
def test_reward_two_processes_log_the_losses_of_one(
    training_settings, tiny_reward_dir, reward_snapshot
):
    config = reward_config(tiny_reward_dir)
    one = _run(training_settings, "reward", config, reward_snapshot, processes=1)
    two = _run(training_settings, "reward", config, reward_snapshot, processes=2)
    _assert_same_losses(one, two)
    assert two.current_metrics["global_step"] == STEPS


def _without_dropout(model_dir: Path, out: Path) -> Path:
    """Save a copy of a tiny GPT-2 whose dropout is off."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


@pytest.mark.django_db
def test_sft_two_processes_log_the_losses_of_one(
    training_settings, tiny_policy_dir, make_snapshot, tmp_path
):
    # TRL's SFT keeps the model's dropout (reward and DPO turn it off), and each process
    # draws its own dropout masks: with GPT-2's 0.1 the second loss is 2e-3 apart. So the
    # comparison is made on the same model with dropout off.
    policy = _without_dropout(tiny_policy_dir, tmp_path / "policy-no-dropout")
    snapshot = make_snapshot(
        train=arithmetic_rows(48, seed=1), validation=arithmetic_rows(16, seed=2)
    )
    config = {"model_name_or_path": str(policy), "learning_rate": 1e-3}
    one = _run(training_settings, "sft", config, snapshot, processes=1)
    two = _run(training_settings, "sft", config, snapshot, processes=2)
    _assert_same_losses(one, two)


@pytest.mark.django_db
def test_dpo_two_processes_log_the_losses_of_one(training_settings, tiny_policy_dir, make_snapshot):
    snapshot = make_snapshot(
        train=arithmetic_rows(48, seed=1), validation=arithmetic_rows(16, seed=2)
    )
    config = {"model_name_or_path": str(tiny_policy_dir), "learning_rate": 1e-3}
    one = _run(training_settings, "dpo", config, snapshot, processes=1)
    two = _run(training_settings, "dpo", config, snapshot, processes=2)
    _assert_same_losses(one, two)


@pytest.mark.django_db
def test_an_accelerate_config_is_named_never_a_path(training_settings, tiny_reward_dir):
    assert config_policy.accelerate_config_names() == [
        "cpu_gloo",
        "ddp",
        "deepspeed_zero2",
        "deepspeed_zero3",
        "fsdp",
    ]
    for bad in ("/etc/passwd", "../accelerate/ddp", "ddp.yaml", 3):
        with pytest.raises(InvalidTrainingConfig) as refused:
            config_policy.training_config_resolve(
                recipe="reward",
                config={**reward_config(tiny_reward_dir), "accelerate_config": bad},
            )
        assert refused.value.field == "config.accelerate_config"


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_gpu_worker_runs_two_processes_and_registers_one_model(
    training_settings, tiny_reward_dir, reward_snapshot, tmp_path
):
    broker_url = f"redis://127.0.0.1:6379/{os.environ.get('PREFLOOP_CELERY_TEST_REDIS_DB', '11')}"
    queue = f"gpu-test-{uuid.uuid4().hex[:10]}"
    purge(queue)
    worker = None
    try:
        # given a reward run naming the two-process config, queued for a gpu worker
        run = services.training_run_create(
            recipe="reward",
            config={
                **reward_config(tiny_reward_dir, max_steps=4, save_steps=2),
                "accelerate_config": "cpu_gloo",
            },
            dataset_path=reward_snapshot,
            enqueue=False,
        )
        with Connection(broker_url) as broker:
            run_training.apply_async(args=(run.pk,), queue=queue, connection=broker)

        # when a real worker takes it (its supervisor launches accelerate, which starts two CLIs)
        worker = Worker(queue=queue, broker_url=broker_url, log_path=tmp_path / "w.log", name=queue)
        ranks = wait_for(
            lambda: (
                len(
                    [
                        p
                        for p in worker.tree()
                        if "training.trainers.cli" in " ".join(p.cmdline())
                        and "accelerate" not in " ".join(p.cmdline())
                    ]
                )
                == 2
            ),
            timeout=600,
            interval=0.2,
            what="two training processes under the worker",
        )
        assert ranks
        done = wait_for(
            lambda: TrainingRun.objects.filter(
                pk=run.pk,
                status__in=[TrainingRun.Status.SUCCEEDED, TrainingRun.Status.FAILED],
            ).first(),
            timeout=900,
            interval=0.5,
            what="the run to end",
        )

        # then it succeeded once and registered exactly one model version
        log = Path(done.output_dir, "train.log").read_text()
        assert done.status == TrainingRun.Status.SUCCEEDED, done.error + log[-3000:]
        assert done.attempts == 1
        assert "cpu_gloo.yaml" in log
        assert done.current_metrics["global_step"] == 4
        assert ModelVersion.objects.filter(training_run=done).count() == 1
        assert ModelVersion.objects.count() == 1
    finally:
        if worker is not None:
            worker.stop()
        purge(queue)


PPO_STATS_SCRIPT = """
import json, sys
from types import SimpleNamespace

import torch
from accelerate import Accelerator

from training.trainers import ppo_core as core
from training.trainers.ppo import PPOTrainer

accelerator = Accelerator()
trainer = SimpleNamespace(accelerator=accelerator, device=accelerator.device)
reduce = lambda t: PPOTrainer._reduce(trainer, t)
gather = lambda t: PPOTrainer._gather(trainer, t)

# the same rollouts on every process; each process holds its half of the rows
generator = torch.Generator().manual_seed(0)
advantages = torch.randn(8, 6, generator=generator) * 3 + 1
rewards = torch.randn(8, 6, generator=generator)
kl = torch.rand(8, 6, generator=generator) * 0.1
scores = torch.randn(8, generator=generator)
mask = torch.rand(8, 6, generator=generator) > 0.3
mask[1, :] = False  # a filtered sequence
rows = slice(4 * accelerator.process_index, 4 * (accelerator.process_index + 1))

one = {
    "advantages": core.masked_whiten(advantages, mask)[rows],
    "rewards": core.masked_whiten(rewards, mask, shift_mean=False)[rows],
    "kl_seq_mean": (kl * mask).sum(dim=1).mean(),
    "score_mean": scores.mean(),
}
two = {
    "advantages": core.masked_whiten(advantages[rows], mask[rows], reduce=reduce),
    "rewards": core.masked_whiten(rewards[rows], mask[rows], shift_mean=False, reduce=reduce),
    "kl_seq_mean": gather((kl[rows] * mask[rows]).sum(dim=1)).mean(),
    "score_mean": gather(scores[rows]).mean(),
}
out = {k: float((one[k] - two[k]).abs().max()) for k in one}
out["world"] = accelerator.num_processes
out["naive_advantages"] = float(
    (one["advantages"] - core.masked_whiten(advantages[rows], mask[rows])).abs().max()
)
with open(f"{sys.argv[1]}/rank{accelerator.process_index}.json", "w") as f:
    json.dump(out, f)
# leave the gloo group before exit: a live group's threads can abort the interpreter's exit
# ("terminate called without an active exception", SIGABRT)
accelerator.end_training()
"""


@pytest.mark.django_db
def test_ppo_statistics_over_two_processes_equal_those_of_one(settings, tmp_path):
    import subprocess
    import sys

    from training import processes

    script = tmp_path / "ppo_stats.py"
    script.write_text(PPO_STATS_SCRIPT)
    config = config_policy.accelerate_config_path(name="cpu_gloo")
    # given PPO's own reduce and gather under the shipped two-process config
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(config),
            "--main_process_port",
            str(_free_port()),
            str(script),
            str(tmp_path),
        ],
        cwd=str(settings.BASE_DIR),
        env=processes.child_env(accelerate_config=config),
        capture_output=True,
        text=True,
        # two processes importing torch and transformers on two loaded cores
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-12000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["world"] == 2
        # then whitening, the KL per sequence and the score mean are the one-process figures
        for key in ("advantages", "rewards", "kl_seq_mean", "score_mean"):
            assert result[key] < 1e-6, (rank, key, result)
        # while whitening each half alone would not be (the check can tell them apart)
        assert result["naive_advantages"] > 1e-2, result


ONLINE_CONFIGS = {
    "grpo": {
        "reward_function": "digits",
        "num_generations": 4,
        "max_completion_length": 8,
        "per_device_train_batch_size": 4,
    },
    "rloo": {
        "reward_function": "digits",
        "num_generations": 4,
        "max_completion_length": 8,
        "per_device_train_batch_size": 4,
    },
    "ppo": {
        "reward_function": "demo",
        "rollout_batch_size": 4,
        "per_device_train_batch_size": 4,
        "max_new_tokens": 8,
        "num_ppo_epochs": 1,
    },
}


@pytest.mark.parametrize("recipe", sorted(ONLINE_CONFIGS))
@pytest.mark.django_db
def test_sampling_recipes_finish_in_two_processes_with_one_model(
    training_settings, tiny_policy_dir, make_snapshot, recipe
):
    from training import demo

    training_settings.PREFLOOP_REWARD_FUNCTIONS = {
        "demo": "training.demo:true_reward",
        "digits": "tests.training.test_trainers_online:digit_share",
    }
    training_settings.TRAINING_ACCELERATE_ARGS = ["--main_process_port", str(_free_port())]
    prompts = [{"prompt": p.prompt} for p in demo.problems_in("train")[:16]]
    snapshot = make_snapshot(train=prompts)
    config = {
        "model_name_or_path": str(tiny_policy_dir),
        "max_steps": 2,
        "save_steps": 2,
        "logging_steps": 1,
        "seed": 3,
        "accelerate_config": "cpu_gloo",
        **ONLINE_CONFIGS[recipe],
    }
    run = services.training_run_create(
        recipe=recipe, config=config, dataset_path=snapshot, enqueue=False
    )
    run = supervisor.training_run_execute(run_id=run.pk)
    log = Path(run.output_dir, "train.log").read_text()
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error + log[-3000:]
    assert "cpu_gloo.yaml" in log
    assert run.current_metrics["global_step"] == 2
    assert ModelVersion.objects.filter(training_run=run).count() == 1


@pytest.mark.parametrize("recipe", ["grpo", "rloo"])
@pytest.mark.django_db
def test_sampling_statistics_are_those_of_both_processes_samples(
    training_settings, tiny_policy_dir, make_snapshot, recipe, tmp_path, monkeypatch
):
    from training import demo

    # given a reward function that records, per process, the rewards it gave
    record = tmp_path / "rewards"
    record.mkdir()
    monkeypatch.setenv("PREFLOOP_TEST_REWARD_LOG", str(record))
    training_settings.PREFLOOP_TRAINING_ENV_PASSTHROUGH = ["PREFLOOP_TEST_REWARD_LOG"]
    training_settings.PREFLOOP_REWARD_FUNCTIONS = {
        "recorded": "tests.training.multiprocess_rewards:digits_recorded"
    }
    training_settings.TRAINING_ACCELERATE_ARGS = ["--main_process_port", str(_free_port())]
    snapshot = make_snapshot(train=[{"prompt": p.prompt} for p in demo.problems_in("train")[:16]])
    config = {
        **ONLINE_CONFIGS[recipe],
        "reward_function": "recorded",
        "model_name_or_path": str(tiny_policy_dir),
        "max_steps": 1,
        "save_steps": 1,
        "logging_steps": 1,
        "seed": 3,
        "accelerate_config": "cpu_gloo",
    }

    # when one step runs in two processes
    run = services.training_run_create(
        recipe=recipe, config=config, dataset_path=snapshot, enqueue=False
    )
    run = supervisor.training_run_execute(run_id=run.pk)
    log = Path(run.output_dir, "train.log").read_text()
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error + log[-3000:]

    # then each process scored its own 4 samples, and the logged statistics are the union's
    import statistics

    per_rank = [
        [r for line in (record / f"rank{n}.jsonl").open() for r in json.loads(line)] for n in (0, 1)
    ]
    assert [len(rewards) for rewards in per_rank] == [4, 4]
    union = per_rank[0] + per_rank[1]
    text = Path(run.output_dir, "metrics.jsonl").read_text()
    logged = next(r for r in map(json.loads, text.splitlines()) if "reward" in r)
    assert logged["reward"] == pytest.approx(statistics.fmean(union), rel=1e-5, abs=1e-7)
    assert logged["reward_std"] == pytest.approx(statistics.stdev(union), rel=1e-5, abs=1e-7)
    # and one process's samples alone would give other figures (the check tells them apart)
    alone = (statistics.fmean(per_rank[0]), statistics.stdev(per_rank[0]))
    assert alone != pytest.approx((logged["reward"], logged["reward_std"]), rel=1e-3)
