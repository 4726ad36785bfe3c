"""Fixtures of the fault tests: tiny models and snapshots (shared with the training tests)."""

from tests.training.conftest import (  # noqa: F401 - fixtures, found by name
    make_snapshot,
    tiny_reward_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from tests.training.test_runs_support import (  # noqa: F401 - fixtures, found by name
    reward_snapshot,
    training_settings,
)
