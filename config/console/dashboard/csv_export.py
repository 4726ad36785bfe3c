"""CSV downloads of dashboard panels: the same rows the table and the chart show."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from django.http import HttpResponse

# A spreadsheet runs a cell that starts with one of these as a formula ("CSV injection",
# OWASP); text cells get a leading apostrophe so they stay text. Tab and carriage return are
# on the list because some spreadsheets strip them and then read the rest as a formula.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """Return a value as written to a CSV cell: numbers as numbers, formula-like text escaped."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, int | float | np.number):
        return value
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    if text.startswith(FORMULA_START) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def table_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Return a table as CSV (full precision; empty cell for a missing value)."""
    out = io.StringIO()
    # RFC 4180 line ends: a cell holding a lone carriage return is quoted too.
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([csv_cell(column) for column in columns])
    for row in rows:
        writer.writerow(["" if v is None else csv_cell(v) for v in row])
    return out.getvalue()


def csv_response(columns: Sequence[str], rows: Sequence[Sequence[Any]], filename: str):
    """Return the table as a CSV attachment named ``filename``.csv."""
    response = HttpResponse(table_csv(columns, rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}.csv"'
    return response
