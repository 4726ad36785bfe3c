import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Start every test with empty caches: login lockout counters must not leak across."""
    from django.core.cache import caches

    for cache in caches.all(initialized_only=True):
        cache.clear()
    yield
