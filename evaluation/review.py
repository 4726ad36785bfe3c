"""What a reviewer sees of a disputed item: how split its votes are, and its review payload.

`evaluation.selectors` loads the items, labels and adjudications; these functions judge the
split and shape the JSON. Nothing here touches the database.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from annotation.labels import label_text, top_positions
from evaluation.stats.jsonable import number

if TYPE_CHECKING:
    from annotation.models import Adjudication, Item
    from evaluation.models import QualityPolicy


def item_split(labels: list, *, ranking: bool) -> tuple[float | None, int]:
    """Return (majority share, votes counted) of an item's labels.

    Pairwise: the larger of A and B over the A/B votes (tie and both-bad do not count).
    Ranking: the share of rankings that put the most often top-ranked answer first.
    """
    if ranking:
        tops = Counter(top_positions(tuple(ranks)) for ranks in labels)
        n = sum(tops.values())
        return (max(tops.values()) / n if n else None), n
    counts = Counter(label for label in labels if label in ("A", "B"))
    n = counts["A"] + counts["B"]
    return (max(counts["A"], counts["B"]) / n if n else None), n


def disputed_shares(
    labels: dict[int, list], *, ranking: bool, policy: QualityPolicy
) -> dict[int, float]:
    """Return item id -> majority share of the items split beyond the policy's threshold."""
    disputed = {}
    for item_id, item_labels in labels.items():
        share, n = item_split(item_labels, ranking=ranking)
        if (
            share is not None
            and n >= policy.disagreement_min_votes
            and share < policy.disagreement_threshold - 1e-9
        ):
            disputed[item_id] = share
    return disputed


def vote_counts(labels: list) -> dict[str, int]:
    """Count labels by their text form ("A", or "1,2,3" for a ranking)."""
    return dict(
        Counter(label if isinstance(label, str) else label_text(tuple(label)) for label in labels)
    )


# What `label_json` reads of a judgment.
LABEL_FIELDS = (
    "id",
    "item_id",
    "annotator__username",
    "external_rater",
    "source",
    "choice",
    "ranking",
    "strength",
    "confidence",
    "rationale",
    "is_repeat",
    "is_gold",
    "item__is_gold",
    "qc_flag",
    "created_at",
)


def label_json(row: dict) -> dict:
    """Return one judgment row (a `values()` dict) as the reviewer sees it, with its author."""
    return {
        "judgment_id": row["id"],
        "annotator": row["annotator__username"] or row["external_rater"],
        "source": row["source"],
        "choice": row["choice"] or None,
        "ranking": row["ranking"],
        "strength": row["strength"],
        "confidence": row["confidence"],
        "rationale": row["rationale"],
        "is_repeat": row["is_repeat"],
        "qc_flag": row["qc_flag"],
        "created_at": row["created_at"].isoformat(),
    }


def adjudication_payload(adjudication: Adjudication) -> dict:
    """Return an adjudication as JSON."""
    return {
        "id": adjudication.pk,
        "item_id": adjudication.item_id,
        "reviewer": adjudication.reviewer.username,
        "choice": adjudication.choice or None,
        "ranking": adjudication.ranking,
        "note": adjudication.note,
        "created_at": adjudication.created_at.isoformat(),
    }


def review_payload(
    item: Item,
    *,
    ranking: bool,
    candidates: list[dict],
    labels: list[dict],
    counted: list,
    adjudications: list[dict],
) -> dict:
    """Return one item's review payload; the split shown is that of its ``counted`` votes."""
    share, n = item_split(counted, ranking=ranking)
    return {
        "item_id": item.pk,
        "round": item.round.number,
        "needs_review": item.needs_review,
        "prompt": {"text": item.prompt.text, "messages": item.prompt.messages},
        "candidates": candidates,
        "majority_share": number(share),
        "n_votes": n,
        "vote_counts": vote_counts(counted),
        "labels": labels,
        "adjudications": adjudications,
    }
