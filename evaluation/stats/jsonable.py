"""Numbers in JSON-ready form: JSON has no NaN or infinity, so they become None."""

from __future__ import annotations

import math
from typing import Any

from evaluation.stats.agreement import BootstrapCI


def number(value: Any) -> float | None:
    """Return a float, or None for None, NaN and infinity."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def ci_json(result: BootstrapCI | None) -> dict | None:
    """Return a bootstrap result as a JSON-ready dict."""
    if result is None:
        return None
    return {
        "estimate": number(result.estimate),
        "low": number(result.low),
        "high": number(result.high),
        "n_valid": result.n_valid,
    }
