"""Label backup and restore: export_all_labels -> empty database -> import_all_labels.

The labels are made through the real services (assignment_next / judgment_submit), so the
file holds what production holds: pairwise and ranking votes, gold, flipped repeats, skips,
live leases, QC flags and adjudications.
"""

import gzip
import io
import json
import random

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from annotation import services
from annotation.models import (
    Adjudication,
    Assignment,
    Candidate,
    Item,
    ItemCandidate,
    Judgment,
    Membership,
    Project,
    Prompt,
    Round,
    Skip,
    TaskKind,
)
from tests.factories import add_member, make_items, make_project, make_user
from training.management.commands.export_all_labels import KINDS, exported_fields
from training.models import ModelVersion

pytestmark = pytest.mark.django_db


def _label_everything(project, annotators, rng, *, ranking: bool) -> None:
    """Let each annotator take and answer items until none is left (one skip, one lease)."""
    for n_user, user in enumerate(annotators):
        step = 0
        while True:
            assignment = services.assignment_next(project_id=project.pk, user=user, rng=rng)
            if assignment is None:
                break
            step += 1
            if n_user == 0 and step == 2:
                services.assignment_skip(
                    assignment_id=assignment.pk, user=user, reason="prompt is unreadable"
                )
                continue
            answer = (
                {"ranking": rng.sample(range(1, project.k + 1), project.k)}
                if ranking
                else {"choice": rng.choice(["A", "B", "tie", "both_bad"])}
            )
            services.judgment_submit(
                assignment_id=assignment.pk,
                user=user,
                idempotency_key=f"{project.pk}-{user.username}-{step}",
                strength=rng.choice(["", "slightly", "much"]) if not ranking else "",
                confidence=rng.randint(1, 5),
                rationale=f"reason {step} by {user.username}: «ünïcode» \n second line",
                time_spent_ms=rng.randint(500, 90_000),
                **answer,
            )
    # A lease that is still live when the backup is taken.
    late = make_user(f"late-{project.pk}")
    add_member(project, late)
    make_items(project, 1)
    assert services.assignment_next(project_id=project.pk, user=late, rng=rng) is not None


@pytest.fixture
def labelled_instance():
    rng = random.Random(7)
    policy = ModelVersion.objects.create(
        name="policy-v1", artifact_path="/artifacts/policy-v1", eval_results={"win": 0.6}
    )
    ModelVersion.objects.create(name="policy-v2", artifact_path="/a/v2", parent=policy)
    reviewer = make_user("rev")
    researcher = make_user("res")

    pairwise = make_project(
        name="pairwise helpfulness",
        overlap=2,
        gold_rate=0.2,
        repeat_rate=0.3,
        repeat_min_gap=1,
        ask_strength=True,
        ask_confidence=True,
        ask_rationale=True,
    )
    round_ = Round.objects.create(project=pairwise, number=1, model_version=policy)
    make_items(pairwise, 6, round_=round_, models=("policy-v1", "reference"))
    make_items(pairwise, 2, round_=round_, gold=["A", "B"])
    Candidate.objects.filter(prompt__project=pairwise, model_name="policy-v1").update(
        policy_version=policy
    )
    annotators = [make_user(f"ann-{i}") for i in range(3)]
    for user in annotators:
        add_member(pairwise, user)
    add_member(pairwise, reviewer, role=Membership.Role.REVIEWER)
    add_member(pairwise, researcher, role=Membership.Role.RESEARCHER)
    _label_everything(pairwise, annotators, rng, ranking=False)

    ranking = make_project(
        name="ranking of 3",
        task_kind=TaskKind.RANKING,
        k=3,
        overlap=2,
        gold_rate=0.3,
        repeat_rate=0.3,
        repeat_min_gap=1,
        ask_confidence=True,
        ask_rationale=True,
    )
    make_items(ranking, 4)
    make_items(ranking, 1, gold=[[1, 3, 2]])
    for user in annotators[:2]:
        add_member(ranking, user)
    _label_everything(ranking, annotators[:2], rng, ranking=True)

    # QC marks, an adjudication, chat-format prompts and an external rater's label.
    flagged = Judgment.objects.filter(project=pairwise).order_by("id").first()
    flagged.qc_flag = "failed_gold"
    flagged.save(update_fields=["qc_flag"])
    Membership.objects.filter(user=annotators[2], project=pairwise).update(
        status=Membership.Status.PAUSED, flagged=True, status_reason="gold accuracy 40%"
    )
    item = Item.objects.filter(project=pairwise, is_gold=False).order_by("id").first()
    Adjudication.objects.create(item=item, reviewer=reviewer, choice="A", note="A is right")
    Prompt.objects.filter(pk=item.prompt_id).update(
        messages=[{"role": "user", "content": "hi"}], group_key="g1", external_id="ext-1"
    )
    Judgment.objects.create(
        project=pairwise,
        item=item,
        external_rater="vendor-7",
        choice="B",
        source="imported",
        rationale="imported vote",
    )

    # The instance really has every flavour of label the file must carry.
    judgments = Judgment.objects.all()
    assert judgments.filter(is_gold=True).exists()
    assert judgments.filter(is_repeat=True, project=pairwise).exists()
    assert judgments.filter(is_repeat=True, project=ranking).exists()
    assert judgments.filter(ranking__isnull=False).exists()
    assert Skip.objects.exists()
    assert Assignment.objects.filter(status=Assignment.Status.LEASED).exists()
    assert Assignment.objects.filter(repeat_of__isnull=False).exists()
    return {"annotators": annotators}


def _key(obj):
    """Return a natural key: what identifies a row without its database id."""
    if obj is None:
        return None
    match obj:
        case Project():
            return obj.name
        case ModelVersion():
            return obj.name
        case Membership():
            return (obj.project.name, obj.user.username)
        case Round():
            return (obj.project.name, obj.number)
        case Prompt():
            return (obj.project.name, obj.content_hash)
        case Candidate():
            return (_key(obj.prompt), obj.content_hash, obj.model_name)
        case Item():
            return (_key(obj.round), _key(obj.prompt), obj.is_gold)
        case ItemCandidate():
            return (_key(obj.item), obj.position)
        case Assignment():
            return (_key(obj.item), obj.annotator.username, obj.kind, obj.seq)
        case Skip():
            return _key(obj.assignment)
        case Judgment():
            who = obj.annotator.username if obj.annotator else obj.external_rater
            return (_key(obj.item), who, obj.is_repeat)
        case Adjudication():
            return (_key(obj.item), obj.reviewer.username, obj.created_at)
    if isinstance(obj, get_user_model()):
        return obj.username
    raise TypeError(type(obj))


def _snapshot() -> dict:
    """Return every exported row of every kind, keyed by natural key, ids replaced by keys."""
    snapshot = {}
    for kind in KINDS:
        rows = {}
        for obj in kind.model.objects.all():
            row = {}
            for field in exported_fields(kind):
                if field.primary_key:
                    continue
                value = getattr(obj, field.name)
                row[field.name] = _key(value) if field.is_relation else value
            key = _key(obj)
            assert key not in rows, f"natural key {key} is not unique"
            rows[key] = row
        snapshot[kind.type] = rows
    return snapshot


def _flush() -> None:
    """Empty every table, as on a fresh instance (inside the test's transaction)."""
    with connection.cursor() as cursor:
        # TRUNCATE refuses tables with deferred foreign-key checks still pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    call_command("flush", interactive=False, verbosity=0)


def _export(path=None) -> str:
    if path is None:
        out = io.StringIO()
        call_command("export_all_labels", stdout=out)
        return out.getvalue()
    call_command("export_all_labels", output=str(path), stderr=io.StringIO())
    return ""


def test_export_flush_import_restores_every_label_field_for_field(labelled_instance, tmp_path):
    # given a labelled instance and its export
    before = _snapshot()
    path = tmp_path / "labels.jsonl.gz"
    _export(path)
    # when the database is emptied and the file imported
    _flush()
    assert not Judgment.objects.exists() and not get_user_model().objects.exists()
    call_command("import_all_labels", str(path), stdout=io.StringIO())
    # then every row is back with every field, matched by natural keys
    after = _snapshot()
    assert after.keys() == before.keys()
    for kind_type in before:
        assert after[kind_type].keys() == before[kind_type].keys(), kind_type
        for key, row in before[kind_type].items():
            assert after[kind_type][key] == row, (kind_type, key)
    assert len(after["judgment"]) == Judgment.objects.count() > 30


def test_judgments_field_for_field(labelled_instance, tmp_path):
    # Spelled out for the raw votes: every column of every judgment survives the trip.
    fields = [f.name for f in Judgment._meta.concrete_fields if not f.primary_key]

    def votes():
        return {
            _key(j): {
                name: _key(getattr(j, name))
                if Judgment._meta.get_field(name).is_relation
                else getattr(j, name)
                for name in fields
            }
            | {"display_order": j.assignment.display_order if j.assignment else None}
            for j in Judgment.objects.select_related("assignment", "annotator", "item")
        }

    before = votes()
    path = tmp_path / "labels.jsonl"
    _export(path)
    _flush()
    call_command("import_all_labels", str(path), stdout=io.StringIO())
    assert votes() == before
    restored = Judgment.objects.filter(is_repeat=True).select_related("assignment")
    assert all(j.assignment.repeat_of is not None for j in restored if j.assignment)


def test_missing_users_come_back_as_inactive_placeholders(labelled_instance, tmp_path):
    text = _export()
    _flush()
    call_command("import_all_labels", _write(tmp_path, text), stdout=io.StringIO())
    users = get_user_model().objects.all()
    assert {"ann-0", "ann-1", "ann-2", "rev", "res"} <= {u.username for u in users}
    assert not any(u.is_active or u.has_usable_password() or u.is_staff for u in users)


def test_existing_users_are_reused(labelled_instance, tmp_path):
    text = _export()
    _flush()
    kept = make_user("ann-0")
    call_command("import_all_labels", _write(tmp_path, text), stdout=io.StringIO())
    assert Judgment.objects.filter(annotator=kept).exists()
    assert get_user_model().objects.get(username="ann-0").is_active


def test_lines_are_typed_json_objects_with_raw_votes(labelled_instance):
    lines = [json.loads(line) for line in _export().splitlines()]
    assert lines[0]["type"] == "meta" and lines[-1]["type"] == "end"
    counts = lines[-1]["counts"]
    for kind in KINDS:
        assert counts[kind.type] == sum(1 for row in lines if row["type"] == kind.type)
    vote = next(row for row in lines if row["type"] == "judgment" and row["is_repeat"])
    for field in (
        "annotator",
        "choice",
        "ranking",
        "shown_choice",
        "strength",
        "confidence",
        "rationale",
        "time_spent_ms",
        "source",
        "is_gold",
        "is_repeat",
        "qc_flag",
        "created_at",
    ):
        assert field in vote
    assert vote["annotator"].startswith("ann-")
    candidate = next(row for row in lines if row["type"] == "candidate")
    assert candidate["generation_config"] and candidate["checkpoint_id"]
    assert any(row["type"] == "assignment" and row["display_order"] for row in lines)


def test_refuses_a_non_empty_instance_unless_forced(labelled_instance, tmp_path):
    text = _export()
    n_judgments = Judgment.objects.count()
    with pytest.raises(CommandError, match="empty"):
        call_command("import_all_labels", _write(tmp_path, text), stdout=io.StringIO())
    # --force into the same instance clashes on project names: nothing is written.
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("import_all_labels", _write(tmp_path, text), force=True, stdout=io.StringIO())
    assert Judgment.objects.count() == n_judgments


def test_force_adds_to_an_instance_with_other_projects(labelled_instance, tmp_path):
    text = _export()
    _flush()
    other = make_project(name="another team's project")
    call_command("import_all_labels", _write(tmp_path, text), force=True, stdout=io.StringIO())
    assert Project.objects.count() == 3 and Project.objects.filter(pk=other.pk).exists()


def test_truncated_file_is_refused_and_nothing_written(labelled_instance, tmp_path):
    lines = _export().splitlines(keepends=True)
    _flush()
    with pytest.raises(CommandError, match="truncated"):
        truncated = _write(tmp_path, "".join(lines[:-1]))
        call_command("import_all_labels", truncated, stdout=io.StringIO())
    assert not Project.objects.exists() and not get_user_model().objects.exists()
    half = "".join(lines[: len(lines) // 2]) + lines[-1]
    with pytest.raises(CommandError, match=r"Counts differ|not earlier"):
        call_command("import_all_labels", _write(tmp_path, half), stdout=io.StringIO())
    assert not Judgment.objects.exists()


def test_gzip_output_is_compressed_and_written_whole(labelled_instance, tmp_path):
    path = tmp_path / "sub" / "labels.jsonl.gz"
    _export(path)
    with gzip.open(path, "rt", encoding="utf-8") as stream:
        last = stream.read().splitlines()[-1]
    assert json.loads(last)["type"] == "end"
    assert not list(tmp_path.glob("sub/*.partial"))


def _write(tmp_path, text: str) -> str:
    path = tmp_path / f"labels-{len(list(tmp_path.iterdir()))}.jsonl"
    path.write_text(text, encoding="utf-8")
    return str(path)
