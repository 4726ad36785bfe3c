"""Fuzzed imports: any file is either imported or refused with its bad lines, never a crash.

Hypothesis writes JSONL (and CSV) files: raw bytes, JSON of any shape, and valid rows with
one field replaced by an arbitrary JSON value. The strings include what a database or a
UTF-8 encoder chokes on (NUL, unpaired surrogates), the numbers include NaN, infinities and
integers too long to print. Each file goes to `items_import`, to `preferences_import` in
each format, and through the import endpoints. Checked for every file:
- the service returns a report or raises ImportFailed (the lines and what is wrong with
  them) or a Conflict; anything else is a bug;
- a refused file writes nothing: every table's row count is unchanged;
- an endpoint answers 201 or a 4xx whose JSON body says what is wrong, never a 5xx.
"""

from __future__ import annotations

import io
import json
import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from annotation.errors import Conflict
from annotation.imports import (
    FORMATS,
    ImportFailed,
    ImportReport,
    PreferenceImportReport,
    items_import,
    preferences_import,
)
from annotation.models import (
    Candidate,
    Item,
    ItemCandidate,
    Judgment,
    Membership,
    Project,
    Prompt,
    Round,
    TaskKind,
)
from tests.factories import add_member, make_project, make_user

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=int(os.environ.get("PREFLOOP_FUZZ_EXAMPLES", "60")),
    deadline=None,
    database=None,  # the checkout is shared: keep no example database in it
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TABLES = (Prompt, Candidate, Item, ItemCandidate, Judgment, Round)

# ---- strategies --------------------------------------------------------------------------

NASTY = st.sampled_from(
    ["\x00", "\ud800", "a\udfffb", "\u202e", "\ufeff", "\r", "\n\nHuman: ", "\n\nAssistant: "]
)
TEXT = st.one_of(
    st.text(max_size=30),
    st.builds(lambda a, b, c: a + b + c, st.text(max_size=8), NASTY, st.text(max_size=8)),
    st.sampled_from(["", " ", "A", "B", "tie", "much", "slightly", "x" * 300]),
)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-3, max_value=9),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(10**400),
)
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "bot"]), "content": TEXT}
    ),
    max_size=3,
)
CANDIDATE = st.one_of(
    TEXT,
    st.fixed_dictionaries(
        {"text": TEXT},
        optional={
            "model_name": JSON,
            "checkpoint_id": JSON,
            "generation_config": st.dictionaries(
                st.sampled_from(["temperature", "seed", "top_p", "batch", "stop", "odd"]), JSON
            ),
        },
    ),
)


def _with_overrides(base: st.SearchStrategy, fields: list[str]) -> st.SearchStrategy:
    """Return rows drawn from ``base`` with some fields replaced or added (any JSON)."""
    return st.builds(
        lambda row, extra: {**row, **extra},
        base,
        st.dictionaries(st.sampled_from([*fields, "unknown_field"]), JSON, max_size=2),
    )


ITEM_ROW = _with_overrides(
    st.fixed_dictionaries(
        {"prompt": TEXT, "candidates": st.lists(CANDIDATE, min_size=2, max_size=2)},
        optional={"id": st.one_of(TEXT, NUMBERS), "gold": JSON, "messages": MESSAGES},
    ),
    ["id", "prompt", "messages", "candidates", "gold", "group_key"],
)
PAIR_ROW = _with_overrides(
    st.fixed_dictionaries(
        {"chosen": TEXT, "rejected": TEXT},
        optional={
            "prompt": st.one_of(TEXT, MESSAGES),
            "rater": JSON,
            "strength": JSON,
            "confidence": JSON,
        },
    ),
    ["prompt", "chosen", "rejected", "chosen_model", "rejected_model", "id", "group_key"],
)
HH_ROW = st.builds(
    lambda q, a, b: {
        "chosen": f"\n\nHuman: {q}\n\nAssistant: {a}",
        "rejected": f"\n\nHuman: {q}\n\nAssistant: {b}",
    },
    TEXT,
    TEXT,
    TEXT,
)
RANKING_ROW = _with_overrides(
    st.fixed_dictionaries(
        {
            "prompt": TEXT,
            "candidates": st.lists(CANDIDATE, min_size=2, max_size=3),
            "ranking": st.lists(st.integers(-1, 4), min_size=2, max_size=3),
        }
    ),
    ["prompt", "messages", "candidates", "ranking", "confidence", "id"],
)


def _encode(row) -> bytes:
    # NaN/Infinity come out as the bare tokens Python's json reads back; surrogates as \\u escapes
    return json.dumps(row, allow_nan=True).encode()


def _jsonl(rows: st.SearchStrategy) -> st.SearchStrategy:
    """Return files of 1-4 lines mixing rows, arbitrary JSON and raw bytes."""
    line = st.one_of(
        rows.map(_encode),
        rows.map(_encode),
        JSON.map(_encode),
        st.binary(max_size=40),
        st.sampled_from([b"{", b"[" * 5000, b"1" * 5000, b"NaN", b"\xff\xfe", b'{"a":1}\x00']),
    )
    return st.lists(line, min_size=1, max_size=4).map(lambda lines: b"\n".join(lines) + b"\n")


CSV_CELL = st.one_of(TEXT, st.sampled_from(["[1,2", '["A"]', "[1, 2]", "A", "B"]))
CSV_FILE = st.one_of(
    st.binary(max_size=80),
    st.lists(st.lists(CSV_CELL, min_size=1, max_size=6), min_size=1, max_size=4).map(
        lambda rows: "\n".join(
            ["id,prompt,candidate_1,candidate_2,model_1,gold"]
            + [",".join(json.dumps(c) if "," in c else c for c in row) for row in rows]
        ).encode("utf-8", "surrogatepass")
    ),
)

# ---- helpers -----------------------------------------------------------------------------


def _counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in TABLES}


def _refused(exc: ImportFailed) -> None:
    assert exc.total_bad >= 1 and exc.errors
    for line, message in exc.errors:
        assert isinstance(line, int) and line >= 0
        assert isinstance(message, str) and message.strip()


@pytest.fixture
def pairwise():
    return make_project(task_kind=TaskKind.PAIRWISE, k=2, allow_tie=True, ask_confidence=True)


@pytest.fixture
def ranking():
    return make_project(task_kind=TaskKind.RANKING, k=3, allow_tie=True)


def _import_items(project: Project, data: bytes, fmt: str = "jsonl") -> None:
    before = _counts()
    try:
        report = items_import(project=project, stream=io.BytesIO(data), fmt=fmt)
    except ImportFailed as exc:
        _refused(exc)
        assert _counts() == before
        return
    assert isinstance(report, ImportReport) and report.items_created >= 1
    assert _counts()["Item"] == before["Item"] + report.items_created


def _import_preferences(project: Project, data: bytes, fmt: str) -> None:
    before = _counts()
    try:
        report = preferences_import(project=project, stream=io.BytesIO(data), fmt=fmt)
    except ImportFailed as exc:
        _refused(exc)
        assert _counts() == before
        return
    except Conflict as exc:  # the same batch twice
        assert exc.code == "already_imported"
        assert _counts() == before
        return
    assert isinstance(report, PreferenceImportReport) and report.judgments_created >= 1
    assert _counts()["Judgment"] == before["Judgment"] + report.judgments_created


# ---- services ----------------------------------------------------------------------------


@FUZZ
@given(data=_jsonl(ITEM_ROW))
@example(data=b'{"prompt": "a\\u0000b", "candidates": ["x", "y"]}\n')
@example(data=b'{"prompt": "a\\ud800b", "candidates": ["x", "y"]}\n')
@example(data=b'{"prompt": "q", "candidates": ["x", "y"], "id": ' + b"1" * 5000 + b"}\n")
@example(data=b"[" * 100_000 + b"\n")
@example(
    data=b'{"prompt": "q", "candidates": [{"text": "x", "generation_config": {"seed": NaN}}, "y"]}'
)
@example(
    data=b'{"prompt": "q", "candidates": [{"text": "x", "generation_config": {"seed": 1e999}},'
    b' "y"]}'
)
@example(
    data=b'{"prompt": "q", "candidates": [{"text": "x", "generation_config":'
    b' {"stop": ["\\u0000"]}}, "y"]}'
)
@example(data=b'{"prompt": "q", "candidates": ["x", "y"], "group_key": "g\\u0000"}')
def test_items_import_takes_or_refuses_any_jsonl(pairwise, data):
    _import_items(pairwise, data)


@FUZZ
@given(data=_jsonl(ITEM_ROW))
def test_items_import_takes_or_refuses_any_jsonl_for_a_ranking_project(ranking, data):
    _import_items(ranking, data)


@FUZZ
@given(data=CSV_FILE)
@example(data=b"prompt,candidate_1,candidate_2,gold\nq,a,b,[1\n")
@example(data=b"prompt,candidate_1,candidate_2\nq\xff,a,b\n")
@example(data=b"prompt,candidate_1,candidate_2\nq\x00,a,b\n")
def test_items_import_takes_or_refuses_any_csv(pairwise, data):
    _import_items(pairwise, data, fmt="csv")


@FUZZ
@given(data=_jsonl(PAIR_ROW))
@example(data=b'{"prompt": "a\\u0000b", "chosen": "x", "rejected": "y"}\n')
@example(data=b'{"prompt": "q", "chosen": "x", "rejected": "y", "rater": "\\u0000"}\n')
@example(data=b'{"prompt": "q", "chosen": "x", "rejected": "y", "id": ' + b"9" * 5000 + b"}\n")
@example(data=b'{"prompt": "q", "chosen": "x\\udc80", "rejected": "y"}\n')
def test_trl_preferences_import_takes_or_refuses_any_jsonl(pairwise, data):
    _import_preferences(pairwise, data, "trl")


@FUZZ
@given(data=_jsonl(st.one_of(HH_ROW, PAIR_ROW)))
def test_hh_preferences_import_takes_or_refuses_any_jsonl(pairwise, data):
    _import_preferences(pairwise, data, "hh")


@FUZZ
@given(data=_jsonl(RANKING_ROW))
@example(
    data=b'{"prompt": "q", "candidates": [{"text": "x", "generation_config": {"t": NaN}}, "y",'
    b' "z"], "ranking": [1, 2, 3]}\n'
)
@example(
    data=b'{"prompt": "q", "candidates": [{"text": "x", "checkpoint_id": "\\u0000"}, "y", "z"],'
    b' "ranking": [1, 2, 3]}\n'
)
@example(
    data=b'{"prompt": "q", "candidates": [{"text": "x", "model_name": "'
    + b"m" * 600
    + b'"}, "y", "z"], "ranking": [1, 2, 3]}\n'
)
def test_ranking_preferences_import_takes_or_refuses_any_jsonl(ranking, data):
    _import_preferences(ranking, data, "ranking")


# ---- endpoints ---------------------------------------------------------------------------


@pytest.fixture
def researcher_client(pairwise):
    researcher = make_user()
    add_member(pairwise, researcher, Membership.Role.RESEARCHER)
    client = APIClient()
    client.force_authenticate(researcher)
    return client


def _sendable(value: str) -> bool:
    """Return whether a test client can put ``value`` in a multipart form field."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


FILE_NAMES = st.sampled_from(["items.jsonl", "items.csv", "prefs.jsonl.gz", "x", "a.b.c"])
FORM_VALUES = st.one_of(
    st.none(),
    TEXT.filter(_sendable),
    st.integers(-3, 10**12).map(str),
    st.sampled_from(["jsonl", "csv", "hh", "trl", "ranking", "1", "0", "true", "false"]),
)


def _form(fields: dict, upload: SimpleUploadedFile | str | None) -> dict:
    body = {k: v for k, v in fields.items() if v is not None}
    if upload is not None:
        body["file"] = upload
    return body


def _assert_clean_answer(response, before: dict) -> None:
    assert response.status_code < 500, response.content[:2000]
    if response.status_code >= 400:
        assert _counts() == before
        body = response.json()
        assert body and isinstance(body, dict), body
        assert "detail" in body or all(isinstance(v, list) for v in body.values()), body


@FUZZ
@given(
    data=st.one_of(_jsonl(ITEM_ROW), CSV_FILE),
    name=FILE_NAMES,
    fmt=FORM_VALUES,
    round_=FORM_VALUES,
    as_text=st.booleans(),
)
@example(
    data=b'{"prompt": "q", "candidates": ["x", "y"]}\n',
    name="a.jsonl",
    fmt=None,
    round_="abc",
    as_text=False,
)
@example(
    data=b'{"prompt": "q", "candidates": ["x", "y"]}\n',
    name="a.jsonl",
    fmt=None,
    round_=None,
    as_text=True,
)
@example(
    data=b'{"prompt": "q", "candidates": ["x", "y"]}\n',
    name="a.jsonl",
    fmt=None,
    round_="99999999999999999999",
    as_text=False,
)
def test_import_endpoint_answers_4xx_for_any_bad_upload(
    pairwise, researcher_client, data, name, fmt, round_, as_text
):
    before = _counts()
    upload = data.decode("latin-1") if as_text else SimpleUploadedFile(name, data)
    response = researcher_client.post(
        f"/api/projects/{pairwise.pk}/import/",
        _form({"format": fmt, "round": round_}, upload),
        format="multipart",
    )
    _assert_clean_answer(response, before)


@FUZZ
@given(
    data=st.one_of(_jsonl(PAIR_ROW), _jsonl(HH_ROW), st.binary(max_size=60)),
    name=FILE_NAMES,
    fmt=st.one_of(st.sampled_from(FORMATS), FORM_VALUES),
    batch=FORM_VALUES,
    round_=FORM_VALUES,
    serve=FORM_VALUES,
    as_text=st.booleans(),
)
@example(
    data=b"\x1f\x8b\x08\x00garbage",
    name="prefs.jsonl.gz",
    fmt="trl",
    batch=None,
    round_=None,
    serve=None,
    as_text=False,
)
def test_preference_import_endpoint_answers_4xx_for_any_bad_upload(
    pairwise, researcher_client, data, name, fmt, batch, round_, serve, as_text
):
    before = _counts()
    upload = data.decode("latin-1") if as_text else SimpleUploadedFile(name, data)
    response = researcher_client.post(
        f"/api/projects/{pairwise.pk}/import-preferences/",
        _form({"format": fmt, "batch": batch, "round": round_, "serve": serve}, upload),
        format="multipart",
    )
    _assert_clean_answer(response, before)


def test_the_strategies_reach_both_outcomes(pairwise):
    """Guard the fuzzers against only ever producing refused files."""
    good = {"prompt": "What is 2 + 2?", "candidates": ["4", "5"]}
    assert items_import(project=pairwise, stream=io.BytesIO(_encode(good))).items_created == 1


def test_a_valid_csv_upload_is_imported(pairwise, researcher_client):
    """The CSV reader must not close the upload between its validating and writing passes."""
    data = b"id,prompt,candidate_1,candidate_2,gold\nq1,What is 2 + 2?,4,5,A\nq2,And 3 + 3?,6,7,\n"
    response = researcher_client.post(
        f"/api/projects/{pairwise.pk}/import/",
        {"file": SimpleUploadedFile("items.csv", data)},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    assert response.json()["items_created"] == 2
    assert Item.objects.filter(project=pairwise, is_gold=True).count() == 1
