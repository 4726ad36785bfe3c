"""Which judgments count: the named filters of `Judgment.objects` and the row check beside them."""

import pytest

from annotation.exports import ExportPolicy
from annotation.models import Judgment
from annotation.querysets import is_counted_row
from tests.factories import make_items, make_project, make_round

pytestmark = pytest.mark.django_db


@pytest.fixture
def labels():
    """One label of each kind on a two-round project, named by what sets it apart."""
    project = make_project()
    first, second = make_round(project, 1), make_round(project, 2)
    plain, other = make_items(project, 2, round_=first)
    (gold_item,) = make_items(project, 1, round_=first, gold=["A"])
    (late,) = make_items(project, 1, round_=second)

    def label(item, **fields):
        fields.setdefault("source", "human")
        return Judgment.objects.create(project=project, item=item, choice="A", **fields)

    return project, {
        "human": label(plain, external_rater="h1"),
        "human_round2": label(late, external_rater="h1"),
        "ai": label(plain, external_rater="m1", source="ai"),
        "simulated": label(other, external_rater="s1", source="simulated"),
        "repeat": label(plain, external_rater="h2", is_repeat=True),
        "gold_check": label(other, external_rater="h3", is_gold=True),
        "on_gold_item": label(gold_item, external_rater="h4"),
        "flagged": label(other, external_rater="h5", qc_flag="paused"),
    }


def names(queryset, labels_by_name) -> set[str]:
    ids = set(queryset.values_list("id", flat=True))
    return {name for name, judgment in labels_by_name.items() if judgment.pk in ids}


def test_each_named_filter_leaves_out_exactly_its_labels(labels):
    project, by_name = labels
    mine = Judgment.objects.filter(project=project)
    everything = set(by_name)
    assert names(mine.without_repeats(), by_name) == everything - {"repeat"}
    assert names(mine.without_gold(), by_name) == everything - {"gold_check", "on_gold_item"}
    assert names(mine.primary(), by_name) == everything - {"repeat", "gold_check", "on_gold_item"}
    assert names(mine.unflagged(), by_name) == everything - {"flagged"}
    assert names(mine.of_sources("ai", "simulated"), by_name) == {"ai", "simulated"}
    assert names(mine.of_sources(["ai"]), by_name) == {"ai"}
    assert names(mine.in_rounds([2]), by_name) == {"human_round2"}
    assert mine.in_rounds(None).count() == len(by_name)


def test_counted_votes_are_primary_unflagged_and_human_unless_sources_are_named(labels):
    project, by_name = labels
    mine = Judgment.objects.filter(project=project)
    assert names(mine.counted(), by_name) == {"human", "human_round2"}
    assert names(mine.counted(["ai", "human"]), by_name) == {"human", "human_round2", "ai"}
    assert names(mine.counted([]), by_name) == set()
    assert names(mine.flagged(), by_name) == {"flagged"}


def test_export_policy_takes_its_sources_rounds_and_flags(labels):
    project, by_name = labels
    mine = Judgment.objects.filter(project=project)
    default = ExportPolicy.from_dict({})
    assert names(mine.for_policy(default), by_name) == {"human", "human_round2"}
    raw = ExportPolicy.from_dict({"format": "raw", "sources": ["human", "ai"], "rounds": [1]})
    assert names(mine.for_policy(raw), by_name) == set(by_name) - {"simulated", "human_round2"}
    flagged_too = ExportPolicy.from_dict({"include_qc_flagged": True})
    assert names(mine.for_policy(flagged_too), by_name) == {"human", "human_round2", "flagged"}


def test_loaded_rows_are_judged_as_the_queryset_judges_them(labels):
    project, _ = labels
    fields = ("id", "source", "is_repeat", "is_gold", "item__is_gold", "qc_flag")
    rows = Judgment.objects.filter(project=project).values(*fields)
    for sources in ((), ("human",), ("ai",), ("human", "simulated")):
        counted = {row["id"] for row in rows if is_counted_row(row, sources)}
        expected = set(
            Judgment.objects.filter(project=project).counted(sources).values_list("id", flat=True)
        )
        assert counted == expected
