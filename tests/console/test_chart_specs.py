"""Chart specs are the contract with the JavaScript: each type is drawn from declared fields."""

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from config.console.dashboard.specs import (
    CHART_TYPES,
    ForestChart,
    ForestSeries,
    spec_json,
)

STATIC = Path(__file__).resolve().parents[2] / "static" / "dashboard"


def _type_name(spec_class) -> str:
    return next(f.default for f in fields(spec_class) if f.name == "type")


@pytest.mark.parametrize("spec_class", CHART_TYPES, ids=_type_name)
def test_every_chart_type_has_a_module_that_draws_it_from_declared_fields(spec_class):
    kind = _type_name(spec_class)
    module = (STATIC / "charts" / f"{kind}.js").read_text()
    assert f"export function {kind}(Chart, el, spec)" in module
    assert f'from "./charts/{kind}.js";' in (STATIC / "main.js").read_text()
    # A field the module reads but the dataclass lacks would be undefined in the browser.
    read = set(re.findall(r"\bspec\.(\w+)", module))
    assert read, kind
    assert read <= {f.name for f in fields(spec_class)}, kind


def test_spec_json_is_plain_json_with_the_type_and_no_nan():
    spec = ForestChart(
        labels=["a", "b"],
        series=[ForestSeries("Win rate", [0.5, float("nan")], [0.4, None], [0.6, None])],
        x_label="share",
        reference=0.5,
    )
    out = spec_json(spec)
    assert out["type"] == "forest"
    assert out["series"][0] == {
        "name": "Win rate",
        "estimate": [0.5, None],
        "low": [0.4, None],
        "high": [0.6, None],
    }
    assert json.loads(json.dumps(out, allow_nan=False)) == out
