"""docker-compose.yml, Dockerfile, .dockerignore and .env.example, checked without Docker.

No Docker engine runs here, so the files are parsed and checked against the project: the
compose file against the Compose Specification JSON schema (tests/deploy/compose_spec.json,
the schema docker-compose 1.29.2 ships, Apache-2.0), every command against the modules and
files it names, every variable against .env.example, and the Dockerfile's stages, user,
COPY sources and health check.
"""

import ast
import importlib
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from celery import Celery
from celery.app.utils import find_app
from django.conf import settings
from django.core.management import get_commands
from kombu.utils.imports import symbol_by_name

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
SCHEMA = json.loads((Path(__file__).with_name("compose_spec.json")).read_text())
ARTIFACT_MOUNT = "/var/lib/prefloop/artifacts"
APP_SERVICES = ("migrate", "web", "worker-gpu", "worker-cpu", "beat")
SECRETISH = re.compile(r"(^|_)(SECRET|PASSWORD|TOKEN|PRIVATE_KEY|API_KEY)(_|$)", re.I)


# --- helpers ---------------------------------------------------------------------------
def _command(service: dict) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _env_example() -> dict[str, dict]:
    """Return NAME -> {"value", "commented"} for every `NAME=` or `# NAME=` line."""
    names = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.match(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$", line)
        if match:
            assert match[2] not in names, f".env.example lists {match[2]} twice"
            names[match[2]] = {"value": match[3], "commented": bool(match[1])}
    return names


def _settings_env_vars() -> set[str]:
    """Return every environment variable read under config/ (env(...), env.int(...), ...)."""
    readers = {"env", "_required", "getenv"}
    found = set()
    for path in (ROOT / "config").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.value.id
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                else None
            )
            # env.str(...), os.environ.get(...), os.environ.setdefault(...), os.getenv(...)
            environ = (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Attribute)
                and func.value.attr == "environ"
            )
            if name not in readers and not environ and getattr(func, "attr", "") != "getenv":
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and re.fullmatch(r"[A-Z][A-Z0-9_]*", str(arg.value)):
                found.add(arg.value)
    return found


def _compose_variables() -> set[str]:
    text = (ROOT / "docker-compose.yml").read_text()
    text = text.replace("$$", "")  # escaped dollars reach the container's shell, not compose
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text)) | set(
        re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", text)
    )


def _dockerfile() -> list[tuple[str, str]]:
    """Return (INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions, current = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, "Dockerfile ends inside a continued line"
    return instructions


def _stages() -> list[dict]:
    """Return the Dockerfile's stages: name, base and instructions."""
    stages = []
    for keyword, rest in _dockerfile():
        if keyword == "FROM":
            parts = rest.split()
            parts = [p for p in parts if not p.startswith("--platform")]
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append({"name": name, "base": parts[0], "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((keyword, rest))
    return stages


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# --- compose: structure ------------------------------------------------------------------
def test_compose_file_matches_the_compose_specification():
    validator = jsonschema.Draft201909Validator(SCHEMA)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(COMPOSE)]
    assert not errors, errors
    # The schema is not vacuous: a misspelt key is caught.
    broken = {"services": {"web": {"image": "x", "helthcheck": {}}}}
    assert list(validator.iter_errors(broken))


def test_the_stack_has_every_service():
    assert set(SERVICES) >= {*APP_SERVICES, "db", "redis"}
    assert SERVICES["db"]["image"].split(":")[0] == "postgres"
    assert SERVICES["db"]["image"].split(":")[1].split("-")[0] in {"15", "16"}
    assert SERVICES["redis"]["image"].split(":")[1].startswith("7")


def test_every_long_running_service_has_a_health_check():
    for name, service in SERVICES.items():
        if service.get("restart") in ("no", None) or service.get("profiles"):
            continue
        check = service.get("healthcheck") or {}
        assert not check.get("disable"), name
        assert check.get("test"), f"{name} has no health check"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_depends_on_names_real_services_with_the_right_condition():
    for name, service in SERVICES.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: use the long depends_on form with conditions"
        for target, spec in depends.items():
            assert target in SERVICES, f"{name} depends on unknown service {target}"
            condition = spec["condition"]
            if condition == "service_healthy":
                assert SERVICES[target].get("healthcheck", {}).get("test"), (name, target)
            elif condition == "service_completed_successfully":
                assert SERVICES[target].get("restart") == "no", (name, target)
            else:
                pytest.fail(f"{name} -> {target}: wait for health or completion, not {condition}")
    for name in APP_SERVICES:
        depends = SERVICES[name]["depends_on"]
        assert depends["db"]["condition"] == "service_healthy", name
    for name in ("web", "worker-gpu", "worker-cpu", "beat"):
        depends = SERVICES[name]["depends_on"]
        assert depends["redis"]["condition"] == "service_healthy", name
        assert depends["migrate"]["condition"] == "service_completed_successfully", name


def test_every_volume_is_declared_and_used():
    declared = set(COMPOSE.get("volumes") or {})
    used = set()
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            if source.startswith((".", "/", "~")):
                pytest.fail(f"{name} bind-mounts {source}; use a named volume")
            assert source in declared, f"{name} uses undeclared volume {source}"
            used.add(source)
    assert used == declared, f"declared but unused: {declared - used}"
    db_mounts = [v.split(":")[1] for v in SERVICES["db"]["volumes"]]
    assert "/var/lib/postgresql/data" in db_mounts


def test_artefacts_are_on_a_named_volume_where_the_settings_look():
    for name in ("web", "worker-gpu", "worker-cpu"):
        service = SERVICES[name]
        assert service["environment"]["PREFLOOP_ARTIFACT_ROOT"] == ARTIFACT_MOUNT, name
        assert f"artifacts:{ARTIFACT_MOUNT}" in service["volumes"], name


# --- compose: commands name real things --------------------------------------------------
@pytest.mark.filterwarnings("ignore:No directory at")  # whitenoise: static not collected here
def test_web_runs_gunicorn_with_our_config_and_wsgi_app():
    argv = _command(SERVICES["web"])
    assert argv[0] == "gunicorn"
    conf = ROOT / _option(argv, "--config", "-c")
    assert conf.is_file()
    namespace = {"__file__": str(conf)}
    exec(compile(conf.read_text(), str(conf), "exec"), namespace)  # as gunicorn loads it
    module_name, _, attr = namespace["wsgi_app"].partition(":")
    assert module_name == "config.wsgi"
    assert callable(getattr(importlib.import_module(module_name), attr))
    assert namespace["raw_env"][0].startswith("DJANGO_SETTINGS_MODULE=config.settings.")


def test_gunicorn_accepts_the_config_file():
    from gunicorn.config import Config

    # What gunicorn does with a config file: run it, then validate each known setting.
    path = ROOT / "config" / "gunicorn.conf.py"
    namespace = {"__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    config = Config()
    for key, value in namespace.items():
        if key in config.settings:
            config.set(key, value)
    assert config.worker_class_str == "gthread"
    assert config.wsgi_app == "config.wsgi:application"
    assert config.accesslog == "-" and config.timeout >= 30
    assert config.address and config.workers >= 1


def test_migrate_and_backup_commands_exist():
    argv = _command(SERVICES["migrate"])
    assert argv[:3] == ["python", "manage.py", "migrate"] and (ROOT / "manage.py").is_file()
    assert "migrate" in get_commands() and "export_all_labels" in get_commands()
    script = ROOT / _command(SERVICES["backup"])[0]
    assert script.is_file() and script.stat().st_mode & 0o111, f"{script} is not executable"


def test_celery_services_load_our_app_and_consume_every_queue():
    queues = {q.name for q in settings.CELERY_TASK_QUEUES}
    consumed = {}
    for name, service in SERVICES.items():
        argv = _command(service)
        if not argv or argv[0] != "celery":
            continue
        app_name = _option(argv, "-A", "--app")
        assert app_name == "config", name
        assert isinstance(find_app(app_name), Celery), name
        if "worker" in argv:
            worker_queues = _option(argv, "-Q", "--queues").split(",")
            assert set(worker_queues) <= queues, f"{name} consumes unknown queues"
            consumed[name] = worker_queues
    # Every queue the settings route to has a worker.
    assert {q for qs in consumed.values() for q in qs} == queues
    assert consumed["worker-cpu"] == ["default"]


def test_gpu_worker_takes_one_gpu_job_at_a_time_from_the_gpu_queue_only():
    service = SERVICES["worker-gpu"]
    argv = _command(service)
    assert _option(argv, "-Q", "--queues") == "gpu"
    assert _option(argv, "-c", "--concurrency") == "1"
    assert _option(argv, "--prefetch-multiplier") == "1"
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    # Its image carries a CUDA build of torch, via the Dockerfile's build argument.
    build_args = service["build"]["args"]
    assert "TORCH_INDEX_URL" in build_args
    assert re.search(r"/cu\d+", build_args["TORCH_INDEX_URL"])
    assert service["image"] != SERVICES["web"]["image"]


def test_beat_runs_once_with_the_database_scheduler():
    beats = [n for n, s in SERVICES.items() if "beat" in _command(s)]
    assert beats == ["beat"]
    argv = _command(SERVICES["beat"])
    scheduler = _option(argv, "--scheduler", "-S")
    assert scheduler == settings.CELERY_BEAT_SCHEDULER
    assert symbol_by_name(scheduler).__name__ == "DatabaseScheduler"


# --- environment -------------------------------------------------------------------------
def test_every_variable_the_settings_read_is_in_env_example():
    read = _settings_env_vars()
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "CELERY_VISIBILITY_TIMEOUT"} <= read
    missing = read - set(_env_example())
    assert not missing, f"add to .env.example: {sorted(missing)}"


def test_every_compose_variable_is_in_env_example():
    missing = _compose_variables() - set(_env_example())
    assert not missing, f"add to .env.example: {sorted(missing)}"


def test_required_variables_are_set_not_commented_out():
    example = _env_example()
    required = {"DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DATABASE_URL", "POSTGRES_PASSWORD"}
    required |= set(re.findall(r"\$\{(\w+):\?", (ROOT / "docker-compose.yml").read_text()))
    for name in required:
        assert not example[name]["commented"], name
    # Secrets are placeholders, never real values.
    for name, entry in example.items():
        if SECRETISH.search(name) and not entry["commented"]:
            assert "CHANGE_ME" in entry["value"], name
    assert "CHANGE_ME" in example["DATABASE_URL"]["value"]


def test_app_services_read_the_env_file_and_use_production_settings():
    for name in APP_SERVICES:
        service = SERVICES[name]
        assert service["env_file"] in (".env", [".env"]), name
        assert service["environment"]["DJANGO_SETTINGS_MODULE"] == "config.settings.production"


# --- Dockerfile --------------------------------------------------------------------------
def test_dockerfile_is_multi_stage_with_a_slim_runtime():
    stages = _stages()
    names = [s["name"] for s in stages]
    assert len(stages) >= 2 and "builder" in names and names[-1] == "runtime"
    args = {rest.split("=")[0] for kw, rest in _dockerfile() if kw == "ARG"}
    image = next(r for kw, r in _dockerfile() if kw == "ARG" and r.startswith("PYTHON_IMAGE="))
    assert "slim" in image
    assert "TORCH_INDEX_URL" in args
    for service in SERVICES.values():
        build = service.get("build")
        if isinstance(build, dict):
            assert build.get("target") in names
            assert set(build.get("args", {})) <= args


def test_dockerfile_runs_as_a_non_root_user():
    runtime = _stages()[-1]
    users = [rest for kw, rest in runtime["instructions"] if kw == "USER"]
    assert users, "the runtime stage sets no USER"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_dockerfile_copy_sources_exist():
    stages = _stages()
    for i, stage in enumerate(stages):
        for keyword, rest in stage["instructions"]:
            if keyword not in ("COPY", "ADD"):
                continue
            parts = [p for p in shlex.split(rest) if not p.startswith("--chown")]
            from_stage = next((p.split("=", 1)[1] for p in parts if p.startswith("--from=")), None)
            parts = [p for p in parts if not p.startswith("--")]
            sources = parts[:-1]
            if from_stage:
                assert from_stage in [s["name"] for s in stages[:i]], rest
                continue
            for source in sources:
                assert (ROOT / source).exists(), f"COPY source {source} does not exist"


def test_dockerfile_has_a_health_check_and_starts_gunicorn_with_our_config():
    instructions = dict(_dockerfile())
    assert "HEALTHCHECK" in instructions and "CMD" in instructions["HEALTHCHECK"]
    assert "/admin/login/" in instructions["HEALTHCHECK"]
    cmd = json.loads(instructions["CMD"])
    assert cmd[0] == "gunicorn" and (ROOT / _option(cmd, "--config", "-c")).is_file()


def test_dockerfile_bakes_in_no_secret():
    for keyword, rest in _dockerfile():
        if keyword in ("ENV", "ARG"):
            for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", rest):
                assert not SECRETISH.search(name), f"{keyword} {name} in the Dockerfile"
        assert "DJANGO_SECRET_KEY=" not in rest


def test_dockerignore_keeps_secrets_and_tooling_out_but_the_app_in():
    ignored = _dockerignore()
    for pattern in (".env", ".git", ".venv/", "var/"):
        assert pattern in ignored, pattern
    needed = ["manage.py", "requirements.txt", "config", "templates", "static", "scripts"]
    needed += [
        app.split(".")[0] for app in settings.INSTALLED_APPS if (ROOT / app.split(".")[0]).is_dir()
    ]
    for path in needed:
        for pattern in ignored:
            assert pattern.rstrip("/") != path, f".dockerignore drops {path}"


# --- compose: Redis and PostgreSQL stay private ----------------------------------------------
def _substitute(text: str, values: dict[str, str]) -> str:
    """Return text as compose passes it on: ${NAME...} filled in, $$ turned into $."""
    text = re.sub(r"\$\{(\w+)(?::?[?-][^}]*)?\}", lambda m: values[m[1]], text)
    return text.replace("$$", "$")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_db_and_redis_publish_no_port_and_no_service_uses_the_host_network():
    for name in ("db", "redis"):
        assert "ports" not in SERVICES[name], f"{name} publishes a port"
    for name, service in SERVICES.items():
        assert service.get("network_mode") != "host", name
    # Only the web service is published, on loopback unless .env says otherwise.
    published = [name for name, service in SERVICES.items() if service.get("ports")]
    assert published == ["web"]
    assert _env_example()["PREFLOOP_HTTP_BIND"]["value"].startswith("127.0.0.1:")


def test_redis_requires_the_password_every_broker_url_carries(tmp_path):
    import subprocess
    import time

    import kombu

    password = "t0psecret" + "x" * 20
    redis = SERVICES["redis"]
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")
    argv = [_substitute(arg, {"REDIS_PASSWORD": password}) for arg in _command(redis)]
    assert password not in " ".join(argv), "the password would show in the process list"
    # Run the service's own command (on a free port, in a scratch folder) as compose would.
    port = _free_port()
    argv[-1] = argv[-1].replace("redis-server", f"redis-server --port {port} --dir {tmp_path}", 1)
    env = {"PATH": "/usr/bin:/bin", "REDIS_PASSWORD": password}
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        cli = ["redis-cli", "-p", str(port), "ping"]
        for _ in range(50):
            anonymous = subprocess.run(cli, capture_output=True, text=True, env=env, check=False)
            if anonymous.stdout.strip():
                break
            time.sleep(0.1)
        assert "NOAUTH" in anonymous.stdout
        # The health check authenticates through REDISCLI_AUTH.
        check = redis["healthcheck"]["test"]
        assert check[:2] == ["CMD", "redis-cli"]
        healthy = subprocess.run(
            [*check[1:2], "-p", str(port), *check[2:]],
            capture_output=True,
            text=True,
            env={**env, "REDISCLI_AUTH": password},
            check=False,
        )
        assert healthy.stdout.strip() == "PONG"
        # Every app service's broker URL carries the password and reaches the server.
        for name in APP_SERVICES:
            url = _substitute(
                SERVICES[name]["environment"]["CELERY_BROKER_URL"], {"REDIS_PASSWORD": password}
            )
            assert url.startswith(f"redis://:{password}@redis:6379/"), name
            local = url.replace("@redis:6379", f"@127.0.0.1:{port}")
            with kombu.Connection(local, connect_timeout=5) as connection:
                connection.ensure_connection(max_retries=1)
            wrong = url.replace(password, "wrong").replace("@redis:6379", f"@127.0.0.1:{port}")
            refused = pytest.raises(Exception, match=r"(?i)password|WRONGPASS|auth")
            with refused, kombu.Connection(wrong, connect_timeout=5) as connection:
                connection.ensure_connection(max_retries=1)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_background_work_yields_the_cpu_to_web():
    # Docker's default CPU weight is 1024; web keeps it, the default-queue worker has less.
    assert "cpu_shares" not in SERVICES["web"]
    assert 0 < SERVICES["worker-cpu"]["cpu_shares"] < 1024
