"""Overdue leases: swept every few claims, and always before a claim would come back empty."""

from datetime import timedelta

import pytest
from django.utils import timezone

from annotation import services
from annotation.models import Assignment
from annotation.serving import LEASE_SWEEP_EVERY
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


def _annotators(project, n: int) -> list:
    users = [make_user() for _ in range(n)]
    for user in users:
        add_member(project, user)
    return users


def _overdue(assignment) -> None:
    Assignment.objects.filter(pk=assignment.pk).update(
        lease_expires=timezone.now() - timedelta(seconds=1)
    )


def test_an_item_whose_lease_ran_out_is_served_when_nothing_else_is_left():
    # Given two items seen once each; the first one's lease ran out after the last sweep
    project = make_project(overlap=1, gold_rate=0.0, repeat_rate=0.0)
    make_items(project, 2)
    alice, bob, carol = _annotators(project, 3)
    first = services.assignment_next(project_id=project.pk, user=alice)
    _overdue(first)
    second = services.assignment_next(project_id=project.pk, user=bob)
    assert second.item_id != first.item_id

    # When a third annotator asks while no other item is free
    third = services.assignment_next(project_id=project.pk, user=carol)

    # Then they get the item whose lease ran out, and that lease is over
    assert third is not None and third.item_id == first.item_id
    assert Assignment.objects.get(pk=first.pk).status == Assignment.Status.EXPIRED


def test_overdue_leases_are_given_back_within_a_sweep_interval_of_claims():
    # Given plenty of items and one lease that ran out
    project = make_project(overlap=1, gold_rate=0.0, repeat_rate=0.0)
    make_items(project, LEASE_SWEEP_EVERY + 4)
    first_user, *others = _annotators(project, LEASE_SWEEP_EVERY + 1)
    overdue = services.assignment_next(project_id=project.pk, user=first_user)
    _overdue(overdue)

    # When other annotators claim LEASE_SWEEP_EVERY items meanwhile
    statuses = []
    for user in others:
        assert services.assignment_next(project_id=project.pk, user=user) is not None
        statuses.append(Assignment.objects.get(pk=overdue.pk).status)

    # Then the lease was swept on the way (not on every claim), and its item counts as free
    assert statuses[-1] == Assignment.Status.EXPIRED
    assert statuses[0] == Assignment.Status.LEASED
    overdue.item.refresh_from_db()
    assert overdue.item.n_taken == 0
