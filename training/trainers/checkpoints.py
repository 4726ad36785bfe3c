"""Find the checkpoints a run saved, and the newest one written to the end.

One rule for the training CLI (``--resume``) and for the supervisor that resumes a run
whose worker died: a checkpoint counts once its ``trainer_state.json`` is readable.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_folders(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Return every ``checkpoint-N`` folder in ``output_dir`` with its step, oldest first."""
    found = []
    with contextlib.suppress(OSError):
        for entry in Path(output_dir).iterdir():
            match = _CHECKPOINT_RE.match(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), entry))
    return sorted(found)


def checkpoint_complete(path: Path) -> bool:
    """Return whether a checkpoint folder was written to the end.

    transformers writes ``trainer_state.json`` last, straight into ``checkpoint-N``; the PPO
    recipe keeps it in ``ppo_state/``. A worker killed mid-save leaves a folder without it.
    """
    for state in (path / "trainer_state.json", *path.glob("*/trainer_state.json")):
        try:
            if isinstance(json.loads(state.read_text()), dict):
                return True
        except (OSError, ValueError):
            continue
    return False


def newest_complete_checkpoint(output_dir: str | Path) -> tuple[str, int] | None:
    """Return the newest complete ``checkpoint-N`` folder in ``output_dir`` and its step."""
    for step, path in reversed(checkpoint_folders(output_dir)):
        if checkpoint_complete(path):
            return str(path), step
    return None
