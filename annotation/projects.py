"""Create a project: the one place its settings are checked, for the API and the admin alike."""

from django.core.exceptions import NON_FIELD_ERRORS
from django.db import transaction

from annotation.errors import ServiceError
from annotation.members import membership_set
from annotation.models import Membership, Project, TaskKind

# The settings a researcher chooses when creating a project; everything else is the server's.
PROJECT_SETTINGS = (
    "name",
    "rubric",
    "task_kind",
    "k",
    "overlap",
    "gold_rate",
    "repeat_rate",
    "repeat_min_gap",
    "lease_seconds",
    "max_skip_fraction",
    "max_skips_in_row",
    "skip_fraction_min_served",
    "allow_tie",
    "allow_both_bad",
    "ask_strength",
    "ask_confidence",
    "ask_rationale",
    "max_text_chars",
)


class ProjectInvalid(ServiceError):
    """Project settings that break a rule; `problems` maps each field to what is wrong."""

    code = "invalid_project"

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        super().__init__("; ".join(f"{field}: {text}" for field, text in problems.items()))


def _default(name: str):
    return Project._meta.get_field(name).get_default()


def project_problems(*, settings: dict) -> dict[str, str]:
    """Return {field: what is wrong} for project settings; NON_FIELD_ERRORS for combinations."""
    unknown = sorted(set(settings) - set(PROJECT_SETTINGS))
    if unknown:
        return {NON_FIELD_ERRORS: f"unknown setting(s): {', '.join(unknown)}."}
    value = {name: settings.get(name, _default(name)) for name in PROJECT_SETTINGS}
    kind, k = value["task_kind"], value["k"]
    if kind not in TaskKind.values:
        return {"task_kind": f"must be one of {', '.join(TaskKind.values)}."}
    if kind == TaskKind.PAIRWISE and k != 2:
        return {"k": "A pairwise project has k = 2."}
    if not 2 <= k <= 8:
        return {"k": "k must be from 2 to 8."}
    for rate in ("gold_rate", "repeat_rate", "max_skip_fraction"):
        if not 0 <= value[rate] <= 1:
            return {rate: "must be between 0 and 1."}
    if value["gold_rate"] + value["repeat_rate"] > 1:
        return {NON_FIELD_ERRORS: "gold_rate + repeat_rate must be at most 1."}
    if value["lease_seconds"] < 10:
        return {"lease_seconds": "must be at least 10."}
    if value["overlap"] < 1:
        return {"overlap": "must be at least 1."}
    return {}


@transaction.atomic
def project_create(*, settings: dict, researcher=None) -> Project:
    """Create a project from checked settings; the researcher given, if any, manages it."""
    problems = project_problems(settings=settings)
    if problems:
        raise ProjectInvalid(problems)
    project = Project.objects.create(**settings)
    if researcher is not None:
        membership_set(project=project, user=researcher, role=Membership.Role.RESEARCHER)
    return project
