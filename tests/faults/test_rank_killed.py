"""One of the two processes of an `accelerate launch --num_processes 2 --cpu` run is SIGKILLed.

The supervisor launches the run with the shipped ``cpu_gloo`` config (torchrun starts two
training CLIs that talk over gloo). Once a checkpoint is complete, a thread SIGKILLs rank 1
only, as the kernel's out-of-memory killer would. The whole run restarts from that checkpoint
once, under the same supervisor, and ends with one model version.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path

import psutil
import pytest

from tests.training.test_runs_support import reward_config, wait_for
from training import services, supervisor
from training.models import ModelVersion, TrainingRun
from training.trainers import checkpoints

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.django_db]

STEPS = 60
SAVE_EVERY = 10


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ranks(output_dir: str) -> dict[int, psutil.Process]:
    """The training CLIs (not the launcher) under this process, by their RANK."""
    ranks = {}
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
            if "training.trainers.cli" not in cmdline or "accelerate" in cmdline:
                continue
            if output_dir not in cmdline:
                continue
            rank = proc.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None:
            ranks[int(rank)] = proc
    return ranks


class RankKiller(threading.Thread):
    """Wait for two ranks and a complete checkpoint, then SIGKILL rank 1; with ``again``,
    SIGKILL rank 1 of the restarted run too, as soon as it is up (before a newer checkpoint).
    """

    def __init__(self, output_dir: str, *, again: bool = False):
        super().__init__(daemon=True)
        self.output_dir = output_dir
        self.again = again
        self.killed: dict = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            ranks = wait_for(
                lambda: (r := _ranks(self.output_dir)) and len(r) == 2 and r,
                timeout=300,
                interval=0.2,
                what="two training processes",
            )
            found = wait_for(
                lambda: checkpoints.newest_complete_checkpoint(self.output_dir),
                timeout=300,
                interval=0.1,
                what="a complete checkpoint",
            )
            survivor = ranks[0]
            ranks[1].send_signal(signal.SIGKILL)
            self.killed = {
                "pid": ranks[1].pid,
                "survivor": survivor,
                "checkpoint_step": found[1],
            }
            if self.again:
                first = {p.pid for p in ranks.values()}
                restarted = wait_for(
                    lambda: (
                        (r := _ranks(self.output_dir))
                        and len(r) == 2
                        and not first & {p.pid for p in r.values()}
                        and r
                    ),
                    timeout=300,
                    interval=0.05,
                    what="the two processes of the restarted run",
                )
                restarted[1].send_signal(signal.SIGKILL)
                self.killed["again_at_step"] = checkpoints.newest_complete_checkpoint(
                    self.output_dir
                )[1]
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_killing_one_rank_restarts_the_whole_run_from_its_checkpoint_once(
    training_settings, tiny_reward_dir, reward_snapshot
):
    # given a reward run in two processes with a checkpoint every 10 of its 60 steps
    training_settings.TRAINING_ACCELERATE_ARGS = ["--main_process_port", str(_free_port())]
    run = services.training_run_create(
        recipe="reward",
        config={
            **reward_config(
                tiny_reward_dir,
                max_steps=STEPS,
                save_steps=SAVE_EVERY,
                logging_steps=5,
                per_device_train_batch_size=4,
            ),
            "accelerate_config": "cpu_gloo",
        },
        dataset_path=reward_snapshot,
        enqueue=False,
    )
    output_dir = str(services.training_output_root() / f"run-{run.pk}")
    killer = RankKiller(output_dir)
    killer.start()

    # when rank 1 is SIGKILLed after a checkpoint while the supervisor runs the run
    done = supervisor.training_run_execute(run_id=run.pk)
    killer.join(timeout=5)
    assert killer.error is None, killer.error
    assert killer.killed, "rank 1 was never killed"

    # then the rank left alive did not outlive the attempt
    assert not killer.killed["survivor"].is_running()
    # and the whole run restarted once, from the checkpoint complete at the kill
    log = Path(done.output_dir, "train.log").read_text()
    assert done.status == TrainingRun.Status.SUCCEEDED, done.error + log[-4000:]
    assert done.attempts == 2
    assert len(done.resumes) == 1
    resume = done.resumes[0]
    assert resume["attempt"] == 2
    assert resume["step"] >= killer.killed["checkpoint_step"] >= SAVE_EVERY
    assert resume["reason"] == "rank 1 killed by signal SIGKILL"
    assert log.count("=== attempt ") == 2
    assert "=== rank 1 killed by signal SIGKILL; restarting the whole run" in log
    assert f"=== resuming from {resume['checkpoint']}" in log
    text = Path(done.output_dir, "metrics.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    resumed = [r for r in records if r.get("event") == "resume"]
    assert len(resumed) == 1 and resumed[0]["checkpoint"] == resume["checkpoint"]
    assert done.current_metrics["global_step"] == STEPS
    assert ModelVersion.objects.filter(training_run=done).count() == 1


def test_a_rank_killed_again_before_a_newer_checkpoint_fails_the_run(
    training_settings, tiny_reward_dir, reward_snapshot
):
    # given a two-process reward run whose rank 1 is killed after a checkpoint
    training_settings.TRAINING_ACCELERATE_ARGS = ["--main_process_port", str(_free_port())]
    run = services.training_run_create(
        recipe="reward",
        config={
            **reward_config(
                tiny_reward_dir,
                max_steps=STEPS,
                save_steps=SAVE_EVERY,
                logging_steps=5,
                per_device_train_batch_size=4,
            ),
            "accelerate_config": "cpu_gloo",
        },
        dataset_path=reward_snapshot,
        enqueue=False,
    )
    killer = RankKiller(str(services.training_output_root() / f"run-{run.pk}"), again=True)
    killer.start()

    # when the restarted run loses rank 1 again before it saves a newer checkpoint
    done = supervisor.training_run_execute(run_id=run.pk)
    killer.join(timeout=5)
    assert killer.error is None, killer.error
    assert killer.killed["again_at_step"] == done.resumes[0]["step"]

    # then the run fails, naming the signal, after exactly one restart
    log = Path(done.output_dir, "train.log").read_text()
    assert done.status == TrainingRun.Status.FAILED, log[-3000:]
    assert "SIGKILL" in done.error
    assert done.attempts == 2 and len(done.resumes) == 1
    assert log.count("restarting the whole run") == 1
    assert not ModelVersion.objects.filter(training_run=done).exists()
