"""Imports of prompts with candidates and of existing preference data: bounded, atomic.

`limits` (bounded reading, the two failures), `formats` (JSON lines, CSV, hashing),
`items` (prompts + K candidates), `preference_lines` and `preferences` (HH-RLHF, TRL,
rankings as `imported` judgments), `jobs` (large uploads imported by a Celery task).
"""

from annotation.imports.formats import content_hash, json_line, normalise, unstorable
from annotation.imports.items import (
    ImportReport,
    candidates_get_or_create,
    items_import,
    prompts_get_or_create,
    validate_row,
)
from annotation.imports.limits import ImportFailed, ImportTooLarge, bounded_lines, size_text
from annotation.imports.preference_lines import (
    FORMATS,
    parse_line,
    parse_pair,
    render_hh,
    split_hh_dialogue,
    split_hh_pair,
)
from annotation.imports.preferences import PreferenceImportReport, preferences_import

__all__ = [
    "FORMATS",
    "ImportFailed",
    "ImportReport",
    "ImportTooLarge",
    "PreferenceImportReport",
    "bounded_lines",
    "candidates_get_or_create",
    "content_hash",
    "items_import",
    "json_line",
    "normalise",
    "parse_line",
    "parse_pair",
    "preferences_import",
    "prompts_get_or_create",
    "render_hh",
    "size_text",
    "split_hh_dialogue",
    "split_hh_pair",
    "unstorable",
    "validate_row",
]
