"""Export judgments as versioned, immutable preference-data snapshots.

A snapshot is the folder of the training contract (docs/DEVELOPING.md):
``ARTIFACT_ROOT/datasets/<project id>/<version>/`` holding ``train.jsonl``, optional
``validation.jsonl`` / ``test.jsonl``, ``manifest.json`` (content hash, counts, policies,
filters, source rounds, dedup report) and ``hf/`` (the same splits saved with
``datasets.DatasetDict.save_to_disk``). Side files ``<split>.both_bad.jsonl`` hold both-bad
pairs or KTO negatives when the both-bad policy asks for them. The content hash is
`training.trainers.data.data_hash` of the split files, as the trainers compute it.

Formats (one JSON object per line):

* ``trl`` — ``{"prompt", "chosen", "rejected", "margin", "soft_label", "group_id"}`` (plus
  ``"tie"`` when ties are kept). Plain text, or conversational when any exported prompt is
  a chat transcript (``conversational`` forces either): prompt = messages, chosen/rejected =
  ``[{"role": "assistant", "content": ...}]``. Plain text renders a chat prompt HH-style.
* ``hh`` — ``{"chosen", "rejected"}``: whole ``\\n\\nHuman: `` / ``\\n\\nAssistant: `` dialogues.
* ``unpaired`` — TRL unpaired / KTO rows ``{"prompt", "completion", "label", "group_id"}``:
  a preferred answer is ``true``, a rejected or both-bad answer ``false``.
* ``raw`` — one row per judgment: pseudonymous annotator, display order, shown choice,
  strength, confidence, time, rationale, gold / repeat flags, source, qc flag.

Modules, in the order an export runs: `policy` (the named policies, split assignment),
`select` (one streaming read of prompts, items and votes), `decisions` (votes -> decisions:
aggregation, ties, agreement, trust weights), `formats` (decisions -> rows of each format),
`writer` (split files, Hugging Face folder, read-only snapshot), `pipeline` (one export end to
end), `services` (the DatasetVersion services callers use).
"""

from annotation.exports.decisions import Decider, Decision, gold_weights
from annotation.exports.pipeline import ExportResult, export_rows
from annotation.exports.policy import (
    AGGREGATIONS,
    BOTH_BAD_POLICIES,
    DEFAULT_MARGINS,
    DEFAULT_SPLIT,
    FORMATS,
    GROUP_BY,
    NEAR_DUPLICATES,
    TIE_POLICIES,
    ExportPolicy,
    PolicyError,
    pseudonym,
    split_for,
)
from annotation.exports.select import prompt_groups
from annotation.exports.services import (
    SnapshotCorrupt,
    dataset_file_list,
    dataset_file_path,
    dataset_version_build,
    dataset_version_create,
    dataset_version_export,
    dataset_version_fail,
    dataset_version_load,
)
from annotation.exports.writer import dataset_root, write_hf_folder

__all__ = [
    "AGGREGATIONS",
    "BOTH_BAD_POLICIES",
    "DEFAULT_MARGINS",
    "DEFAULT_SPLIT",
    "FORMATS",
    "GROUP_BY",
    "NEAR_DUPLICATES",
    "TIE_POLICIES",
    "Decider",
    "Decision",
    "ExportPolicy",
    "ExportResult",
    "PolicyError",
    "SnapshotCorrupt",
    "dataset_file_list",
    "dataset_file_path",
    "dataset_root",
    "dataset_version_build",
    "dataset_version_create",
    "dataset_version_export",
    "dataset_version_fail",
    "dataset_version_load",
    "export_rows",
    "gold_weights",
    "prompt_groups",
    "pseudonym",
    "split_for",
    "write_hf_folder",
]
