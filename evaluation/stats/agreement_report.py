"""Agreement figures of one project's labels, one block per label source, with bootstrap CIs.

Pure (numpy, no Django): `evaluation.selectors.project_agreement` loads the labels and names
the raters; this module turns them into the JSON-ready blocks of the agreement report.
Pairwise labels are nominal over ``categories`` (e.g. A / B / tie / both_bad); rankings are
tuples of ranks by position, ordinal. Every interval is a percentile bootstrap over items.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evaluation.stats.agreement import (
    bootstrap_ci,
    cohen_kappa,
    fleiss_kappa,
    kendall_tau_b,
    krippendorff_alpha,
    percent_agreement,
)
from evaluation.stats.jsonable import ci_json, number

Rater = Hashable  # a user id, or "ext:<name>" for imported labels without an account
Label = str | tuple[int, ...]


@dataclass(frozen=True)
class RatedLabel:
    """One rater's label on one item, with its source and round."""

    item_id: int
    rater: Rater
    source: str
    label: Label
    round_number: int


def mean_ci(values: Iterable[float], n_boot: int, seed: int, alpha: float = 0.05) -> dict | None:
    """Return the mean of per-item values with a percentile bootstrap interval over items.

    Resampling n items with replacement draws how often each distinct value occurs from
    Multinomial(n, observed shares): the same bootstrap as `bootstrap_ci(np.mean, ...)`, at
    the cost of the (few) distinct values instead of the items.
    """
    array = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if array.size == 0:
        return None
    distinct, counts = np.unique(array, return_counts=True)
    rng = np.random.default_rng(seed)
    means = rng.multinomial(array.size, counts / array.size, size=n_boot) @ distinct / array.size
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2]) if n_boot else (None, None)
    return {
        "estimate": number(array.mean()),
        "low": number(low),
        "high": number(high),
        "n_valid": n_boot,
    }


def modes(counts: Counter) -> set:
    """Return the most frequent labels (several when tied)."""
    top = max(counts.values())
    return {label for label, n in counts.items() if n == top}


def by_item(votes: Iterable[RatedLabel]) -> dict[int, dict[Rater, Any]]:
    """Group labels by item and rater; a rater's later label on an item replaces an earlier one."""
    grouped: dict[int, dict[Rater, Any]] = defaultdict(dict)
    for vote in votes:
        grouped[vote.item_id][vote.rater] = vote.label
    return grouped


def _by_rater(labels_by_item: dict[int, dict[Rater, Any]]) -> dict[Rater, dict[int, Any]]:
    out: dict[Rater, dict[int, Any]] = defaultdict(dict)
    for item, labels in labels_by_item.items():
        for rater, label in labels.items():
            out[rater][item] = label
    return out


def _compact_matrix(
    labels_by_item: dict[int, dict[Rater, Any]], code: Callable[[Any], Any]
) -> np.ndarray:
    """Return a (max labels per item) x items x ... matrix of codes, NaN where empty.

    Krippendorff's alpha and percent agreement depend only on how many labels of each value a
    unit got, not on who gave them, so row r simply holds each item's r-th label: the matrix
    is as tall as the overlap instead of the number of annotators.
    """
    items = list(labels_by_item)
    height = max(len(labels) for labels in labels_by_item.values())
    first = code(next(iter(labels_by_item[items[0]].values())))
    shape = (height, len(items), *np.shape(first))
    matrix = np.full(shape, np.nan)
    for column, item in enumerate(items):
        for row, label in enumerate(labels_by_item[item].values()):
            matrix[row, column] = code(label)
    return matrix


def _kappa_ci(
    codes_a: np.ndarray,
    codes_b: np.ndarray,
    n_values: int,
    n_boot: int,
    seed: int,
    alpha: float = 0.05,
) -> tuple[float, float]:
    """Return a percentile bootstrap interval of Cohen's kappa over the shared items.

    Resampling n items with replacement draws the pair table from Multinomial(n, observed
    cell shares), so all replicates come from one vectorised draw.
    """
    n = codes_a.size
    table = np.bincount(codes_a * n_values + codes_b, minlength=n_values * n_values)
    rng = np.random.default_rng(seed)
    shares = rng.multinomial(n, table / n, size=n_boot).reshape(n_boot, n_values, n_values) / n
    observed = np.trace(shares, axis1=1, axis2=2)
    expected = (shares.sum(axis=2) * shares.sum(axis=1)).sum(axis=1)
    # kappa = (p_o - p_e) / (1 - p_e)  (Cohen 1960), as evaluation.stats.agreement.cohen_kappa
    with np.errstate(divide="ignore", invalid="ignore"):
        kappas = np.where(expected < 1, (observed - expected) / (1 - expected), np.nan)
    kappas = kappas[~np.isnan(kappas)]
    if kappas.size == 0:
        return float("nan"), float("nan")
    low, high = np.quantile(kappas, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def _pair_table(
    by_rater: dict[Rater, dict[int, Any]],
    names: dict[Rater, str],
    min_shared_items: int,
    pair_stat: Callable[[list, list], dict],
) -> dict:
    """Return the annotator x annotator matrix of a pairwise statistic on shared items."""
    raters = sorted(by_rater, key=lambda r: (names.get(r, str(r)), str(r)))
    size = len(raters)
    matrix: list[list[float | None]] = [[None] * size for _ in range(size)]
    shared_counts = [[0] * size for _ in range(size)]
    pairs = []
    for i in range(size):
        shared_counts[i][i] = len(by_rater[raters[i]])
        for j in range(i + 1, size):
            labels_a, labels_b = by_rater[raters[i]], by_rater[raters[j]]
            shared = sorted(labels_a.keys() & labels_b.keys())
            shared_counts[i][j] = shared_counts[j][i] = len(shared)
            if len(shared) < max(min_shared_items, 1):
                continue
            stat = pair_stat([labels_a[k] for k in shared], [labels_b[k] for k in shared])
            matrix[i][j] = matrix[j][i] = stat["estimate"]
            pairs.append({"a": raters[i], "b": raters[j], "n_shared": len(shared), **stat})
    return {
        "min_shared_items": min_shared_items,
        "annotators": [{"id": r, "name": names.get(r, str(r))} for r in raters],
        "matrix": matrix,
        "n_shared": shared_counts,
        "pairs": pairs,
    }


def _block_counts(labels_by_item: dict[int, dict[Rater, Any]], units: dict) -> dict[str, int]:
    return {
        "n_items": len(units),
        "n_judgments": sum(len(labels) for labels in labels_by_item.values()),
        "n_annotators": len({r for labels in labels_by_item.values() for r in labels}),
    }


def pairwise_block(
    labels_by_item: dict[int, dict[Rater, str]],
    names: dict[Rater, str],
    *,
    categories: Sequence[str],
    overlap: int,
    n_boot: int,
    seed: int,
    min_shared_items: int,
) -> dict:
    """Return nominal agreement figures of pairwise labels from one source."""
    code = {label: n for n, label in enumerate(categories)}
    units = {item: labels for item, labels in labels_by_item.items() if len(labels) >= 2}
    block: dict[str, Any] = {
        "level": "nominal",
        "labels": list(categories),
        **_block_counts(labels_by_item, units),
        "alpha": None,
        "percent_agreement": None,
        "fleiss_kappa": None,
    }
    if units:
        matrix = _compact_matrix(units, code.__getitem__)
        block["alpha"] = ci_json(
            bootstrap_ci(
                lambda m: krippendorff_alpha(m, "nominal"), matrix, n_boot, seed=seed, axis=1
            )
        )
        block["percent_agreement"] = ci_json(
            bootstrap_ci(percent_agreement, matrix, n_boot, seed=seed, axis=1)
        )
        block["fleiss_kappa"] = _fleiss_block(
            units, code, overlap=overlap, n_boot=n_boot, seed=seed
        )
    by_rater = _by_rater(labels_by_item)

    def kappa_stat(labels_a: list, labels_b: list) -> dict:
        estimate = cohen_kappa(labels_a, labels_b, categories=categories)
        codes_a = np.fromiter((code[x] for x in labels_a), dtype=np.int64)
        codes_b = np.fromiter((code[x] for x in labels_b), dtype=np.int64)
        low, high = _kappa_ci(codes_a, codes_b, len(categories), n_boot, seed)
        return {"estimate": number(estimate), "low": number(low), "high": number(high)}

    block["pairwise"] = {
        "metric": "cohen_kappa",
        **_pair_table(by_rater, names, min_shared_items, kappa_stat),
    }
    block["leave_one_out"] = _leave_one_out(
        by_rater, labels_by_item, names, credit=mode_credit, n_boot=n_boot, seed=seed
    )
    return block


def _fleiss_block(
    units: dict[int, dict[Rater, str]],
    code: dict[str, int],
    *,
    overlap: int,
    n_boot: int,
    seed: int,
) -> dict | None:
    """Return Fleiss' kappa over the items with the full overlap (equal raters per item)."""
    sizes = Counter(len(labels) for labels in units.values())
    n_raters = overlap if sizes.get(overlap, 0) >= 2 else sizes.most_common(1)[0][0]
    rows = [labels for labels in units.values() if len(labels) == n_raters]
    if len(rows) < 2 or n_raters < 2:
        return None
    table = np.zeros((len(rows), len(code)))
    for row, labels in enumerate(rows):
        for label in labels.values():
            table[row, code[label]] += 1
    result = ci_json(bootstrap_ci(fleiss_kappa, table, n_boot, seed=seed))
    return {**result, "n_items": len(rows), "n_raters": n_raters}


def mode_credit(label: str, others: list[str]) -> float:
    """Return 1 if the label is the others' unique mode, 1/m when it is one of m tied modes."""
    tops = modes(Counter(others))
    return 1.0 / len(tops) if label in tops else 0.0


def rank_credit(ranks: tuple[int, ...], others: list[tuple[int, ...]]) -> float:
    """Return Kendall's tau-b between a ranking and the others' mean ranks."""
    return kendall_tau_b(ranks, np.mean(np.asarray(others, dtype=float), axis=0))


def _leave_one_out(
    by_rater: dict[Rater, dict[int, Any]],
    labels_by_item: dict[int, dict[Rater, Any]],
    names: dict[Rater, str],
    *,
    credit: Callable[[Any, list], float],
    n_boot: int,
    seed: int,
) -> list[dict]:
    """Return each annotator's agreement with the consensus of the others on the same items."""
    rows = []
    for rater, labels in by_rater.items():
        credits = []
        for item, label in labels.items():
            others = [other for r, other in labels_by_item[item].items() if r != rater]
            if others:
                credits.append(credit(label, others))
        rows.append(
            {
                "annotator_id": rater,
                "name": names.get(rater, str(rater)),
                "n_items": sum(not math.isnan(c) for c in credits),
                "agreement": mean_ci(credits, n_boot, seed),
            }
        )
    rows.sort(key=lambda row: (row["name"], str(row["annotator_id"])))
    return rows


def _mean_pairwise_tau(units: dict[int, dict[Rater, tuple[int, ...]]], n_boot: int, seed: int):
    """Return the mean tau-b over all rater pairs of all items, resampling items."""
    sums = []
    for labels in units.values():
        rankings = list(labels.values())
        taus = [
            kendall_tau_b(rankings[i], rankings[j])
            for i in range(len(rankings))
            for j in range(i + 1, len(rankings))
        ]
        taus = [t for t in taus if not math.isnan(t)]
        if taus:
            sums.append((sum(taus), len(taus)))
    if not sums:
        return None
    totals = np.asarray(sums, dtype=float)
    return ci_json(bootstrap_ci(lambda a: a[:, 0].sum() / a[:, 1].sum(), totals, n_boot, seed=seed))


def ranking_block(
    labels_by_item: dict[int, dict[Rater, tuple[int, ...]]],
    names: dict[Rater, str],
    *,
    k: int,
    n_boot: int,
    seed: int,
    min_shared_items: int,
) -> dict:
    """Return ordinal agreement figures of K-way rankings from one source."""
    labels_by_item = {
        item: {r: ranks for r, ranks in labels.items() if len(ranks) == k}
        for item, labels in labels_by_item.items()
    }
    units = {item: labels for item, labels in labels_by_item.items() if len(labels) >= 2}
    block: dict[str, Any] = {
        "level": "ordinal",
        "labels": list(range(1, k + 1)),
        **_block_counts(labels_by_item, units),
        "alpha": None,
        "percent_agreement": None,
        "fleiss_kappa": None,
        "kendall_tau": None,
    }
    if units:
        # Units are (item, candidate position); resampling keeps an item's positions together.
        matrix = _compact_matrix(units, lambda ranks: np.asarray(ranks, dtype=float))

        def ordinal_alpha(m: np.ndarray) -> float:
            return krippendorff_alpha(m.reshape(m.shape[0], -1), "ordinal")

        block["alpha"] = ci_json(bootstrap_ci(ordinal_alpha, matrix, n_boot, seed=seed, axis=1))
        block["kendall_tau"] = _mean_pairwise_tau(units, n_boot, seed)
    by_rater = _by_rater(labels_by_item)

    def tau_stat(labels_a: list, labels_b: list) -> dict:
        taus = [kendall_tau_b(a, b) for a, b in zip(labels_a, labels_b, strict=True)]
        result = mean_ci(taus, n_boot, seed) or {"estimate": None, "low": None, "high": None}
        return {key: result[key] for key in ("estimate", "low", "high")}

    block["pairwise"] = {
        "metric": "kendall_tau_b",
        **_pair_table(by_rater, names, min_shared_items, tau_stat),
    }
    block["leave_one_out"] = _leave_one_out(
        by_rater, labels_by_item, names, credit=rank_credit, n_boot=n_boot, seed=seed
    )
    return block


def cross_source(
    votes: list[RatedLabel],
    *,
    reference: str,
    ranking: bool,
    categories: Sequence[str],
    n_boot: int,
    seed: int,
) -> list[dict]:
    """Return, per round, how often each other source agrees with the reference source."""
    human: dict[tuple[int, int], list] = defaultdict(list)
    for vote in votes:
        if vote.source == reference:
            human[(vote.round_number, vote.item_id)].append(vote.label)
    if not human:
        return []
    compared: dict[tuple[int, str], list[tuple[Any, list]]] = defaultdict(list)
    for vote in votes:
        if vote.source != reference and (vote.round_number, vote.item_id) in human:
            compared[(vote.round_number, vote.source)].append(
                (vote.label, human[(vote.round_number, vote.item_id)])
            )
    out = []
    for (round_number, source), rows in sorted(compared.items()):
        entry: dict[str, Any] = {
            "round": round_number,
            "source": source,
            "reference": reference,
            "n_items": len(rows),
        }
        if ranking:
            entry["metric"] = "kendall_tau_b"
            entry["agreement"] = mean_ci([rank_credit(lab, ref) for lab, ref in rows], n_boot, seed)
            entry["kappa"] = None
        else:
            entry["metric"] = "consensus_agreement"
            entry["agreement"] = mean_ci([mode_credit(lab, ref) for lab, ref in rows], n_boot, seed)
            entry.update(_kappa_against_majority(rows, categories))
        out.append(entry)
    return out


def _kappa_against_majority(rows: list[tuple[Any, list]], categories: Sequence[str]) -> dict:
    """Return Cohen's kappa against the reference majority where it has a unique mode."""
    decided = []
    for label, reference in rows:
        tops = modes(Counter(reference))
        if len(tops) == 1:
            decided.append((label, tops.pop()))
    kappa = (
        number(cohen_kappa([d[0] for d in decided], [d[1] for d in decided], categories=categories))
        if decided
        else None
    )
    return {"n_decided": len(decided), "kappa": kappa}
