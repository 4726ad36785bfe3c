"""Two `gpu` workers and one `default` worker on one Redis; the gpu worker at work is SIGKILLed.

Every worker is a real `celery worker` (concurrency 1, prefetch 1) on this test's own queues
of the Redis database of the Celery tests, with a 10 s broker visibility timeout, so the
unacknowledged message of the killed worker comes back to the other gpu worker, which is
already up and idle. A training run then resumes from its checkpoint (its supervisor's
process is dead) and a generation job starts again from nothing (it opened no round).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from django.db.models import Count
from kombu import Connection

from annotation.models import Candidate, Item, ItemCandidate, Round
from tests.celery_worker import Worker
from tests.factories import make_project, make_tiny_demo_policy
from tests.training.test_celery_worker import purge
from tests.training.test_rounds import pool
from tests.training.test_runs_support import reward_config, wait_for
from training import rounds, services
from training.models import GenerationJob, ModelVersion, TrainingRun
from training.tasks import requeue_stale_runs, run_generation_job, run_training
from training.trainers import checkpoints

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.celery,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

REDIS_DB = int(os.environ.get("PREFLOOP_CELERY_TEST_REDIS_DB", "11"))
BROKER_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"
VISIBILITY_TIMEOUT = 10
STEPS = 60


class Workers:
    """gpu1 and gpu2 on a private gpu queue, cpu on a private default queue."""

    def __init__(self, tmp_path: Path):
        tag = uuid.uuid4().hex[:8]
        self.gpu_queue, self.default_queue = f"gpu-test-{tag}", f"default-test-{tag}"
        purge(self.gpu_queue)
        purge(self.default_queue)
        self.all: dict[str, Worker] = {}
        for name, queue in (
            ("gpu1", self.gpu_queue),
            ("gpu2", self.gpu_queue),
            ("cpu", self.default_queue),
        ):
            self.all[name] = Worker(
                queue=queue,
                broker_url=BROKER_URL,
                log_path=tmp_path / f"{name}.log",
                name=f"{name}-{tag}",
                visibility_timeout=VISIBILITY_TIMEOUT,
                extra_env={"OMP_NUM_THREADS": "1"},
            )

    def send(self, task, *args, queue: str) -> None:
        options = {"visibility_timeout": VISIBILITY_TIMEOUT}
        with Connection(BROKER_URL, transport_options=options) as broker:
            task.apply_async(args=args, queue=queue, connection=broker)

    def gpu_holding(self, pid: int) -> str:
        """The name of the gpu worker with process ``pid`` in its tree ("" when none)."""
        for name in ("gpu1", "gpu2"):
            if any(p.pid == pid for p in self.all[name].tree()):
                return name
        return ""

    def stop(self) -> None:
        for worker in self.all.values():
            worker.stop()
        purge(self.gpu_queue)
        purge(self.default_queue)


def test_a_run_of_a_killed_gpu_worker_is_finished_by_the_other_once(
    training_settings, tiny_reward_dir, reward_snapshot, tmp_path
):
    workers = Workers(tmp_path)
    try:
        # given a reward run (60 steps, a checkpoint every 10) taken by one of two gpu workers
        run = services.training_run_create(
            recipe="reward",
            config=reward_config(tiny_reward_dir, max_steps=STEPS, save_steps=10),
            dataset_path=reward_snapshot,
            enqueue=False,
        )
        workers.send(run_training, run.pk, queue=workers.gpu_queue)
        workers.send(requeue_stale_runs, queue=workers.default_queue)
        first = wait_for(
            lambda: TrainingRun.objects.filter(
                pk=run.pk, status=TrainingRun.Status.RUNNING, child_pid__isnull=False
            ).first(),
            timeout=180,
            what="a gpu worker to start the run",
        )
        holder = workers.gpu_holding(first.child_pid)
        assert holder, "the training process is under no gpu worker"
        other = "gpu2" if holder == "gpu1" else "gpu1"
        checkpoint = wait_for(
            lambda: checkpoints.newest_complete_checkpoint(run.output_dir),
            timeout=300,
            interval=0.1,
            what="a first checkpoint",
        )

        # when that worker is SIGKILLed with its training process
        killed = workers.all[holder].kill()
        assert any(p.pid == first.child_pid for p in killed)
        at_kill = TrainingRun.objects.get(pk=run.pk)
        assert at_kill.status == TrainingRun.Status.RUNNING and at_kill.attempts == 1

        # then the other gpu worker, already up, gets the message back and finishes the run
        done = wait_for(
            lambda: TrainingRun.objects.filter(
                pk=run.pk,
                status__in=[TrainingRun.Status.SUCCEEDED, TrainingRun.Status.FAILED],
            ).first(),
            timeout=480,
            interval=0.5,
            what="the other gpu worker to finish the run",
        )
        log = Path(done.output_dir, "train.log").read_text()
        assert done.status == TrainingRun.Status.SUCCEEDED, done.error + log[-3000:]
        assert done.attempts == 2 and len(done.resumes) == 1
        assert done.resumes[0]["step"] >= checkpoint[1] > 0
        assert f"=== resuming from {done.resumes[0]['checkpoint']}" in log
        assert done.worker_pid in [p.pid for p in workers.all[other].tree()]
        assert "training.tasks.run_training[" in workers.all[other].text()
        assert done.current_metrics["global_step"] == STEPS
        assert ModelVersion.objects.filter(training_run=done).count() == 1
        assert ModelVersion.objects.count() == 1
        # and the default worker ran its own task and no training
        assert "training.tasks.requeue_stale_runs[" in workers.all["cpu"].text()
        assert "training.tasks.run_training[" not in workers.all["cpu"].text()
    finally:
        workers.stop()


def test_a_generation_job_of_a_killed_gpu_worker_makes_each_candidate_once(tmp_path):
    from training import demo

    # given a project with a pool of 64 prompts and a tiny policy
    project = make_project(name="gpu worker killed", k=2)
    texts = [p.prompt for p in demo.problems_in("train")][:64]
    assert len(texts) == 64
    pool(project, texts=texts, chat=[])
    policy = make_tiny_demo_policy(tmp_path / "policy", name="tiny-gen", n_positions=96)
    policy.project = project
    policy.save(update_fields=["project"])
    job = rounds.generation_job_create(
        project=project,
        user=None,
        policies=[policy.pk],
        n_prompts=64,
        sampling=[{"temperature": 1.0, "max_new_tokens": 48, "batch_size": 8}] * 2,
        seed=5,
        source_key="killed",
        enqueue=False,
    )
    workers = Workers(tmp_path)
    try:
        workers.send(run_generation_job, job.pk, queue=workers.gpu_queue)
        # and a gpu worker in the middle of sampling its candidates
        wait_for(
            lambda: GenerationJob.objects.filter(
                pk=job.pk, status=GenerationJob.Status.RUNNING, progress__gt=0
            ).exists(),
            timeout=240,
            interval=0.1,
            what="the job to start sampling",
        )
        holder = next(
            name
            for name in ("gpu1", "gpu2")
            if "training.tasks.run_generation_job[" in workers.all[name].text()
        )
        other = "gpu2" if holder == "gpu1" else "gpu1"

        # when that worker is SIGKILLed before the round is made
        workers.all[holder].kill()
        at_kill = GenerationJob.objects.get(pk=job.pk)
        assert at_kill.status == GenerationJob.Status.RUNNING and at_kill.progress < 0.99
        assert not Round.objects.filter(project=project, source_key=job.source_key).exists()
        assert not Candidate.objects.filter(prompt__project=project).exists()

        # then the other gpu worker gets the message back and makes the round, once
        done = wait_for(
            lambda: GenerationJob.objects.filter(
                pk=job.pk,
                status__in=[GenerationJob.Status.SUCCEEDED, GenerationJob.Status.FAILED],
            ).first(),
            timeout=480,
            interval=0.5,
            what="the other gpu worker to finish the job",
        )
        assert done.status == GenerationJob.Status.SUCCEEDED, done.error
        assert "training.tasks.run_generation_job[" in workers.all[other].text()
        assert Round.objects.filter(project=project, source_key=job.source_key).count() == 1
        items = Item.objects.filter(round=done.round)
        assert items.count() == done.n_items > 0
        # no candidate twice: K per prompt and model, each in an item
        per_prompt = (
            Candidate.objects.filter(prompt__project=project)
            .values("prompt_id", "model_name")
            .annotate(n=Count("id"))
        )
        assert len(per_prompt) == done.n_items
        assert {row["n"] for row in per_prompt} == {project.k}
        assert {row["model_name"] for row in per_prompt} == {"tiny-gen"}
        slots = ItemCandidate.objects.filter(item__in=items)
        assert slots.count() == Candidate.objects.filter(prompt__project=project).count()

        # and the same message once more changes nothing
        workers.send(run_generation_job, job.pk, queue=workers.gpu_queue)
        wait_for(
            lambda: (
                sum(workers.all[n].text().count("run_generation_job[") for n in ("gpu1", "gpu2"))
                >= 5
            ),
            timeout=120,
            what="the duplicate message to be handled",
        )
        assert Candidate.objects.filter(prompt__project=project).count() == slots.count()
        assert Round.objects.filter(project=project).count() == 1
    finally:
        workers.stop()
