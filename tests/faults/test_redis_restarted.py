"""The broker restarts while one training run is running and another is queued.

A real `celery worker` trains on a private redis-server (never the shared one). Redis is
stopped and started again while run 1 is in the middle of training and run 2 waits in the
queue behind it (concurrency 1, prefetch 1).

- Durable broker (append-only file, as docker-compose.yml runs Redis): the queued message
  survives the restart; the worker reconnects; run 1 (whose supervisor never needs the
  broker) and then run 2 both succeed, once each (one attempt, one model version).
- Volatile broker (no persistence: the restart loses every key): run 1 still succeeds once;
  run 2's message is gone; the beat's check (`training_runs_requeue_lost`, every minute)
  sees it was sent before the broker started and sends it again, and it succeeds once. A
  message for a run that has finished is a no-op.
"""

from __future__ import annotations

import uuid

import pytest
from kombu import Connection

from tests.faults.support import CeleryWorker, RedisServer, wait_for
from tests.training.test_runs_support import reward_config
from training import services
from training.models import ModelVersion, TrainingRun
from training.tasks import run_training

pytestmark = [pytest.mark.slow, pytest.mark.celery, pytest.mark.django_db(transaction=True)]

VISIBILITY_TIMEOUT = 10
FINISHED = (TrainingRun.Status.SUCCEEDED, TrainingRun.Status.FAILED, TrainingRun.Status.CANCELLED)


def _sender(broker_url: str, queue: str):
    """Return send(run_id): the run's task onto our queue on the private broker."""

    def send(run_id: int) -> None:
        options = {"visibility_timeout": VISIBILITY_TIMEOUT}
        with Connection(broker_url, transport_options=options) as broker:
            run_training.apply_async(args=(run_id,), queue=queue, connection=broker)

    return send


def _send(broker_url: str, queue: str, run: TrainingRun) -> None:
    # As the run service sends it (noting the time on the row), to our private broker.
    services.training_run_enqueue(run=run, send=_sender(broker_url, queue))


def _create(model_dir, snapshot, steps: int) -> TrainingRun:
    return services.training_run_create(
        recipe="reward",
        config=reward_config(model_dir, max_steps=steps, save_steps=max(10, steps // 5)),
        dataset_path=snapshot,
        enqueue=False,
    )


def _finished(run: TrainingRun, worker: CeleryWorker, timeout: float = 300) -> TrainingRun:
    done = wait_for(
        lambda: TrainingRun.objects.filter(pk=run.pk, status__in=FINISHED).first(),
        timeout=timeout,
        interval=0.5,
        what=f"run {run.pk} to finish",
    )
    assert done.status == TrainingRun.Status.SUCCEEDED, done.error + worker.text()[-3000:]
    return done


def _start_run_and_queue_another(tiny_reward_dir, reward_snapshot, tmp_path, redis, queue):
    """Return (worker, run 1 mid-training, run 2 still queued)."""
    first = _create(tiny_reward_dir, reward_snapshot, steps=600)
    second = _create(tiny_reward_dir, reward_snapshot, steps=20)
    _send(redis.url, queue, first)
    _send(redis.url, queue, second)
    worker = CeleryWorker(
        queue=queue,
        broker_url=redis.url,
        log_path=tmp_path / "worker.log",
        name=f"w-{queue}",
        visibility_timeout=VISIBILITY_TIMEOUT,
        extra_env={"OMP_NUM_THREADS": "1"},
    )
    wait_for(
        lambda: TrainingRun.objects.filter(
            pk=first.pk, status=TrainingRun.Status.RUNNING, progress__gt=0
        ).exists(),
        timeout=180,
        what="run 1 to be training",
    )
    second.refresh_from_db()
    assert second.status == TrainingRun.Status.QUEUED
    return worker, first, second


def _assert_running_through_the_outage(run: TrainingRun) -> None:
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.RUNNING and run.progress < 1.0


def _assert_reconnected(worker: CeleryWorker) -> None:
    log = worker.text()
    lost = log.index("Connection to broker lost")
    assert "Connected to redis://" in log[lost:], log[-3000:]


def _assert_once(run: TrainingRun) -> None:
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.SUCCEEDED
    assert run.attempts == 1 and run.resumes == []
    assert ModelVersion.objects.filter(training_run=run).count() == 1


@pytest.fixture
def broker_and_two_runs(training_settings, tiny_reward_dir, reward_snapshot, tmp_path):
    """Return start(durable=...) -> (redis, queue, worker, run 1 mid-training, run 2 queued)
    on a private redis-server; the worker and Redis are stopped after the test."""
    services_started: list = []

    def start(*, durable: bool):
        redis = RedisServer(tmp_path / "redis", durable=durable)
        services_started.append(redis)
        queue = f"gpu-faults-{uuid.uuid4().hex[:8]}"
        worker, first, second = _start_run_and_queue_another(
            tiny_reward_dir, reward_snapshot, tmp_path, redis, queue
        )
        services_started.append(worker)
        return redis, queue, worker, first, second

    yield start
    for service in reversed(services_started):
        service.stop()


def test_durable_broker_restart_loses_no_run(broker_and_two_runs):
    redis, queue, worker, first, second = broker_and_two_runs(durable=True)
    # when Redis stops (writing its append-only file) and comes back a few seconds later
    redis.restart(down_for=3)
    assert redis.client().llen(queue) + redis.client().hlen("unacked") >= 1
    _assert_running_through_the_outage(first)

    # then the worker reconnects, run 1 finishes, run 2 is still delivered and finishes
    _finished(first, worker)
    _finished(second, worker)
    _assert_once(first)
    _assert_once(second)
    assert ModelVersion.objects.count() == 2
    assert worker.process.poll() is None, "the worker survived the broker restart"
    _assert_reconnected(worker)


def test_volatile_broker_restart_keeps_the_running_run_and_the_lost_one_can_be_resent(
    broker_and_two_runs,
):
    redis, queue, worker, first, second = broker_and_two_runs(durable=False)
    # when Redis restarts and loses every message
    redis.restart(down_for=3)
    assert redis.client().llen(queue) == 0 and redis.client().hlen("unacked") == 0
    _assert_running_through_the_outage(first)

    # then the running run still finishes once: its supervisor never needed the broker
    _finished(first, worker)
    _assert_once(first)
    second.refresh_from_db()
    assert second.status == TrainingRun.Status.QUEUED  # its message was lost with Redis

    # and the beat's check finds it was sent before the broker started, sends it again
    # (the finished run is left alone), and it runs once
    started = services.broker_started_at(url=redis.url)
    assert started > second.enqueued_at
    lost = services.training_runs_requeue_lost(
        broker_started_at=started, send=_sender(redis.url, queue)
    )
    assert lost == [second.pk]
    _finished(second, worker)
    _assert_once(second)
    _assert_reconnected(worker)
    # a stale duplicate delivery of a finished run is a no-op
    _send(redis.url, queue, first)
    wait_for(
        lambda: worker.text().count("succeeded in") >= 3,
        timeout=120,
        what="the duplicate message to be handled",
    )
    _assert_once(first)
    assert ModelVersion.objects.count() == 2
