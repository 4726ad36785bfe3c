"""The real-model benchmark's path at toy size: the tiny policy, a handful of prompts.

`benchmarks/real_loop.py` runs SmolLM2 on HH-RLHF; this runs its same `run()` on a tiny
GPT-2 and synthetic dialogues in the HH shape: register and validate the base policy, train
the annotator and judge reward models on parts A and B, import part C into the prompt pool,
generate round 1 by a generation job, label it through the REST API as the AI annotator, and
let the loop export, train DPO with LoRA, evaluate, gate and generate the next round, twice.
"""

from __future__ import annotations

import random

import pytest

from annotation.models import Prompt
from benchmarks import real_loop
from training.models import LoopEvent, ModelVersion, PolicyEvaluation

TOPICS = ["bread", "tea", "a bike", "a tent", "rice", "a kite", "soup", "a shelf", "paint"]


def hh_like_rows(n: int, seed: int = 0) -> list[dict]:
    """Return n HH-shaped pairs: a short chat prompt, a kind answer and a rude one."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        prompt = [{"role": "user", "content": f"How do I make {topic}? (question {i})"}]
        if i % 3 == 0:
            prompt = [
                {"role": "user", "content": f"Hi, question {i}."},
                {"role": "assistant", "content": "Hello! How can I help?"},
                *prompt,
            ]
        rows.append(
            {
                "prompt": prompt,
                "chosen": f"Sure, happy to help with {topic}: start simple and go slowly.",
                "rejected": f"Figure out {topic} yourself, idiot.",
            }
        )
    return rows


def test_dialogue_messages_parse_hh_turns():
    text = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: How do I bake bread?"
    assert real_loop.dialogue_messages(text) == [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How do I bake bread?"},
    ]


def test_parts_are_a_fixed_three_way_split_by_prompt():
    rows = hh_like_rows(90)
    first, again = real_loop.parts(rows), real_loop.parts(list(reversed(rows)))
    assert {k: len(v) for k, v in first.items()} == {k: len(v) for k, v in again.items()}
    assert all(len(part) > 15 for part in first.values())
    prompts = [{repr(r["prompt"]) for r in part} for part in first.values()]
    assert not (prompts[0] & prompts[1] or prompts[0] & prompts[2] or prompts[1] & prompts[2])


@pytest.mark.django_db(transaction=True)
def test_the_real_loop_path_runs_end_to_end_at_toy_size(
    live_server, settings, tmp_path, tiny_policy_dir, tiny_reward_dir
):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    settings.TRAINING_OUTPUT_ROOT = str(tmp_path / "runs")
    settings.PREFLOOP_MODEL_ROOTS = [str(tiny_policy_dir.parent), str(tiny_reward_dir.parent)]
    settings.TRAINING_MIN_FREE_BYTES = 1 << 20
    settings.TRAINING_POLL_SECONDS = 0.2
    sizes = real_loop.Sizes(
        prompts_per_round=4,
        k=2,
        new_tokens=8,
        eval_prompts=3,
        rounds=2,
        rm_max_length=64,
        dpo={
            "use_lora": True,
            "learning_rate": 1e-3,
            "num_train_epochs": 1,
            "per_device_train_batch_size": 4,
            "max_length": 64,
            "save_steps": 10_000,
            "evaluate_at_end": False,
        },
    )
    lines: list[str] = []

    figures = real_loop.run(
        base_url=live_server.url,
        policy_folder=str(tiny_policy_dir),
        reward_backbone=str(tiny_reward_dir),
        rows=hh_like_rows(240),
        sizes=sizes,
        say=lines.append,
    )

    assert [f.round for f in figures] == [1, 2], lines
    held_out = Prompt.objects.filter(in_pool=True, split="eval").count()
    assert held_out >= 1
    for f in figures:
        # judged by the part-B reward model against the base, on the pool's evaluation prompts
        assert f.n_eval == min(3, held_out) and f.win_rate_vs_base is not None, lines
        low, high = f.ci_vs_base
        assert 0.0 <= low <= f.win_rate_vs_base <= high <= 1.0
        assert f.kl_reference is not None and f.mean_length is not None
        assert f.promotion in ("promoted", "undecided") or f.promotion_reason
        assert f.seconds["label"] > 0 and f.generation_tokens_per_second > 0
    policies = ModelVersion.objects.filter(kind="policy", parent__isnull=False)
    assert policies.count() == 2
    judge = ModelVersion.objects.filter(kind="reward", name__endswith="rm-b-judge").get()
    assert set(
        PolicyEvaluation.objects.filter(judge_kind="reward_model").values_list("judge", flat=True)
    ) == {f"reward model {judge.pk} ({judge.name})"}
    assert LoopEvent.objects.filter(step="generate", status="done").count() == 2
    assert any("AI labels" in line for line in lines)
