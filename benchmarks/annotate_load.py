"""Load test of the serving loop over HTTP: gunicorn + PostgreSQL, N closed-loop annotators.

Each simulated annotator loops next -> submit (with an idempotency key) until the project is
done or the time budget runs out. Every feature is on: gold items, planned repeats, overlap 3,
leases, permissions, token auth. Prints, for each N: judgments/s, p50/p95 latency of next and
submit, double-serves, lost submits, and server CPU per judgment (from the gunicorn
processes' CPU time over the run).

    .venv/bin/python benchmarks/annotate_load.py --clients 1 5 20 --items 2000 --seconds 30
"""

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_NAME = "prefloop_bench"
DB_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
PORT = 8765
BROKER_URL = "redis://127.0.0.1:6379/7"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _django(db_url: str):
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.local"
    os.environ["DATABASE_URL"] = db_url
    os.environ["DJANGO_DEBUG"] = "0"
    import django

    django.setup()


def prepare(n_items: int, n_clients: int, gold_rate: float, repeat_rate: float) -> tuple[int, list]:
    """Create a fresh project with n_items pairwise items and n_clients annotators."""
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from annotation.imports import items_import
    from annotation.models import Project
    from tests.factories import add_member, make_user

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    project = Project.objects.create(
        name="load",
        overlap=3,
        gold_rate=gold_rate,
        repeat_rate=repeat_rate,
        ask_strength=True,
        ask_confidence=True,
    )
    rng = random.Random(0)
    lines = []
    for i in range(n_items):
        row = {
            "id": f"q{i}",
            "prompt": f"Question {i}: explain topic {rng.randrange(10**9)} briefly.",
            "candidates": [
                {
                    "text": f"Answer one to {i}. " * 20,
                    "model_name": "policy-v1",
                    "generation_config": {"temperature": 0.7, "seed": i},
                },
                {
                    "text": f"Answer two to {i}. " * 25,
                    "model_name": "policy-v0",
                    "generation_config": {"temperature": 0.7, "seed": i},
                },
            ],
        }
        if i < n_items * 0.05:
            row["gold"] = "A"
        lines.append(json.dumps(row))
    import io

    items_import(project=project, stream=io.StringIO("\n".join(lines)))
    tokens = []
    for c in range(n_clients):
        user = make_user(f"annotator{c}")
        add_member(project, user)
        tokens.append(Token.objects.create(user=user).key)
    return project.pk, tokens


def _client(token: str, project_id: int, deadline: float, seed: int, queue) -> None:
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    next_lat, submit_lat, accepted, served, errors = [], [], [], [], 0

    def post(path: str, body: dict | None = None):
        nonlocal conn
        payload = json.dumps(body or {})
        for _ in range(3):
            try:
                conn.request("POST", path, body=payload, headers=headers)
                r = conn.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, ConnectionError, TimeoutError):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        return 599, b""

    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        status, body = post(f"/api/projects/{project_id}/next/")
        next_lat.append(time.perf_counter() - t0)
        if status == 204:
            break
        if status != 200:
            errors += 1
            continue
        aid = json.loads(body)["assignment_id"]
        served.append(aid)
        submit = {
            "choice": rng.choice(["A", "B", "A", "B", "tie"]),
            "idempotency_key": uuid.uuid4().hex,
            "time_spent_ms": rng.randrange(2000, 9000),
            "strength": rng.choice(["slightly", "much"]),
            "confidence": rng.randrange(1, 6),
        }
        t0 = time.perf_counter()
        status, body = post(f"/api/assignments/{aid}/submit/", submit)
        submit_lat.append(time.perf_counter() - t0)
        if status in (200, 201):
            accepted.append(json.loads(body)["judgment_id"])
        else:
            errors += 1
    queue.put({"next": next_lat, "submit": submit_lat, "accepted": accepted, "errors": errors})


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except FileNotFoundError:
            pass
    return total / CLK_TCK


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def run(n_clients: int, args) -> dict:
    subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-qc",
            f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)",
        ],
        check=True,
    )
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {DB_NAME}"],
        check=True,
    )
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        project_id, tokens = pool.apply(
            _prepare_in_child, (args.items, n_clients, args.gold_rate, args.repeat_rate)
        )
    # Quality-control checks are queued to the broker as in production (a worker elsewhere
    # runs them); this measures the web tier, so nothing consumes the queue during the run.
    env = {
        **os.environ,
        "DATABASE_URL": DB_URL,
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DJANGO_DEBUG": "0",
        "DJANGO_LOG_LEVEL": "ERROR",
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "CELERY_BROKER_URL": BROKER_URL,
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi:application",
            "-b",
            f"127.0.0.1:{PORT}",
            "--workers",
            str(args.workers),
            "--worker-class",
            "gthread",
            "--threads",
            "4",
            "--keep-alive",
            "30",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        for _ in range(100):
            try:
                c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=1)
                c.request("GET", "/api/projects/")
                c.getresponse().read()
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(0.5)
        workers = _children(server.pid)
        cpu_before = _cpu_seconds(workers)
        queue = ctx.Queue()
        start = time.perf_counter()
        deadline = start + args.seconds
        procs = [
            ctx.Process(target=_client, args=(t, project_id, deadline, i, queue))
            for i, t in enumerate(tokens)
        ]
        for p in procs:
            p.start()
        results = [queue.get() for _ in procs]
        elapsed = time.perf_counter() - start
        for p in procs:
            p.join()
        cpu = _cpu_seconds(workers) - cpu_before
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    import redis

    redis.Redis.from_url(BROKER_URL).flushdb()
    accepted = [j for r in results for j in r["accepted"]]
    with ctx.Pool(1) as pool:
        audit = pool.apply(_audit_in_child, (accepted,))
    n = len(accepted)
    return {
        "clients": n_clients,
        "judgments": n,
        "judgments_per_s": n / elapsed,
        "next_p50_ms": _pct([x for r in results for x in r["next"]], 0.50),
        "next_p95_ms": _pct([x for r in results for x in r["next"]], 0.95),
        "submit_p50_ms": _pct([x for r in results for x in r["submit"]], 0.50),
        "submit_p95_ms": _pct([x for r in results for x in r["submit"]], 0.95),
        "server_cpu_ms_per_judgment": 1000 * cpu / n if n else float("nan"),
        "errors": sum(r["errors"] for r in results),
        **audit,
    }


def _prepare_in_child(n_items, n_clients, gold_rate, repeat_rate):
    _django(DB_URL)
    return prepare(n_items, n_clients, gold_rate, repeat_rate)


def _audit_in_child(accepted: list[int]) -> dict:
    _django(DB_URL)
    from django.db.models import Count

    from annotation.models import Assignment, Judgment

    stored = set(Judgment.objects.values_list("id", flat=True))
    over_served = (
        Judgment.objects.filter(is_gold=False, is_repeat=False)
        .values("item_id")
        .annotate(n=Count("id"))
        .filter(n__gt=3)
        .count()
    )
    twice = (
        Assignment.objects.exclude(kind="repeat")
        .exclude(status="expired")
        .values("item_id", "annotator_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    return {
        "double_serves": over_served + twice,
        "lost_submits": len(set(accepted) - stored),
        "duplicated_submits": len(accepted) - len(set(accepted)),
        "gold_judgments": Judgment.objects.filter(is_gold=True).count(),
        "repeat_judgments": Judgment.objects.filter(is_repeat=True).count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gold-rate", type=float, default=0.05)
    parser.add_argument("--repeat-rate", type=float, default=0.05)
    args = parser.parse_args()
    print(
        "clients judgments  j/s   next_p50 next_p95 submit_p50 submit_p95 cpu_ms/j "
        "double lost dup errors gold repeats"
    )
    for n in args.clients:
        r = run(n, args)
        print(
            f"{r['clients']:7d} {r['judgments']:9d} {r['judgments_per_s']:5.1f} "
            f"{r['next_p50_ms']:8.1f} {r['next_p95_ms']:8.1f} {r['submit_p50_ms']:10.1f} "
            f"{r['submit_p95_ms']:10.1f} {r['server_cpu_ms_per_judgment']:8.2f} "
            f"{r['double_serves']:6d} {r['lost_submits']:4d} {r['duplicated_submits']:3d} "
            f"{r['errors']:6d} {r['gold_judgments']:4d} {r['repeat_judgments']:7d}",
            flush=True,
        )


if __name__ == "__main__":
    main()
