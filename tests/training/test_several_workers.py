"""Two `gpu` workers and one `default` worker on one Redis share ten queued training runs.

Each worker is a real `celery worker` process (concurrency 1, prefetch 1) on queues of this
test's own, against the pytest-django test database (transactional, so workers see the rows).
"""

from __future__ import annotations

import os
import uuid

import pytest
from kombu import Connection

from tests.celery_worker import Worker
from tests.training import test_runs_support as support
from tests.training.test_celery_worker import purge
from tests.training.test_runs_support import reward_config, wait_for
from training import services
from training.models import ModelVersion, TrainingRun
from training.tasks import requeue_stale_runs, run_training

pytestmark = [pytest.mark.celery, pytest.mark.multiprocess, pytest.mark.slow]

training_settings = support.training_settings
reward_snapshot = support.reward_snapshot

REDIS_DB = int(os.environ.get("PREFLOOP_CELERY_TEST_REDIS_DB", "11"))
BROKER_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
RUNS = 10
TASK_DONE = "training.tasks.run_training["


@pytest.mark.django_db(transaction=True)
def test_ten_runs_are_each_executed_once_spread_over_two_gpu_workers(
    training_settings, tiny_reward_dir, reward_snapshot, tmp_path
):
    tag = uuid.uuid4().hex[:8]
    gpu_queue, default_queue = f"gpu-test-{tag}", f"default-test-{tag}"
    purge(gpu_queue)
    purge(default_queue)
    workers: dict[str, Worker] = {}
    try:
        # given ten short reward runs queued on the gpu queue before any worker is up
        runs = [
            services.training_run_create(
                recipe="reward",
                config=reward_config(tiny_reward_dir, max_steps=2, save_steps=2, logging_steps=1),
                dataset_path=reward_snapshot,
                enqueue=False,
            )
            for _ in range(RUNS)
        ]
        with Connection(BROKER_URL) as broker:
            for run in runs:
                run_training.apply_async(args=(run.pk,), queue=gpu_queue, connection=broker)
            # and the default worker's own light work
            requeue_stale_runs.apply_async(queue=default_queue, connection=broker)

        # when two gpu workers and one default worker take the queues
        for name, queue in (("gpu1", gpu_queue), ("gpu2", gpu_queue), ("cpu", default_queue)):
            workers[name] = Worker(
                queue=queue,
                broker_url=BROKER_URL,
                log_path=tmp_path / f"{name}.log",
                name=f"{name}-{tag}",
            )

        done = wait_for(
            lambda: (
                TrainingRun.objects.filter(
                    pk__in=[r.pk for r in runs],
                    status__in=[TrainingRun.Status.SUCCEEDED, TrainingRun.Status.FAILED],
                ).count()
                == RUNS
            ),
            timeout=600,
            interval=1,
            what="all ten runs to end",
        )
        assert done
        wait_for(
            lambda: sum(workers[n].text().count(TASK_DONE) for n in ("gpu1", "gpu2")) >= 2 * RUNS,
            timeout=60,
            what="the workers to log every task's end",
        )

        # then every run succeeded once, with one model version each
        for run in TrainingRun.objects.filter(pk__in=[r.pk for r in runs]):
            assert run.status == TrainingRun.Status.SUCCEEDED, run.error
            assert run.attempts == 1 and run.resumes == []
            assert ModelVersion.objects.filter(training_run=run).count() == 1
        assert ModelVersion.objects.count() == RUNS

        # and both gpu workers took runs (a task's received and succeeded lines name it)
        per_worker = {n: workers[n].text().count(TASK_DONE) // 2 for n in ("gpu1", "gpu2", "cpu")}
        assert per_worker["gpu1"] >= 1 and per_worker["gpu2"] >= 1, per_worker
        assert per_worker["gpu1"] + per_worker["gpu2"] == RUNS, per_worker
        # while the default worker ran its own task and no training
        assert per_worker["cpu"] == 0
        assert "training.tasks.requeue_stale_runs[" in workers["cpu"].text()
    finally:
        for worker in workers.values():
            worker.stop()
        purge(gpu_queue)
        purge(default_queue)
