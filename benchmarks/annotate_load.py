"""Load test of the serving loop over HTTP, as a ratio to the lean reference in the same run.

Both servers run under gunicorn (gthread, 2 workers x 4 threads) on PostgreSQL, each with its
own database, driven by the same closed-loop client processes (one per annotator). With
`--reference`, runs alternate (reference, ours two-call, ours one-round-trip, reference, ...)
and every figure is printed as the median over the repetitions of ours / reference; absolute
figures do not carry over from one machine to the next, the ratio does.

Ours runs as deployed: production settings (a throwaway secret; requests carry the proxy's
`X-Forwarded-Proto: https`), every serving feature on (overlap 3, 5 % gold, 5 % planned
repeats, strength and confidence, leases, permissions, token auth) and quality control: a
real Celery worker consumes the QC checks during the run (at a quarter of web's CPU weight,
as docker-compose.yml runs it), every check queued by the run has run before the CPU is read,
and the worker's CPU counts in "server CPU".
The annotators are machine accounts (group prefloop:simulated, not speed-checked) that
mostly prefer the same answer, so QC has no reason to pause them; the pauses seen are
printed (the calls they refused, the submit a pause overtook among them, are not counted as
failures). Two loops of ours: the classic two calls (next, then submit) and the one round trip
(submit with `"next": true`), which is compared with the reference's two calls: "next" is then
the call that returns the next item. `--profile` adds one cProfile run of our one-round-trip
loop (CPU time per thread in every gunicorn worker thread) and prints the top 15 functions.

    .venv/bin/python benchmarks/annotate_load.py --reference --clients 1 20 --seconds 10 \\
        --repeats 4 --profile

The output also gives, pooled over the runs, the latency of the call that returned the next
item by the kind it was (primary, gold, repeat): annotators must not tell them apart by timing.

Measured 2026-12-06 on a 2-core virtual machine with nothing else running, 2000 items, 10 s per
run, steal 0-6 % (the host's other guests took up to 6 % of the reference's runs: only the
ratios of neighbouring runs mean anything), load average 1.0-6.1 (the benchmark's own
processes). Commit ecf9ded, `--reference --clients 1 20 --seconds 10 --repeats 3 --profile`:

    Median ratios, ours / reference (the reference always runs its two calls; for ours
    one-trip, 'next' is the submit that returns the next item):
      N  ours loop  j/s   next_p50 next_p95 cpu/judgment  load steal failures
       1 two-call   1.90x    0.45x    0.57x      0.48x    1.15    1%  0
       1 one-trip   2.83x    0.56x    0.69x      0.33x    1.34    3%  0
      20 two-call   1.43x    0.69x    0.65x      0.56x    4.63    0%  1
      20 one-trip   2.02x    0.94x    0.88x      0.40x    4.60    0%  0
    Call returning the next item, by the kind served (ours, runs pooled): p50 / p95 ms (n)
     1 two-call  gold 5.0 / 9.0 (149); primary 4.9 / 8.6 (2656); repeat 5.4 / 8.2 (143)
     1 one-trip  gold 6.5 / 11.9 (207); primary 6.5 / 11.5 (3756); repeat 7.4 / 12.8 (202)
    20 two-call  gold 48.5 / 92.4 (288); primary 46.3 / 92.5 (4955); repeat 46.6 / 87.3 (272)
    20 one-trip  gold 67.3 / 109.3 (397); primary 67.5 / 114.4 (6772); repeat 70.8 / 117.4 (364)
    QC: 772 checks run by the worker during the runs; pauses seen: 1 refused calls, 1 paused
    memberships at the end

After this run the repeat claim was changed to look up rounds for a window of the earliest
eligible items only (`annotation.serving.REPEAT_WINDOW`); the figure by kind at N=1 one round
trip then, 2 alternated pairs: primary 5.3 / 8.3 ms (3114), gold 5.4 / 8.3 (162), repeat 5.3 /
8.5 (195), p95 next 0.65x, 2.70x j/s.

The one failure is the submit a QC pause overtook (position bias, the check at the 76th
judgment of one of the 60 simulated annotators of the two-call runs at N=20, 146 in the whole
invocation: each test spends alpha = 0.001 over an annotator's checks, so an annotator who
labels like everyone else is paused with chance at most 0.1 % per test, 0.05 % by the
position test at the default spacing); the pause ends the annotator's lease and the submit on
it is refused.
Such a refusal now counts with the pause's refused calls, not as a failure.

Absolute figures, one round trip: at N=20 ours 223.6-258.5 j/s at 3.80-4.33 ms of server CPU
per judgment (web 2.93-3.28 ms, the rest the QC worker), the reference 113.3-136.0 j/s at
8.96-10.58 ms (pairs 2.02x, 1.64x, 2.24x); PostgreSQL 2.31-2.56 ms per judgment against the
reference's 2.33-2.69 (counted on neither side). At N=1 the p95 of the call that returns the
next item is 8.6-12.6 ms against the reference's 12.4-19.2 ms (pairs 0.83x, 0.66x, 0.69x).
What holds the N=1 tail: an annotator's QC check runs while they go on labelling, and on two
cores it slows the calls that overlap it (a check of an annotator with 54 judgments takes
~15 ms of CPU and ~10 statements): in a run at N=1 the 8 calls after a check was queued had
p50 6.2-7.4 ms and p95 10.4-11.7 ms, the others p50 5.0-5.4 and p95 7.2-7.5 ms, which is
0.55-0.6x of the reference's p95 next. Before the checks were spaced out as an annotator's
count grows (`evaluation.services.qc_check_due`), each read the whole history every 20
judgments (31 ms of CPU at 1,450) and the N=1 p50 grew from 4.0 to 6.4 ms over a run; alone
that change took N=1 one round trip from 2.05x to 2.88x j/s and 0.96x to 0.60x p95 next in
back-to-back 2-pair runs. The invocation before (2026-12-04, commit fd785ca, a machine 1.5x
slower): N=20 1.90x j/s and 0.46x CPU, N=1 0.65x; b7214a9 2.06x and 0.40x, N=1 0.61x;
67215db 2.33x and 0.36x, N=1 0.59x; d410f10 2.41x and 0.34x, N=1 0.52x, 0.58x and 0.63x.
Targets: N=20 one round trip 2.0x j/s and 0.5x CPU: CPU met in every invocation, j/s in four
of five (2.02x in the last); N=1 0.6x p95 next: not met (0.52x-0.69x over six invocations);
0 double serves, lost or duplicated judgments and 0 failed calls in every run but the one
above: met.

Profile (commit ecf9ded; cProfile, thread CPU time of the gunicorn worker threads, 20
annotators one round trip, 1369 judgments), top by own time: model `__init__` 0.43 s (9451
calls), `getattr` 0.33, the gthread worker's queue `get` 0.24 (one per request), `isinstance`
0.24, psycopg `_send_query_prepared` 0.23 (5488 statements), psycopg prepare bookkeeping 0.19,
`setattr` 0.19, `_exec_command` (BEGIN/COMMIT) 0.16, psycopg `wait` 0.16, `dict.get` 0.14,
parameter dumping 0.14, gunicorn header parsing 0.14, `annotation.sql._instance` 0.13, lazy-
object `__getattribute__` 0.12, result selection 0.12.

What got it there (single runs of this script before and after each step): token calls to the
per-item views skip the page middleware and DRF's request objects (`annotation/fastpath.py`;
N=20 CPU 0.68x -> 0.59x); the serving statements are prepared once per connection (planning
cost PostgreSQL more than running them; 0.59x -> 0.52x, and 1.21x -> 1.62x j/s); planned
repeats claimed by a written-out statement (the ORM compiled it in ~10 ms, every 20th item); an
annotator's QC check looks for disputes only on items labelled since their previous check; a
primary item's claim, its lease and its payload read in one statement (5 statements per one-
round-trip judgment instead of 7); QC loads text lengths and skip rates only for the
annotators whose speed and skips it judges, filters out pre-resume labels in SQL and reads the
crowd's items as a subquery; the claims exclude the annotator's past items with one hashed read
of their assignments (the prepared statements' generic plans, made while the assignment table
was nearly empty, had scanned the table once per candidate item: PostgreSQL 7.2 -> 3.4 ms per
judgment at N=20); the database health check needs no round trip (`config/postgres`); overdue
leases are swept every 16 claims instead of on each (4 statements per one-round-trip
judgment); wsgi imports the views and the broker client before the first request, then
`gc.freeze`; QC checks spaced out as an annotator's count grows and reading the policy once;
the repeat claim reads the annotator's repeats by their own partial index.
"""

import argparse
import http.client
import io
import json
import multiprocessing as mp
import os
import pstats
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = (ROOT / ".." / "shared" / "lean-reference").resolve()
sys.path.insert(0, str(ROOT))
CLK_TCK = os.sysconf("SC_CLK_TCK")
HOST = "127.0.0.1"
OURS_PORT, REF_PORT = 8765, 8766
OVERLAP = 3

# Imported by gunicorn (`-c`) in the profiled run: a CPU-time profiler per worker thread,
# started once the worker has warmed up (lazy imports, URL resolver) and written out at exit.
GUNICORN_PROFILE_CONF = """
import cProfile, itertools, os, threading, time
_profiles = []
_local = threading.local()
_seen = itertools.count()
def pre_request(worker, req):
    if next(_seen) >= 20 and getattr(_local, "profile", None) is None:
        _local.profile = cProfile.Profile(time.thread_time)
        _profiles.append(_local.profile)
        _local.profile.enable()
def worker_exit(server, worker):
    for n, profile in enumerate(_profiles):
        profile.create_stats()
        profile.dump_stats(os.path.join(os.environ["PROFILE_DIR"], f"{os.getpid()}-{n}.prof"))
"""


def _psql(sql: str, db: str = "postgres") -> None:
    subprocess.run(["psql", "-h", HOST, "-U", "postgres", "-d", db, "-qc", sql], check=True)


def _recreate_db(name: str) -> None:
    _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _psql(f"CREATE DATABASE {name}")


def _our_env(args) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "DJANGO_SECRET_KEY": args.secret,
        "DJANGO_ALLOWED_HOSTS": HOST,
        "DATABASE_URL": f"postgres://postgres@{HOST}:5432/{args.db}",
        "CELERY_BROKER_URL": args.broker,
        "DJANGO_CACHE_URL": args.broker,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "DJANGO_LOG_LEVEL": "WARNING",
    }


# ---------- preparing the two servers' data ----------


def _candidate_text(i: int, better: bool, rng: random.Random) -> str:
    # The simulated annotators prefer the answer marked "Answer one" (gold agrees with them).
    words = " ".join(rng.choice(("lorem", "ipsum", "dolor", "sit", "amet")) for _ in range(150))
    return f"Answer {'one' if better else 'two'} to {i}. {words}"


def _prepare_ours(n_items: int, n_clients: int, gold_rate: float, repeat_rate: float) -> tuple:
    """Create a fresh project with n_items pairwise items and n_clients machine annotators."""
    import django

    django.setup()
    from django.core.management import call_command

    from annotation import services
    from annotation.imports import items_import
    from annotation.models import LabelSource, Project

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    project = Project.objects.create(
        name="load",
        overlap=OVERLAP,
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
                    "text": _candidate_text(i, True, rng),
                    "model_name": "policy-v1",
                    "generation_config": {"temperature": 0.7, "seed": i},
                },
                {
                    "text": _candidate_text(i, False, rng),
                    "model_name": "policy-v0",
                    "generation_config": {"temperature": 0.7, "seed": i},
                },
            ],
        }
        if i < n_items * 0.05:
            row["gold"] = "A"
        lines.append(json.dumps(row))
    items_import(project=project, stream=io.StringIO("\n".join(lines)))
    tokens = [
        services.simulated_annotator_ensure(
            project=project, username=f"sim{c}", source=LabelSource.SIMULATED
        )
        for c in range(n_clients)
    ]
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return project.pk, tokens


def _prepare_ours_in_child(env: dict, *args) -> tuple:
    os.environ.update(env)
    return _prepare_ours(*args)


def _audit_ours_in_child(env: dict, accepted: list[int], served: list[int]) -> dict:
    os.environ.update(env)
    import django

    django.setup()
    from django.db.models import Count

    from annotation.models import Assignment, Judgment, Membership
    from evaluation.models import AnnotatorAssessment

    stored = set(Judgment.objects.values_list("id", flat=True))
    over_served = (
        Judgment.objects.filter(is_gold=False, is_repeat=False)
        .values("item_id")
        .annotate(n=Count("id"))
        .filter(n__gt=OVERLAP)
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
        "lost": len(set(accepted) - stored),
        "duplicated": len(accepted) - len(set(accepted)),
        "paused_members": Membership.objects.filter(status=Membership.Status.PAUSED).count(),
        "qc_checks": AnnotatorAssessment.objects.count(),
        "gold": Judgment.objects.filter(is_gold=True).count(),
        "repeats": Judgment.objects.filter(is_repeat=True).count(),
        # Which QC checks paused a simulated annotator, and after how many judgments.
        "pause_checks": [
            f"{','.join(a.failed_checks)}@{a.n_judgments}"
            for a in AnnotatorAssessment.objects.filter(verdict="pause", applied=True)
        ],
        # The kind of each assignment served, for the timing by kind (never shown to them).
        "kinds": dict(Assignment.objects.filter(pk__in=served).values_list("pk", "kind")),
    }


def _reference_env(args) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return {**env, "LEAN_DB_NAME": args.reference_db}


def _prepare_reference(args, n_clients: int) -> tuple:
    env = _reference_env(args)
    manage = [sys.executable, "manage.py"]
    settings = "--settings=ceiling.settings"
    subprocess.run([*manage, "migrate", "-v", "0", settings], cwd=REFERENCE, env=env, check=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [
                *manage,
                "seed",
                "--reset",
                "--items",
                str(args.items),
                "--users",
                str(n_clients),
                "--tokens-out",
                out.name,
                settings,
            ],
            cwd=REFERENCE,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return 1, json.loads(Path(out.name).read_text())


def _audit_reference(args, accepted: list[int]) -> dict:
    import psycopg

    with psycopg.connect(host=HOST, user="postgres", dbname=args.reference_db) as conn:
        stored = {row[0] for row in conn.execute("SELECT id FROM app_judgment")}
        over = conn.execute(
            "SELECT COUNT(*) FROM (SELECT a.item_id FROM app_judgment j JOIN app_assignment a "
            "ON a.id = j.assignment_id GROUP BY a.item_id HAVING COUNT(*) > %s) x",
            [OVERLAP],
        ).fetchone()[0]
    return {
        "double_serves": over,
        "lost": len(set(accepted) - stored),
        "duplicated": len(accepted) - len(set(accepted)),
        "paused_members": 0,
        "qc_checks": 0,
        "gold": 0,
        "repeats": 0,
        "pause_checks": [],
        "kinds": {},
    }


# ---------- the client ----------


def _choose(payload: dict, rng: random.Random) -> str:
    """Prefer the better answer 9 times in 10, as a careful annotator would."""
    marked = [c["slot"] for c in payload["candidates"] if c["text"].startswith("Answer one")]
    better = marked[0] if marked else rng.choice("AB")  # the reference's texts are unmarked
    draw = rng.random()
    if draw < 0.9:
        return better
    return "tie" if draw < 0.95 else ("B" if better == "A" else "A")


def _client(token: str, project_id: int, deadline: float, seed: int, port: int, loop: str, queue):
    """Label until the deadline; `loop` is "two-call" (next, submit) or "one-trip"."""
    rng = random.Random(seed)
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    headers = {
        "Authorization": f"Token {token}",
        "Content-Type": "application/json",
        # Our production settings redirect plain HTTP; the proxy in front says it was TLS.
        "X-Forwarded-Proto": "https",
    }
    next_lat, submit_lat, accepted, errors, paused = [], [], [], 0, 0
    served = []  # the assignment each `next_lat` call returned (None: none)

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
                conn = http.client.HTTPConnection(HOST, port, timeout=60)
        return 599, b""

    def fetch_next():
        nonlocal errors, paused
        t0 = time.perf_counter()
        status, body = post(f"/api/projects/{project_id}/next/")
        next_lat.append(time.perf_counter() - t0)
        if status == 200:
            payload = json.loads(body)
            served.append(payload["assignment_id"])
            return payload
        served.append(None)
        if status == 403 and b"paused" in body:
            paused += 1
        elif status != 204:
            errors += 1
        return None

    payload = fetch_next()
    while payload is not None and time.perf_counter() < deadline:
        submit = {
            "choice": _choose(payload, rng),
            "idempotency_key": uuid.uuid4().hex,
            "time_spent_ms": rng.randrange(2000, 9000),
            "strength": rng.choice(["slightly", "much"]),
            "confidence": rng.randrange(1, 6),
        }
        if loop == "one-trip":
            submit["next"] = True
        t0 = time.perf_counter()
        status, body = post(f"/api/assignments/{payload['assignment_id']}/submit/", submit)
        elapsed = time.perf_counter() - t0
        if status not in (200, 201):
            refused_before = paused
            payload = fetch_next()
            # A QC pause ends the annotator's live lease (`evaluation.services.annotator_pause`):
            # the submit it overtook is refused with it, a refused call of the pause.
            if paused > refused_before:
                paused += 1
            else:
                errors += 1
            continue
        answer = json.loads(body)
        accepted.append(answer["judgment_id"])
        if loop == "one-trip":
            next_lat.append(elapsed)
            payload = answer["next"]
            served.append(payload and payload["assignment_id"])
            if payload is None and answer.get("next_error", {}).get("code") == "paused":
                paused += 1
        else:
            submit_lat.append(elapsed)
            payload = fetch_next()
    queue.put(
        {
            "next": next_lat,
            "served": served,
            "submit": submit_lat,
            "accepted": accepted,
            "errors": errors,
            "paused": paused,
        }
    )


# ---------- one run ----------


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except FileNotFoundError:
            pass
    return total / CLK_TCK


def _cpu_ticks() -> tuple[int, int]:
    """(all, stolen) CPU ticks of the machine: a virtual machine's host may take its CPUs."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[7]


def _postgres_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _tree(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return [pid] + [p for c in children for p in _tree(c)]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def _wait_for(port: int) -> None:
    for _ in range(150):
        try:
            c = http.client.HTTPConnection(HOST, port, timeout=1)
            c.request("GET", "/", headers={"X-Forwarded-Proto": "https"})
            c.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the server on port {port} did not start")


def _wait_for_queue(broker: str, queue: str) -> None:
    """Wait (up to a minute) until the broker holds no message of the queue."""
    import redis

    client = redis.Redis.from_url(broker)
    for _ in range(120):
        if client.llen(queue) == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the {queue} queue did not drain within a minute")


def _wait_until_idle(counted: list) -> None:
    """Wait until the server processes stop using CPU: gunicorn's second worker and the
    Celery worker boot after the first answer, and their start-up is not serving cost."""
    quiet = 0
    for _ in range(60):
        pids = [p for proc in counted for p in _tree(proc.pid)]
        before = _cpu_seconds(pids)
        time.sleep(0.5)
        quiet = quiet + 1 if _cpu_seconds(pids) - before < 0.03 else 0
        if quiet >= 2:
            return


def _gunicorn(app: str, port: int, workers: int, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        app,
        "-b",
        f"{HOST}:{port}",
        "--workers",
        str(workers),
        "--worker-class",
        "gthread",
        "--threads",
        "4",
        "--keep-alive",
        "30",
        "--log-level",
        "warning",
        *extra,
    ]


def run(*, server: str, loop: str, n_clients: int, args, profile_dir: str = "") -> dict:
    """Start one server on fresh data, run the clients for args.seconds, stop, audit."""
    ctx = mp.get_context("spawn")
    procs_to_stop = []
    if server == "reference":
        project_id, tokens = _prepare_reference(args, n_clients)
        port = REF_PORT
        web = subprocess.Popen(
            _gunicorn("ceiling.wsgi:application", port, args.workers, ["--chdir", str(REFERENCE)]),
            cwd=REFERENCE,
            env=_reference_env(args),
        )
        procs_to_stop.append(web)
        counted = [web]
    else:
        env = _our_env(args)
        _recreate_db(args.db)
        with ctx.Pool(1) as pool:
            project_id, tokens = pool.apply(
                _prepare_ours_in_child,
                (env, args.items, n_clients, args.gold_rate, args.repeat_rate),
            )
        import redis

        redis.Redis.from_url(args.broker).flushdb()
        port = OURS_PORT
        extra = []
        if profile_dir:
            conf = Path(profile_dir) / "gunicorn_profile.py"
            conf.write_text(GUNICORN_PROFILE_CONF)
            extra = ["-c", str(conf)]
            env = {**env, "PROFILE_DIR": profile_dir}
        web = subprocess.Popen(
            _gunicorn("config.wsgi:application", port, args.workers, extra), cwd=ROOT, env=env
        )
        worker = subprocess.Popen(
            [
                # As deployed: docker-compose.yml gives the worker a quarter of web's CPU
                # weight (cpu_shares 256 of 1024); nice 6 is the same weight here (272).
                "nice",
                "-n",
                "6",
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                "default",
                "--pool",
                "solo",
                "--loglevel",
                "WARNING",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        procs_to_stop += [web, worker]
        counted = [web, worker]
    try:
        _wait_for(port)
        _wait_until_idle(counted)
        pids = [p for proc in counted for p in _tree(proc.pid)]
        web_pids = _tree(web.pid)
        cpu_before = _cpu_seconds(pids)
        web_before = _cpu_seconds(web_pids)
        pg_before = _cpu_seconds(_postgres_pids())
        ticks_before = _cpu_ticks()
        load_before = os.getloadavg()[0]
        queue = ctx.Queue()
        start = time.perf_counter()
        deadline = start + args.seconds
        clients = [
            ctx.Process(target=_client, args=(t, project_id, deadline, i, port, loop, queue))
            for i, t in enumerate(tokens)
        ]
        for c in clients:
            c.start()
        # A client that died puts nothing: wait at most a minute past the deadline.
        results = [queue.get(timeout=args.seconds + 60) for _ in clients]
        elapsed = time.perf_counter() - start
        for c in clients:
            c.join()
        if server == "ours":
            # The QC checks queued during the run are part of the cost: wait until the queue
            # is empty and the worker idle (and at least --drain seconds).
            time.sleep(args.drain)
            _wait_for_queue(args.broker, "default")
            _wait_until_idle([worker])
        cpu = _cpu_seconds(pids) - cpu_before
        web_cpu = _cpu_seconds(web_pids) - web_before
        pg_cpu = _cpu_seconds(_postgres_pids()) - pg_before
        ticks_after = _cpu_ticks()
        stolen = (ticks_after[1] - ticks_before[1]) / max(1, ticks_after[0] - ticks_before[0])
        load_after = os.getloadavg()[0]
    finally:
        for proc in procs_to_stop:
            proc.send_signal(signal.SIGTERM)
        for proc in procs_to_stop:
            proc.wait(timeout=60)
    accepted = [j for r in results for j in r["accepted"]]
    if server == "reference":
        audit = _audit_reference(args, accepted)
    else:
        with ctx.Pool(1) as pool:
            served = [a for r in results for a in r["served"] if a is not None]
            audit = pool.apply(_audit_ours_in_child, (_our_env(args), accepted, served))
    n = len(accepted)
    nexts = [x for r in results for x in r["next"]]
    by_kind: dict[str, list[float]] = {}
    for r in results:
        for took, assignment_id in zip(r["next"], r["served"], strict=True):
            kind = audit["kinds"].get(assignment_id)
            if kind is not None:
                by_kind.setdefault(kind, []).append(took)
    submits = [x for r in results for x in r["submit"]]
    return {
        "server": server,
        "loop": loop,
        "clients": n_clients,
        "judgments": n,
        "jps": n / elapsed,
        "next_p50": _pct(nexts, 0.50),
        "next_p95": _pct(nexts, 0.95),
        "submit_p95": _pct(submits, 0.95),
        "cpu_ms": 1000 * cpu / n if n else float("nan"),
        # Parts, for reading only: the web server's share (the rest is the QC worker), and
        # PostgreSQL's CPU, which no figure of either server counts.
        "web_ms": 1000 * web_cpu / n if n else float("nan"),
        "pg_ms": 1000 * pg_cpu / n if n else float("nan"),
        "errors": sum(r["errors"] for r in results),
        "paused_seen": sum(r["paused"] for r in results),
        "load": (load_before + load_after) / 2,
        "steal": stolen,
        "by_kind": by_kind,
        **{k: v for k, v in audit.items() if k != "kinds"},
    }


def _print_row(r: dict) -> None:
    print(
        f"  {r['server']:9s} {r['loop']:8s} {r['clients']:3d} {r['judgments']:6d} "
        f"{r['jps']:6.1f} {r['next_p50']:7.1f} {r['next_p95']:7.1f} {r['submit_p95']:7.1f} "
        f"{r['cpu_ms']:7.2f} {r['web_ms']:6.2f} {r['pg_ms']:6.2f} "
        f"{r['double_serves']:4d} {r['lost']:4d} {r['duplicated']:3d} "
        f"{r['errors']:4d} {r['paused_seen']:4d}/{r['paused_members']:<3d} {r['qc_checks']:3d} "
        f"{r['load']:5.2f} {100 * r['steal']:4.0f}% {' '.join(r['pause_checks'])}",
        flush=True,
    )


def _ratios(ours: list[dict], refs: list[dict]) -> dict:
    """Median over the repetitions of ours / reference (paired run by run)."""

    def median_ratio(key):
        return statistics.median(o[key] / r[key] for o, r in zip(ours, refs, strict=True))

    return {key: median_ratio(key) for key in ("jps", "next_p50", "next_p95", "cpu_ms")}


def _print_timing_by_kind(summary: list) -> None:
    """Latency of the call that returned the next item, by the kind it was: annotators must
    not tell gold or repeats from primary items by how long the next item takes."""
    print("Call returning the next item, by the kind served (ours, runs pooled): p50 / p95 ms (n)")
    for n, loop, _, rows in summary:
        pooled: dict[str, list[float]] = {}
        for r in rows:
            for kind, values in r["by_kind"].items():
                pooled.setdefault(kind, []).extend(values)
        parts = [
            f"{kind} {_pct(values, 0.5):.1f} / {_pct(values, 0.95):.1f} ({len(values)})"
            for kind, values in sorted(pooled.items())
        ]
        print(f"  {n:2d} {loop:9s} " + "; ".join(parts))


def profile_run(n_clients: int, args) -> None:
    """Run our one-round-trip loop once under cProfile and print the top 15 by CPU."""
    with tempfile.TemporaryDirectory() as folder:
        r = run(server="ours", loop="one-trip", n_clients=n_clients, args=args, profile_dir=folder)
        files = sorted(str(p) for p in Path(folder).glob("*.prof"))
        stats = pstats.Stats(*files, stream=sys.stdout)
    print(
        f"\nProfile: ours one-trip, {n_clients} annotators, {r['judgments']} judgments "
        f"(CPU time of every gunicorn worker thread; the QC worker is not profiled):"
    )
    stats.sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--repeats", type=int, default=2, help="alternated runs per figure")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gold-rate", type=float, default=0.05)
    parser.add_argument("--repeat-rate", type=float, default=0.05)
    parser.add_argument("--reference", action="store_true", help="run the lean reference too")
    parser.add_argument("--loops", nargs="+", default=["two-call", "one-trip"])
    parser.add_argument("--profile", action="store_true", help="add one profiled run")
    parser.add_argument("--db", default="prefloop_bench_load")
    parser.add_argument("--reference-db", default="lean_reference_bench")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--drain", type=float, default=2.0, help="seconds for QC to finish")
    args = parser.parse_args()
    # A throwaway secret: nothing signed with it outlives the benchmark.
    args.secret = secrets.token_urlsafe(50)
    if args.reference:
        _recreate_db(args.reference_db)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        "  server    loop     N  judgm    j/s  next50  next95 subm95  cpu_ms web_ms  pg_ms "
        " dbl lost dup errs paused(seen/members) qc load steal pauses(checks@judgments)"
    )
    summary = []
    for n in args.clients:
        refs, ours = [], {loop: [] for loop in args.loops}
        for _ in range(args.repeats):
            if args.reference:
                refs.append(run(server="reference", loop="two-call", n_clients=n, args=args))
                _print_row(refs[-1])
            for loop in args.loops:
                ours[loop].append(run(server="ours", loop=loop, n_clients=n, args=args))
                _print_row(ours[loop][-1])
        if args.reference:
            for loop in args.loops:
                summary.append((n, loop, _ratios(ours[loop], refs), ours[loop]))
    if summary:
        print(
            "\nMedian ratios, ours / reference (the reference always runs its two calls; for "
            "ours one-trip, 'next' is the submit that returns the next item):"
        )
        print("  N  ours loop  j/s   next_p50 next_p95 cpu/judgment  load steal failures")
        for n, loop, ratio, rows in summary:
            bad = sum(r["double_serves"] + r["lost"] + r["duplicated"] + r["errors"] for r in rows)
            load = statistics.median(r["load"] for r in rows)
            steal = statistics.median(r["steal"] for r in rows)
            print(
                f"  {n:2d} {loop:9s} {ratio['jps']:5.2f}x {ratio['next_p50']:7.2f}x "
                f"{ratio['next_p95']:7.2f}x {ratio['cpu_ms']:9.2f}x   {load:5.2f} "
                f"{100 * steal:4.0f}%  {bad}"
            )
        _print_timing_by_kind(summary)
        pauses = sum(r["paused_seen"] for *_, rows in summary for r in rows)
        members = sum(r["paused_members"] for *_, rows in summary for r in rows)
        checks = sum(r["qc_checks"] for *_, rows in summary for r in rows)
        print(
            f"QC: {checks} checks run by the worker during the runs; pauses seen: {pauses} "
            f"refused calls, {members} paused memberships at the end"
        )
    if args.profile:
        profile_run(max(args.clients), args)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
