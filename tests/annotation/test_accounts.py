"""Accounts: lockout after repeated bad passwords, API tokens that expire and can be revoked."""

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from annotation import services
from annotation.models import LabelSource
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db

PASSWORD = "kettle-orbit-58-lantern"
ROOT = Path(__file__).resolve().parents[2]


def _token_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def _age(token: Token, days: float) -> None:
    Token.objects.filter(pk=token.pk).update(created=timezone.now() - timedelta(days=days))


# --- lockout -------------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
def test_login_pages_lock_an_account_out_after_the_failure_limit(url):
    user = make_user(password=PASSWORD, staff=True)
    bystander = make_user(password=PASSWORD, staff=True)
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    for _ in range(limit - 1):
        response = client.post(url, {"username": user.username, "password": "wrong-guess-1"})
        assert response.status_code == 200  # the form again, with its error
    response = client.post(url, {"username": user.username, "password": "wrong-guess-2"})
    assert response.status_code == 429
    # Locked out: even the right password is refused, and no session is opened.
    response = client.post(url, {"username": user.username, "password": PASSWORD})
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
    # Another account from the same address still logs in.
    response = client.post(url, {"username": bystander.username, "password": PASSWORD})
    assert response.status_code == 302
    assert client.session["_auth_user_id"] == str(bystander.pk)


def test_token_endpoint_locks_an_account_out_after_the_failure_limit():
    user = make_user(password=PASSWORD)
    client = APIClient()
    response = client.post("/api/auth/token/", {"username": user.username}, format="json")
    assert response.status_code == 400 and "password" in response.json()
    body = {"username": user.username, "password": PASSWORD}
    # A successful login clears the count of failures before it.
    for round_ in range(2):
        for _ in range(settings.AXES_FAILURE_LIMIT - 1):
            response = client.post("/api/auth/token/", body | {"password": "nope"}, format="json")
            assert response.status_code == 400
        if round_ == 0:
            assert client.post("/api/auth/token/", body, format="json").status_code == 200
            Token.objects.filter(user=user).delete()
    client.post("/api/auth/token/", body | {"password": "nope"}, format="json")
    response = client.post("/api/auth/token/", body, format="json")
    assert response.status_code == 429, response.content
    assert response.json()["code"] == "locked_out"
    assert int(response["Retry-After"]) == settings.AXES_COOLOFF_TIME.total_seconds()
    assert not Token.objects.filter(user=user).exists()


def test_production_keeps_lockout_counters_in_the_shared_redis_cache():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env |= {
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "DJANGO_SECRET_KEY": "k" * 60,
        "DJANGO_ALLOWED_HOSTS": "prefloop.example.org",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/13",
    }
    code = (
        "import json, django; from django.conf import settings; django.setup(); "
        "print(json.dumps([settings.CACHES['default'], settings.AXES_HANDLER]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    cache, handler = json.loads(result.stdout)
    assert cache["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    assert cache["LOCATION"] == "redis://127.0.0.1:6379/13"
    assert handler == "axes.handlers.cache.AxesCacheHandler"


# --- token lifetime ------------------------------------------------------------------------
def test_expired_token_is_refused_in_the_same_single_query():
    project = make_project()
    user = make_user()
    add_member(project, user)
    make_items(project, 1)
    token = Token.objects.create(user=user)
    _age(token, days=settings.API_TOKEN_LIFETIME.days + 1)
    with CaptureQueriesContext(connection) as queries:
        response = _token_client(token.key).post(f"/api/projects/{project.pk}/next/")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    assert len(queries.captured_queries) == 1
    # Just inside the lifetime it still works.
    _age(token, days=settings.API_TOKEN_LIFETIME.days - 1)
    assert _token_client(token.key).post(f"/api/projects/{project.pk}/next/").status_code == 200


def test_logging_in_again_replaces_an_expired_token():
    user = make_user(password=PASSWORD)
    client = APIClient()
    body = {"username": user.username, "password": PASSWORD}
    first = client.post("/api/auth/token/", body, format="json").json()
    token = Token.objects.get(key=first["token"])
    expires = token.created + settings.API_TOKEN_LIFETIME
    assert first["expires"] == expires.isoformat().replace("+00:00", "Z")
    # While it is live, logging in again returns the same token.
    assert client.post("/api/auth/token/", body, format="json").json()["token"] == token.key
    _age(token, days=settings.API_TOKEN_LIFETIME.days + 1)
    second = client.post("/api/auth/token/", body, format="json").json()["token"]
    assert second != token.key
    assert _token_client(token.key).get("/api/projects/").status_code == 401
    assert _token_client(second).get("/api/projects/").status_code == 200


def test_machine_accounts_get_a_fresh_token_per_run_that_does_not_expire():
    project = make_project()
    make_items(project, 1)
    first = services.simulated_annotator_ensure(project=project, username="sim-bot")
    second = services.simulated_annotator_ensure(project=project, username="sim-bot")
    assert first != second
    assert _token_client(first).get("/api/projects/").status_code == 401
    # A run longer than the human token lifetime keeps its token.
    _age(Token.objects.get(key=second), days=settings.API_TOKEN_LIFETIME.days + 5)
    response = _token_client(second).post(f"/api/projects/{project.pk}/next/")
    assert response.status_code == 200
    assert services.label_source_for(user=Token.objects.get(key=second).user) == (
        LabelSource.SIMULATED
    )


# --- revocation ----------------------------------------------------------------------------
def test_owner_revokes_their_token():
    user = make_user()
    other = make_user()
    token = Token.objects.create(user=user)
    other_token = Token.objects.create(user=other)
    client = _token_client(token.key)
    assert client.post("/api/auth/token/revoke/").status_code == 204
    assert client.get("/api/projects/").status_code == 401
    assert not Token.objects.filter(user=user).exists()
    assert _token_client(other_token.key).get("/api/projects/").status_code == 200
    # Anonymous callers cannot revoke anything.
    assert APIClient().post("/api/auth/token/revoke/").status_code in (401, 403)


def test_staff_revoke_tokens_from_the_user_admin():
    staff = make_user(staff=True)
    user, bystander = make_user(), make_user()
    token = Token.objects.create(user=user)
    kept = Token.objects.create(user=bystander)
    client = Client()
    client.force_login(staff)
    response = client.post(
        "/admin/auth/user/", {"action": "revoke_tokens", "_selected_action": [user.pk]}
    )
    assert response.status_code == 302
    assert _token_client(token.key).get("/api/projects/").status_code == 401
    assert _token_client(kept.key).get("/api/projects/").status_code == 200
