"""Live agreement served from the cache until a label arrives or changes.

The bootstrap behind `evaluation.selectors.project_agreement` costs seconds on a big project,
so a figure asked for again with the same round, ``n_boot`` and ``seed`` is read back from the
cache. The cache key holds a fingerprint of the project's labels (how many, the newest id, and
which are QC-flagged), so a new or newly flagged label makes the next request compute afresh.
"""

from __future__ import annotations

from django.core.cache import cache
from django.db.models import Count, Max, Sum

from annotation.models import Judgment, Project, Round
from annotation.querysets import flagged_q
from evaluation import selectors

CACHE_SECONDS = 3600


def labels_fingerprint(*, project: Project) -> str:
    """Return a short string that changes whenever a label of the project is added or flagged."""
    flagged = flagged_q()
    figures = Judgment.objects.filter(project=project).aggregate(
        n=Count("id"),
        newest=Max("id"),
        n_flagged=Count("id", filter=flagged),
        flagged_ids=Sum("id", filter=flagged),
    )
    return "-".join(str(figures[key] or 0) for key in ("n", "newest", "n_flagged", "flagged_ids"))


def project_agreement_cached(
    *, project: Project, round_: Round | None = None, n_boot: int = 1000, seed: int = 0
) -> dict:
    """Return `project_agreement`, from the cache while the project's labels are unchanged."""
    key = ":".join(
        [
            "prefloop:agreement",
            str(project.pk),
            str(round_.pk if round_ is not None else 0),
            str(n_boot),
            str(seed),
            labels_fingerprint(project=project),
        ]
    )
    report = cache.get(key)
    if report is None:
        report = selectors.project_agreement(
            project=project, round_=round_, n_boot=n_boot, seed=seed
        )
        cache.set(key, report, CACHE_SECONDS)
    return report
