"""Token calls to the per-item endpoints skip the page machinery and answer as the full path."""

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient

from annotation import inputs
from annotation.models import Judgment
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


def _clients(user) -> dict[str, APIClient]:
    token = APIClient()
    token.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    session = APIClient()
    session.force_login(user)
    return {"token": token, "session": session}


def _scenario(client, project) -> list[tuple[int, object]]:
    """The calls of an annotator page, good and bad; ids are left out of the record."""
    seen = []

    def call(path, body=None, **kwargs):
        response = client.post(path, body, format="json", **kwargs)
        data = response.json() if response.content else None
        seen.append((response.status_code, data))
        return data

    first = call(f"/api/projects/{project.pk}/next/")
    aid = first["assignment_id"]
    ahead = call(f"/api/projects/{project.pk}/prefetch/", {"html": False})
    call(f"/api/assignments/{aid}/heartbeat/")
    for bad in (
        {"choice": 1, "idempotency_key": "k"},
        {"choice": "A", "confidence": "3", "time_spent_ms": -1},
        {"choice": "A", "next": "yes"},
        {"choice": "A", "ahead": True},
        {"choice": "A", "ranking": [1, "2"]},
        {"choice": "sideways", "idempotency_key": "k"},
        ["not", "an", "object"],
    ):
        call(f"/api/assignments/{aid}/submit/", bad)
    call("/api/assignments/999999/submit/", {"choice": "A", "idempotency_key": "k"})
    body = {"choice": "A", "idempotency_key": "k1", "next": True, "confidence": 4}
    done = call(f"/api/assignments/{aid}/submit/", body)
    replay = call(f"/api/assignments/{aid}/submit/", body)
    assert replay["judgment_id"] == done["judgment_id"]
    assert done["next"]["assignment_id"] == ahead["assignment_id"]
    later = call(f"/api/projects/{project.pk}/prefetch/")
    call(f"/api/assignments/{later['assignment_id']}/release/")
    call(f"/api/assignments/{later['assignment_id']}/release/")
    call(f"/api/assignments/{done['next']['assignment_id']}/release/")
    return [
        (code, sorted(data) if code in (200, 201) and isinstance(data, dict) else data)
        for code, data in seen
    ]


def test_token_and_session_calls_answer_alike():
    # Given two annotators of one project with the same settings, one calling with an API
    # token (the fast path) and one with a browser session (the full path)
    project = make_project(overlap=2, ask_confidence=True)
    make_items(project, 6)
    records = {}
    for path in ("token", "session"):
        user = make_user()
        add_member(project, user)
        # When each makes the same calls, good and bad
        records[path] = _scenario(_clients(user)[path], project)

    # Then every answer has the same status, the same fields and the same error messages
    assert records["token"] == records["session"]
    codes = [code for code, _ in records["token"]]
    assert codes == [200, 200, 200, *[400] * 7, 404, 201, 200, 200, 200, 200, 409]
    assert Judgment.objects.count() == 2


def test_token_calls_skip_the_page_middleware_but_not_the_security_headers():
    project = make_project(overlap=1)
    make_items(project, 2)
    user = make_user()
    add_member(project, user)
    clients = _clients(user)

    token = clients["token"].post(f"/api/projects/{project.pk}/next/")
    session = clients["session"].post(f"/api/projects/{project.pk}/next/")

    assert token.status_code == session.status_code == 200
    # The page's content-security header comes from middleware the token call skips ...
    assert "Content-Security-Policy" in session.headers
    assert "Content-Security-Policy" not in token.headers
    # ... while SecurityMiddleware, before the fast path, still marks the JSON as such
    assert token.headers["X-Content-Type-Options"] == "nosniff"
    assert token.headers["Content-Type"] == "application/json"


def test_bad_token_bad_json_and_other_content_types():
    project = make_project(overlap=1)
    make_items(project, 1)
    user = make_user()
    add_member(project, user)
    client = _clients(user)["token"]
    aid = client.post(f"/api/projects/{project.pk}/next/").json()["assignment_id"]

    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    refused = wrong.post(f"/api/assignments/{aid}/submit/", {"choice": "A"}, format="json")
    assert refused.status_code == 401
    assert refused.json() == {"detail": "Invalid token."}
    assert refused.headers["WWW-Authenticate"] == "Token"

    garbled = client.post(
        f"/api/assignments/{aid}/submit/", b'{"choice": "A"', content_type="application/json"
    )
    assert garbled.status_code == 400 and garbled.json()["detail"].startswith("JSON parse error")

    # Another content type takes the full path, where submit takes JSON only
    form = client.post(f"/api/assignments/{aid}/submit/", {"choice": "A"})
    assert form.status_code == 415
    assert not Judgment.objects.exists()


def test_declared_inputs_check_json_types_and_fill_defaults():
    assert inputs.SUBMIT.validate({"choice": " A ", "confidence": 3.0}) == {
        "idempotency_key": "",
        "choice": "A",
        "ranking": None,
        "strength": "",
        "confidence": 3,
        "rationale": "",
        "time_spent_ms": None,
        "next": False,
        "ahead": False,
        "html": False,
    }
    with pytest.raises(ValidationError) as refused:
        inputs.SUBMIT.validate(
            {"choice": "", "confidence": True, "rationale": "x" * 10_001, "html": 1}
        )
    assert set(refused.value.detail) == {"choice", "confidence", "rationale", "html"}
    assert inputs.SUBMIT.validate({"rationale": "  kept  "})["rationale"] == "  kept  "
    with pytest.raises(ValidationError) as nul:
        inputs.SUBMIT.validate({"idempotency_key": "k\x00", "rationale": "a\x00b"})
    assert set(nul.value.detail) == {"idempotency_key", "rationale"}


def test_the_schema_serializer_declares_the_same_fields():
    serializer = inputs.SUBMIT.serializer("SubmitInput")()
    assert list(serializer.fields) == list(inputs.SUBMIT.fields)
    assert serializer.fields["time_spent_ms"].max_value == 86_400_000
