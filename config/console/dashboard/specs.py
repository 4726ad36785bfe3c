"""Chart specs: the contract between the panels and the JavaScript that draws them.

Each spec is a dataclass whose ``type`` names the ES module in ``static/dashboard/charts/``
that draws it; ``spec_json`` turns it into the plain JSON the page embeds. A field renamed
here must be renamed in that module too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class ForestSeries:
    """One series of a forest plot: per row an estimate and its interval."""

    name: str
    estimate: list[float | None]
    low: list[float | None]
    high: list[float | None]

    @classmethod
    def from_rows(
        cls, name: str, rows: Sequence[Sequence[Any]], estimate: int, low: int, high: int
    ) -> ForestSeries:
        """Build a series from the table columns holding the estimate and its bounds."""
        return cls(
            name=name,
            estimate=[r[estimate] for r in rows],
            low=[r[low] for r in rows],
            high=[r[high] for r in rows],
        )


@dataclass
class ForestChart:
    """Estimate and interval per labelled row, optionally with a dashed reference line."""

    labels: list[str]
    series: list[ForestSeries]
    x_label: str
    reference: float | None = None
    reference_label: str = ""
    x_min: float | None = None
    x_max: float | None = None
    percent: bool = False
    type: str = field(default="forest", init=False)


@dataclass
class StackedSeries:
    """One layer of a stacked bar chart; ``color`` is a name the stylesheet defines."""

    name: str
    values: list[float | int | None]
    color: str | None = None


@dataclass
class StackedChart:
    """Stacked bars, one bar per label (counts, or shares when ``percent``)."""

    labels: list[str]
    series: list[StackedSeries]
    x_label: str
    horizontal: bool = True
    percent: bool = False
    type: str = field(default="stacked", init=False)


@dataclass
class ReliabilityPoint:
    """One confidence bin: mean confidence, accuracy, and how many pairs fell in it."""

    x: float | None
    y: float | None
    n: int


@dataclass
class ReliabilitySeries:
    name: str
    points: list[ReliabilityPoint]


@dataclass
class ReliabilityChart:
    """Reliability diagram: accuracy against confidence, with the diagonal drawn."""

    series: list[ReliabilitySeries]
    x_label: str
    y_label: str
    type: str = field(default="reliability", init=False)


@dataclass
class HistogramChart:
    """Counts between consecutive edges; bins left of zero are drawn in red."""

    edges: list[float]
    counts: list[int]
    x_label: str
    type: str = field(default="histogram", init=False)


@dataclass
class Curve:
    """One training metric: ``points`` are ``[step, raw, smoothed]``."""

    metric: str
    title: str
    source: str
    points: list[list[float | None]]


@dataclass
class CurveAlarm:
    """An alarm's first step, drawn as a dashed line and labelled on its own metric."""

    step: int
    kind: str
    metric: str


@dataclass
class CurvesChart:
    """Small multiples of training curves with alarm lines across all of them."""

    charts: list[Curve]
    alarms: list[CurveAlarm]
    type: str = field(default="curves", init=False)


@dataclass
class ScatterPoint:
    """One point of a scatter; ``label`` names it in the tooltip (short, never model text)."""

    x: float | None
    y: float | None
    label: str


@dataclass
class ScatterSeries:
    name: str
    points: list[ScatterPoint]


@dataclass
class ScatterChart:
    """Points in x/y, one colour per series (e.g. each answer's reward against its KL)."""

    series: list[ScatterSeries]
    x_label: str
    y_label: str
    type: str = field(default="scatter", init=False)


@dataclass
class LinesSeries:
    """One line: a value per label (None leaves a gap)."""

    name: str
    values: list[float | None]


@dataclass
class LinesChart:
    """Lines over ordered categories (e.g. text statistics per policy version)."""

    labels: list[str]
    series: list[LinesSeries]
    x_label: str
    y_label: str
    percent: bool = False
    type: str = field(default="lines", init=False)


ChartSpec = (
    ForestChart
    | StackedChart
    | ReliabilityChart
    | HistogramChart
    | CurvesChart
    | ScatterChart
    | LinesChart
)
CHART_TYPES = (
    ForestChart,
    StackedChart,
    ReliabilityChart,
    HistogramChart,
    CurvesChart,
    ScatterChart,
    LinesChart,
)


def finite(value: Any) -> Any:
    """Return chart data with NaN and infinities as None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if isinstance(value, np.generic):
        return finite(value.item())
    return value


def spec_json(spec: ChartSpec) -> dict[str, Any]:
    """Return a chart spec as the JSON-ready dict the page embeds."""
    return finite(asdict(spec))
