"""Admin forms: no add form saves a row the services never queue or build, and the
membership switch pauses and resumes through the QC services."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation.models import Adjudication, DatasetVersion, Judgment, Membership
from evaluation.models import AnnotatorAssessment
from tests.factories import add_member, make_items, make_project, make_user
from training.models import TrainingRun

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    client.force_login(make_user("admin-staff", staff=True))
    return client


@pytest.mark.parametrize(
    ("url_name", "model", "post"),
    [
        ("admin:training_trainingrun_add", TrainingRun, {"recipe": "dpo", "config": "{}"}),
        ("admin:annotation_datasetversion_add", DatasetVersion, {"version": "1"}),
        ("admin:annotation_adjudication_add", Adjudication, {"choice": "A"}),
    ],
)
def test_add_forms_that_would_bypass_the_services_are_gone(staff_client, url_name, model, post):
    # given a project the rows could belong to
    project = make_project()
    item = make_items(project, 1)[0]
    # when staff open or post the add form
    assert staff_client.get(reverse(url_name)).status_code == 403
    response = staff_client.post(
        reverse(url_name), {**post, "project": project.pk, "item": item.pk}
    )
    # then it is refused and nothing is saved
    assert response.status_code == 403
    assert model.objects.count() == 0


def test_adjudication_cannot_be_edited_in_the_admin(staff_client):
    project = make_project()
    item = make_items(project, 1)[0]
    reviewer = make_user("reviewer-x")
    adjudication = Adjudication.objects.create(item=item, reviewer=reviewer, choice="A")
    url = reverse("admin:annotation_adjudication_change", args=[adjudication.pk])
    response = staff_client.post(url, {"item": item.pk, "choice": "B"})
    assert response.status_code == 403
    adjudication.refresh_from_db()
    assert adjudication.choice == "A"


def _membership_post(membership: Membership, status: str, note: str = "") -> dict:
    return {"role": membership.role, "status": status, "note": note}


def test_admin_resume_keeps_the_resumed_record_and_clears_the_pause_flags(staff_client):
    # given an annotator paused by QC, with a flagged label
    project = make_project()
    annotator = make_user("paused-one")
    membership = add_member(project, annotator)
    item = make_items(project, 1)[0]
    Judgment.objects.create(
        project=project, item=item, annotator=annotator, choice="A", qc_flag="paused:gold"
    )
    Membership.objects.filter(pk=membership.pk).update(
        status=Membership.Status.PAUSED, status_reason="too fast", flagged=True
    )
    membership.refresh_from_db()
    url = reverse("admin:annotation_membership_change", args=[membership.pk])
    # when staff flip the status switch to active, with a note
    response = staff_client.post(url, _membership_post(membership, "active", "talked to them"))
    # then the QC service made the switch and kept its record
    assert response.status_code == 302, response.content.decode()[:2000]
    membership.refresh_from_db()
    assert membership.status == Membership.Status.ACTIVE
    assert membership.flagged is False and membership.status_reason == ""
    record = AnnotatorAssessment.objects.get(project=project, annotator=annotator)
    assert record.verdict == AnnotatorAssessment.Verdict.RESUMED
    assert record.reasons == ["talked to them"]
    assert Judgment.objects.get(annotator=annotator).qc_flag == ""


def test_admin_pause_ends_the_lease_and_keeps_the_reason(staff_client):
    project = make_project()
    annotator = make_user("active-one")
    membership = add_member(project, annotator)
    url = reverse("admin:annotation_membership_change", args=[membership.pk])
    response = staff_client.post(url, _membership_post(membership, "paused", "answers copied"))
    assert response.status_code == 302, response.content.decode()[:2000]
    membership.refresh_from_db()
    assert membership.status == Membership.Status.PAUSED
    assert membership.flagged is True
    assert "answers copied" in membership.status_reason


def test_membership_list_has_no_inline_status_switch(staff_client):
    project = make_project()
    add_member(project, make_user("listed-one"))
    page = staff_client.get(reverse("admin:annotation_membership_changelist")).content.decode()
    assert 'name="form-0-status"' not in page


def test_a_runs_config_cannot_be_edited_in_the_admin(staff_client):
    project = make_project()
    run = TrainingRun.objects.create(recipe="dpo", project=project, config={"beta": 0.1})
    url = reverse("admin:training_trainingrun_change", args=[run.pk])
    page = staff_client.get(url).content.decode()
    assert 'name="config"' not in page and 'name="base_model_path"' not in page
    staff_client.post(url, {"recipe": "ppo", "config": '{"model_name_or_path": "/etc"}'})
    run.refresh_from_db()
    assert run.recipe == "dpo" and run.config == {"beta": 0.1}
