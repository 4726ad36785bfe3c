"""The panel every dashboard tab is made of: a table, an optional chart drawn from it, notes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from config.console.dashboard.csv_export import table_csv
from config.console.dashboard.specs import ChartSpec

MAX_SAMPLE_CHARS = 1_500


@dataclass
class Panel:
    """One dashboard panel: a table, an optional chart spec drawn from it, and notes."""

    key: str
    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    chart: ChartSpec | None = None
    note: str = ""
    status: str = "ok"  # ok | empty
    message: str = ""
    wide: bool = False
    show_table: bool = True
    # Template-only extras (e.g. samples grouped by prompt); never part of the CSV.
    extra: dict[str, Any] = field(default_factory=dict)
    csv_url: str = ""
    # Set on the panels a page refreshes while it is open (runs, progress, QC state).
    live_url: str = ""

    @property
    def has_data(self) -> bool:
        return self.status == "ok" and bool(self.rows)

    def cells(self) -> list[list[tuple[str, bool]]]:
        """Return the rows as (short text, is a number) pairs for the HTML table."""
        return [
            [
                (format_cell(value), isinstance(value, int | float) and not isinstance(value, bool))
                for value in row
            ]
            for row in self.rows
        ]

    def as_csv(self) -> str:
        """Return the table as CSV, exactly as the download serves it."""
        return table_csv(self.columns, self.rows)


def empty(key: str, title: str, message: str) -> Panel:
    """Return a panel that says why it has nothing to show."""
    return Panel(key=key, title=title, status="empty", message=message)


def format_cell(value: Any) -> str:
    """Return a cell as text: floats to 3 decimals (0 from 100 up), None as a dash."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3f}"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def number(value: Any) -> float | None:
    """Return a finite float, or None (stored JSON may hold strings, NaN or nothing)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


def clip(text: str) -> str:
    """Return a sample text cut at MAX_SAMPLE_CHARS."""
    return text if len(text) <= MAX_SAMPLE_CHARS else text[:MAX_SAMPLE_CHARS] + " […]"


def messages_text(messages: Any) -> str:
    """Return a chat prompt as ``role: content`` lines."""
    if not isinstance(messages, list):
        return ""
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)
