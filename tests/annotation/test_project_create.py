"""Creating a project (annotation.projects.project_create): one set of rules for API and admin."""

import re

import pytest
from django.core.exceptions import NON_FIELD_ERRORS
from django.test import Client
from rest_framework.test import APIClient

from annotation.models import Membership, Project
from annotation.projects import PROJECT_SETTINGS, ProjectInvalid, project_create
from tests.factories import make_user

pytestmark = pytest.mark.django_db

BROKEN = [
    ({"task_kind": "pairwise", "k": 3}, "k"),
    ({"task_kind": "ranking", "k": 9}, "k"),
    ({"task_kind": "poll"}, "task_kind"),
    ({"gold_rate": 1.5}, "gold_rate"),
    ({"repeat_rate": -0.1}, "repeat_rate"),
    ({"max_skip_fraction": 1.01}, "max_skip_fraction"),
    ({"gold_rate": 0.6, "repeat_rate": 0.6}, NON_FIELD_ERRORS),
    ({"lease_seconds": 5}, "lease_seconds"),
    ({"overlap": 0}, "overlap"),
    ({"archived": True}, NON_FIELD_ERRORS),
]


@pytest.mark.parametrize(("settings", "field"), BROKEN)
def test_project_create_names_the_broken_setting_and_writes_nothing(settings, field):
    with pytest.raises(ProjectInvalid) as caught:
        project_create(settings={"name": "broken", **settings}, researcher=make_user())
    assert list(caught.value.problems) == [field]
    assert caught.value.status == 400
    assert not Project.objects.exists() and not Membership.objects.exists()


def test_project_create_makes_the_researcher_its_manager():
    researcher = make_user()
    project = project_create(
        settings={"name": "ranked", "task_kind": "ranking", "k": 4, "max_skip_fraction": 0.1},
        researcher=researcher,
    )
    assert (project.k, project.max_skip_fraction, project.overlap) == (4, 0.1, 3)
    assert project.memberships.get().user == researcher
    assert project.memberships.get().role == Membership.Role.RESEARCHER


def _admin_add_form(client: Client) -> tuple[dict, str]:
    """Return the admin's add form as posted untouched (no members) and its inline prefix."""
    page = client.get("/admin/annotation/project/add/").content.decode()
    total = re.search(r'name="(\w+)-TOTAL_FORMS"', page).group(1)
    data = {
        f"{total}-TOTAL_FORMS": "0",
        f"{total}-INITIAL_FORMS": "0",
        f"{total}-MIN_NUM_FORMS": "0",
        f"{total}-MAX_NUM_FORMS": "1000",
    }
    for name, value in re.findall(
        r'<input type="(?:text|number)" name="(\w+)" value="([^"]*)"', page
    ):
        data[name] = value
    for name in re.findall(r'<input type="checkbox" name="(\w+)"[^>]*checked', page):
        data[name] = "on"
    data.update(task_kind="pairwise", rubric="")
    return data, total


def test_admin_add_form_refuses_what_the_api_refuses_with_the_same_words():
    staff = make_user(staff=True)
    client = Client()
    client.force_login(staff)
    form, _ = _admin_add_form(client)
    api = APIClient()
    api.force_authenticate(staff)
    for settings, words in (
        ({"gold_rate": "0.6", "repeat_rate": "0.6"}, "gold_rate + repeat_rate must be at most 1."),
        ({"k": "3"}, "A pairwise project has k = 2."),
    ):
        page = client.post("/admin/annotation/project/add/", {**form, "name": "x", **settings})
        assert page.status_code == 200 and words in page.content.decode()
        response = api.post("/api/projects/", {"name": "x", **settings}, format="json")
        assert response.status_code == 400 and words in str(response.json())
    assert not Project.objects.exists()


def test_admin_add_form_creates_the_project_with_its_inline_members():
    staff, annotator = make_user(staff=True), make_user()
    client = Client()
    client.force_login(staff)
    form, prefix = _admin_add_form(client)
    form.update(
        {
            "name": "from the admin",
            "gold_rate": "0.1",
            "repeat_rate": "0.2",
            f"{prefix}-TOTAL_FORMS": "1",
            f"{prefix}-0-user": str(annotator.pk),
            f"{prefix}-0-role": Membership.Role.ANNOTATOR,
            f"{prefix}-0-status": Membership.Status.ACTIVE,
        }
    )
    response = client.post("/admin/annotation/project/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    project = Project.objects.get(name="from the admin")
    assert (project.gold_rate, project.repeat_rate) == (0.1, 0.2)
    assert [(m.user, m.role) for m in project.memberships.all()] == [
        (annotator, Membership.Role.ANNOTATOR)
    ]


def test_api_shows_its_manager_every_setting_chosen_and_whether_the_project_is_archived():
    # given a project created through the API with a setting off its default
    staff = make_user(staff=True)
    api = APIClient()
    api.force_authenticate(staff)
    created = api.post("/api/projects/", {"name": "shown", "overlap": 5}, format="json")
    assert created.status_code == 201, created.json()
    project = Project.objects.get(name="shown")
    # when it is archived and its manager reads it back
    project.archived = True
    project.save(update_fields=["archived"])
    shown = api.get(f"/api/projects/{project.pk}/").json()
    # then every setting a researcher chooses is there with its stored value, and the state
    assert set(PROJECT_SETTINGS) <= set(created.json()) and set(PROJECT_SETTINGS) <= set(shown)
    assert {name: shown[name] for name in PROJECT_SETTINGS} == {
        name: getattr(project, name) for name in PROJECT_SETTINGS
    }
    assert shown["overlap"] == 5
    assert (created.json()["archived"], shown["archived"]) == (False, True)
