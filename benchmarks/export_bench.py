"""Export benchmark: 1,000,000 judgments over 300,000 items in PostgreSQL -> TRL JSONL.

Creates its own database, migrates it, bulk-loads prompts, candidates, items, slots and
judgments with COPY, then runs each requested export in a fresh child process (so that the
peak RSS printed is the export's own, from ``resource.getrusage``) and drops the database.

    .venv/bin/python benchmarks/export_bench.py                       # the issue's figures
    .venv/bin/python benchmarks/export_bench.py --judgments 100000 --items 30000 \\
        --aggregations per_judgment majority

Targets (issue #5): under 60 s and under 500 MB peak RSS for the TRL export.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SERVER = "postgres://postgres@127.0.0.1:5432"
WORDS = [
    "the",
    "model",
    "answer",
    "explains",
    "why",
    "a",
    "careful",
    "reader",
    "should",
    "check",
    "each",
    "claim",
    "against",
    "sources",
    "before",
    "trusting",
    "summaries",
    "of",
    "complex",
    "topics",
    "like",
    "climate",
    "policy",
    "economics",
    "or",
    "medicine",
]


def _setup_django(db_name: str, artifacts: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.local"
    os.environ["DATABASE_URL"] = f"{SERVER}/{db_name}"
    os.environ["PREFLOOP_ARTIFACT_ROOT"] = artifacts
    os.environ["DJANGO_DEBUG"] = "0"
    import django

    django.setup()


def _text(rng: random.Random, n_words: int, serial: int) -> str:
    return f"#{serial} " + " ".join(rng.choice(WORDS) for _ in range(n_words))


def load(db_name: str, n_items: int, n_judgments: int, seed: int) -> int:
    """Create and fill the database; return the project id."""
    import psycopg
    from django.core.management import call_command

    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db_name}"')
    call_command("migrate", verbosity=0)
    from annotation.imports import content_hash
    from annotation.models import Project, Round

    project = Project.objects.create(name="export-bench", overlap=4, ask_strength=True)
    round_ = Round.objects.create(project=project, number=1)
    rng = random.Random(seed)
    now = datetime.now(UTC)
    n_annotators = 400
    started = time.perf_counter()
    with psycopg.connect(f"{SERVER}/{db_name}") as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY auth_user (id, password, is_superuser, username, first_name, last_name, "
            "email, is_staff, is_active, date_joined) FROM STDIN"
        ) as copy:
            for uid in range(1, n_annotators + 1):
                copy.write_row(
                    (uid, "!", False, f"bench{uid}", "", "", "", False, True, now)
                )  # fmt: skip
        with cur.copy(
            "COPY annotation_prompt (id, project_id, text, messages, content_hash, group_key, "
            "external_id, created_at) FROM STDIN"
        ) as copy:
            for pid in range(1, n_items + 1):
                text = _text(rng, 14, pid)
                copy.write_row((pid, project.pk, text, None, content_hash(text), "", "", now))
        with cur.copy(
            "COPY annotation_candidate (id, prompt_id, text, content_hash, model_name, "
            "checkpoint_id, generation_config, created_at) FROM STDIN"
        ) as copy:
            for pid in range(1, n_items + 1):
                for j in range(2):
                    text = _text(rng, 28, pid * 2 + j)
                    copy.write_row(
                        (pid * 2 + j, pid, text, content_hash(text), f"m{j}", "", "{}", now)
                    )
        with cur.copy(
            "COPY annotation_item (id, project_id, round_id, prompt_id, is_gold, gold_answer, "
            "n_taken, n_done, external_id, needs_review, created_at) FROM STDIN"
        ) as copy:
            for iid in range(1, n_items + 1):
                copy.write_row((iid, project.pk, round_.pk, iid, False, None, 4, 4, "", False, now))
        with cur.copy(
            "COPY annotation_itemcandidate (id, item_id, candidate_id, position) FROM STDIN"
        ) as copy:
            for iid in range(1, n_items + 1):
                copy.write_row((iid * 2, iid, iid * 2, 0))
                copy.write_row((iid * 2 + 1, iid, iid * 2 + 1, 1))
        with cur.copy(
            "COPY annotation_judgment (id, project_id, item_id, annotator_id, external_rater, "
            "choice, ranking, shown_choice, strength, confidence, rationale, time_spent_ms, "
            "idempotency_key, source, is_gold, is_repeat, qc_flag, created_at) FROM STDIN"
        ) as copy:
            base, extra = divmod(n_judgments, n_items)
            jid = 0
            choices = ["A"] * 55 + ["B"] * 35 + ["tie"] * 6 + ["both_bad"] * 4
            for iid in range(1, n_items + 1):
                votes = base + (1 if iid <= extra else 0)
                for annotator in rng.sample(range(1, n_annotators + 1), votes):
                    jid += 1
                    choice = rng.choice(choices)
                    strength = rng.choice(("slightly", "much")) if choice in "AB" else ""
                    copy.write_row(
                        (jid, project.pk, iid, annotator, "", choice, None, choice, strength,
                         None, "", rng.randint(2000, 60000), "", "human", False, False, "", now)
                    )  # fmt: skip
        for table in ("auth_user", "annotation_prompt", "annotation_candidate", "annotation_item",
                      "annotation_itemcandidate", "annotation_judgment"):  # fmt: skip
            cur.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"(SELECT max(id) FROM {table}))"
            )
        conn.commit()
        conn.autocommit = True
        cur.execute("VACUUM ANALYZE")
    print(
        f"loaded {n_items:,} items, {2 * n_items:,} candidates, {jid:,} judgments "
        f"in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    return project.pk


def export_child(project_id: int, aggregation: str, hf: bool) -> None:
    """Run one export (in a child process) and print its figures as JSON."""
    from annotation.exports import dataset_version_export
    from annotation.models import Project

    project = Project.objects.get(pk=project_id)
    policy = {"format": "trl", "aggregation": aggregation, "ties": "soft", "hf": hf}
    started = time.perf_counter()
    dv = dataset_version_export(project=project, policy=policy, name=f"bench {aggregation}")
    seconds = time.perf_counter() - started
    size = sum(p.stat().st_size for p in Path(dv.path).glob("*.jsonl"))
    print(
        json.dumps(
            {
                "aggregation": aggregation,
                "hf": hf,
                "seconds": round(seconds, 2),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "rows": dv.split_counts,
                "jsonl_mb": round(size / 2**20, 1),
                "votes_used": dv.report["votes_used"],
                "content_hash": dv.content_hash,
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=300_000)
    parser.add_argument("--judgments", type=int, default=1_000_000)
    parser.add_argument("--aggregations", nargs="+", default=["per_judgment", "majority"])
    parser.add_argument("--hf", action="store_true", help="Also write the HF datasets folder.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", default="prefloop_export_bench")
    parser.add_argument("--keep", action="store_true", help="Keep the database afterwards.")
    parser.add_argument("--child", nargs=3, metavar=("PROJECT", "AGGREGATION", "HF"))
    parser.add_argument("--artifacts", default="")
    args = parser.parse_args()

    if args.child:
        _setup_django(args.db, args.artifacts)
        export_child(int(args.child[0]), args.child[1], args.child[2] == "1")
        return

    artifacts = tempfile.mkdtemp(prefix="prefloop-export-bench-")
    _setup_django(args.db, artifacts)
    from django.db import connections

    try:
        project_id = load(args.db, args.items, args.judgments, args.seed)
        connections.close_all()
        for aggregation in args.aggregations:
            cmd = [sys.executable, __file__, "--db", args.db, "--artifacts", artifacts]
            cmd += ["--child", str(project_id), aggregation, "1" if args.hf else "0"]
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if result.returncode:
                print(result.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"export with {aggregation} failed")
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            verdict = figures["seconds"] < 60 and figures["peak_rss_mb"] < 500
            print(
                f"{aggregation:>13}: {figures['seconds']:.1f} s, peak RSS "
                f"{figures['peak_rss_mb']:.0f} MB, rows {figures['rows']}, "
                f"{figures['jsonl_mb']} MB JSONL -> {'OK' if verdict else 'OVER TARGET'}",
                flush=True,
            )
            print(json.dumps(figures), flush=True)
    finally:
        connections.close_all()
        import shutil

        for root, dirs, _ in os.walk(artifacts):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
        shutil.rmtree(artifacts, ignore_errors=True)
        if not args.keep:
            import psycopg

            with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
