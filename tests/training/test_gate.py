"""The promotion gate: criteria, the researcher's manual decision, and the policy rounds use."""

from __future__ import annotations

import pytest

from annotation.errors import Conflict, NotFound, ServiceError
from annotation.models import Membership
from tests.factories import add_member, add_pool_prompts, make_project, make_round, make_user
from tests.training.conftest import label_first_round
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


def _evaluated(new, previous, *, ci_low, kl, length_ratio, judge_kind="reward_model"):
    """Store an evaluation record as policy_evaluate leaves it (inputs of the gate)."""
    from training.models import PolicyEvaluation

    new.eval_results = {
        "generation": {
            "previous_id": previous.pk,
            "kl_reference": {"available": kl is not None, "value": kl},
            "length_ratio_vs_previous": length_ratio,
        }
    }
    new.save(update_fields=["eval_results"])
    PolicyEvaluation.objects.create(
        policy=new,
        opponent=previous,
        judge_kind=judge_kind,
        judge=f"{judge_kind} 1",
        wins=20,
        ties=2,
        losses=10,
        win_rate=0.656,
        ci_low=ci_low,
        ci_high=0.8,
        n_prompts=32,
    )


def _loop_settings(**gate):
    from training.loop.settings import LoopSettings

    return LoopSettings(path="dpo", gate=gate)


def test_gate_promotes_a_policy_within_every_criterion_and_rounds_follow_it():
    from training.loop.gate import policy_gate

    project, base, new = _project_with_policies()
    _evaluated(new, base, ci_low=0.55, kl=3.0, length_ratio=1.2)

    decided = policy_gate(policy=new, settings=_loop_settings(kl_budget=5.0))

    assert decided.promotion == "promoted" and decided.promoted_by is None
    criteria = decided.gate["criteria"]
    assert criteria["win_rate_ci_low[reward_model 1]"] == {
        "value": 0.55,
        "threshold": 0.5,
        "passed": True,
        "judge_kind": "reward_model",
        "opponent": base.pk,
        "win_rate": 0.656,
    }
    assert criteria["kl_reference"] == {"value": 3.0, "threshold": 5.0, "passed": True}
    assert criteria["length_ratio"]["passed"] is True
    # No reward model in a DPO iteration: reported, not counted.
    assert criteria["rm_test_accuracy"]["passed"] is None
    assert decided.promotion_reason.startswith("passed")
    assert policy_current(project=project) == new


@pytest.mark.parametrize(
    ("ci_low", "kl", "length_ratio", "failing"),
    [
        (0.45, 3.0, 1.0, "win_rate_ci_low[reward_model 1]"),
        (0.6, 7.5, 1.0, "kl_reference"),
        (0.6, 3.0, 2.5, "length_ratio"),
    ],
)
def test_gate_keeps_a_failing_policy_unpromoted_and_rounds_stay_on_the_last_promoted(
    ci_low, kl, length_ratio, failing
):
    from training.loop.gate import policy_gate

    project, base, new = _project_with_policies()
    staff = make_user(staff=True)
    policy_promote(version=base, user=staff, reason="the base reads well")
    _evaluated(new, base, ci_low=ci_low, kl=kl, length_ratio=length_ratio)

    decided = policy_gate(policy=new, settings=_loop_settings(kl_budget=5.0))

    assert decided.promotion == "rejected"
    assert decided.gate["passed"] is False
    assert decided.gate["criteria"][failing]["passed"] is False
    assert failing in decided.promotion_reason
    assert ModelVersion.objects.filter(pk=new.pk).exists()  # kept, not deleted
    assert policy_current(project=project) == base
    # A researcher overrides the gate by hand; the gate does not undo it.
    policy_promote(version=new, user=staff, reason="the judge is too strict here")
    assert policy_gate(policy=new, settings=_loop_settings(kl_budget=5.0)).promotion == "promoted"
    assert policy_current(project=project) == new


@pytest.mark.parametrize(
    ("ci_low", "ci_high", "promotion"), [(0.3, 0.55, "promoted"), (0.2, 0.45, "rejected")]
)
def test_the_held_out_judge_rejects_only_a_clearly_worse_policy(ci_low, ci_high, promotion):
    from training.loop.gate import policy_gate
    from training.models import PolicyEvaluation

    # given a new policy that the loop's held-out judge finds not better (CI low under 0.5)
    project, base, new = _project_with_policies()
    staff = make_user(staff=True)
    policy_promote(version=base, user=staff, reason="the base reads well")
    _evaluated(new, base, ci_low=0.6, kl=1.0, length_ratio=1.0)
    PolicyEvaluation.objects.create(
        policy=new,
        opponent=base,
        judge_kind="reward_model",
        judge="reward model 9 (judge)",
        wins=12,
        ties=2,
        losses=18,
        win_rate=0.4,
        ci_low=ci_low,
        ci_high=ci_high,
        n_prompts=32,
        details={"held_out_judge": True},
    )

    # when the gate judges it
    decided = policy_gate(policy=new, settings=_loop_settings(kl_budget=5.0))

    # then the judge's verdict counts as a non-inferiority check on its CI's upper end
    criterion = decided.gate["criteria"]["not_worse[reward model 9 (judge)]"]
    assert criterion["value"] == ci_high and criterion["threshold"] == 0.5
    assert criterion["passed"] is (promotion == "promoted")
    assert decided.promotion == promotion
    assert policy_current(project=project) == (new if promotion == "promoted" else base)


def test_gate_without_a_judge_or_kl_reports_them_and_a_failed_evaluation_is_not_promoted():
    from training.loop.gate import kl_budget, policy_gate

    project, base, new = _project_with_policies()
    new.eval_results = {
        "generation": {
            "previous_id": base.pk,
            "kl_reference": {"available": False, "reason": "not available: endpoint"},
        }
    }
    new.save(update_fields=["eval_results"])
    settings = _loop_settings()
    assert kl_budget(settings=settings) == settings.gate["kl_budget"] == 20.0
    decided = policy_gate(policy=new, settings=settings)
    assert decided.gate["criteria"]["win_rate_ci_low"]["passed"] is None
    assert decided.gate["criteria"]["kl_reference"]["note"] == "not available: endpoint"
    assert decided.promotion == "promoted"

    other = ModelVersion.objects.create(name="other", artifact_path="/o", project=project)
    refused = policy_gate(policy=other, settings=settings, evaluation_error="no eval prompts")
    assert refused.promotion == "rejected"
    assert "no eval prompts" in refused.promotion_reason


def test_gate_settings_refuse_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown gate setting"):
        _loop_settings(kl=3)
    with pytest.raises(ValueError, match="kl_budget"):
        _loop_settings(kl_budget="a lot")
    with pytest.raises(ValueError, match="win_rate_judges"):
        _loop_settings(win_rate_judges=["oracle"])


def _pool_loop(tiny_policy_dir, *, n_eval: int, **gate):
    """Return (project, base, settings) with round 1 generated from the base and labelled."""
    from training.loop.settings import LoopSettings

    project = make_project(overlap=1)
    add_pool_prompts(project, train=8, eval=n_eval)
    base = ModelVersion.objects.create(
        name=f"tiny-base-{project.pk}", artifact_path=str(tiny_policy_dir), project=project
    )
    loop_settings = LoopSettings(
        path="dpo",
        n_prompts=8,
        generation={"temperature": 1.0, "max_new_tokens": 6},
        dpo={"max_steps": 2, "per_device_train_batch_size": 2, "save_steps": 2},
        evaluation={"n_prompts": 4},
        gate=gate,
    )
    label_first_round(project, base, loop_settings, choices="A")
    return project, base, loop_settings


def test_an_unevaluated_policy_waits_for_the_evaluation_or_a_decision_by_hand(
    settings, tmp_path, tiny_policy_dir
):
    from annotation.models import Round
    from training.loop import loop_advance

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    # Given a pool without evaluation prompts, the new policy cannot be evaluated.
    project, base, loop_settings = _pool_loop(tiny_policy_dir, n_eval=0)

    state = loop_advance(project=project, settings=loop_settings, sync=True)

    steps = {s.name: s for s in state.steps}
    assert steps["evaluate"].status == "failed"
    assert "no evaluation prompts" in steps["evaluate"].detail
    assert steps["gate"].status == "waiting" and "by hand" in steps["gate"].detail
    assert state.new_round is None
    assert Round.objects.filter(project=project).count() == 1
    new = ModelVersion.objects.get(training_run__project=project, training_run__recipe="dpo")
    assert new.promotion == ""

    # A researcher rejects it by hand: the loop goes on, from the base.
    policy_reject(version=new, user=make_user(staff=True), reason="not evaluated, too risky")
    state = loop_advance(project=project, settings=loop_settings, sync=True)
    assert state.new_round is not None and state.new_round.model_version == base
    assert state.new_round.items.exists()


@pytest.mark.parametrize("passes", [True, False], ids=["gate passes", "gate fails"])
def test_a_loop_iteration_evaluates_gates_and_generates_from_the_last_promoted_policy(
    settings, tmp_path, tiny_policy_dir, passes
):
    from training.loop import loop_advance
    from training.models import PolicyEvaluation

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    # Failing: any answer longer than nothing breaks a length ratio of 0.
    project, base, loop_settings = _pool_loop(
        tiny_policy_dir, n_eval=4, kl_budget=None, max_length_ratio=100.0 if passes else 0.0
    )

    state = loop_advance(project=project, settings=loop_settings, sync=True)

    steps = {s.name: s for s in state.steps}
    assert steps["dpo"].status == "done", state.steps
    new = ModelVersion.objects.get(training_run__project=project, training_run__recipe="dpo")
    assert steps["evaluate"].status == "done"
    assert "generation" in new.eval_results
    assert new.eval_results["generation"]["kl_reference"]["available"] is True
    assert not PolicyEvaluation.objects.filter(policy=new).exists()  # a pool DPO: no judge
    assert new.promotion == ("promoted" if passes else "rejected")
    assert steps["gate"].detail.startswith(new.promotion)
    # The next round comes from the last promoted policy: the new one, or still the base.
    assert state.new_round.model_version == (new if passes else base)
    assert state.new_round.items.exists()


def test_an_rm_ppo_iteration_scores_its_reward_model_on_the_test_split_and_freezes_it(
    settings, tmp_path, tiny_policy_dir
):
    from training.loop import loop_advance
    from training.loop.settings import LoopSettings

    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project(overlap=1)
    add_pool_prompts(project, train=40, eval=4)
    base = ModelVersion.objects.create(
        name=f"tiny-base-rm-{project.pk}", artifact_path=str(tiny_policy_dir), project=project
    )
    loop_settings = LoopSettings(
        path="rm_ppo",
        n_prompts=40,
        generation={"temperature": 1.0, "max_new_tokens": 6},
        reward={"max_steps": 2, "per_device_train_batch_size": 4, "save_steps": 2},
        ppo={"max_steps": 1, "rollout_batch_size": 4, "per_device_train_batch_size": 4},
        evaluation={"n_prompts": 4},
        # Only the criteria this test is about: an untrained policy's lengths vary freely.
        gate={"kl_budget": None, "max_length_ratio": None, "min_rm_accuracy": 0.0},
        # No held-out judge: its verdict on an untrained policy would decide the promotion.
        held_out_judge=False,
    )
    label_first_round(project, base, loop_settings)

    state = loop_advance(project=project, settings=loop_settings, sync=True)

    steps = {s.name: s for s in state.steps}
    assert steps["ppo"].status == "done", state.steps
    reward = ModelVersion.objects.get(kind="reward", training_run__project=project)
    report = reward.eval_results["rm_metrics"]
    assert report["split"] == "test" and report["n_pairs"] >= 1
    assert {"accuracy", "nll", "roc_auc", "ece"} <= set(report)
    assert steps["rm_test"].status == "done"
    normalisation = reward.eval_results["calibration"]["normalisation"]
    assert normalisation["policy_version_id"] == base.pk and normalisation["std"] > 0
    policy = ModelVersion.objects.get(training_run__project=project, training_run__recipe="ppo")
    rm_criterion = policy.gate["criteria"]["rm_test_accuracy"]
    assert rm_criterion["value"] == report["accuracy"]
    assert rm_criterion["reward_model"] == reward.pk and rm_criterion["passed"] is True
    # The iteration's reward model judged the new policy against its parent, but PPO was
    # optimised against it: the gate reports that verdict without counting it.
    verdict = policy.evaluations.get(judge_kind="reward_model", opponent=base)
    assert verdict.details["optimised_against"] is True
    win_criterion = policy.gate["criteria"][f"win_rate_ci_low[{verdict.judge}]"]
    assert win_criterion["passed"] is None and "optimised against" in win_criterion["note"]
    assert policy.promotion == "promoted"
