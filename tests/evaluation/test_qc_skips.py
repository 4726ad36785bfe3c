"""QC judges skip rates against the pool, and speed on the server's time on task for humans."""

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from annotation import services as annotation_services
from annotation.models import LabelSource, Membership
from evaluation import services
from evaluation.models import QualityPolicy
from evaluation.stats.quality import QualityThresholds, assess_annotator, skip_rate
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


def _client(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _label_all(client, project, *, skip_every: int = 0, body: dict | None = None) -> None:
    """Ask for items until done; skip every `skip_every`-th, else press the left answer."""
    served = submitted = 0
    while (response := client.post(f"/api/projects/{project.pk}/next/")).status_code == 200:
        aid = response.json()["assignment_id"]
        served += 1
        if skip_every and served % skip_every == 0:
            answer = client.post(f"/api/assignments/{aid}/skip/", {"reason": "x"}, format="json")
            assert answer.status_code == 200, answer.content
            continue
        # Alternate sides, so that no one leans left.
        submitted += 1
        choice = "A" if submitted % 2 else "B"
        answer = client.post(
            f"/api/assignments/{aid}/submit/", {"choice": choice, **(body or {})}, format="json"
        )
        assert answer.status_code == 201, answer.content
    assert response.status_code == 204, response.content


def test_skip_rate_is_judged_against_the_pool_with_a_margin():
    thresholds = QualityThresholds(min_skip_served=20, max_skip_excess=0.2, skip_alpha=0.01)
    # Half of 40 skipped where others skipped 2 of 120: paused, with the figures.
    far = skip_rate(20, 40, pool_skipped=2, pool_served=120)
    verdict = assess_annotator(thresholds=thresholds, skips=far)
    assert verdict.status == "pause"
    assert "skipped 50% of 40 items, others 2% of the same items" in verdict.reasons[0]
    # Significant but within the margin: passes.
    near = skip_rate(8, 40, pool_skipped=2, pool_served=120)
    assert near.p_value < 0.01
    assert assess_annotator(thresholds=thresholds, skips=near).status == "pass"
    # Too few served items: not judged yet.
    early = assess_annotator(thresholds=thresholds, skips=skip_rate(10, 10, **_pool(0, 0)))
    assert early.status == "pass" and early.notes == ["skip rate: 10 of 20 served items needed"]


def _pool(skipped: int, served: int) -> dict:
    return {"pool_skipped": skipped, "pool_served": served}


def test_an_annotator_who_skips_far_more_than_the_others_is_paused_for_it():
    # Given four annotators served every item, one of whom skips every second one
    project = make_project(overlap=4, max_skip_fraction=1.0, max_skips_in_row=0)
    make_items(project, 40)
    QualityPolicy.objects.create(project=project, enabled=False, min_timed_judgments=10_000)
    careful = [make_user() for _ in range(3)]
    skipper = make_user()
    for user in [*careful, skipper]:
        add_member(project, user)
        _label_all(_client(user), project, skip_every=2 if user == skipper else 0)

    # When the project is checked
    result = services.qc_check_project(project=project, agreement=False)

    # Then only the skipper is paused, for the skip rate, with the figures kept
    assert result.paused == [skipper.pk]
    by_user = {a.annotator_id: a for a in result.assessments}
    assert by_user[skipper.pk].failed_checks == ["skip_rate"]
    skips = by_user[skipper.pk].metrics["skips"]
    assert skips["n_served"] == 40 and skips["n_skipped"] == 20
    assert skips["pool_rate"] < 0.02
    for user in careful:
        assert "skip_rate" not in by_user[user.pk].failed_checks
        assert by_user[user.pk].metrics["skips"]["n_skipped"] == 0


def test_a_client_that_sends_no_time_is_speed_checked_on_the_servers_clock():
    # Given a human annotator whose client never reports a time and who answers at once
    project = make_project(overlap=1)
    make_items(project, 12)
    QualityPolicy.objects.create(project=project, enabled=True)
    user = make_user()
    add_member(project, user)
    _label_all(_client(user), project)

    # When they are checked
    result = services.qc_check_annotator(project=project, annotator_id=user.pk)

    # Then the server's times count and they are paused for speed
    (assessment,) = result.assessments
    assert assessment.failed_checks == ["speed"]
    assert assessment.metrics["speed"]["n_timed"] == 12
    assert Membership.objects.get(project=project, user=user).status == "paused"


@pytest.mark.parametrize("source", [LabelSource.SIMULATED, LabelSource.AI])
def test_machine_accounts_are_not_speed_checked(source):
    # Given a machine account labelling through the API in milliseconds
    project = make_project(overlap=1)
    make_items(project, 12)
    QualityPolicy.objects.create(project=project, enabled=False)
    key = annotation_services.simulated_annotator_ensure(
        project=project, username=f"bot-{source}", source=source
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    _label_all(client, project, body={"time_spent_ms": 5})

    # When it is checked
    bot = Token.objects.get(key=key).user
    result = services.qc_check_annotator(project=project, annotator_id=bot.pk)

    # Then speed is not judged at all, and it stays active
    (assessment,) = result.assessments
    assert "speed" not in assessment.failed_checks
    assert assessment.metrics["speed"] is None
    assert not any(note.startswith("speed") for note in assessment.notes)
    assert Membership.objects.get(project=project, user=bot).status == "active"
