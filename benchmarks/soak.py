"""Soak: 50 simulated annotators label for 10 minutes while a Celery worker keeps training.

    .venv/bin/python benchmarks/soak.py [--minutes 10] [--annotators 50] [--think 1.0]

Everything runs for real on this host: gunicorn (config/gunicorn.conf.py, persistent
database connections) on a throwaway PostgreSQL database ``prefloop_soak_<pid>`` (created,
migrated, dropped at the end), a private redis-server on a free port as the broker, and a
``celery worker`` on a queue of its own. The worker trains tiny reward models one after
another (a new run is queued as soon as the last one ends) for the whole soak.

Each annotator is a process running the simulation's ApiClient (retries 502/503/504 and
connection errors with the same idempotency key) and a simulated labeller (careful, noisy,
biased, always-left, random; honest ones by default), looping next -> think -> submit.
Quality control runs as deployed (a second worker takes its checks). Prints:

* judgments accepted (2xx-acknowledged judgment ids), lost (acknowledged but not stored:
  must be 0), duplicated (acknowledged twice, or more than one judgment per annotator and
  item, or more than `overlap` per item: must be 0), and 5xx answers seen (must be 0; a
  retried 503 counts too);
* p50/p95/p99 latency of next and submit as the annotator sees them (retries included);
* the training runs started, succeeded and failed during the soak.

Exit status 1 when lost, duplicated or 5xx is not 0, or a training run failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from tests.celery_worker import worker_argv  # noqa: E402

PG_URL = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
# Honest labellers by default, so all of them keep labelling for the whole soak (QC pauses
# always_left and random ones within their first checks: pass --mix to include them).
DEFAULT_MIX = "careful,careful,noisy"


# ---- services ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def psql(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_URL}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


def start(command: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=str(BASE_DIR),
        env={**os.environ, **(env or {})},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def celery_worker(queue: str, name: str) -> list[str]:
    return worker_argv(queue, f"soak-{name}-{os.getpid()}")


def stop(process: subprocess.Popen | None, grace: float = 30) -> None:
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


# ---- Django side (main process) -----------------------------------------------------------


def django_setup(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()


def prepare_project(n_items: int, n_annotators: int, overlap: int) -> tuple[int, list[str]]:
    """Create a pairwise project with `n_items` items and machine annotators; return tokens."""
    import io

    from django.core.management import call_command

    from annotation.imports import items_import
    from annotation.models import Project
    from annotation.services import simulated_annotator_ensure

    call_command("migrate", verbosity=0)
    project = Project.objects.create(
        name="soak", overlap=overlap, allow_tie=True, ask_confidence=True, lease_seconds=300
    )
    rng = random.Random(0)
    lines = (
        json.dumps(
            {
                "id": f"q{i}",
                "prompt": f"Question {i}: explain topic {rng.randrange(10**9)} briefly.",
                "candidates": [
                    # short answers: the reported time on task must be enough to read them
                    {"text": f"First answer to {i}. " * rng.randint(1, 3), "model_name": "v1"},
                    {"text": f"Second answer to {i}. " * rng.randint(1, 3), "model_name": "v0"},
                ],
            }
        )
        for i in range(n_items)
    )
    items_import(project=project, stream=io.StringIO("\n".join(lines)))
    tokens = [
        simulated_annotator_ensure(project=project, username=f"soak-{i:02d}")
        for i in range(n_annotators)
    ]
    return project.pk, tokens


def build_training_inputs(folder: Path) -> tuple[Path, Path]:
    """Return (tiny reward model folder, preference snapshot folder)."""
    from training.trainers.data import write_snapshot
    from training.trainers.tiny import build_tiny_reward_model, train_tokenizer

    rng = random.Random(0)
    rows = []
    for _ in range(256):
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        rows.append(
            {
                "prompt": f"Q: What is {a} + {b}?\nA:",
                "chosen": f" {a} + {b} = {a + b}.",
                "rejected": rng.choice([" I don't know.", " No idea.", " Ask later."]),
            }
        )
    texts = [r["prompt"] + r["chosen"] for r in rows] + [r["prompt"] + r["rejected"] for r in rows]
    tokenizer = train_tokenizer(texts, vocab_size=400)
    model = build_tiny_reward_model(tokenizer, folder / "reward-base", n_layer=2, n_embd=64)
    snapshot = write_snapshot(
        folder / "snapshot", {"train": rows[:224], "validation": rows[224:]}, {"soak": True}
    )
    return model, snapshot


class Trainer:
    """Keep one tiny reward-model run queued or running on the worker's queue."""

    def __init__(self, *, model: Path, snapshot: Path, queue: str, broker_url: str, steps: int):
        self.model, self.snapshot = model, snapshot
        self.queue, self.broker_url, self.steps = queue, broker_url, steps
        self.run_ids: list[int] = []

    def current(self):
        from training.models import TrainingRun

        return TrainingRun.objects.filter(pk=self.run_ids[-1]).first() if self.run_ids else None

    def tick(self) -> None:
        """Queue a new run when there is none or the last one ended."""
        from kombu import Connection

        from training import services
        from training.models import TrainingRun
        from training.tasks import run_training

        run = self.current()
        if run is not None and run.status in (
            TrainingRun.Status.QUEUED,
            TrainingRun.Status.RUNNING,
        ):
            return
        run = services.training_run_create(
            recipe="reward",
            config={
                "model_name_or_path": str(self.model),
                "max_steps": self.steps,
                "logging_steps": 10,
                "save_steps": max(10, self.steps // 4),
                "save_total_limit": 1,
                "max_length": 64,
                "per_device_train_batch_size": 8,
                "per_device_eval_batch_size": 8,
                "learning_rate": 1e-3,
            },
            dataset_path=self.snapshot,
            enqueue=False,
        )
        with Connection(self.broker_url) as broker:
            run_training.apply_async(args=(run.pk,), queue=self.queue, connection=broker)
        self.run_ids.append(run.pk)

    def summary(self) -> dict:
        from training.models import TrainingRun

        runs = list(TrainingRun.objects.filter(pk__in=self.run_ids))
        by_status: dict[str, int] = {}
        for run in runs:
            by_status[run.status] = by_status.get(run.status, 0) + 1
        succeeded = [r for r in runs if r.status == TrainingRun.Status.SUCCEEDED]
        return {
            "runs_started": len(runs),
            "runs_by_status": by_status,
            "training_steps_done": sum(
                int(r.current_metrics.get("global_step") or 0) for r in succeeded
            ),
            "failed_errors": [r.error[:300] for r in runs if r.status == "failed"],
        }


def audit(project_id: int, acknowledged: list[int], overlap: int) -> dict:
    from django.db.models import Count

    from annotation.models import Judgment

    judgments = Judgment.objects.filter(project_id=project_id)
    stored = set(judgments.values_list("id", flat=True))
    twice_by_one = (
        judgments.filter(is_repeat=False)
        .values("item_id", "annotator_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    over_overlap = (
        judgments.filter(is_repeat=False, is_gold=False)
        .values("item_id")
        .annotate(n=Count("id"))
        .filter(n__gt=overlap)
        .count()
    )
    return {
        "judgments_stored": len(stored),
        "lost": len(set(acknowledged) - stored),
        "duplicated": len(acknowledged) - len(set(acknowledged)) + twice_by_one + over_overlap,
        "stored_not_acknowledged": len(stored - set(acknowledged)),
    }


# ---- annotator processes -----------------------------------------------------------------


def annotator(
    base_url: str, token: str, project_id: int, kind: str, think: float, deadline: float, seed: int
) -> dict:
    """Label until the deadline (wall clock of this host); return what was seen."""
    from annotation.simulation import PRESETS, ApiClient, decide, default_score

    rng = random.Random(seed)
    api = ApiClient(base_url, token, retries=10)
    statuses: dict[int, int] = {}

    def record(response, *args, **kwargs):
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    api.session.hooks["response"].append(record)
    profile = PRESETS[kind]
    project = api.get(f"/api/projects/{project_id}/").json()
    options = {
        "task_kind": project["task_kind"],
        "choices": ["A", "B"] + (["tie"] if project["allow_tie"] else []),
    }
    out = {
        "next": [],
        "submit": [],
        "acknowledged": [],
        "errors": [],
        "finished": False,
        "paused": False,
    }
    try:
        while time.time() < deadline:
            t0 = time.perf_counter()
            served = api.post(f"/api/projects/{project_id}/next/")
            out["next"].append(time.perf_counter() - t0)
            if served.status_code == 204:
                out["finished"] = True
                break
            if served.status_code == 403 and served.json().get("code") == "paused":
                out["paused"] = True  # quality control stopped this annotator
                break
            if served.status_code != 200:
                out["errors"].append(f"next {served.status_code}: {served.text[:200]}")
                time.sleep(1)
                continue
            payload = served.json()
            body = decide(payload, options, profile, default_score, rng)
            time.sleep(rng.uniform(0.5, 1.5) * think)
            # report a person's time on task (QC pauses the implausibly fast), sleep `think`
            spent = max(0.3, rng.gauss(profile.seconds_per_item, profile.seconds_per_item / 4))
            body.update(idempotency_key=uuid.uuid4().hex, time_spent_ms=int(spent * 1000))
            if rng.random() < 0.3:
                body["confidence"] = rng.randint(1, 5)
            t0 = time.perf_counter()
            submitted = api.post(f"/api/assignments/{payload['assignment_id']}/submit/", body)
            out["submit"].append(time.perf_counter() - t0)
            if submitted.status_code in (200, 201):
                out["acknowledged"].append(submitted.json()["judgment_id"])
            elif submitted.status_code != 409:  # 409: the lease ran out; ask again
                out["errors"].append(f"submit {submitted.status_code}: {submitted.text[:200]}")
    except Exception as exc:  # report, never vanish
        out["errors"].append(repr(exc))
    out["statuses"] = statuses
    out["retries"] = api.retried
    return out


def _annotator_entry(args: tuple, queue) -> None:
    queue.put(annotator(*args))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


# ---- main ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="Length of the soak.")
    parser.add_argument("--annotators", type=int, default=50, help="Simulated annotators.")
    parser.add_argument("--think", type=float, default=1.0, help="Mean seconds per item.")
    parser.add_argument("--items", type=int, default=0, help="Items (0: enough for the soak).")
    parser.add_argument("--overlap", type=int, default=3)
    parser.add_argument(
        "--mix", default=DEFAULT_MIX, help="Annotator kinds, cycled (annotation.simulation)."
    )
    parser.add_argument("--train-steps", type=int, default=200, help="Steps per training run.")
    parser.add_argument("--gunicorn-workers", type=int, default=0, help="0: the config's default.")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    parser.add_argument("--keep", action="store_true", help="Keep the database and the logs.")
    args = parser.parse_args()

    seconds = args.minutes * 60
    n_items = args.items or int(args.annotators * seconds / max(args.think, 0.05) / args.overlap)
    n_items = max(n_items, 100)
    db_name = f"prefloop_soak_{os.getpid()}"
    db_url = f"{PG_URL}/{db_name}"
    work = Path(tempfile.mkdtemp(prefix="prefloop-soak-"))
    redis_port, web_port = free_port(), free_port()
    broker_url = f"redis://127.0.0.1:{redis_port}/0"
    queue = f"soak-{uuid.uuid4().hex[:8]}"
    common_env = {
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DJANGO_DEBUG": "0",
        "DJANGO_LOG_LEVEL": "ERROR",
        "DATABASE_URL": db_url,
        "DB_CONN_MAX_AGE": "60",
        "CELERY_BROKER_URL": broker_url,
        "CELERY_TASK_ALWAYS_EAGER": "0",  # local settings run tasks inline by default
        "PREFLOOP_ARTIFACT_ROOT": str(work / "artifacts"),
        # the tiny base model and snapshot are built beside the artefacts, not inside them
        "PREFLOOP_MODEL_ROOTS": str(work),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    ports = (redis_port, web_port, broker_url)
    print(f"soak: {args.annotators} annotators, {args.minutes:g} min, {n_items} items; {work}")
    psql(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    psql(f'CREATE DATABASE "{db_name}"')
    try:
        return _soak(args, seconds, n_items, db_name, work, common_env, queue, ports)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            psql(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
            shutil.rmtree(work, ignore_errors=True)


def _soak(args, seconds, n_items, db_name, work, common_env, queue, ports) -> int:
    redis_port, web_port, broker_url = ports
    redis = web = worker = cpu_worker = None
    try:
        django_setup(common_env)
        project_id, tokens = prepare_project(n_items, args.annotators, args.overlap)
        model, snapshot = build_training_inputs(work)

        redis = start(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(redis_port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(work),
            ],
            work / "redis.log",
        )
        web_env = {
            **common_env,
            "GUNICORN_BIND": f"127.0.0.1:{web_port}",
            "GUNICORN_LOG_LEVEL": "warning",
        }
        if args.gunicorn_workers:
            web_env["GUNICORN_WORKERS"] = str(args.gunicorn_workers)
        web = start(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                "config/gunicorn.conf.py",
                "--access-logfile",
                str(work / "access.log"),
            ],
            work / "gunicorn.log",
            web_env,
        )
        # as deployed: one worker trains (its own queue), one does light work (QC checks)
        worker = start(celery_worker(queue, "train"), work / "worker.log", common_env)
        cpu_worker = start(celery_worker("default", "cpu"), work / "cpu-worker.log", common_env)
        base_url = f"http://127.0.0.1:{web_port}"

        import requests

        wait_until(lambda: requests.get(base_url + "/admin/login/", timeout=5).ok, 60, "gunicorn")
        trainer = Trainer(
            model=model,
            snapshot=snapshot,
            queue=queue,
            broker_url=broker_url,
            steps=args.train_steps,
        )
        trainer.tick()

        kinds = [k.strip() for k in args.mix.split(",") if k.strip()]
        ctx = mp.get_context("spawn")
        results_queue = ctx.Queue()
        start_time = time.time()
        deadline = start_time + seconds
        procs = [
            ctx.Process(
                target=_annotator_entry,
                args=(
                    (base_url, token, project_id, kinds[i % len(kinds)], args.think, deadline, i),
                    results_queue,
                ),
            )
            for i, token in enumerate(tokens)
        ]
        for proc in procs:
            proc.start()
        results = []
        load: list[float] = []  # the host's 1-minute load average: other work skews latency
        while len(results) < len(procs):
            load.append(os.getloadavg()[0])
            trainer.tick()
            while not results_queue.empty():
                results.append(results_queue.get())
            if time.time() > deadline + 300:
                raise RuntimeError("annotators did not finish 5 minutes after the deadline")
            time.sleep(1)
        elapsed = time.time() - start_time
        for proc in procs:
            proc.join(timeout=30)
        # let the run in flight finish, so none is left half-done
        wait_until(
            lambda: trainer.current().status not in ("queued", "running"), 900, "the last run"
        )
    finally:
        stop(worker)
        stop(cpu_worker)
        stop(web)
        stop(redis)

    acknowledged = [j for r in results for j in r["acknowledged"]]
    statuses: dict[int, int] = {}
    for r in results:
        for status, n in r["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
    figures = {
        "annotators": args.annotators,
        "minutes": round(elapsed / 60, 2),
        "items": n_items,
        "judgments_accepted": len(acknowledged),
        "judgments_per_s": round(len(acknowledged) / elapsed, 2),
        **audit(project_id, acknowledged, args.overlap),
        "http_5xx": sum(n for s, n in statuses.items() if s >= 500),
        "http_statuses": dict(sorted(statuses.items())),
        "client_retries": sum(r["retries"] for r in results),
        "client_errors": sum(len(r["errors"]) for r in results),
        "annotators_out_of_items": sum(r["finished"] for r in results),
        "annotators_paused_by_qc": sum(r["paused"] for r in results),
        "next_p50_ms": round(percentile([x for r in results for x in r["next"]], 0.50), 1),
        "next_p95_ms": round(percentile([x for r in results for x in r["next"]], 0.95), 1),
        "next_p99_ms": round(percentile([x for r in results for x in r["next"]], 0.99), 1),
        "submit_p50_ms": round(percentile([x for r in results for x in r["submit"]], 0.50), 1),
        "submit_p95_ms": round(percentile([x for r in results for x in r["submit"]], 0.95), 1),
        "submit_p99_ms": round(percentile([x for r in results for x in r["submit"]], 0.99), 1),
        **trainer.summary(),
        "host_cpus": os.cpu_count(),
        "host_load_mean": round(sum(load) / max(len(load), 1), 1),
        "host_load_max": round(max(load, default=0.0), 1),
    }
    errors = [e for r in results for e in r["errors"]][:10]
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    if errors:
        print("first client errors:", *errors, sep="\n  ")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    bad = (
        figures["lost"]
        or figures["duplicated"]
        or figures["http_5xx"]
        or figures["runs_by_status"].get("failed", 0)
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
