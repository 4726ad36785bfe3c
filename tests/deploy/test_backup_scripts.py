"""scripts/backup.sh and scripts/restore.sh against the real PostgreSQL test server.

A committed project is dumped with the label export beside it; old sets past BACKUP_KEEP
are pruned; the dump is restored into a scratch database, which then holds the project.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from tests.factories import add_member, make_items, make_project, make_user

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(shutil.which("pg_dump") is None, reason="pg_dump is not installed"),
]


def _url(dbname: str) -> str:
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = f"{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}"
    return f"postgres://{user}{password}@{host}/{dbname}"


def _env(database_url: str, **extra) -> dict:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "MANAGE": f"{sys.executable} manage.py",
        **extra,
    }


def _run(args, env, check=True, cwd=ROOT):
    result = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


@pytest.fixture
def scratch_db():
    name = f"prefloop_restore_{os.getpid()}"
    admin = _url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.django_db(transaction=True)
def test_backup_writes_a_checked_set_prunes_old_ones_and_restores(tmp_path, scratch_db):
    # given committed labels and two older backup sets
    project = make_project(name="backed-up project")
    add_member(project, make_user("backup-annotator"))
    make_items(project, 3)
    source_url = _url(connection.settings_dict["NAME"])
    for stamp in ("20200101T000000Z", "20210101T000000Z"):
        for suffix in (".dump", ".labels.jsonl.gz", ".sha256"):
            (tmp_path / f"prefloop-{stamp}{suffix}").write_text("old")

    # when backup.sh runs with a retention of two sets
    _run(["bash", "scripts/backup.sh", str(tmp_path)], _env(source_url, BACKUP_KEEP="2"))

    # then the new set is complete and verified, and only the newest old set is kept
    dumps = sorted(p.name for p in tmp_path.glob("prefloop-*.dump"))
    assert dumps[0] == "prefloop-20210101T000000Z.dump" and len(dumps) == 2
    assert not (tmp_path / "prefloop-20200101T000000Z.sha256").exists()
    new = tmp_path / dumps[1]
    stamp = new.name.removeprefix("prefloop-").removesuffix(".dump")
    labels = tmp_path / f"prefloop-{stamp}.labels.jsonl.gz"
    assert labels.exists() and not list(tmp_path.glob("*.partial*"))
    _run(["sha256sum", "--check", f"prefloop-{stamp}.sha256"], os.environ, cwd=tmp_path)
    assert oct(new.stat().st_mode & 0o777) == "0o600"

    # restore.sh refuses without --yes and touches nothing
    restore_env = _env(_url(scratch_db))
    refused = _run(["bash", "scripts/restore.sh", str(new)], restore_env, check=False)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    with psycopg.connect(_url(scratch_db)) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchone()[0] == 0

    # restore.sh --yes brings the project back into the scratch database
    _run(["bash", "scripts/restore.sh", "--yes", str(new)], restore_env)
    with psycopg.connect(_url(scratch_db)) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM annotation_project")]
        n_items = conn.execute("SELECT count(*) FROM annotation_item").fetchone()[0]
    assert names == ["backed-up project"] and n_items == 3


def test_restore_refuses_a_file_whose_checksum_does_not_match(tmp_path):
    dump = tmp_path / "prefloop-20240101T000000Z.dump"
    dump.write_bytes(b"not the dumped bytes")
    (tmp_path / "prefloop-20240101T000000Z.sha256").write_text(
        f"{'0' * 64}  prefloop-20240101T000000Z.dump\n"
    )
    result = _run(
        ["bash", "scripts/restore.sh", "--yes", str(dump)],
        _env("postgres://nobody@127.0.0.1:1/none"),
        check=False,
    )
    assert result.returncode == 1 and "checksum mismatch" in result.stderr


def test_backup_needs_a_database_url(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    result = _run(["bash", "scripts/backup.sh", str(tmp_path)], env, check=False)
    assert result.returncode == 2 and "DATABASE_URL" in result.stderr
    assert not list(tmp_path.iterdir())
