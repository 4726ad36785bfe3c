"""A reward function for the multi-process tests that records what each process scored.

The training CLI imports it by path in each process; no Django here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def digits_recorded(prompts, completions, **kwargs):
    """Reward the share of digits and append the rewards to this process's file."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    rewards = [sum(ch.isdigit() for ch in t) / (1 + len(t)) for t in texts]
    folder = os.environ.get("PREFLOOP_TEST_REWARD_LOG")
    if folder:
        path = Path(folder) / f"rank{os.environ.get('RANK', '0')}.jsonl"
        with path.open("a") as f:
            f.write(json.dumps(rewards) + "\n")
    return rewards
