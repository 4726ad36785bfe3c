"""Training runs: create, execute through the CLI, register once, cancel, resume, fail clearly."""

from __future__ import annotations

import json
import os
import socket
import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path

import psutil
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from annotation.errors import Conflict
from tests.factories import make_project
from tests.training import test_runs_support as support
from tests.training.test_runs_support import make_dataset_version, reward_config, wait_for
from training import processes, services, supervisor
from training.models import ModelVersion, TrainingRun
from training.trainers import checkpoints

training_settings = support.training_settings
reward_snapshot = support.reward_snapshot


def _create(model_dir, snapshot, **overrides) -> TrainingRun:
    return services.training_run_create(
        recipe="reward",
        config=reward_config(model_dir, **overrides),
        dataset_path=snapshot,
        enqueue=False,
    )


# --------------------------------------------------------------------------- create


@pytest.mark.django_db
def test_create_rejects_unknown_recipe_and_bad_config_early(
    training_settings, tiny_reward_dir, reward_snapshot
):
    with pytest.raises(services.InvalidTrainingConfig, match="recipe: unknown recipe"):
        services.training_run_create(
            recipe="ppo2", config={}, dataset_path=reward_snapshot, enqueue=False
        )
    with pytest.raises(services.InvalidTrainingConfig, match="unknown config field"):
        _create(tiny_reward_dir, reward_snapshot, learnin_rate=1.0)
    with pytest.raises(services.InvalidTrainingConfig, match="max_steps"):
        _create(tiny_reward_dir, reward_snapshot, max_steps=0)
    with pytest.raises(services.InvalidTrainingConfig, match="model_name_or_path"):
        _create(tiny_reward_dir, reward_snapshot, model_name_or_path="/nonexistent/model")
    with pytest.raises(services.InvalidTrainingConfig, match="set by the runner"):
        _create(tiny_reward_dir, reward_snapshot, resume=True)
    with pytest.raises(services.InvalidTrainingConfig, match="dataset_path: the dataset folder"):
        services.training_run_create(
            recipe="reward",
            config=reward_config(tiny_reward_dir),
            dataset_path=str(reward_snapshot.parent / "missing"),
            enqueue=False,
        )
    with pytest.raises(services.InvalidTrainingConfig, match="dataset_path: outside"):
        services.training_run_create(
            recipe="reward",
            config=reward_config(tiny_reward_dir),
            dataset_path="/nonexistent/snapshot",
            enqueue=False,
        )
    assert not TrainingRun.objects.exists()


@pytest.mark.django_db
def test_create_queues_the_task_only_after_commit(
    training_settings,
    tiny_reward_dir,
    reward_snapshot,
    django_capture_on_commit_callbacks,
    monkeypatch,
):
    from training import tasks

    sent = []
    monkeypatch.setattr(tasks.run_training, "delay", lambda run_id: sent.append(run_id))
    project = make_project()
    version = make_dataset_version(project, reward_snapshot)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        run = services.training_run_create(
            recipe="reward", config=reward_config(tiny_reward_dir), dataset_version=version
        )
        assert sent == []  # nothing is sent while the transaction is open
    assert len(callbacks) == 1
    assert sent == [run.pk]
    assert run.status == TrainingRun.Status.QUEUED
    assert run.project == project  # taken from the dataset version
    assert run.output_dir == str(Path(training_settings.TRAINING_OUTPUT_ROOT) / f"run-{run.pk}")


def test_launcher_is_configurable(settings):
    args = {
        "recipe": "dpo",
        "config_path": Path("/o/c.json"),
        "data_dir": "/d",
        "output_dir": "/o",
        "resume": True,
    }
    settings.TRAINING_LAUNCHER = "python"
    plain = processes.training_command(**args)
    assert plain[1:4] == ["-m", "training.trainers.cli", "--recipe"]
    assert plain[-1] == "--resume"
    settings.TRAINING_LAUNCHER = "accelerate"
    settings.TRAINING_ACCELERATE_ARGS = ["--num_processes", "2"]
    launched = processes.training_command(**args)
    assert launched[1:6] == ["-m", "accelerate.commands.launch", "--num_processes", "2", "-m"]
    assert launched[6] == "training.trainers.cli"


# --------------------------------------------------------------------------- end to end


@pytest.mark.django_db
def test_train_sync_reward_run_end_to_end(training_settings, tiny_reward_dir, reward_snapshot):
    # given a tiny GPT-2 reward model and an arithmetic preference snapshot
    project = make_project()
    version = make_dataset_version(project, reward_snapshot)
    out, err = StringIO(), StringIO()

    # when `manage.py train reward --sync` runs it in this process
    call_command(
        "train",
        "reward",
        config=json.dumps(reward_config(tiny_reward_dir)),
        dataset_version=version.pk,
        sync=True,
        stdout=out,
        stderr=err,
    )

    # then the run succeeded with its final metrics, and exactly one model was registered
    run = TrainingRun.objects.get()
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error
    assert run.progress == 1.0
    assert run.exit_code == 0 and run.attempts == 1
    assert run.current_metrics["global_step"] == 20
    assert 0.0 <= run.current_metrics["eval_accuracy"] <= 1.0
    assert "eval_loss" in run.current_metrics and "train_loss" in run.current_metrics
    assert "step 20/20" in run.log_tail
    assert run.heartbeat_at is not None and run.finished_at is not None
    model = ModelVersion.objects.get()
    assert model.training_run == run
    assert model.kind == ModelVersion.Kind.REWARD
    assert model.dataset_version == version
    assert model.base_model_path == str(tiny_reward_dir)
    assert Path(model.artifact_path, "config.json").is_file()
    assert model.eval_results["eval_accuracy"] == run.current_metrics["eval_accuracy"]
    assert len(model.eval_results["data_hash"]) == 64
    assert "20/20" in err.getvalue()  # the tqdm bar
    assert f"model version: {model.name}" in out.getvalue()

    # and executing the finished run again (a redelivered task) changes nothing
    again = supervisor.training_run_execute(run_id=run.pk)
    assert again.status == TrainingRun.Status.SUCCEEDED and again.attempts == 1
    assert ModelVersion.objects.count() == 1

    # and `manage.py models` lists it with its lineage
    listing = StringIO()
    call_command("models", stdout=listing)
    assert model.name in listing.getvalue()
    assert f"{model.name} <- {tiny_reward_dir}" in listing.getvalue()


@pytest.mark.django_db
def test_child_of_a_registered_model_keeps_lineage(
    training_settings, tiny_reward_dir, reward_snapshot
):
    parent_run = _create(tiny_reward_dir, reward_snapshot, max_steps=2, save_steps=2)
    parent_run = supervisor.training_run_execute(run_id=parent_run.pk)
    parent = parent_run.model_version

    child = services.training_run_create(
        recipe="reward",
        config={
            k: v
            for k, v in reward_config(tiny_reward_dir, max_steps=2).items()
            if k != "model_name_or_path"
        },
        dataset_path=reward_snapshot,
        base_model=parent,
        enqueue=False,
    )
    assert child.config["model_name_or_path"] == parent.artifact_path
    child = supervisor.training_run_execute(run_id=child.pk)
    assert child.status == TrainingRun.Status.SUCCEEDED, child.error
    assert child.model_version.parent == parent
    assert child.model_version.base_model_path == parent.artifact_path


@pytest.mark.slow
@pytest.mark.django_db
def test_accelerate_launcher_trains_too(training_settings, tiny_reward_dir, reward_snapshot):
    training_settings.TRAINING_LAUNCHER = "accelerate"
    training_settings.TRAINING_ACCELERATE_ARGS = [
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--cpu",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    run = _create(tiny_reward_dir, reward_snapshot, max_steps=4, save_steps=4)

    run = supervisor.training_run_execute(run_id=run.pk)

    assert run.status == TrainingRun.Status.SUCCEEDED, run.error
    assert "accelerate.commands.launch" in Path(run.output_dir, "train.log").read_text()
    assert run.current_metrics["global_step"] == 4
    assert ModelVersion.objects.filter(training_run=run).count() == 1


# --------------------------------------------------------------------------- failures


@pytest.mark.django_db
def test_bad_data_fails_with_a_clear_error(training_settings, tiny_reward_dir, make_snapshot):
    broken = make_snapshot(train=[{"prompt": "Q", "chosen": "A"}])  # no "rejected"
    run = _create(tiny_reward_dir, broken)

    run = supervisor.training_run_execute(run_id=run.pk)

    assert run.status == TrainingRun.Status.FAILED
    assert run.exit_code == 2
    assert run.error.startswith("Bad config or data")
    assert "rejected" in run.error  # the CLI's own message follows
    assert not ModelVersion.objects.exists()


@pytest.mark.django_db
def test_bad_config_that_slipped_past_validation_fails_with_exit_2(
    training_settings, tiny_reward_dir, reward_snapshot
):
    run = _create(tiny_reward_dir, reward_snapshot)
    TrainingRun.objects.filter(pk=run.pk).update(config={**run.config, "overlong": "squash"})

    run = supervisor.training_run_execute(run_id=run.pk)

    assert run.status == TrainingRun.Status.FAILED
    assert run.error.startswith("Bad config or data")
    assert "overlong" in run.error


@pytest.mark.django_db
def test_unwritable_artifact_folder_fails_the_run_clearly(
    training_settings, tiny_reward_dir, reward_snapshot, tmp_path
):
    # tests may run as root, which ignores permission bits: a file where a folder must be
    # makes the folder impossible to create for anyone
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    training_settings.TRAINING_OUTPUT_ROOT = str(blocker / "runs")
    run = _create(tiny_reward_dir, reward_snapshot)

    run = supervisor.training_run_execute(run_id=run.pk)

    assert run.status == TrainingRun.Status.FAILED
    assert "is not writable" in run.error and str(blocker) in run.error
    assert run.finished_at is not None
    assert not ModelVersion.objects.exists()


@pytest.mark.django_db
def test_full_disk_fails_the_run_clearly(training_settings, tiny_reward_dir, reward_snapshot):
    training_settings.TRAINING_MIN_FREE_BYTES = 1 << 62  # more than any disk has
    run = _create(tiny_reward_dir, reward_snapshot)

    run = supervisor.training_run_execute(run_id=run.pk)

    assert run.status == TrainingRun.Status.FAILED
    assert run.error.startswith("Disk full")


@pytest.mark.django_db
def test_a_launcher_that_cannot_start_fails_the_run_clearly(
    training_settings, tiny_reward_dir, reward_snapshot
):
    training_settings.TRAINING_LAUNCHER = ["/nonexistent/python"]
    run = supervisor.training_run_execute(run_id=_create(tiny_reward_dir, reward_snapshot).pk)
    assert run.status == TrainingRun.Status.FAILED
    # the launcher's path is the server's business: the caller reads a placeholder
    assert run.error.startswith("Could not start the training process (<server path>)")

    training_settings.TRAINING_LAUNCHER = "deepspeed"
    run = supervisor.training_run_execute(run_id=_create(tiny_reward_dir, reward_snapshot).pk)
    assert run.status == TrainingRun.Status.FAILED
    assert run.error.startswith("Unknown launcher")


def test_failure_messages_name_the_cause():
    message = supervisor._failure_message
    assert message(1, "OSError: [Errno 28] No space left on device", "/o").startswith(
        "Disk full while writing to /o"
    )
    assert "not writable" in message(1, "PermissionError: Permission denied", "/o")
    assert "SIGKILL (out of memory?)" in message(-9, "", "/o")
    assert message(1, "Traceback ...", "/o").startswith("Training failed (exit code 1)")


@pytest.mark.django_db
def test_task_on_failure_records_the_traceback(training_settings, monkeypatch):
    from training import tasks

    run = TrainingRun.objects.create(recipe="reward", status=TrainingRun.Status.RUNNING)

    def boom(**kwargs):
        raise ValueError("supervisor bug")

    monkeypatch.setattr(supervisor, "training_run_execute", boom)
    result = tasks.run_training.apply(args=(run.pk,))

    assert result.failed()
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.FAILED
    assert "supervisor bug" in run.error and "Traceback" in run.error


def test_task_options():
    from training.tasks import run_training

    assert run_training.acks_late is True
    assert run_training.reject_on_worker_lost is True
    assert run_training.max_retries == 5
    assert supervisor.DatabaseError not in run_training.autoretry_for  # only connection errors


# --------------------------------------------------------------------------- idempotency


@pytest.mark.django_db
def test_run_supervised_elsewhere_is_not_started_twice(
    training_settings, tiny_reward_dir, reward_snapshot
):
    run = _create(tiny_reward_dir, reward_snapshot)
    TrainingRun.objects.filter(pk=run.pk).update(
        status=TrainingRun.Status.RUNNING,
        worker_host="gpu-box-7",
        worker_pid=12345,
        heartbeat_at=timezone.now(),
        attempts=1,
    )

    again = supervisor.training_run_execute(run_id=run.pk)

    assert again.status == TrainingRun.Status.RUNNING
    assert again.attempts == 1 and again.worker_host == "gpu-box-7"
    assert not Path(run.output_dir).exists()  # nothing was launched


@pytest.mark.django_db
def test_worker_gone_rules(training_settings):
    now = timezone.now()
    host = socket.gethostname()
    dead_pid = _dead_pid()

    def run(**fields):
        return TrainingRun(status=TrainingRun.Status.RUNNING, **fields)

    gone = processes.training_run_worker_gone
    assert gone(run=run(heartbeat_at=None, worker_host="x", worker_pid=1))
    assert gone(run=run(heartbeat_at=now - timedelta(minutes=5), worker_host="x", worker_pid=1))
    assert not gone(run=run(heartbeat_at=now, worker_host="x", worker_pid=1))
    assert gone(run=run(heartbeat_at=now, worker_host=host, worker_pid=dead_pid))
    assert gone(run=run(heartbeat_at=now, worker_host=host, worker_pid=os.getpid()))
    assert not gone(run=run(heartbeat_at=now, worker_host=host, worker_pid=os.getppid()))


def _dead_pid() -> int:
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


# --------------------------------------------------------------------------- cancel, resume


@pytest.mark.django_db
def test_cancel_a_queued_run_then_executing_it_does_nothing(
    training_settings, tiny_reward_dir, reward_snapshot
):
    run = _create(tiny_reward_dir, reward_snapshot)
    call_command("cancel", str(run.pk), stdout=StringIO())
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.CANCELLED

    assert supervisor.training_run_execute(run_id=run.pk).attempts == 0
    assert services.training_run_cancel(run_id=run.pk).status == TrainingRun.Status.CANCELLED


@pytest.mark.django_db
def test_cancel_a_finished_run_is_a_conflict(training_settings):
    run = TrainingRun.objects.create(recipe="reward", status=TrainingRun.Status.SUCCEEDED)
    with pytest.raises(Conflict):
        services.training_run_cancel(run_id=run.pk)
    with pytest.raises(CommandError, match="already succeeded"):
        call_command("cancel", str(run.pk))


@pytest.mark.django_db(transaction=True)
def test_cancel_kills_the_running_process_group_and_resume_continues_from_checkpoint(
    training_settings, tiny_reward_dir, reward_snapshot
):
    # given a run long enough to be caught mid-training, supervised in a background thread
    run = _create(
        tiny_reward_dir, reward_snapshot, max_steps=2000, save_steps=5, save_total_limit=1
    )
    outcome = {}

    def supervise():
        try:
            outcome["run"] = supervisor.training_run_execute(run_id=run.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=supervise)
    thread.start()
    row = wait_for(
        lambda: TrainingRun.objects.filter(
            pk=run.pk, child_pid__isnull=False, current_metrics__step__gte=5
        ).first(),
        timeout=120,
        what="the training process to pass step 5",
    )
    assert row.status == TrainingRun.Status.RUNNING and 0 < row.progress < 1
    assert row.heartbeat_at is not None and "step" in row.log_tail
    wait_for(
        lambda: checkpoints.newest_complete_checkpoint(run.output_dir),
        timeout=60,
        what="a checkpoint",
    )
    child = psutil.Process(row.child_pid)

    # when it is cancelled
    services.training_run_cancel(run_id=run.pk)
    thread.join(timeout=60)

    # then the process group is gone, the row says cancelled and no model is registered
    assert not thread.is_alive()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.CANCELLED
    assert run.exit_code is not None and run.exit_code < 0
    assert run.child_pid is None
    assert not ModelVersion.objects.exists()
    checkpoint, step = checkpoints.newest_complete_checkpoint(run.output_dir)

    # when it is resumed (in-process) with a shorter horizon... the config is fixed, so
    # shorten the work by resuming a run whose checkpoint is already near its end
    TrainingRun.objects.filter(pk=run.pk).update(config={**run.config, "max_steps": step + 5})
    # and a newer checkpoint was only half written when the process died
    partial = Path(run.output_dir, f"checkpoint-{step + 1000}")
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 10)
    out = StringIO()
    call_command("resume", str(run.pk), sync=True, stdout=out, stderr=StringIO())

    # then it continues from the checkpoint, not from step 0, and registers one model
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.SUCCEEDED, run.error
    assert run.attempts == 2
    assert run.resumes == [
        {"attempt": 2, "checkpoint": checkpoint, "step": step, "at": run.resumes[0]["at"]}
    ]
    records = [
        json.loads(line) for line in Path(run.output_dir, "metrics.jsonl").read_text().splitlines()
    ]
    resume_index = max(i for i, r in enumerate(records) if r.get("event") == "resume")
    assert records[resume_index]["checkpoint"] == checkpoint
    after = [r["step"] for r in records[resume_index + 1 :] if "loss" in r]
    assert after and min(after) > step
    assert run.current_metrics["global_step"] == step + 5
    assert ModelVersion.objects.filter(training_run=run).count() == 1
    log = Path(run.output_dir, "train.log").read_text()
    assert f"resuming from {checkpoint}" in log
    # the cancel may also have cut a save short, so the line can name another folder too
    dropped = [
        line.split(": ", 1)[1].split(", ")
        for line in log.splitlines()
        if line.startswith("=== deleted half-written checkpoints: ")
    ]
    assert dropped and partial.name in dropped[-1]
    assert not partial.exists()


# --------------------------------------------------------------------------- broker restarts


@pytest.mark.django_db
def test_queued_runs_sent_before_the_broker_restarted_are_sent_again_once(
    training_settings, tiny_reward_dir, reward_snapshot, django_capture_on_commit_callbacks
):
    sent: list[int] = []
    before, after, running, legacy = (_create(tiny_reward_dir, reward_snapshot) for _ in range(4))
    restart = timezone.now()
    TrainingRun.objects.filter(pk__in=[before.pk, running.pk]).update(
        enqueued_at=restart - timedelta(minutes=5)
    )
    TrainingRun.objects.filter(pk=after.pk).update(enqueued_at=restart + timedelta(seconds=1))
    TrainingRun.objects.filter(pk=running.pk).update(status=TrainingRun.Status.RUNNING)
    # a run queued before enqueued_at existed: its creation time stands in
    TrainingRun.objects.filter(pk=legacy.pk).update(
        enqueued_at=None, created_at=restart - timedelta(minutes=1)
    )

    with django_capture_on_commit_callbacks(execute=True):
        lost = services.training_runs_requeue_lost(broker_started_at=restart, send=sent.append)

    assert sorted(lost) == sorted(sent) == sorted([before.pk, legacy.pk])
    before.refresh_from_db()
    assert before.enqueued_at >= restart and before.status == TrainingRun.Status.QUEUED
    # sent again now, so the next beat tick leaves them alone
    with django_capture_on_commit_callbacks(execute=True):
        assert (
            services.training_runs_requeue_lost(broker_started_at=restart, send=sent.append) == []
        )
    assert len(sent) == 2


def test_broker_start_time_comes_from_redis_uptime():
    import redis
    from django.conf import settings as django_settings

    url = "redis://127.0.0.1:6379/0"
    started = services.broker_started_at(url=url)
    uptime = redis.Redis.from_url(url).info("server")["uptime_in_seconds"]
    expected = timezone.now() - timedelta(seconds=uptime)
    assert started is not None and abs((started - expected).total_seconds()) <= 2
    assert services.broker_started_at(url="memory://") is None
    assert services.broker_started_at(url="redis://127.0.0.1:1/0") is None  # nobody there
    assert django_settings.CELERY_BEAT_SCHEDULE["requeue-stale-training-runs"]["schedule"] == 60
