"""A committed submit starts quality control through the hook evaluation registers at startup."""

import pytest

from annotation import services as annotation_services
from evaluation import services
from evaluation.models import AnnotatorAssessment
from evaluation.tasks import qc_check_annotator_task
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def inline_tasks():
    """Run queued Celery tasks in this process, so their effect is seen when delay returns."""
    conf = qc_check_annotator_task.app.conf
    before = conf.task_always_eager
    conf.task_always_eager = True
    yield
    conf.task_always_eager = before


def test_every_nth_committed_submit_runs_the_annotators_qc_check(inline_tasks):
    # Given a project whose policy checks an annotator after every second judgment
    project = make_project(overlap=1)
    make_items(project, 3)
    user = make_user()
    add_member(project, user)
    services.quality_policy_update(project=project, check_every_n_judgments=2)

    def submit(n: int) -> None:
        assignment = annotation_services.assignment_next(project_id=project.pk, user=user)
        annotation_services.judgment_submit(
            assignment_id=assignment.pk, user=user, idempotency_key=f"k{n}", choice="A"
        )

    # When the annotator submits once, then twice (each submit commits on its own)
    submit(1)
    checks = AnnotatorAssessment.objects.filter(project=project, annotator=user)
    assert not checks.exists()
    submit(2)

    # Then the second judgment's commit ran one automatic check of this annotator
    assert list(checks.values_list("trigger", flat=True)) == [AnnotatorAssessment.Trigger.AUTO]
