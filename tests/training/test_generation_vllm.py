"""Local policies through vLLM's offline engine (training.generation.vllm).

vLLM needs a CUDA GPU and is installed only in the GPU worker image, so this test runs there
and is skipped, saying why, everywhere else.
"""

import pytest

from training.generation import GenerationSettings
from training.generation.vllm import VLLMBackend, vllm_available

pytestmark = pytest.mark.skipif(
    not vllm_available(), reason="vllm is not installed or no CUDA GPU is visible"
)


def test_vllm_samples_k_recorded_candidates_with_distinct_seeds(tiny_policy_dir):
    settings = GenerationSettings(temperature=1.0, top_p=0.9, max_new_tokens=8, seed=5)
    prompts = ["What is 1 + 2?", [{"role": "user", "content": "What is 3 + 4?"}]]
    out = VLLMBackend(tiny_policy_dir).generate(prompts, k=3, settings=settings, model_name="v")
    assert [len(row) for row in out] == [3, 3]
    configs = [c["generation_config"] for c in out[0]]
    assert {c["backend"] for c in configs} == {"vllm"} and len({c["seed"] for c in configs}) == 3
    assert all(c["max_new_tokens"] == 8 for c in configs)
