"""The serving statements on SQLite, the database `scripts/demo.sh` runs on.

The rest of the suite runs on PostgreSQL; the serving SQL is written per vendor
(`annotation/sql.py`), so the SQLite statements are run here, in a subprocess with the local
settings on a throwaway SQLite file: every item claimed, labelled with the next one served in
the same call, and the last call saying nothing is left.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
from annotation import services
from annotation.models import Judgment
from tests.factories import add_member, make_items, make_project, make_user

project = make_project(overlap=1, gold_rate=0.0, repeat_rate=0.0)
make_items(project, 5)
user = make_user()
add_member(project, user)
served = services.assignment_next(project_id=project.pk, user=user)
seen = []
while served is not None:
    seen.append(served.item_id)
    result = services.judgment_submit(
        assignment_id=served.pk, user=user, choice="A", idempotency_key=str(served.pk),
        serve_next=True,
    )
    served = result.next_assignment
assert len(seen) == len(set(seen)) == 5, seen
assert Judgment.objects.filter(project=project).count() == 5
print("served", len(seen))
"""


def test_items_are_claimed_labelled_and_served_next_on_sqlite(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'serving.sqlite3'}",
        "CELERY_TASK_ALWAYS_EAGER": "1",
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True)
    shell = subprocess.run(
        [*manage, "shell", "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert "served 5" in shell.stdout
