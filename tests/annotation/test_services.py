"""Serving, submitting, skipping and leases (annotation.services)."""

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from annotation import errors, services
from annotation.models import (
    Assignment,
    Item,
    Judgment,
    Membership,
    Project,
    Round,
    TaskKind,
)
from annotation.selectors import assignment_payload
from annotation.serving import REPEAT_WINDOW
from tests.factories import add_member, make_items, make_project, make_round, make_user

pytestmark = pytest.mark.django_db


def _project(**kw):
    project = make_project(**kw)
    annotators = [make_user() for _ in range(4)]
    for user in annotators:
        add_member(project, user)
    return project, annotators


def test_each_item_is_served_to_exactly_overlap_different_people():
    project, annotators = _project(overlap=3)
    make_items(project, 5)
    served: dict[int, list[int]] = {}
    for user in annotators:
        while (a := services.assignment_next(project_id=project.pk, user=user)) is not None:
            served.setdefault(a.item_id, []).append(user.pk)
            services.judgment_submit(assignment_id=a.pk, user=user, choice="A")
    assert sorted(len(v) for v in served.values()) == [3] * 5
    assert all(len(set(v)) == 3 for v in served.values())
    assert set(Item.objects.values_list("n_done", flat=True)) == {3}


def test_serving_is_breadth_first():
    project, annotators = _project(overlap=2)
    items = make_items(project, 3)
    first = [services.assignment_next(project_id=project.pk, user=u) for u in annotators[:3]]
    # Three people asking at once get three different items before any item is doubled.
    assert {a.item_id for a in first} == {i.pk for i in items}


def test_next_returns_the_live_lease_again():
    project, (user, *_) = _project()
    make_items(project, 3)
    a1 = services.assignment_next(project_id=project.pk, user=user)
    a2 = services.assignment_next(project_id=project.pk, user=user)
    assert a1.pk == a2.pk


def test_payload_hides_model_identity_gold_and_kind():
    project, (user, *_) = _project(gold_rate=1.0)
    # Gold is served only while primary work remains for the annotator.
    make_items(project, 1)
    make_items(project, 1, gold=["A"], models=("secret-model-x", "secret-model-y"))
    assignment = services.assignment_next(project_id=project.pk, user=user)
    assert assignment.kind == Assignment.Kind.GOLD
    payload = assignment_payload(assignment=assignment)
    text = repr(payload)
    for forbidden in ("secret-model", "ckpt", "gold", "kind", "temperature", "primary"):
        assert forbidden not in text
    assert [c["slot"] for c in payload["candidates"]] == ["A", "B"]


def test_pairwise_choice_is_mapped_back_through_display_order():
    project, (user, *_) = _project()
    item = make_items(project, 1)[0]
    assignment = services.assignment_next(project_id=project.pk, user=user)
    payload = assignment_payload(assignment=assignment)
    shown_a_text = payload["candidates"][0]["text"]
    result = services.judgment_submit(assignment_id=assignment.pk, user=user, choice="A")
    canonical_a_text = item.slots.get(position=0).candidate.text
    expected = "A" if shown_a_text == canonical_a_text else "B"
    assert result.judgment.choice == expected
    assert result.judgment.shown_choice == "A"


def test_display_order_is_randomised_across_assignments():
    project, annotators = _project(overlap=1)
    make_items(project, 40)
    rng = random.Random(3)
    orders = set()
    user = annotators[0]
    for _ in range(40):
        a = services.assignment_next(project_id=project.pk, user=user, rng=rng)
        orders.add(tuple(a.display_order))
        services.judgment_submit(assignment_id=a.pk, user=user, choice="tie")
    assert orders == {(0, 1), (1, 0)}


def test_ranking_is_mapped_back_and_ties_follow_the_project():
    project, (user, *_) = _project(task_kind=TaskKind.RANKING, k=4, allow_tie=False)
    make_items(project, 1)
    a = services.assignment_next(project_id=project.pk, user=user)
    with pytest.raises(errors.ServiceError, match="tied"):
        services.judgment_submit(assignment_id=a.pk, user=user, ranking=[1, 1, 2, 3])
    with pytest.raises(errors.ServiceError, match="1 to 4"):
        services.judgment_submit(assignment_id=a.pk, user=user, ranking=[1, 2, 3, 5])
    shown = [2, 1, 4, 3]
    j = services.judgment_submit(assignment_id=a.pk, user=user, ranking=shown).judgment
    for slot, rank in enumerate(shown):
        assert j.ranking[a.display_order[slot]] == rank
    assert Judgment.objects.count() == 1


def test_tied_ranks_are_dense_when_the_project_allows_ties():
    project, (user, *_) = _project(task_kind=TaskKind.RANKING, k=4, allow_tie=True)
    make_items(project, 1)
    a = services.assignment_next(project_id=project.pk, user=user)
    with pytest.raises(errors.ServiceError, match="no gaps"):
        services.judgment_submit(assignment_id=a.pk, user=user, ranking=[1, 3, 3, 4])
    j = services.judgment_submit(assignment_id=a.pk, user=user, ranking=[1, 2, 2, 3]).judgment
    assert sorted(j.ranking) == [1, 2, 2, 3]


def test_disabled_options_are_rejected_and_nothing_is_written():
    project, (user, *_) = _project(allow_tie=False, allow_both_bad=False)
    make_items(project, 1)
    a = services.assignment_next(project_id=project.pk, user=user)
    for kwargs in (
        {"choice": "tie"},
        {"choice": "both_bad"},
        {"choice": "C"},
        {"choice": "A", "strength": "much"},
        {"choice": "A", "confidence": 3},
        {"choice": "A", "rationale": "because"},
        {"ranking": [1, 2]},
    ):
        with pytest.raises(errors.ServiceError):
            services.judgment_submit(assignment_id=a.pk, user=user, **kwargs)
    assert Judgment.objects.count() == 0
    assert Assignment.objects.get(pk=a.pk).status == Assignment.Status.LEASED


def test_submit_is_idempotent_by_key():
    project, (user, *_) = _project()
    make_items(project, 2)
    a = services.assignment_next(project_id=project.pk, user=user)
    first = services.judgment_submit(
        assignment_id=a.pk, user=user, choice="A", idempotency_key="k1"
    )
    again = services.judgment_submit(
        assignment_id=a.pk, user=user, choice="B", idempotency_key="k1"
    )
    assert again.replayed and again.judgment.pk == first.judgment.pk
    assert Judgment.objects.count() == 1
    assert Item.objects.get(pk=a.item_id).n_done == 1
    b = services.assignment_next(project_id=project.pk, user=user)
    with pytest.raises(errors.Conflict, match="another assignment"):
        services.judgment_submit(assignment_id=b.pk, user=user, choice="A", idempotency_key="k1")
    b.refresh_from_db()
    assert b.status == Assignment.Status.LEASED and Judgment.objects.count() == 1
    with pytest.raises(errors.Conflict, match="already submitted"):
        services.judgment_submit(assignment_id=a.pk, user=user, choice="A", idempotency_key="k2")


def test_foreign_assignment_is_not_found():
    project, (alice, bob, *_) = _project()
    make_items(project, 1)
    a = services.assignment_next(project_id=project.pk, user=alice)
    with pytest.raises(errors.NotFound):
        services.judgment_submit(assignment_id=a.pk, user=bob, choice="A")
    with pytest.raises(errors.NotFound):
        services.assignment_heartbeat(assignment_id=a.pk, user=bob)
    assert Judgment.objects.count() == 0


def test_expired_lease_is_rejected_and_the_item_goes_back():
    project, (alice, bob, *_) = _project(overlap=1)
    make_items(project, 1)
    a = services.assignment_next(project_id=project.pk, user=alice)
    assert services.assignment_next(project_id=project.pk, user=bob) is None
    Assignment.objects.filter(pk=a.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))
    b = services.assignment_next(project_id=project.pk, user=bob)
    assert b is not None and b.item_id == a.item_id
    assert Assignment.objects.get(pk=a.pk).status == Assignment.Status.EXPIRED
    with pytest.raises(errors.Conflict, match="expired"):
        services.judgment_submit(assignment_id=a.pk, user=alice, choice="A")
    services.judgment_submit(assignment_id=b.pk, user=bob, choice="A")
    assert Item.objects.get(pk=a.item_id).n_taken == 1
    assert Judgment.objects.count() == 1


def test_heartbeat_extends_the_lease():
    project, (user, *_) = _project(lease_seconds=60)
    make_items(project, 1)
    a = services.assignment_next(project_id=project.pk, user=user)
    Assignment.objects.filter(pk=a.pk).update(lease_expires=timezone.now() + timedelta(seconds=5))
    renewed = services.assignment_heartbeat(assignment_id=a.pk, user=user)
    assert renewed.lease_expires > timezone.now() + timedelta(seconds=50)


def test_skip_gives_the_item_to_someone_else_but_not_back():
    project, (alice, bob, *_) = _project(overlap=1)
    make_items(project, 1)
    a = services.assignment_next(project_id=project.pk, user=alice)
    with pytest.raises(errors.ServiceError):
        services.assignment_skip(assignment_id=a.pk, user=alice, reason="  ")
    services.assignment_skip(assignment_id=a.pk, user=alice, reason="not my language")
    services.assignment_skip(assignment_id=a.pk, user=alice, reason="not my language")
    assert services.assignment_next(project_id=project.pk, user=alice) is None
    assert services.assignment_next(project_id=project.pk, user=bob).item_id == a.item_id


def test_gold_items_are_mixed_in_at_the_gold_rate():
    project, (user, *_) = _project(overlap=1, gold_rate=0.3)
    make_items(project, 60)
    make_items(project, 30, gold=["A"] * 30)
    rng = random.Random(7)
    kinds = []
    while (a := services.assignment_next(project_id=project.pk, user=user, rng=rng)) is not None:
        kinds.append(a.kind)
        services.judgment_submit(assignment_id=a.pk, user=user, choice="A")
    served_before_done = kinds[:60]
    share = served_before_done.count(Assignment.Kind.GOLD) / len(served_before_done)
    assert 0.15 < share < 0.45
    assert Judgment.objects.filter(is_gold=True).count() == kinds.count(Assignment.Kind.GOLD)


def test_planned_repeats_come_later_with_sides_flipped():
    project, (user, *_) = _project(overlap=1, repeat_rate=0.3, repeat_min_gap=3)
    make_items(project, 30)
    rng = random.Random(11)
    history = []
    while (a := services.assignment_next(project_id=project.pk, user=user, rng=rng)) is not None:
        history.append(a)
        services.judgment_submit(assignment_id=a.pk, user=user, choice="A")
    repeats = [a for a in history if a.kind == Assignment.Kind.REPEAT]
    assert repeats, "no planned repeat was served"
    for rep in repeats:
        original = Assignment.objects.get(pk=rep.repeat_of_id)
        assert rep.item_id == original.item_id
        assert rep.display_order == list(reversed(original.display_order))
        assert rep.seq - original.seq >= 3
    assert len({r.repeat_of_id for r in repeats}) == len(repeats)
    # Repeats do not count towards overlap.
    assert set(Item.objects.values_list("n_done", flat=True)) == {1}


def test_repeats_reach_past_an_early_history_in_closed_rounds():
    # Given an annotator whose first REPEAT_WINDOW + 4 items are in a round since closed
    project, (user, *_) = _project(overlap=1, repeat_rate=0.0, repeat_min_gap=1)
    first, second = make_round(project), make_round(project)
    rng = random.Random(3)

    def label(n):
        served = []
        for _ in range(n):
            a = services.assignment_next(project_id=project.pk, user=user, rng=rng)
            services.judgment_submit(assignment_id=a.pk, user=user, choice="A")
            served.append(a)
        return served

    make_items(project, REPEAT_WINDOW + 4, round_=first)
    label(REPEAT_WINDOW + 4)
    make_items(project, 20, round_=second)
    later = label(5)
    Round.objects.filter(pk=first.pk).update(status=Round.Status.CLOSED)
    Project.objects.filter(pk=project.pk).update(repeat_rate=1.0)

    # When a repeat is drawn, it is of their earliest item still in an open round
    a = services.assignment_next(project_id=project.pk, user=user, rng=rng)
    assert a.kind == Assignment.Kind.REPEAT
    assert a.repeat_of_id == later[0].pk


def test_paused_annotator_is_not_served():
    project, (user, *_) = _project()
    make_items(project, 2)
    Membership.objects.filter(user=user).update(status=Membership.Status.PAUSED)
    with pytest.raises(errors.Forbidden):
        services.assignment_next(project_id=project.pk, user=user)


def test_non_member_gets_not_found_and_closed_rounds_are_not_served():
    project, (user, *_) = _project()
    make_items(project, 2)
    with pytest.raises(errors.NotFound):
        services.assignment_next(project_id=project.pk, user=make_user())
    Round.objects.update(status=Round.Status.CLOSED)
    assert services.assignment_next(project_id=project.pk, user=user) is None


def test_round_create_numbers_rounds_and_is_idempotent_by_source_key():
    project, _ = _project()
    r1 = services.round_create(project=project)
    r2 = services.round_create(project=project, source_key="gen-7")
    r2_again = services.round_create(project=project, source_key="gen-7")
    assert (r1.number, r2.number) == (1, 2)
    assert r2_again.pk == r2.pk
