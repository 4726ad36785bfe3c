"""Candidate generation from a local policy (training.generation)."""

from training.generation import GenerationSettings, candidate_seed, generate_candidates


def test_generates_k_recorded_candidates_per_prompt_reproducibly(tiny_policy_dir):
    prompts = ["What is 1 + 2?", [{"role": "user", "content": "What is 3 + 4?"}], "Hi"]
    settings = GenerationSettings(temperature=1.0, top_p=0.9, max_new_tokens=8, seed=5)
    first = generate_candidates(
        tiny_policy_dir, prompts, k=3, settings=settings, model_name="tiny-v1"
    )
    again = generate_candidates(
        tiny_policy_dir, prompts, k=3, settings=settings, model_name="tiny-v1"
    )
    assert [len(c) for c in first] == [3, 3, 3]
    assert [[c["text"] for c in row] for row in first] == [
        [c["text"] for c in row] for row in again
    ]
    cand = first[1][2]
    assert cand["model_name"] == "tiny-v1"
    config = cand["generation_config"]
    assert (config["temperature"], config["top_p"], config["max_new_tokens"]) == (1.0, 0.9, 8)
    assert config["template"].startswith("sha256:") and config["k"] == 3
    # the three candidates of a prompt come from different seeds
    assert len({c["generation_config"]["seed"] for c in first[0]}) == 3


def test_candidate_seeds_are_stable_and_distinct():
    assert candidate_seed(1, "p", 0) == candidate_seed(1, "p", 0)
    assert len({candidate_seed(1, "p", j) for j in range(8)}) == 8


def test_each_candidate_records_how_many_tokens_were_generated(tiny_policy_dir):
    settings = GenerationSettings(temperature=1.0, max_new_tokens=6, seed=1, batch_size=4)
    out = generate_candidates(
        tiny_policy_dir, ["Hi", "What is 2 + 2?", "x"], k=2, settings=settings
    )
    for row in out:
        for cand in row:
            response = cand["generation_config"]["response"]
            count = response["usage"]["completion_tokens"]
            assert 1 <= count <= 6
            assert response["finish_reason"] == ("length" if count == 6 else "stop")
            assert cand["generation_config"]["backend"] == "transformers"


def test_long_prompts_go_in_smaller_batches_within_both_limits():
    from training.generation.transformers import length_batches

    lengths = [900, 700, 300, 120, 100, 90, 40, 30, 20, 10, 5, 5]  # longest first
    settings = GenerationSettings(batch_size=4, batch_tokens=1000)
    slices = length_batches(lengths, settings)
    # Every prompt once, in order; a lone prompt over the budget still gets its own batch.
    assert [i for start, end in slices for i in range(start, end)] == list(range(len(lengths)))
    assert slices[0] == (0, 1)
    for start, end in slices:
        assert end - start <= 4
        assert (end - start) * lengths[start] <= 1000 or end - start == 1
    assert slices == [(0, 1), (1, 2), (2, 5), (5, 9), (9, 12)]
