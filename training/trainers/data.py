"""Read dataset snapshots into ``datasets.Dataset`` and hash them.

A snapshot is a folder::

    train.jsonl         required
    validation.jsonl    optional
    test.jsonl          optional
    manifest.json       optional (written by the exporter: content hash, counts, policies...)

Each line of a split is one JSON object of one of these kinds (one kind per file):

* preference (TRL preference format):
  ``{"prompt": str | [messages], "chosen": str | [messages], "rejected": str | [messages]}``
  with optional ``"margin"`` (float, from annotation strength), ``"soft_label"``
  (P(chosen preferred), in [0, 1]) and ``"group_id"``. ``"prompt"`` may be left out when
  chosen and rejected are whole texts/dialogues sharing their prompt (implicit prompt).
* SFT: ``{"prompt", "completion"}`` or ``{"messages"}``;
* prompt only (online RL): ``{"prompt"}``.

Other keys are ignored. Messages are ``{"role": ..., "content": ...}`` dicts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPLITS = ("train", "validation", "test")
PREFERENCE_KEYS = ("prompt", "chosen", "rejected", "margin", "soft_label", "group_id", "tie")
MANIFEST = "manifest.json"


class DatasetError(ValueError):
    """A snapshot folder that does not follow the contract."""


@dataclass
class Splits:
    """The loaded splits of one snapshot (validation/test are None when absent)."""

    train: Any
    validation: Any = None
    test: Any = None
    kind: str = ""
    dropped: dict[str, int] | None = None

    def items(self):
        """Yield ``(name, dataset)`` for the splits that exist."""
        for name in SPLITS:
            dataset = getattr(self, name)
            if dataset is not None:
                yield name, dataset


def split_path(dataset_dir: str | Path, split: str) -> Path:
    """Return the file of ``split`` in ``dataset_dir``."""
    return Path(dataset_dir) / f"{split}.jsonl"


def data_hash(dataset_dir: str | Path) -> str:
    """Return the snapshot's content hash.

    sha256 over one line per present split, in the order train, validation, test:
    ``"<split>.jsonl <sha256 of the file bytes>\\n"``. The manifest is not hashed.
    """
    outer = hashlib.sha256()
    for split in SPLITS:
        path = split_path(dataset_dir, split)
        if path.exists():
            inner = hashlib.sha256()
            with path.open("rb") as fh:
                for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    inner.update(chunk)
            outer.update(f"{path.name} {inner.hexdigest()}\n".encode())
    return outer.hexdigest()


def read_manifest(dataset_dir: str | Path) -> dict | None:
    """Return the parsed manifest.json, or None when it is absent."""
    path = Path(dataset_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from exc


def read_rows(path: Path) -> list[dict]:
    """Read a JSONL file, skipping blank lines; report the line of any bad row."""
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{lineno}: expected a JSON object")
            rows.append(row)
    return rows


def row_kind(row: dict) -> str:
    """Return 'preference', 'sft', 'messages', 'prompt' or '' for one row."""
    if "chosen" in row and "rejected" in row:
        return "preference"
    if "messages" in row:
        return "messages"
    if "prompt" in row and "completion" in row:
        return "sft"
    if "prompt" in row:
        return "prompt"
    return ""


def read_split(dataset_dir: str | Path, split: str) -> tuple[str, list[dict]] | None:
    """Return ``(kind, rows)`` of one split, or None when its file is absent."""
    path = split_path(dataset_dir, split)
    if not path.exists():
        return None
    rows = read_rows(path)
    if not rows:
        if split == "train":
            raise DatasetError(f"{path}: no rows")
        return None
    kind = row_kind(rows[0])
    if not kind:
        raise DatasetError(
            f"{path}:1: row has none of the expected keys "
            "(chosen+rejected, prompt+completion, messages or prompt)"
        )
    for index, row in enumerate(rows, 1):
        if row_kind(row) != kind:
            raise DatasetError(f"{path}: row {index} is not a {kind} row like the first one")
    return kind, rows


def _check_snapshot(dataset_dir: str | Path) -> Path:
    dataset_dir = Path(dataset_dir)
    if not dataset_dir.is_dir():
        raise DatasetError(f"dataset folder not found: {dataset_dir}")
    if not split_path(dataset_dir, "train").exists():
        raise DatasetError(f"{dataset_dir}: train.jsonl is missing")
    return dataset_dir


def _text_or_messages(value: Any, where: str, key: str) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value
    ):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    raise DatasetError(f"{where}: '{key}' must be a string or a list of {{role, content}} messages")


def _preference_row(row: dict, where: str) -> dict:
    out = {
        key: _text_or_messages(row[key], where, key)
        for key in ("prompt", "chosen", "rejected")
        if key in row
    }
    shapes = {type(value).__name__ for value in out.values()}
    if len(shapes) > 1:
        raise DatasetError(f"{where}: prompt/chosen/rejected mix plain text and message lists")
    margin = row.get("margin")
    soft_label = row.get("soft_label")
    try:
        out["margin"] = 0.0 if margin is None else float(margin)
        out["soft_label"] = 1.0 if soft_label is None else float(soft_label)
    except (TypeError, ValueError) as exc:
        raise DatasetError(f"{where}: margin and soft_label must be numbers") from exc
    if not 0.0 <= out["soft_label"] <= 1.0:
        raise DatasetError(f"{where}: soft_label must lie in [0, 1]")
    if out["soft_label"] < 0.5:
        # P(chosen preferred) < 1/2: the "rejected" answer is the majority choice.
        out["chosen"], out["rejected"] = out["rejected"], out["chosen"]
        out["soft_label"] = 1.0 - out["soft_label"]
    out["group_id"] = None if row.get("group_id") is None else str(row["group_id"])
    tie = row.get("tie", False)
    if not isinstance(tie, bool):
        raise DatasetError(f"{where}: tie must be true or false")
    out["tie"] = tie
    return out


def _same_shape(rows: list[dict], path_hint: str) -> None:
    """Refuse a column mixing plain strings and message lists (Arrow cannot hold both)."""
    if not rows:
        return
    for key in rows[0]:
        kinds = {type(r.get(key)).__name__ for r in rows if r.get(key) is not None}
        if "str" in kinds and "list" in kinds:
            raise DatasetError(f"{path_hint}: '{key}' mixes plain text and message lists")


def _to_dataset(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(rows)


def load_preferences(dataset_dir: str | Path) -> Splits:
    """Load a preference snapshot as prompt/chosen/rejected/margin/soft_label/group_id/tie rows.

    ``margin`` defaults to 0, ``soft_label`` to 1 and ``tie`` to false. Rows whose soft_label
    is below 1/2 are turned round so that ``chosen`` is the answer more likely preferred.
    """
    dataset_dir = _check_snapshot(dataset_dir)
    loaded = {}
    for split in SPLITS:
        result = read_split(dataset_dir, split)
        if result is None:
            continue
        kind, rows = result
        path = split_path(dataset_dir, split)
        if kind != "preference":
            raise DatasetError(f"{path}: expected preference rows (prompt, chosen, rejected)")
        has_prompt = "prompt" in rows[0]
        if any(("prompt" in r) != has_prompt for r in rows):
            raise DatasetError(f"{path}: either every row has a prompt or none has")
        clean = [_preference_row(r, f"{path} row {i}") for i, r in enumerate(rows, 1)]
        _same_shape(clean, str(path))
        loaded[split] = _to_dataset(clean)
    return Splits(kind="preference", **loaded)


def _sft_rows_from(kind: str, rows: list[dict], where: str) -> list[dict]:
    if kind == "messages":
        return [{"messages": _text_or_messages(r["messages"], where, "messages")} for r in rows]
    if kind == "sft":
        return [
            {
                "prompt": _text_or_messages(r["prompt"], where, "prompt"),
                "completion": _text_or_messages(r["completion"], where, "completion"),
            }
            for r in rows
        ]
    if kind == "preference":
        out, seen = [], set()
        for index, row in enumerate(rows, 1):
            pref = _preference_row(row, f"{where} row {index}")
            if "prompt" in pref:
                item = {"prompt": pref["prompt"], "completion": pref["chosen"]}
            elif isinstance(pref["chosen"], list):
                item = {"messages": pref["chosen"]}
            else:
                item = {"text": pref["chosen"]}
            key = json.dumps(item, sort_keys=True)
            if key not in seen:  # the same chosen answer can win several pairs
                seen.add(key)
                out.append(item)
        return out
    raise DatasetError(f"{where}: prompt-only rows cannot be used for SFT")


def load_sft(dataset_dir: str | Path) -> Splits:
    """Load an SFT snapshot, or the (deduplicated) chosen answers of a preference snapshot.

    Rows become ``{"prompt", "completion"}``, ``{"messages"}`` or, for implicit-prompt text
    pairs, ``{"text"}``.
    """
    dataset_dir = _check_snapshot(dataset_dir)
    loaded, kinds = {}, set()
    for split in SPLITS:
        result = read_split(dataset_dir, split)
        if result is None:
            continue
        kind, rows = result
        path = split_path(dataset_dir, split)
        clean = _sft_rows_from(kind, rows, str(path))
        _same_shape(clean, str(path))
        kinds.add(kind)
        loaded[split] = _to_dataset(clean)
    return Splits(kind="sft" if kinds != {"preference"} else "sft-from-preference", **loaded)


def _prompt_of(row: dict, where: str) -> Any:
    if "prompt" in row:
        return _text_or_messages(row["prompt"], where, "prompt")
    if "messages" in row:
        messages = _text_or_messages(row["messages"], where, "messages")
        while messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages:
            raise DatasetError(f"{where}: a messages row holds no prompt")
        return messages
    from trl.data_utils import extract_prompt

    pair = {
        "chosen": _text_or_messages(row["chosen"], where, "chosen"),
        "rejected": _text_or_messages(row["rejected"], where, "rejected"),
    }
    return extract_prompt(pair)["prompt"]


def load_prompts(dataset_dir: str | Path) -> Splits:
    """Load the distinct prompts of any snapshot kind as ``{"prompt"}`` rows (for online RL)."""
    dataset_dir = _check_snapshot(dataset_dir)
    loaded = {}
    for split in SPLITS:
        result = read_split(dataset_dir, split)
        if result is None:
            continue
        _, rows = result
        path = split_path(dataset_dir, split)
        out, seen = [], set()
        for index, row in enumerate(rows, 1):
            prompt = _prompt_of(row, f"{path} row {index}")
            key = json.dumps(prompt, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append({"prompt": prompt})
        _same_shape(out, str(path))
        loaded[split] = _to_dataset(out)
    return Splits(kind="prompt", **loaded)


def write_snapshot(
    dataset_dir: str | Path,
    splits: dict[str, list[dict]],
    manifest: dict | None = None,
) -> Path:
    """Write rows as a snapshot folder (used by tests and benchmarks; the exporter has its own)."""
    dataset_dir = Path(dataset_dir)
    dataset_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}")
        with split_path(dataset_dir, split).open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    if manifest is not None:
        payload = {"content_hash": data_hash(dataset_dir), **manifest}
        (dataset_dir / MANIFEST).write_text(json.dumps(payload, indent=2) + "\n")
    return dataset_dir
