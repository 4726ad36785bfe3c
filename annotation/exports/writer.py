"""Write a snapshot's files: JSON lines per split, the Hugging Face folder, read-only."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections import Counter
from pathlib import Path
from typing import IO

from django.conf import settings

from annotation.exports.formats import encode
from training.trainers.data import SPLITS


class SnapshotWriter:
    """Append JSON lines to ``<split>.jsonl`` and side files, opened on first use."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.handles: dict[str, IO] = {}
        self.counts: Counter = Counter()

    def write(self, name: str, row: dict) -> None:
        self.write_line(name, encode(row))

    def write_line(self, name: str, line: str) -> None:
        handle = self.handles.get(name)
        if handle is None:
            handle = self.handles[name] = (self.folder / name).open(
                "w", encoding="utf-8", buffering=1 << 20
            )
        handle.write(line)
        handle.write("\n")
        self.counts[name] += 1

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()


def dataset_root() -> Path:
    """Return the folder that holds every project's snapshots."""
    return Path(settings.ARTIFACT_ROOT) / "datasets"


def file_sha256(path: Path) -> str:
    """Return the sha256 hex digest of a file, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_hf_folder(folder: Path) -> Path:
    """Save the snapshot's splits as a ``datasets.DatasetDict`` in ``folder/hf``."""
    import tempfile

    from datasets import Dataset, DatasetDict

    splits = {}
    with tempfile.TemporaryDirectory(prefix="prefloop-hf-") as cache:
        for split in SPLITS:
            path = folder / f"{split}.jsonl"
            if path.exists() and path.stat().st_size:
                splits[split] = Dataset.from_json(str(path), cache_dir=cache)
        DatasetDict(splits).save_to_disk(str(folder / "hf"))
    return folder / "hf"


def make_read_only(folder: Path) -> None:
    """Take write permission off every file and folder of a snapshot."""
    for root, dirs, files in os.walk(folder):
        for name in files:
            os.chmod(os.path.join(root, name), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)
    os.chmod(folder, 0o555)


def remove_tree(folder: Path) -> None:
    """Delete a folder, read-only snapshot files included."""
    if not folder.exists():
        return
    for root, dirs, _ in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(folder, 0o755)
    shutil.rmtree(folder)
