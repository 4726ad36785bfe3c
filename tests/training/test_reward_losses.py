"""Tests of the reward recipe's soft-target loss and pair weights against hand-computed values."""

import math

import pytest
import torch

from training.trainers import reward
from training.trainers.data import load_preferences

CHOSEN = torch.tensor([2.0, 0.5, -1.0])
REJECTED = torch.tensor([1.0, 0.5, 0.0])  # differences d = 1, 0, -1


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_hard_labels_give_the_bradley_terry_loss():
    expected = -(_log_sigmoid(1) + _log_sigmoid(0) + _log_sigmoid(-1)) / 3
    assert reward.preference_loss(CHOSEN, REJECTED).item() == pytest.approx(expected)
    ones = torch.ones(3)
    assert reward.preference_loss(CHOSEN, REJECTED, soft_label=ones).item() == pytest.approx(
        expected
    )


def test_soft_labels_give_the_binary_cross_entropy():
    q = torch.tensor([0.75, 0.5, 1.0])
    expected = (
        -(0.75 * _log_sigmoid(1) + 0.25 * _log_sigmoid(-1))
        - (0.5 * _log_sigmoid(0) + 0.5 * _log_sigmoid(0))
        - _log_sigmoid(-1)
    ) / 3
    assert reward.preference_loss(CHOSEN, REJECTED, soft_label=q).item() == pytest.approx(expected)


def test_a_tie_is_smallest_where_both_rewards_are_equal():
    # q = 1/2: -(log s(d) + log s(-d)) / 2 is minimal at d = 0 (log 2), not at a large d.
    half = torch.tensor([0.5])
    at_zero = reward.preference_loss(torch.tensor([0.0]), torch.tensor([0.0]), soft_label=half)
    apart = reward.preference_loss(torch.tensor([3.0]), torch.tensor([0.0]), soft_label=half)
    assert at_zero.item() == pytest.approx(math.log(2))
    assert apart.item() > at_zero.item()


def test_margin_is_llama2s_and_asked_of_the_side_q_favours():
    m = torch.tensor([0.5, 1.0, 2.0])
    hard = reward.preference_loss(CHOSEN, REJECTED, margin=m)
    assert hard.item() == pytest.approx(
        -(_log_sigmoid(1 - 0.5) + _log_sigmoid(0 - 1.0) + _log_sigmoid(-1 - 2.0)) / 3
    )
    q = torch.tensor([0.75, 1.0, 1.0])
    soft = reward.preference_loss(CHOSEN, REJECTED, soft_label=q, margin=m)
    assert soft.item() == pytest.approx(
        (
            -(0.75 * _log_sigmoid(0.5) + 0.25 * _log_sigmoid(-1 - 0.5))
            - _log_sigmoid(-1.0)
            - _log_sigmoid(-3.0)
        )
        / 3
    )


def test_weights_multiply_each_pairs_loss():
    w = torch.tensor([2.0, 0.5, 0.5])
    expected = -(2 * _log_sigmoid(1) + 0.5 * _log_sigmoid(0) + 0.5 * _log_sigmoid(-1)) / 3
    assert reward.preference_loss(CHOSEN, REJECTED, weight=w).item() == pytest.approx(expected)


def test_per_prompt_weights_make_each_prompt_count_once():
    # Prompt "a" has three pairs, "b" one: raw 1/3, 1/3, 1/3, 1 -> sum 2, scaled to mean 1.
    weights = reward.prompt_weights(["a", "a", "a", [{"role": "user", "content": "b"}]])
    assert weights == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])
    assert sum(weights[:3]) == pytest.approx(weights[3])


def test_tokenize_pairs_carries_soft_labels_ties_and_weights(make_snapshot, tiny_tokenizer):
    rows = [
        {"prompt": "Q: 1+1?\nA:", "chosen": " 2.", "rejected": " 3.", "soft_label": 0.75},
        {"prompt": "Q: 1+1?\nA:", "chosen": " two", "rejected": " 2.", "tie": True},
        {"prompt": "Q: 2+2?\nA:", "chosen": " 4.", "rejected": " 5.", "margin": 2.0},
    ]
    splits = load_preferences(make_snapshot(train=rows))
    prep = reward.Preprocessing(
        max_length=None, overlong="truncate_left", eos_token=tiny_tokenizer.eos_token, keep_first=0
    )
    data, counts = reward.tokenize_pairs(
        splits.train,
        tiny_tokenizer,
        prep,
        use_margin=True,
        margin_scale=1.0,
        tie_weight=0.5,
        per_prompt_weighting=True,
    )
    assert [r["soft_label"] for r in data] == [0.75, 0.5, 1.0]
    assert [r["margin"] for r in data] == [0.0, 0.0, 2.0]
    # Tie weight 0.5, then prompt shares 1/2, 1/2, 1 scaled by 3 / 2.
    assert [r["weight"] for r in data] == pytest.approx([0.75, 0.375, 1.5])
    assert counts["ties"] == 1

    hard, counts = reward.tokenize_pairs(
        splits.train,
        tiny_tokenizer,
        prep,
        use_margin=False,
        margin_scale=1.0,
        soft_labels=False,
        ties="drop",
    )
    assert [r["soft_label"] for r in hard] == [1.0, 1.0]
    assert counts["dropped_ties"] == 1 and counts["pairs_kept"] == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("ties", "average"), ("tie_weight", -1.0), ("ensemble_size", 9), ("train_on", "test")],
)
def test_a_bad_label_setting_is_refused_naming_its_field(tiny_reward_dir, field, value):
    config = reward.Config(model_name_or_path=str(tiny_reward_dir), **{field: value})
    with pytest.raises(reward.ConfigError, match=field):
        config.validate()
