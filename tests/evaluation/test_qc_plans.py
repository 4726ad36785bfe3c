"""A QC check reads a bounded number of rows per judgment, however stale the statistics.

Statistics are taken before the project has any judgment, as on a new project: every
statement the check sends is run again under EXPLAIN ANALYZE (tests/plans.py) and must touch
no more rows than a few passes over the project's judgments, where a nested loop over the
annotator's judgments per judgment of the project touches their product.
"""

import pytest
from django.db import connection

from annotation.models import Judgment
from evaluation import selectors
from tests.factories import add_member, make_items, make_project, make_user
from tests.plans import statements_explained

pytestmark = pytest.mark.django_db

ITEMS = 300


def test_a_qc_check_touches_a_bounded_number_of_rows_after_hundreds_of_judgments():
    # Given three annotators who labelled the same 300 items, and statistics from before
    project = make_project(overlap=3)
    items = make_items(project, ITEMS)
    annotators = [make_user() for _ in range(3)]
    for annotator in annotators:
        add_member(project, annotator)
    with connection.cursor() as cursor:
        cursor.execute('ANALYZE "annotation_judgment"')
        cursor.execute('ANALYZE "annotation_assignment"')
    Judgment.objects.bulk_create(
        Judgment(
            project=project,
            item=item,
            annotator=annotator,
            choice="A" if (n + i) % 4 else "B",
            shown_choice="A",
            time_spent_ms=4000,
        )
        for n, annotator in enumerate(annotators)
        for i, item in enumerate(items)
    )

    # When the first annotator's quality is checked
    with statements_explained() as touched:
        figures = selectors.annotator_quality(project=project, annotator_ids=[annotators[0].pk])

    # Then every statement touched at most a few passes over the project's judgments
    assert figures[annotators[0].pk].annotator_id == annotators[0].pk
    bound = 4 * Judgment.objects.filter(project=project).count()
    assert touched and max(rows for _, rows, _ in touched) <= bound, touched
