"""Export policy adjudicated_wins: a reviewer's verdict decides its item in the snapshot."""

import pytest

from annotation.exports import (
    ExportPolicy,
    PolicyError,
    dataset_version_export,
    dataset_version_load,
)
from annotation.models import Adjudication, Judgment, TaskKind
from tests.factories import make_items, make_project, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _artifacts(tmp_path, settings):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"


def _vote(item, user, **label):
    return Judgment.objects.create(project=item.project, item=item, annotator=user, **label)


def _rows(project, **policy):
    policy = {"hf": False, "split": {"train": 1.0}, **policy}
    dv = dataset_version_export(project=project, policy=policy)
    return dv, dataset_version_load(dataset_version=dv)["train"]


def _texts(item):
    return [s.candidate.text for s in item.slots.order_by("position").select_related("candidate")]


def test_the_newest_verdict_replaces_the_votes_of_its_item_only():
    # given: two items voted 2:1 for A; a reviewer first said A, then B on the first one
    project = make_project()
    disputed, plain = make_items(project, 2)
    users = [make_user() for _ in range(3)]
    for item in (disputed, plain):
        for user, choice in zip(users, ("A", "A", "B"), strict=True):
            _vote(item, user, choice=choice)
    reviewer = make_user()
    Adjudication.objects.create(item=disputed, reviewer=reviewer, choice="A")
    Adjudication.objects.create(item=disputed, reviewer=reviewer, choice="B")
    a, b = _texts(disputed)

    # when: exported by majority, with and without the policy
    _, without = _rows(project, aggregation="majority")
    dv, rows = _rows(project, aggregation="majority", adjudicated_wins=True)

    # then: without it the votes win; with it the newest verdict (B) decides the item
    assert {(r["chosen"], r["rejected"]) for r in without if r["chosen"] in (a, b)} == {(a, b)}
    assert {(r["chosen"], r["rejected"]) for r in rows if r["chosen"] in (a, b)} == {(b, a)}
    assert len(rows) == 2  # the other item is still decided by its votes
    assert dv.report["adjudicated_items"] == 1
    assert dv.policies["adjudicated_wins"] is True


def test_a_verdict_counts_even_below_min_votes_and_for_rankings():
    project = make_project(task_kind=TaskKind.RANKING, k=3)
    (item,) = make_items(project, 1)
    _vote(item, make_user(), ranking=[1, 2, 3])
    Adjudication.objects.create(item=item, reviewer=make_user(), ranking=[3, 2, 1])
    first, second, third = _texts(item)
    _, rows = _rows(project, aggregation="majority", min_votes=2, adjudicated_wins=True)
    assert {(r["chosen"], r["rejected"]) for r in rows} == {
        (third, first),
        (third, second),
        (second, first),
    }


def test_raw_exports_refuse_the_policy():
    with pytest.raises(PolicyError, match="adjudicated_wins"):
        ExportPolicy.from_dict({"format": "raw", "adjudicated_wins": True})
