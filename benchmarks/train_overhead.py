"""Training overhead: the same reward-model and DPO runs through Prefloop's Celery path vs TRL.

    .venv/bin/python benchmarks/train_overhead.py [--max-steps 60] [--repeats 3]

Both halves train the same tiny models on the same snapshot with the same settings (built
by ``benchmarks/train_overhead_plain.py``):

* Celery path: ``training.tasks.run_training`` is queued on a real ``celery worker`` (own
  queue on Redis, prefork, concurrency 1); the wall time runs from the enqueue until the
  row says succeeded. It includes dispatch, the training CLI's process start and imports,
  preprocessing, training, evaluation, saving, progress streaming into the row and the
  model registration.
* Plain TRL: the same training written against TRL alone, run as a fresh ``python``
  process; the wall time of that process (imports included, as for anyone's script).
* Bare CLI (for attribution): ``python -m training.trainers.cli`` run directly, so the
  ratio splits into Celery + supervision (Celery / CLI) and the recipe itself (CLI / plain).

Prints one line per run, the wall-time ratio per recipe (target <= 1.05) and a JSON
summary. Wall time on a shared machine moves with other people's load, so the CPU seconds
of the training processes (and of the worker's own supervision) are printed too.
Needs PostgreSQL and Redis as for the tests: a throwaway database
``prefloop_bench_<pid>`` is created, migrated and dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
sys.path.insert(0, str(BASE_DIR / "benchmarks"))

from tests.celery_worker import worker_argv  # noqa: E402

PG_URL = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/12")
PLAIN_FUNCTIONS = {"reward": "run_plain_reward", "dpo": "run_plain_dpo"}


def create_database(name: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_URL}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_URL}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_worker(queue: str, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = log_path.open("ab")
    process = subprocess.Popen(
        worker_argv(queue, f"bench-{queue}"),
        cwd=str(BASE_DIR),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while " ready." not in log_path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start; see {log_path}")
        time.sleep(0.2)
    return process


def stop_worker(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def children_cpu() -> float:
    """Return the CPU seconds of this process's finished (waited-for) children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def worker_cpu(worker_pid: int) -> tuple[float, float]:
    """Return (supervision CPU s, training CPU s) of a worker so far.

    Supervision: the worker's main process and its pool process themselves. Training: the
    pool process's finished children, i.e. the training CLI processes it ran and reaped.
    """
    import psutil

    main = psutil.Process(worker_pid)
    times = main.cpu_times()
    supervision, training = times.user + times.system, 0.0
    for pool in main.children():
        pool_times = pool.cpu_times()
        supervision += pool_times.user + pool_times.system
        training += pool_times.children_user + pool_times.children_system
    return supervision, training


def run_celery(recipe: str, setup, queue: str, worker_pid: int) -> dict:
    """Queue one run on the worker; return its wall time from enqueue to succeeded."""
    from django.utils import timezone
    from kombu import Connection

    from training import services
    from training.models import TrainingRun
    from training.tasks import run_training

    created = time.perf_counter()
    run = services.training_run_create(
        recipe=recipe,
        config=setup.prefloop_configs[recipe],
        dataset_path=setup.snapshot_dir,
        enqueue=False,
    )
    create_seconds = time.perf_counter() - created
    supervision_before, training_before = worker_cpu(worker_pid)
    with Connection(BROKER_URL) as broker:
        enqueued_at = timezone.now()
        run_training.apply_async(args=(run.pk,), queue=queue, connection=broker)
    # The row's finished_at marks the end, so this loop can poll slowly and stay out of the
    # way of the training process on a small machine.
    while True:
        run.refresh_from_db()
        if run.status in services.TERMINAL_STATUSES:
            break
        time.sleep(1.0)
    seconds = (run.finished_at - enqueued_at).total_seconds()
    time.sleep(0.5)  # let the task return before reading the worker's CPU time
    supervision_after, training_after = worker_cpu(worker_pid)
    if run.status != TrainingRun.Status.SUCCEEDED:
        raise RuntimeError(f"{recipe} run {run.pk} {run.status}: {run.error}")
    return {
        "seconds": seconds,
        "cpu_seconds": training_after - training_before,
        "supervision_cpu_seconds": supervision_after - supervision_before,
        "create_seconds": create_seconds,
        "run_id": run.pk,
        "model_version": run.model_version.name,
        "metrics": {
            k: v
            for k, v in run.current_metrics.items()
            if k in ("eval_accuracy", "eval_rewards/accuracies", "global_step")
        },
    }


def run_plain(recipe: str, setup, output_dir: Path) -> dict:
    """Run the plain-TRL function in a fresh interpreter; return the process's wall time."""
    code = (
        "import json, sys; from pathlib import Path\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import train_overhead_plain as plain\n"
        "fields = json.loads(sys.argv[2])\n"
        "paths = ('workdir', 'tokenizer_dir', 'policy_dir', 'reward_dir', 'snapshot_dir')\n"
        "fields.update({k: Path(fields[k]) for k in paths})\n"
        "setup = plain.Setup(**fields)\n"
        f"result = plain.{PLAIN_FUNCTIONS[recipe]}(setup, Path(sys.argv[3]))\n"
        "print(json.dumps(result))\n"
    )
    fields = {
        "workdir": str(setup.workdir),
        "tokenizer_dir": str(setup.tokenizer_dir),
        "policy_dir": str(setup.policy_dir),
        "reward_dir": str(setup.reward_dir),
        "snapshot_dir": str(setup.snapshot_dir),
        "seed": setup.seed,
        "max_steps": setup.max_steps,
        "batch_size": setup.batch_size,
        "max_length": setup.max_length,
        "reward_lr": setup.reward_lr,
        "dpo_lr": setup.dpo_lr,
        "beta": setup.beta,
        "logging_steps": setup.logging_steps,
        "save_steps": setup.save_steps,
    }
    cpu_before = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(BASE_DIR / "benchmarks"),
            json.dumps(fields),
            str(output_dir),
        ],
        cwd=str(BASE_DIR),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"plain {recipe} failed:\n{done.stderr[-3000:]}")
    cpu = children_cpu() - cpu_before
    inner = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "in_process_seconds": inner.pop("seconds"),
        "metrics": inner,
    }


def run_cli(recipe: str, setup, output_dir: Path) -> dict:
    """Run the training CLI directly (no Django, no Celery); return the process's wall time."""
    output_dir.mkdir(parents=True, exist_ok=True)
    config_path = output_dir.parent / f"{output_dir.name}.json"
    config_path.write_text(json.dumps(setup.prefloop_configs[recipe]))
    command = [
        sys.executable,
        "-m",
        "training.trainers.cli",
        "--recipe",
        recipe,
        "--config",
        str(config_path),
        "--data",
        str(setup.snapshot_dir),
        "--out",
        str(output_dir),
    ]
    cpu_before = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=str(BASE_DIR), capture_output=True, text=True)
    seconds = time.perf_counter() - started
    cpu = children_cpu() - cpu_before
    if done.returncode != 0:
        raise RuntimeError(f"CLI {recipe} failed:\n{done.stderr[-3000:]}")
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    keep = ("eval_accuracy", "eval_rewards/accuracies", "global_step")
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "metrics": {k: v for k, v in metrics.items() if k in keep},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--pairs", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipes", default="reward,dpo")
    parser.add_argument(
        "--estimator",
        choices=("min", "median"),
        default="min",
        help="how repeats combine; best-of-N (min) since other load only ever adds time",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    recipes = [r for r in args.recipes.split(",") if r]

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="train_overhead_"))
    database = f"prefloop_bench_{os.getpid()}"
    queue = f"gpu-bench-{uuid.uuid4().hex[:8]}"
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "DATABASE_URL": f"{PG_URL}/{database}",
            "CELERY_BROKER_URL": BROKER_URL,
        }
    )
    create_database(database)
    worker = None
    try:
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        settings.TRAINING_OUTPUT_ROOT = str(workdir / "celery_runs")

        import train_overhead_plain as plain

        setup = plain.build_setup(workdir, n_train=args.pairs)
        setup.max_steps = args.max_steps
        setup.save_steps = max(setup.save_steps, args.max_steps // 4)
        for config in setup.prefloop_configs.values():
            config["max_steps"] = setup.max_steps
            config["save_steps"] = setup.save_steps

        worker = start_worker(queue, workdir / "worker.log")
        results: dict[str, dict[str, list[dict]]] = {
            r: {"celery": [], "cli": [], "plain": []} for r in recipes
        }
        for repeat in range(args.repeats):
            for recipe in recipes:
                # alternate the order so that neither half always runs on a warmer machine
                order = ("plain", "cli", "celery")
                for half in order if repeat % 2 == 0 else reversed(order):
                    if half == "plain":
                        result = run_plain(recipe, setup, workdir / f"plain_{recipe}_{repeat}")
                    elif half == "cli":
                        result = run_cli(recipe, setup, workdir / f"cli_{recipe}_{repeat}")
                    else:
                        result = run_celery(recipe, setup, queue, worker.pid)
                    results[recipe][half].append(result)
                    extra = ""
                    if "supervision_cpu_seconds" in result:
                        extra = f" + {result['supervision_cpu_seconds']:.1f} s supervision CPU"
                    print(
                        f"{recipe:6s} {half:6s} #{repeat}: {result['seconds']:6.1f} s wall, "
                        f"{result['cpu_seconds']:6.1f} s training CPU{extra}  "
                        f"{json.dumps(result['metrics'])}",
                        flush=True,
                    )

        summary = {
            "estimator": args.estimator,
            "runs": {
                recipe: {
                    half: [round(r["seconds"], 1) for r in runs]
                    for half, runs in results[recipe].items()
                }
                for recipe in recipes
            },
            "max_steps": setup.max_steps,
            "pairs": args.pairs,
            "repeats": args.repeats,
            "cpu_count": os.cpu_count(),
            "workdir": str(workdir),
        }
        print()
        for recipe in recipes:
            pick = min if args.estimator == "min" else statistics.median
            celery_s = pick(r["seconds"] for r in results[recipe]["celery"])
            plain_s = pick(r["seconds"] for r in results[recipe]["plain"])
            cli_s = pick(r["seconds"] for r in results[recipe]["cli"])

            def cpu(half: str, key: str = "cpu_seconds", recipe=recipe, pick=pick) -> float:
                return pick(r[key] for r in results[recipe][half])

            plain_inner = pick(r["in_process_seconds"] for r in results[recipe]["plain"])
            ratio = celery_s / plain_s
            summary[recipe] = {
                "celery_seconds": round(celery_s, 2),
                "plain_seconds": round(plain_s, 2),
                "cli_seconds": round(cli_s, 2),
                "plain_in_process_seconds": round(plain_inner, 2),
                "ratio": round(ratio, 3),
                "celery_over_cli": round(celery_s / cli_s, 3),
                "cli_over_plain": round(cli_s / plain_s, 3),
                "cpu_seconds": {
                    "celery_training": round(cpu("celery"), 2),
                    "celery_supervision": round(cpu("celery", "supervision_cpu_seconds"), 2),
                    "cli": round(cpu("cli"), 2),
                    "plain": round(cpu("plain"), 2),
                },
                "create_seconds": round(
                    pick(r["create_seconds"] for r in results[recipe]["celery"]), 2
                ),
            }
            verdict = "ok" if ratio <= 1.05 else "over target"
            cpu_ratio = (cpu("celery") + cpu("celery", "supervision_cpu_seconds")) / cpu("plain")
            print(
                f"{recipe:6s} Celery path {celery_s:6.1f} s / plain TRL {plain_s:6.1f} s "
                f"= {ratio:.3f} (target <= 1.05: {verdict})\n"
                f"       of which Celery+supervision vs the bare CLI: {celery_s / cli_s:.3f} "
                f"(CLI {cli_s:.1f} s), recipe vs plain TRL: {cli_s / plain_s:.3f}; "
                f"plain without imports {plain_inner:.1f} s\n"
                f"       CPU s: Celery path {cpu('celery'):.1f} training + "
                f"{cpu('celery', 'supervision_cpu_seconds'):.1f} supervision, bare CLI "
                f"{cpu('cli'):.1f}, plain TRL {cpu('plain'):.1f} "
                f"(ratio {cpu_ratio:.3f})"
            )
        print(json.dumps(summary))
    finally:
        if worker is not None:
            stop_worker(worker)
        import redis

        redis.Redis.from_url(BROKER_URL).delete(
            queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"
        )
        from django.db import connections

        connections.close_all()
        drop_database(database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
