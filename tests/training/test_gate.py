"""The promotion gate: criteria, the researcher's manual decision, and the policy rounds use."""

from __future__ import annotations

import pytest

from annotation.errors import Conflict, NotFound, ServiceError
from annotation.models import Membership
from tests.factories import add_member, make_project, make_round, make_user
from training.loop.gate import (
    policy_base,
    policy_current,
    policy_last_promoted,
    policy_promote,
    policy_reject,
)
from training.models import ModelVersion

pytestmark = pytest.mark.django_db


def _project_with_policies():
    project = make_project()
    base = ModelVersion.objects.create(
        name=f"base-{project.pk}", artifact_path="/b", project=project
    )
    round_ = make_round(project)
    round_.model_version = base
    round_.save(update_fields=["model_version"])
    new = ModelVersion.objects.create(
        name=f"new-{project.pk}", artifact_path="/n", parent=base, project=project
    )
    return project, base, new


def test_researcher_promotes_and_rejects_by_hand_with_a_reason():
    project, base, new = _project_with_policies()
    researcher = make_user()
    add_member(project, researcher, Membership.Role.RESEARCHER)
    # Given nothing promoted, rounds come from the base.
    assert policy_last_promoted(project=project) is None
    assert policy_base(project=project) == base
    assert policy_current(project=project) == base

    promoted = policy_promote(version=new, user=researcher, reason="  reads better  ")
    assert promoted.promotion == "promoted"
    assert promoted.promotion_reason == "reads better"
    assert promoted.promoted_by == researcher
    assert promoted.promoted_at is not None
    assert policy_current(project=project) == new

    rejected = policy_reject(version=new, user=researcher, reason="longer, not better")
    assert rejected.promotion == "rejected"
    assert rejected.promotion_reason == "longer, not better"
    assert policy_current(project=project) == base


def test_manual_decision_keeps_the_gate_verdict_and_marks_it_overridden():
    _project, _base, new = _project_with_policies()
    new.gate = {"passed": False, "criteria": {}}
    new.promotion = "rejected"
    new.save(update_fields=["gate", "promotion"])
    staff = make_user(staff=True)
    version = policy_promote(version=new, user=staff, reason="the judge is wrong here")
    assert version.gate["passed"] is False
    assert version.gate["overridden_by_hand"] is True
    assert version.promotion == "promoted"


def test_manual_decision_refuses_outsiders_annotators_and_bad_input():
    project, _base, new = _project_with_policies()
    outsider = make_user()
    annotator = make_user()
    add_member(project, annotator, Membership.Role.ANNOTATOR)
    researcher = make_user()
    add_member(project, researcher, Membership.Role.RESEARCHER)
    for user in (outsider, annotator):
        with pytest.raises(NotFound):
            policy_promote(version=new, user=user, reason="x")
    with pytest.raises(ServiceError, match="reason"):
        policy_reject(version=new, user=researcher, reason="   ")
    reward = ModelVersion.objects.create(
        name="rm", artifact_path="/r", kind="reward", project=project
    )
    with pytest.raises(ServiceError, match="not a policy"):
        policy_promote(version=reward, user=researcher, reason="x")
    new.status = ModelVersion.Status.FAILED
    new.save(update_fields=["status"])
    with pytest.raises(Conflict, match="ready"):
        policy_promote(version=new, user=researcher, reason="x")
    new.refresh_from_db()
    assert new.promotion == ""
    assert new.promoted_by is None
