"""The dashboard's front page: one card per project the user may read."""

from __future__ import annotations

from annotation.models import Project
from config.console.dashboard import data
from config.console.dashboard.panel import Panel

COLUMNS = ["id", "project", "task", "rounds", "items", "labels", "training runs", "last label"]


def project_overview_panel(*, projects: list[Project]) -> Panel:
    """Return one row per project: rounds, items, labels, models, runs, last label."""
    rows = [
        [
            p.pk,
            p.name,
            p.get_task_kind_display(),
            p.n_rounds,
            p.n_items,
            p.n_judgments,
            p.n_runs,
            p.last_label.strftime("%Y-%m-%d %H:%M") if p.last_label else None,
        ]
        for p in data.project_overview(projects=projects)
    ]
    return Panel(key="projects", title="Projects", columns=COLUMNS, rows=rows)
