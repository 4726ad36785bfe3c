"""Annotator QC: each check pauses a failing annotator, flags (never deletes) their labels."""

import itertools
import random
from datetime import timedelta
from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from annotation.errors import ServiceError
from annotation.models import Assignment, Item, Judgment, Membership, TaskKind
from evaluation import services, tasks
from evaluation.models import AnnotatorAssessment, QualityPolicy
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


def _judge(project, user, item, choice, *, shown=None, ms=5000, kind="primary", repeat_of=None):
    """Record a submitted judgment as the serving path would (canonical choice, shown side)."""
    assignment = Assignment.objects.create(
        project=project,
        item=item,
        annotator=user,
        kind=kind,
        repeat_of=repeat_of,
        display_order=list(range(project.k)),
        status=Assignment.Status.SUBMITTED,
        lease_expires=timezone.now(),
    )
    fields = {"ranking": choice} if isinstance(choice, list) else {"choice": choice}
    shown = shown if shown is not None else (choice if isinstance(choice, str) else "")
    if isinstance(choice, list) and not shown:
        shown = ",".join(map(str, choice))
    return Judgment.objects.create(
        project=project,
        item=item,
        assignment=assignment,
        annotator=user,
        shown_choice=shown,
        time_spent_ms=ms,
        is_gold=item.is_gold,
        is_repeat=kind == "repeat",
        **fields,
    )


def _flip(choice: str) -> str:
    return {"A": "B", "B": "A"}.get(choice, choice)


@pytest.fixture
def project():
    return make_project(overlap=3)


def _member(project, name):
    user = make_user(name)
    add_member(project, user)
    return user


def _gold_items(project, n):
    answers = ["A" if i % 2 else "B" for i in range(n)]
    return make_items(project, n, gold=answers), answers


def test_wrong_gold_answers_pause_the_annotator_flag_their_labels_and_end_their_lease(project):
    # Given an annotator who misses every gold item and holds a live lease
    bad, good = _member(project, "bad"), _member(project, "good")
    gold, answers = _gold_items(project, 10)
    for item, answer in zip(gold, answers, strict=True):
        _judge(project, bad, item, _flip(answer))
        _judge(project, good, item, answer)
    (leased_item,) = make_items(project, 1)
    Item.objects.filter(pk=leased_item.pk).update(n_taken=1)
    lease = Assignment.objects.create(
        project=project,
        item=leased_item,
        annotator=bad,
        display_order=[0, 1],
        lease_expires=timezone.now() + timedelta(minutes=5),
    )

    # When their check runs
    result = services.qc_check_annotator(project=project, annotator_id=bad.pk)

    # Then they are paused and flagged, with the reason; labels are kept but marked
    membership = Membership.objects.get(project=project, user=bad)
    assert result.paused == [bad.pk]
    assert membership.status == Membership.Status.PAUSED and membership.flagged
    # The first check spends 6/pi^2 of the 5 % error: 96.96 % confidence, z = 2.165, and
    # the Wilson upper bound of 0 of 10 is z^2 / (10 + z^2) = 0.319.
    assert "gold accuracy 0.00 < 0.70 on 10 items (97% upper bound 0.32)" in (
        membership.status_reason
    )
    assert Judgment.objects.filter(annotator=bad).count() == 10
    assert set(Judgment.objects.filter(annotator=bad).values_list("qc_flag", flat=True)) == {
        "paused:gold_accuracy"
    }
    lease.refresh_from_db()
    assert lease.status == Assignment.Status.EXPIRED
    assert Item.objects.get(pk=leased_item.pk).n_taken == 0
    (assessment,) = AnnotatorAssessment.objects.filter(annotator=bad)
    assert assessment.verdict == "pause" and assessment.applied
    assert assessment.failed_checks == ["gold_accuracy"]
    assert assessment.metrics["gold"]["accuracy"] == 0.0
    assert assessment.metrics["gold"]["n_items"] == 10

    # And the careful annotator passes untouched
    services.qc_check_annotator(project=project, annotator_id=good.pk)
    assert Membership.objects.get(project=project, user=good).status == "active"
    assert not Judgment.objects.filter(annotator=good).exclude(qc_flag="").exists()
    assert AnnotatorAssessment.objects.get(annotator=good).verdict == "pass"


def test_always_pressing_left_is_position_bias(project):
    user = _member(project, "lefty")
    for i, item in enumerate(make_items(project, 20)):
        _judge(project, user, item, "A" if i % 2 else "B", shown="A")

    result = services.qc_check_annotator(project=project, annotator_id=user.pk)

    (assessment,) = result.assessments
    assert assessment.failed_checks == ["position_bias"]
    assert assessment.metrics["position"]["left_share"] == 1.0
    assert "left answer chosen 100% of 20 decisions" in assessment.reasons[0]


def test_ranking_that_always_puts_the_left_answer_first_is_position_bias():
    project = make_project(task_kind=TaskKind.RANKING, k=3)
    user = _member(project, "ranker")
    for item in make_items(project, 20):
        _judge(project, user, item, [1, 2, 3])

    result = services.qc_check_annotator(project=project, annotator_id=user.pk)

    assert result.assessments[0].failed_checks == ["position_bias"]


def test_repeats_answered_differently_fail_stability(project):
    user = _member(project, "fickle")
    for i, item in enumerate(make_items(project, 6)):
        label = "A" if i % 2 else "B"
        original = _judge(project, user, item, label)
        _judge(project, user, item, _flip(label), kind="repeat", repeat_of=original.assignment)

    result = services.qc_check_annotator(project=project, annotator_id=user.pk)

    (assessment,) = result.assessments
    assert assessment.failed_checks == ["stability"]
    assert assessment.metrics["stability"] == {"n_pairs": 6, "agreement": 0.0, "kappa": -1.0}


def test_judgments_faster_than_reading_fail_speed(project):
    user = _member(project, "speedy")
    for i, item in enumerate(make_items(project, 12)):
        _judge(project, user, item, "A" if i % 2 else "B", ms=200)

    result = services.qc_check_annotator(project=project, annotator_id=user.pk)

    (assessment,) = result.assessments
    assert assessment.failed_checks == ["speed"]
    assert assessment.metrics["speed"]["n_too_fast_to_read"] == 12


def test_an_annotator_who_contradicts_the_crowd_fails_the_consensus_test(project):
    # Given five annotators who label truthfully and one who always says the opposite,
    # each item labelled by three of them
    honest = [_member(project, f"honest{i}") for i in range(5)]
    contrarian = _member(project, "contrarian")
    rng = random.Random(0)
    items = make_items(project, 40)
    for i, item in enumerate(items):
        truth = "A" if i % 2 else "B"
        raters = rng.sample(honest, 2 if i < 30 else 3)
        for user in raters:
            _judge(project, user, item, truth, shown="A" if (i + user.pk) % 2 else "B")
        if i < 30:
            _judge(project, contrarian, item, _flip(truth), shown="A" if i % 2 else "B")

    # When the whole project is checked
    result = services.qc_check_project(project=project, agreement=False)

    # Then only the contrarian is paused, for the consensus test
    assert result.paused == [contrarian.pk]
    verdict = AnnotatorAssessment.objects.get(annotator=contrarian)
    assert verdict.failed_checks == ["consensus"]
    assert verdict.metrics["consensus"]["n_agree"] == 0
    assert verdict.metrics["consensus"]["n_votes"] == 30


def test_too_little_data_passes_with_notes(project):
    user = _member(project, "new")
    for item in make_items(project, 3):
        _judge(project, user, item, "A", shown="A", ms=100)

    result = services.qc_check_annotator(project=project, annotator_id=user.pk)

    (assessment,) = result.assessments
    assert assessment.verdict == "pass" and not assessment.applied
    assert any("gold: 0 of 5 items needed" in note for note in assessment.notes)
    assert any("speed: 3 of 10 timed judgments needed" in note for note in assessment.notes)


def test_disabled_policy_records_the_verdict_without_pausing(project):
    services.quality_policy_update(project=project, enabled=False)
    user = _member(project, "lefty")
    for item in make_items(project, 20):
        _judge(project, user, item, "A", shown="A")

    services.qc_check_annotator(project=project, annotator_id=user.pk)

    assessment = AnnotatorAssessment.objects.get(annotator=user)
    assert assessment.verdict == "pause" and not assessment.applied
    assert Membership.objects.get(project=project, user=user).status == "active"
    assert not Judgment.objects.exclude(qc_flag="").exists()


def test_a_researcher_resume_clears_flags_and_later_checks_judge_only_new_work(project):
    user = _member(project, "lefty")
    researcher = make_user("boss")
    items = make_items(project, 45)
    for item in items[:20]:
        _judge(project, user, item, "A", shown="A")
    services.qc_check_annotator(project=project, annotator_id=user.pk)
    assert Membership.objects.get(project=project, user=user).status == "paused"

    resume = services.annotator_resume(
        project=project, annotator_id=user.pk, by=researcher, note="Talked to them."
    )

    membership = Membership.objects.get(project=project, user=user)
    assert membership.status == "active" and not membership.flagged
    assert membership.status_reason == ""
    assert not Judgment.objects.exclude(qc_flag="").exists()
    assert resume.verdict == "resumed" and resume.reasons == ["Talked to them."]
    assert resume.created_by == researcher
    # The old left presses no longer count: nothing new to judge, nobody paused.
    assert services.qc_check_annotator(project=project, annotator_id=user.pk).paused == []

    # Balanced work after the resume passes, judged on the new labels only
    for i, item in enumerate(items[20:45]):
        _judge(project, user, item, "A", shown="A" if i % 2 else "B")
    check = services.qc_check_annotator(project=project, annotator_id=user.pk)
    assert check.paused == [] and check.assessments[0].metrics["position"]["n_decisions"] == 25
    assert check.assessments[0].metrics["since"] == resume.created_at.isoformat()


def test_pause_is_idempotent(project):
    user = _member(project, "lefty")
    for item in make_items(project, 20):
        _judge(project, user, item, "A", shown="A")
    args = {"project": project, "annotator_id": user.pk, "failed_checks": ["x"], "reasons": ["y"]}

    assert services.annotator_pause(**args) is True
    assert services.annotator_pause(**args) is False
    assert Membership.objects.get(project=project, user=user).status_reason.endswith("y")


def test_qc_after_submit_queues_a_check_every_n_judgments(project):
    user = _member(project, "someone")
    services.quality_policy_update(project=project, check_every_n_judgments=5)
    with mock.patch.object(tasks.qc_check_annotator_task, "delay") as delay:
        queued = [
            services.qc_after_submit(project_id=project.pk, annotator_id=user.pk, judgment_count=n)
            for n in range(1, 11)
        ]
        assert queued == [False] * 4 + [True] + [False] * 4 + [True]
        assert delay.call_args_list == [mock.call(project.pk, user.pk)] * 2

        # Without a count the membership's is read
        Membership.objects.filter(user=user).update(judgment_count=15)
        assert services.qc_after_submit(project_id=project.pk, annotator_id=user.pk)

        services.quality_policy_update(project=project, enabled=False)
        assert not services.qc_after_submit(
            project_id=project.pk, annotator_id=user.pk, judgment_count=20
        )
        assert delay.call_count == 3


def test_checks_space_out_as_the_count_grows():
    due = [n for n in range(1, 5121) if services.qc_check_due(n, 20)]
    # Every 20 judgments for the first 16 checks, then the step doubles with the count.
    assert due[:17] == [20 * k for k in range(1, 17)] + [360]
    assert [b - a for a, b in itertools.pairwise(due)][15:] == (
        [40] * 8 + [80] * 8 + [160] * 8 + [320] * 8
    )
    # The gap stays within an eighth of the count, and the checks' total work (each reads
    # the history up to its count) stays linear in the count, not quadratic.
    assert all(b - a <= max(20, a // 8) for a, b in itertools.pairwise(due))
    assert sum(due) < 13 * 5120 < sum(range(20, 5121, 20)) / 9
    assert services.qc_check_due(7, 7) and not services.qc_check_due(0, 20)
    assert services.qc_check_due(3, 0) and services.qc_check_due(1, 0)


def test_qc_after_submit_default_policy_and_broker_failure_never_raise(project):
    user = _member(project, "someone")
    with mock.patch.object(
        tasks.qc_check_annotator_task, "delay", side_effect=ConnectionError("broker down")
    ):
        assert (
            services.qc_after_submit(project_id=project.pk, annotator_id=user.pk, judgment_count=20)
            is False
        )


def test_tasks_run_the_checks(project):
    user = _member(project, "lefty")
    for item in make_items(project, 20):
        _judge(project, user, item, "A", shown="A")

    assert tasks.qc_check_annotator_task.apply(args=(project.pk, user.pk)).get() == 1
    assert tasks.qc_check_project_task.apply(args=(project.pk,)).get() == 0
    assert tasks.qc_check_annotator_task.apply(args=(10**9, user.pk)).get() == 0


def test_an_annotators_check_reads_the_policy_once_and_costs_the_same_queries_later(project):
    user, other = _member(project, "someone"), _member(project, "other")
    items = make_items(project, 60)

    def check_queries(labelled):
        for item in labelled:
            _judge(project, user, item, "A", shown=random.choice("AB"))
            _judge(project, other, item, "A", shown=random.choice("AB"))
        with CaptureQueriesContext(connection) as queries:
            services.qc_check_annotator(project=project, annotator_id=user.pk)
        return [q["sql"] for q in queries.captured_queries]

    first, later = check_queries(items[:20]), check_queries(items[20:])
    # One policy read however many parts of the check use it; as many statements at 40
    # judgments (and a previous check) as at 20.
    assert sum('FROM "evaluation_qualitypolicy"' in q for q in first) == 1, first
    assert len(later) == len(first), (first, later)


def test_disputed_items_are_queued_for_review_unless_adjudicated(project):
    users = [_member(project, f"u{i}") for i in range(3)]
    reviewer = make_user("rev")
    add_member(project, reviewer, Membership.Role.REVIEWER)
    split, agreed, tie_heavy, settled = make_items(project, 4)
    for user, label in zip(users, ["A", "B", "tie"], strict=True):
        _judge(project, user, split, label)
    for user in users:
        _judge(project, user, agreed, "A")
    for user, label in zip(users, ["A", "A", "B"], strict=True):
        _judge(project, user, tie_heavy, label)
    for user, label in zip(users, ["A", "B", "both_bad"], strict=True):
        _judge(project, user, settled, label)
    services.adjudication_create(item_id=settled.pk, reviewer=reviewer, choice="A")

    assert services.disagreements_mark(project=project) == 1

    flagged = set(Item.objects.filter(needs_review=True).values_list("pk", flat=True))
    # A 2-1 split reaches the 2/3 majority; 1-1 among A/B does not.
    assert flagged == {split.pk}


def test_policy_updates_are_validated(project):
    with pytest.raises(ServiceError):
        services.quality_policy_update(project=project, min_gold_accuracy=1.5)
    with pytest.raises(ServiceError):
        services.quality_policy_update(project=project, no_such_field=1)
    with pytest.raises(ServiceError):
        services.quality_policy_update(project=project, review_sources=["robots"])
    policy = services.quality_policy_update(project=project, review_sources=["human", "ai"])
    assert policy.sources_for_review() == ["human", "ai"]
    assert QualityPolicy.objects.count() == 1


def test_qc_command_is_a_dry_run_unless_asked_to_pause(project):
    user = _member(project, "lefty")
    other = _member(project, "fine")
    for i, item in enumerate(make_items(project, 20)):
        _judge(project, user, item, "A", shown="A")
        _judge(project, other, item, "A", shown="A" if i % 2 else "B")

    out = StringIO()
    call_command(
        "qc", "--project", str(project.pk), "--n-boot", "50", stdout=out, stderr=StringIO()
    )
    assert Membership.objects.get(user=user).status == "active"
    assert "lefty" in out.getvalue() and "pause" in out.getvalue()
    assert "human: alpha" in out.getvalue()

    out = StringIO()
    call_command(
        "qc",
        "--project",
        str(project.pk),
        "--pause",
        "--no-agreement",
        stdout=out,
        stderr=StringIO(),
    )
    assert Membership.objects.get(user=user).status == "paused"
    assert Membership.objects.get(user=other).status == "active"
    assert "PAUSED" in out.getvalue() and "1 paused" in out.getvalue()


def test_gold_is_judged_on_its_wilson_upper_bound_unless_the_policy_asks_for_the_point(project):
    # 6 of 10 right: below 0.7, but not confidently (95% upper bound 0.83)
    user = _member(project, "middling")
    gold, answers = _gold_items(project, 10)
    for i, (item, answer) in enumerate(zip(gold, answers, strict=True)):
        _judge(project, user, item, answer if i < 6 else _flip(answer))

    assert services.qc_check_annotator(project=project, annotator_id=user.pk).paused == []

    services.quality_policy_update(project=project, confidence=None)
    check = services.qc_check_annotator(project=project, annotator_id=user.pk)
    assert check.paused == [user.pk]
    assert check.assessments[0].reasons == ["gold accuracy 0.60 < 0.70 on 10 items"]


def test_the_library_confidence_rule_spares_short_streaks_but_not_clear_failures():
    from evaluation.stats.quality import QualityThresholds, Stability, assess_annotator

    point, confident = QualityThresholds(), QualityThresholds(confidence=0.95)
    streak, failure = Stability(5, 0.4, None), Stability(8, 0.125, None)

    assert assess_annotator(thresholds=point, stability=streak).status == "pause"
    assert assess_annotator(thresholds=confident, stability=streak).status == "pass"
    verdict = assess_annotator(thresholds=confident, stability=failure)
    assert verdict.reasons == ["self-agreement 0.12 < 0.60 on 8 repeats (95% upper bound 0.47)"]


def test_each_check_spends_a_smaller_level_and_a_resume_starts_the_count_again(project):
    # Given an annotator checked twice (pass), then paused by a researcher and resumed
    user = _member(project, "steady")
    researcher = make_user("lead")
    items = make_items(project, 60)
    for i, item in enumerate(items[:20]):
        _judge(project, user, item, "A", shown="A" if i % 2 else "B")
    services.qc_check_annotator(project=project, annotator_id=user.pk)
    services.qc_check_annotator(project=project, annotator_id=user.pk)
    services.annotator_pause_manual(
        project=project, annotator_id=user.pk, by=researcher, reason="x"
    )
    checks = {user.pk: None}
    # Then the stored checks count as looks, the manual pause does not
    assert services.selectors.annotator_checks_taken(project=project, since=checks) == {user.pk: 2}
    resume = services.annotator_resume(project=project, annotator_id=user.pk, by=researcher)
    since = {user.pk: resume.created_at}
    assert services.selectors.annotator_checks_taken(project=project, since=since) == {user.pk: 0}

    # When they press left 17 times of 20 after the resume (two-sided p = 0.0026)
    for i, item in enumerate(items[20:40]):
        _judge(project, user, item, "A", shown="A" if i % 7 else "B")
    first = services.qc_check_annotator(project=project, annotator_id=user.pk)
    # Then the first look after the resume tests at 0.001 * 6 / pi^2 = 0.00061: a pass
    assert first.paused == []
    assert first.assessments[0].metrics["position"]["p_value"] == pytest.approx(0.002577, abs=1e-5)

    # And a policy with a 5 % budget pauses them at the second look, whose level is
    # 0.05 * 6 / (pi^2 * 2^2) = 0.0076
    services.quality_policy_update(project=project, position_alpha=0.05)
    second = services.qc_check_annotator(project=project, annotator_id=user.pk)
    assert second.paused == [user.pk]
    assert "(binomial p = 0.0026 < 0.0076)" in second.assessments[0].reasons[0]
