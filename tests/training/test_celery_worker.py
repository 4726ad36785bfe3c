"""A real Celery worker on Redis: a run survives SIGKILL of its worker and finishes once.

The worker runs `celery -A config worker` against the pytest-django test database (the test
uses a transactional database so the worker sees committed rows), a private Redis database
and a queue of its own, with a 10 s broker visibility timeout so the unacknowledged message
of the killed worker is delivered again to the next one.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from kombu import Connection

from tests.celery_worker import Worker
from tests.training import test_runs_support as support
from tests.training.test_runs_support import reward_config, wait_for
from training import services
from training.models import ModelVersion, TrainingRun
from training.tasks import run_training
from training.trainers import checkpoints

pytestmark = [pytest.mark.celery, pytest.mark.slow]

training_settings = support.training_settings
reward_snapshot = support.reward_snapshot

REDIS_DB = int(os.environ.get("PREFLOOP_CELERY_TEST_REDIS_DB", "11"))
BROKER_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
VISIBILITY_TIMEOUT = 10


def purge(queue: str) -> None:
    """Empty our queue, its bindings, and unacknowledged messages that were routed to it."""
    import redis

    client = redis.Redis.from_url(BROKER_URL)
    client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    for tag, raw in client.hgetall("unacked").items():
        try:
            _message, _exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if routing_key == queue:
            client.hdel("unacked", tag)
            client.zrem("unacked_index", tag)


def _worker(queue: str, log_path: Path, name: str) -> Worker:
    return Worker(
        queue=queue,
        broker_url=BROKER_URL,
        log_path=log_path,
        name=name,
        visibility_timeout=VISIBILITY_TIMEOUT,
    )


def _metrics(run: TrainingRun) -> list[dict]:
    text = Path(run.output_dir, "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.django_db(transaction=True)
def test_run_resumes_after_its_worker_is_killed_and_finishes_once(
    training_settings, tiny_reward_dir, reward_snapshot, tmp_path
):
    queue = f"gpu-test-{uuid.uuid4().hex[:10]}"
    purge(queue)
    workers: list[Worker] = []
    try:
        # given a queued reward run (~300 steps, a checkpoint every 20) on a private queue
        run = services.training_run_create(
            recipe="reward",
            config=reward_config(tiny_reward_dir, max_steps=300, save_steps=20, save_total_limit=2),
            dataset_path=reward_snapshot,
            enqueue=False,
        )
        with Connection(BROKER_URL) as broker:
            run_training.apply_async(args=(run.pk,), queue=queue, connection=broker)

        # when a worker starts it and is SIGKILLed, with its training process, mid-run
        workers.append(_worker(queue, tmp_path / "worker1.log", f"w1-{queue}"))
        first = wait_for(
            lambda: TrainingRun.objects.filter(
                pk=run.pk, status=TrainingRun.Status.RUNNING, child_pid__isnull=False
            ).first(),
            timeout=120,
            what="the first worker to start the run",
        )
        checkpoint = wait_for(
            lambda: checkpoints.newest_complete_checkpoint(run.output_dir),
            timeout=180,
            interval=0.1,
            what="a first checkpoint",
        )
        wait_for(
            lambda: TrainingRun.objects.get(pk=run.pk).progress > 0,
            timeout=30,
            what="progress in the row",
        )
        killed = workers[0].kill()
        assert any(p.pid == first.child_pid for p in killed), "the training CLI was killed too"
        assert all(not p.is_running() for p in killed)
        killed_at = TrainingRun.objects.get(pk=run.pk)
        assert killed_at.status == TrainingRun.Status.RUNNING  # nobody recorded an end
        assert killed_at.progress < 1.0 and killed_at.attempts == 1
        seen_step = checkpoint[1]
        assert seen_step < 300

        # and a new worker starts: the message comes back after the visibility timeout
        workers.append(_worker(queue, tmp_path / "worker2.log", f"w2-{queue}"))
        finished = wait_for(
            lambda: TrainingRun.objects.filter(
                pk=run.pk,
                status__in=[TrainingRun.Status.SUCCEEDED, TrainingRun.Status.FAILED],
            ).first(),
            timeout=300,
            interval=0.5,
            what="the second worker to finish the run",
        )

        # then it resumed from a checkpoint, not from step 0, and finished once
        assert finished.status == TrainingRun.Status.SUCCEEDED, (
            finished.error + "\n" + workers[1].text()[-3000:]
        )
        assert finished.attempts == 2
        assert finished.worker_pid != first.worker_pid
        assert len(finished.resumes) == 1
        resume = finished.resumes[0]
        assert resume["attempt"] == 2 and resume["step"] >= seen_step > 0
        records = _metrics(finished)
        resume_at = [i for i, r in enumerate(records) if r.get("event") == "resume"]
        assert len(resume_at) == 1
        assert records[resume_at[0]]["checkpoint"] == resume["checkpoint"]
        steps_after = [r["step"] for r in records[resume_at[0] + 1 :] if "loss" in r]
        assert steps_after and min(steps_after) > resume["step"]
        log = Path(finished.output_dir, "train.log").read_text()
        assert f"resuming from {resume['checkpoint']}" in log
        assert finished.current_metrics["global_step"] == 300
        assert ModelVersion.objects.filter(training_run=finished).count() == 1
        assert ModelVersion.objects.count() == 1

        # and a duplicate delivery of the finished run is a no-op
        with Connection(BROKER_URL) as broker:
            run_training.apply_async(args=(run.pk,), queue=queue, connection=broker)
        wait_for(
            lambda: workers[1].text().count("succeeded in") >= 2,
            timeout=60,
            what="the duplicate task to be handled",
        )
        again = TrainingRun.objects.get(pk=run.pk)
        assert again.status == TrainingRun.Status.SUCCEEDED and again.attempts == 2
        assert ModelVersion.objects.count() == 1
    finally:
        for worker in workers:
            worker.stop()
        purge(queue)
