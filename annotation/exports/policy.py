"""Export policies: what a snapshot keeps and how labels become rows; split assignment.

Policies (all recorded in the manifest and on the DatasetVersion):

* ``aggregation``: ``per_judgment`` (one row per label), ``majority``, ``trust_weighted``
  (annotator weight = Laplace-smoothed gold accuracy (correct + 1) / (answered + 2); no gold
  answered = 0.5) or ``dawid_skene`` (``evaluation.stats.aggregation``; needs one pass to collect
  every vote, so it keeps one small tuple per judgment in memory).
* ``ties``: ``drop``, ``soft`` (a row with soft_label = P(A preferred), 0.5 for one tie vote,
  margin 0) or ``keep`` (the same row flagged ``"tie": true``). An even split between A and B
  under an aggregation counts as a tie.
* ``both_bad``: ``drop``, ``separate`` (``<split>.both_bad.jsonl``: prompt + both answers) or
  ``kto`` (both answers as unpaired negatives, in the side file, or in the split itself for
  the ``unpaired`` format).
* ``min_agreement``: drop a decision whose agreement is lower: the winning label's share of
  the votes (majority, per_judgment), of the trust weight (trust_weighted) or its posterior
  (dawid_skene). ``min_votes``: drop decisions with fewer votes.
* ``sources``: label sources included, default ``["human"]``; ``ai``, ``simulated`` and
  ``imported`` labels are used only when named. Votes per source are reported.
* gold and repeat judgments and qc-flagged labels are left out unless included (the raw
  format includes them by default).
* ``margins``: strength -> margin, default slightly = 1.0, much = 2.0, not given = 0.0 (the
  margin in the Bradley-Terry loss of Llama 2, Touvron et al. 2023, sec. 3.2.2). Aggregated
  rows take the mean margin of the votes for the winning label.
* Rankings decompose into the n(n-1)/2 pairs of their positions (ties per the tie policy);
  the pairs of one ranking share a ``group_id``.
* ``split``: fractions for train / validation / test; a prompt's split is fixed by
  sha256(seed, group) where the group is the prompt's normalised content hash, or its
  ``group_key`` when ``group_by="group_key"``; with ``near_duplicates="group"`` a prompt
  near-duplicating an earlier one joins its group. No prompt is in two splits.
* Items repeating the same prompt and answers (in either order) are merged into one decision
  and reported (``merge_duplicate_pairs``).
* ``adjudicated_wins``: an item with a reviewer's verdict (``Adjudication``, the newest one)
  is decided by that verdict alone, whatever its votes say and however few they are; the
  raw format lists judgments and takes no verdicts.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

from django.conf import settings

from annotation.errors import ServiceError
from annotation.models import (
    LabelSource,
)
from training.trainers.data import SPLITS

FORMATS = ("trl", "hh", "unpaired", "raw")
AGGREGATIONS = ("per_judgment", "majority", "trust_weighted", "dawid_skene")
TIE_POLICIES = ("drop", "soft", "keep")
BOTH_BAD_POLICIES = ("drop", "separate", "kto")
GROUP_BY = ("prompt", "group_key")
NEAR_DUPLICATES = ("off", "report", "group")
DEFAULT_MARGINS = {"": 0.0, "slightly": 1.0, "much": 2.0}
DEFAULT_SPLIT = {"train": 0.9, "validation": 0.05, "test": 0.05}
CHUNK = 5000
UNTRUSTED_WEIGHT = 0.5  # (0 + 1) / (0 + 2): an annotator with no gold answers yet


class PolicyError(ServiceError):
    code = "invalid_policy"


@dataclass(frozen=True)
class ExportPolicy:
    """Everything that decides an export's rows; stored with the snapshot."""

    format: str = "trl"
    conversational: bool | None = None
    aggregation: str = "per_judgment"
    ties: str = "drop"
    both_bad: str = "drop"
    min_agreement: float = 0.0
    min_votes: int = 1
    sources: tuple[str, ...] = (LabelSource.HUMAN.value,)
    include_gold: bool | None = None
    include_repeats: bool | None = None
    include_qc_flagged: bool | None = None
    margins: dict = field(default_factory=lambda: dict(DEFAULT_MARGINS))
    split: dict = field(default_factory=lambda: dict(DEFAULT_SPLIT))
    seed: int = 0
    group_by: str = "prompt"
    near_duplicates: str = "off"
    merge_duplicate_pairs: bool = True
    rounds: tuple[int, ...] | None = None
    hf: bool = True
    adjudicated_wins: bool = False

    FILTER_KEYS = ("sources", "include_gold", "include_repeats", "include_qc_flagged", "rounds")

    @classmethod
    def from_dict(cls, data: dict | None) -> ExportPolicy:
        """Return a checked policy from JSON-like data; raise PolicyError on a bad value."""
        data = dict(data or {})
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise PolicyError(f"unknown policy field(s): {', '.join(sorted(unknown))}")
        if "sources" in data:
            data["sources"] = tuple(data["sources"] or ())
        if data.get("rounds") is not None:
            data["rounds"] = tuple(sorted({int(r) for r in data["rounds"]}))
        for name, kind in (("min_agreement", float), ("min_votes", int), ("seed", int)):
            if name in data:
                try:
                    data[name] = kind(data[name])
                except (TypeError, ValueError) as exc:
                    raise PolicyError(f"{name} must be a number") from exc
        if "margins" in data:
            data["margins"] = {**DEFAULT_MARGINS, **(data["margins"] or {})}
        try:
            policy = cls(**data)
        except TypeError as exc:
            raise PolicyError(str(exc)) from exc
        policy.check()
        raw = policy.format == "raw"
        for name in ("include_gold", "include_repeats", "include_qc_flagged"):
            if getattr(policy, name) is None:
                object.__setattr__(policy, name, raw)
        return policy

    def check(self) -> None:
        """Raise PolicyError when a field is out of range or fields contradict each other."""
        choices = {
            "format": FORMATS,
            "aggregation": AGGREGATIONS,
            "ties": TIE_POLICIES,
            "both_bad": BOTH_BAD_POLICIES,
            "group_by": GROUP_BY,
            "near_duplicates": NEAR_DUPLICATES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise PolicyError(f"{name} must be one of {', '.join(allowed)}")
        if not self.sources or set(self.sources) - set(LabelSource.values):
            raise PolicyError(f"sources must name some of {', '.join(LabelSource.values)}")
        if not 0.0 <= float(self.min_agreement) <= 1.0:
            raise PolicyError("min_agreement must lie in [0, 1]")
        if int(self.min_votes) < 1:
            raise PolicyError("min_votes must be at least 1")
        if set(self.split) - set(SPLITS) or "train" not in self.split:
            raise PolicyError("split must give train and optionally validation, test")
        fractions = list(self.split.values())
        if any(float(f) < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
            raise PolicyError("split fractions must be non-negative and sum to 1")
        if float(self.split["train"]) <= 0:
            raise PolicyError("the train fraction must be positive")
        if set(self.margins) - set(DEFAULT_MARGINS) or not all(
            isinstance(v, int | float) for v in self.margins.values()
        ):
            raise PolicyError("margins maps '', 'slightly' and 'much' to numbers")
        if self.format in ("hh", "unpaired") and self.ties != "drop":
            raise PolicyError(f"the {self.format} format has no way to hold ties: use ties=drop")
        if self.format == "raw" and (
            self.aggregation != "per_judgment" or self.min_agreement or self.min_votes > 1
        ):
            raise PolicyError("the raw format is one row per judgment: no aggregation filters")
        if self.format == "raw" and self.adjudicated_wins:
            raise PolicyError(
                "adjudicated_wins does not apply to the raw format (one row per judgment)"
            )

    def policies(self) -> dict:
        """Return the row-shaping policies (JSON)."""
        data = asdict(self)
        return {k: v for k, v in data.items() if k not in self.FILTER_KEYS}

    def filters(self) -> dict:
        """Return the label filters (JSON)."""
        data = asdict(self)
        out = {k: data[k] for k in self.FILTER_KEYS}
        out["sources"] = list(out["sources"])
        out["rounds"] = None if out["rounds"] is None else list(out["rounds"])
        return out


def split_for(seed: int, group: str, fractions: dict[str, float]) -> str:
    """Return the split of a group: where sha256(seed, group) falls in the cumulative fractions."""
    digest = hashlib.sha256(f"{seed}\x00{group}".encode()).hexdigest()
    u = int(digest[:15], 16) / 16**15
    total = 0.0
    chosen = "train"
    for name in SPLITS:
        share = float(fractions.get(name, 0.0))
        if share <= 0:
            continue
        chosen = name
        total += share
        if u < total:
            return name
    return chosen


def pseudonym(project_id: int, annotator_id: int | None, external: str) -> str:
    """Return a stable pseudonymous annotator id (salted with the deployment's secret)."""
    who = f"user:{annotator_id}" if annotator_id is not None else f"ext:{external}"
    salt = getattr(settings, "SECRET_KEY", "")
    return "r" + hashlib.sha256(f"{salt}\x00{project_id}\x00{who}".encode()).hexdigest()[:12]
