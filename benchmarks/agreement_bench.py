"""Time evaluation.stats.agreement on 100,000 items x 5 raters against the krippendorff package.

Labels are the pairwise outcomes A / B / tie / both_bad with about 10% of ratings missing.
Prints seconds (best of ``--repeats``) for our Krippendorff's alpha on string labels and on
integer codes, for the krippendorff package on the same integer codes, and for our Fleiss'
kappa on the items every rater labelled, then the speed ratios.

Run: .venv/bin/python benchmarks/agreement_bench.py  (a few seconds).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import krippendorff
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluation.stats.agreement import fleiss_kappa, krippendorff_alpha, rating_counts

LABELS = np.array(["A", "B", "tie", "both_bad"], dtype=object)


def simulate(n_items: int, n_raters: int, missing: float, seed: int):
    """Return (string labels with None, float codes with NaN), raters x items."""
    rng = np.random.default_rng(seed)
    truth = rng.choice(4, size=n_items, p=[0.42, 0.42, 0.1, 0.06])
    noisy = rng.random((n_raters, n_items)) < 0.3
    codes = np.where(noisy, rng.integers(0, 4, (n_raters, n_items)), truth).astype(float)
    codes[rng.random(codes.shape) < missing] = np.nan
    labels = np.where(np.isnan(codes), None, LABELS[np.nan_to_num(codes).astype(int)])
    return labels, codes


def best_of(repeats: int, fn):
    """Return (fastest seconds, result) over ``repeats`` calls."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--raters", type=int, default=5)
    parser.add_argument("--missing", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    labels, codes = simulate(args.items, args.raters, args.missing, args.seed)
    print(f"{args.items:,} items x {args.raters} raters, {np.isnan(codes).mean():.1%} missing")

    ours_str_s, ours_str = best_of(args.repeats, lambda: krippendorff_alpha(labels))
    ours_num_s, ours_num = best_of(args.repeats, lambda: krippendorff_alpha(codes))
    package_s, package = best_of(
        args.repeats,
        lambda: krippendorff.alpha(reliability_data=codes, level_of_measurement="nominal"),
    )
    complete = ~np.isnan(codes).any(axis=0)

    def fleiss():
        return fleiss_kappa(rating_counts(codes[:, complete])[1])

    fleiss_s, kappa = best_of(args.repeats, fleiss)

    print(f"ours alpha, string labels : {ours_str_s:.4f} s  alpha = {ours_str:.6f}")
    print(f"ours alpha, integer codes : {ours_num_s:.4f} s  alpha = {ours_num:.6f}")
    print(f"krippendorff 0.9.0 alpha  : {package_s:.4f} s  alpha = {package:.6f}")
    print(f"ours Fleiss kappa         : {fleiss_s:.4f} s  kappa = {kappa:.6f}", end="")
    print(f"  ({complete.sum():,} items rated by all)")
    print(f"speed-up vs krippendorff (codes)  : {package_s / ours_num_s:.1f}x")
    print(f"ours on strings vs package on pre-coded ints: {package_s / ours_str_s:.1f}x")
    print(f"|ours - krippendorff| = {abs(ours_num - package):.2e}")


if __name__ == "__main__":
    main()
