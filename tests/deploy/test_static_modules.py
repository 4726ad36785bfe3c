"""collectstatic under production settings: ES modules import their siblings by hashed names."""

import json
import os
import posixpath
import re
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPORT = re.compile(r"""\bfrom\s*["']([^"']+)["']""")


def test_hashed_modules_import_their_hashed_siblings(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env |= {
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "DJANGO_ALLOWED_HOSTS": "prefloop.example.org",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_STATIC_ROOT": str(tmp_path),
    }
    collect = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert collect.returncode == 0, collect.stderr
    paths = json.loads((tmp_path / "staticfiles.json").read_text())["paths"]
    # The annotator page and the dashboard's charts are both plain ES modules.
    for folder, entry, min_imports in (
        ("js/annotate/", "js/annotate/main.js", 5),
        ("dashboard/", "dashboard/main.js", 11),
    ):
        modules = {
            name: hashed
            for name, hashed in paths.items()
            if name.startswith(folder) and name.endswith(".js")
        }
        assert entry in modules

        seen = 0
        for hashed in modules.values():
            source = (tmp_path / hashed).read_text()
            for target in IMPORT.findall(source):
                seen += 1
                resolved = posixpath.normpath((Path(hashed).parent / target).as_posix())
                # A hashed (cached for a year) module must not import a name a release reuses.
                assert resolved in modules.values(), f"{hashed} imports {target}"
                assert (tmp_path / resolved).is_file()
        assert seen >= min_imports, folder
