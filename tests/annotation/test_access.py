"""The one project access check: who sees a project, and which role each operation asks for."""

import pytest
from django.urls import reverse

from annotation import access
from annotation.errors import Forbidden, NotFound
from annotation.models import Membership
from tests.factories import add_member, make_project, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    project = make_project()
    people = {"staff": make_user(staff=True), "outsider": make_user()}
    for role in Membership.Role.values:
        people[role] = make_user()
        add_member(project, people[role], role)
    return project, people


# member, reviewer, manager: what each person gets ("ok", or the error's HTTP status)
EXPECTED = {
    "staff": ("ok", "ok", "ok"),
    "outsider": (404, 404, 404),
    Membership.Role.ANNOTATOR: ("ok", 403, 403),
    Membership.Role.REVIEWER: ("ok", "ok", 403),
    Membership.Role.RESEARCHER: ("ok", "ok", "ok"),
}
ROLES = (access.MEMBER, access.REVIEWER, access.MANAGER)


def outcome(user, project, role):
    try:
        assert access.project_for(user=user, project_id=project.pk, role=role) == project
    except (NotFound, Forbidden) as exc:
        return exc.status
    return "ok"


def test_each_role_reaches_what_its_membership_allows(people):
    project, by_name = people
    for name, expected in EXPECTED.items():
        got = tuple(outcome(by_name[name], project, role) for role in ROLES)
        assert got == expected, name
    with pytest.raises(NotFound):
        access.project_for(user=by_name["staff"], project_id=project.pk + 1000)


def test_an_archived_project_is_hidden_from_its_annotators_only(people):
    project, by_name = people
    project.archived = True
    project.save(update_fields=["archived"])
    annotator = by_name[Membership.Role.ANNOTATOR]
    assert [outcome(annotator, project, role) for role in ROLES] == [404, 404, 404]
    assert [outcome(by_name[Membership.Role.REVIEWER], project, r) for r in ROLES] == [
        "ok",
        "ok",
        403,
    ]


def test_every_api_answers_an_annotator_of_an_archived_project_as_if_it_did_not_exist(
    client, people
):
    # Given an annotator of a project that has since been archived
    project, by_name = people
    project.archived = True
    project.save(update_fields=["archived"])
    client.force_login(by_name[Membership.Role.ANNOTATOR])
    kwargs = {"project_id": project.pk}

    # Then the project, QC and dashboard URLs all answer 404 (QC used to answer 403)
    for name in ("api-project", "api-qc-agreement", "api-qc-policy", "dashboard:project"):
        assert client.get(reverse(name, kwargs=kwargs)).status_code == 404, name
