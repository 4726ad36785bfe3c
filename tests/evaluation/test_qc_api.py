"""QC API: reviewers see labels and adjudicate, researchers manage QC, annotators see nothing."""

from unittest import mock

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from annotation.models import Adjudication, Assignment, Item, Judgment, Membership, TaskKind
from evaluation import services, tasks
from evaluation.models import AnnotatorAssessment
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _judge(project, user, item, choice, shown=None):
    assignment = Assignment.objects.create(
        project=project,
        item=item,
        annotator=user,
        display_order=[0, 1],
        status=Assignment.Status.SUBMITTED,
        lease_expires=timezone.now(),
    )
    return Judgment.objects.create(
        project=project,
        item=item,
        assignment=assignment,
        annotator=user,
        choice=choice,
        shown_choice=shown or choice,
        time_spent_ms=4000,
        rationale=f"{user.username} thinks {choice}",
    )


@pytest.fixture
def setup():
    project = make_project(overlap=3, ask_rationale=True)
    annotators = [make_user(f"ann{i}") for i in range(3)]
    for user in annotators:
        add_member(project, user)
    reviewer, researcher, outsider = make_user("rev"), make_user("res"), make_user("out")
    add_member(project, reviewer, Membership.Role.REVIEWER)
    add_member(project, researcher, Membership.Role.RESEARCHER)
    split, agreed = make_items(project, 2, models=("gpt-secret", "llama-secret"))
    for user, label in zip(annotators, ["A", "B", "tie"], strict=True):
        _judge(project, user, split, label)
    for user in annotators:
        _judge(project, user, agreed, "A")
    services.disagreements_mark(project=project)
    return {
        "project": project,
        "annotators": annotators,
        "reviewer": reviewer,
        "researcher": researcher,
        "outsider": outsider,
        "split": split,
        "agreed": agreed,
    }


def _urls(s) -> dict[str, tuple[str, str]]:
    p, item = s["project"].pk, s["split"].pk
    user = s["annotators"][0].pk
    return {
        "agreement": ("get", f"/api/qc/projects/{p}/agreement/"),
        "labels": ("get", f"/api/qc/projects/{p}/labels/"),
        "queue": ("get", f"/api/qc/projects/{p}/disagreements/"),
        "item": ("get", f"/api/qc/items/{item}/"),
        "adjudicate": ("post", f"/api/qc/items/{item}/adjudications/"),
        "annotators": ("get", f"/api/qc/projects/{p}/annotators/"),
        "assessments": ("get", f"/api/qc/projects/{p}/annotators/{user}/assessments/"),
        "resume": ("post", f"/api/qc/projects/{p}/annotators/{user}/resume/"),
        "policy": ("get", f"/api/qc/projects/{p}/policy/"),
        "check": ("post", f"/api/qc/projects/{p}/check/"),
    }


def _call(client, method, url, body=None):
    if method == "post":
        return client.post(url, body or {"choice": "A"}, format="json")
    return client.get(url)


def test_annotators_get_403_and_outsiders_404_on_every_qc_endpoint(setup):
    annotator, outsider = _client(setup["annotators"][0]), _client(setup["outsider"])
    anonymous = APIClient()
    for name, (method, url) in _urls(setup).items():
        assert _call(annotator, method, url).status_code == 403, name
        assert _call(outsider, method, url).status_code == 404, name
        assert _call(anonymous, method, url).status_code in (401, 403), name
    assert not Adjudication.objects.exists()


def test_reviewers_read_labels_but_not_the_researcher_pages(setup):
    reviewer = _client(setup["reviewer"])
    allowed = {"agreement", "labels", "queue", "item"}
    for name, (method, url) in _urls(setup).items():
        if name == "adjudicate":
            continue
        expected = 200 if name in allowed else 403
        assert _call(reviewer, method, url).status_code == expected, name


def test_the_queue_lists_the_split_item_with_every_label_and_no_model_names(setup):
    response = _client(setup["reviewer"]).get(
        f"/api/qc/projects/{setup['project'].pk}/disagreements/"
    )

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 1
    (entry,) = body["results"]
    assert entry["item_id"] == setup["split"].pk
    assert entry["majority_share"] == 0.5 and entry["n_votes"] == 2
    assert entry["vote_counts"] == {"A": 1, "B": 1, "tie": 1}
    assert sorted(label["annotator"] for label in entry["labels"]) == ["ann0", "ann1", "ann2"]
    assert [c["label"] for c in entry["candidates"]] == ["A", "B"]
    assert "secret" not in response.content.decode()


def test_the_queue_shows_the_split_that_queued_the_item_not_other_sources_or_repeats(setup):
    # Given the split item also labelled by an AI annotator and a repeat, which do not count
    project, split = setup["project"], setup["split"]
    Judgment.objects.create(
        project=project, item=split, choice="A", source="ai", external_rater="ai-rm-1"
    )
    Judgment.objects.create(
        project=project, item=split, annotator=setup["annotators"][0], choice="A", is_repeat=True
    )

    # When a reviewer reads the queue and the item
    reviewer = _client(setup["reviewer"])
    (entry,) = reviewer.get(f"/api/qc/projects/{project.pk}/disagreements/").json()["results"]
    item = reviewer.get(f"/api/qc/items/{split.pk}/").json()

    # Then both show the human primary split that queued it; every label is still listed
    for payload in (entry, item):
        assert payload["majority_share"] == 0.5 and payload["n_votes"] == 2
        assert payload["vote_counts"] == {"A": 1, "B": 1, "tie": 1}
        assert len(payload["labels"]) == 5


def test_a_reviewer_adjudication_is_stored_beside_the_labels(setup):
    split = setup["split"]
    before = list(Judgment.objects.filter(item=split).values_list("id", "choice", "qc_flag"))

    response = _client(setup["reviewer"]).post(
        f"/api/qc/items/{split.pk}/adjudications/",
        {"choice": "B", "note": "B answers the question."},
        format="json",
    )

    assert response.status_code == 201
    assert response.json()["choice"] == "B" and response.json()["reviewer"] == "rev"
    adjudication = Adjudication.objects.get(item=split)
    assert adjudication.reviewer == setup["reviewer"] and adjudication.note
    assert list(Judgment.objects.filter(item=split).values_list("id", "choice", "qc_flag")) == (
        before
    )
    assert not Item.objects.get(pk=split.pk).needs_review
    queue = _client(setup["reviewer"]).get(f"/api/qc/projects/{setup['project'].pk}/disagreements/")
    assert queue.json()["count"] == 0
    detail = _client(setup["researcher"]).get(f"/api/qc/items/{split.pk}/").json()
    assert [a["choice"] for a in detail["adjudications"]] == ["B"]


@pytest.mark.parametrize(
    "body",
    [{"choice": "C"}, {"ranking": [1, 2]}, {}, {"choice": "A", "ranking": [1, 2]}],
)
def test_invalid_adjudications_are_refused_with_400(setup, body):
    response = _client(setup["reviewer"]).post(
        f"/api/qc/items/{setup['split'].pk}/adjudications/", body, format="json"
    )
    assert response.status_code == 400
    assert not Adjudication.objects.exists()


def test_ranking_adjudications_take_dense_ranks():
    project = make_project(task_kind=TaskKind.RANKING, k=3)
    reviewer = make_user()
    add_member(project, reviewer, Membership.Role.REVIEWER)
    (item,) = make_items(project, 1)
    client = _client(reviewer)
    url = f"/api/qc/items/{item.pk}/adjudications/"
    assert client.post(url, {"ranking": [1, 3, 3]}, format="json").status_code == 400
    assert client.post(url, {"ranking": [2, 1, 2]}, format="json").status_code == 201


def test_researchers_see_the_quality_table_and_resume_a_paused_annotator(setup):
    project, annotator = setup["project"], setup["annotators"][0]
    services.annotator_pause(
        project=project, annotator_id=annotator.pk, failed_checks=["speed"], reasons=["too fast"]
    )
    client = _client(setup["researcher"])

    table = client.get(f"/api/qc/projects/{project.pk}/annotators/").json()
    row = next(r for r in table if r["username"] == "ann0")
    assert row["status"] == "paused" and row["flagged"]
    assert row["n_flagged_labels"] == 2 and row["sources"] == {"human": 2}

    response = client.post(
        f"/api/qc/projects/{project.pk}/annotators/{annotator.pk}/resume/",
        {"note": "Retrained."},
        format="json",
    )

    assert response.status_code == 200 and response.json()["verdict"] == "resumed"
    membership = Membership.objects.get(project=project, user=annotator)
    assert membership.status == "active" and not membership.flagged
    assert not Judgment.objects.filter(annotator=annotator).exclude(qc_flag="").exists()
    history = client.get(f"/api/qc/projects/{project.pk}/annotators/{annotator.pk}/assessments/")
    assert [a["verdict"] for a in history.json()] == ["resumed"]


def test_researchers_edit_the_policy_and_queue_a_check(setup):
    project = setup["project"]
    client = _client(setup["researcher"])
    url = f"/api/qc/projects/{project.pk}/policy/"

    policy = client.get(url).json()
    assert policy["stored"] is False and policy["min_gold_accuracy"] == 0.7
    changed = client.patch(url, {"min_gold_accuracy": 0.8, "enabled": False}, format="json")
    assert changed.status_code == 200 and changed.json()["min_gold_accuracy"] == 0.8
    assert client.patch(url, {"min_gold_accuracy": 2}, format="json").status_code == 400
    assert client.patch(url, {"bogus": 1}, format="json").status_code == 400

    with mock.patch.object(tasks.qc_check_project_task, "delay") as delay:
        response = client.post(f"/api/qc/projects/{project.pk}/check/")
    assert response.status_code == 202
    delay.assert_called_once_with(project.pk, AnnotatorAssessment.Trigger.API)


def test_agreement_endpoint_serves_the_stored_report_or_computes_one(setup):
    project = setup["project"]
    client = _client(setup["reviewer"])
    url = f"/api/qc/projects/{project.pk}/agreement/"

    live = client.get(url, {"n_boot": 50})
    assert live.status_code == 200 and live.json()["stored"] is False
    assert live.json()["report"]["by_source"]["human"]["n_items"] == 2

    services.agreement_report_store(project=project, n_boot=20)
    stored = client.get(url).json()
    assert stored["stored"] is True and stored["report"]["n_boot"] == 20
    assert client.get(url, {"live": "true", "n_boot": 10}).json()["stored"] is False
    assert client.get(url, {"round": 1, "n_boot": 10}).json()["report"]["round"] == 1
    assert client.get(url, {"round": 9}).status_code == 404
    assert client.get(url, {"n_boot": "x"}).status_code == 400


def test_staff_may_review_any_project(setup):
    staff = make_user("admin", staff=True)
    response = _client(staff).get(f"/api/qc/projects/{setup['project'].pk}/disagreements/")
    assert response.status_code == 200
