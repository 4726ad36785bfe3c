"""PPO maths: masks, reward shaping, whitening scope, GAE, losses, KL controllers, warping."""

import math

import numpy as np
import pytest
import torch

from training.trainers import ppo_core as core

EOS, PAD = 2, 0


def test_masks_for_eos_present_missing_at_the_last_slot_and_empty():
    # given four responses of width 4: EOS in the middle, no EOS (truncated by
    # max_new_tokens), EOS in the very last slot, and EOS as the first action (empty text)
    response = torch.tensor(
        [
            [5, 6, EOS, PAD],
            [5, 6, 7, 8],
            [5, 6, 7, EOS],
            [EOS, PAD, PAD, PAD],
        ]
    )
    masks = core.build_response_masks(response, [EOS])

    assert masks.action_mask.tolist() == [
        [True, True, True, False],
        [True, True, True, True],
        [True, True, True, True],
        [True, False, False, False],
    ]
    assert masks.padding_mask.tolist() == (~masks.action_mask).tolist()
    assert masks.terminal_index.tolist() == [2, 3, 3, 0]
    assert masks.done_mask.sum(dim=1).tolist() == [1, 1, 1, 1]
    assert masks.done_mask[torch.arange(4), masks.terminal_index].all()
    assert masks.ended.tolist() == [True, False, True, True]
    assert masks.truncated.tolist() == [False, True, False, False]
    assert masks.empty.tolist() == [False, False, False, True]
    assert masks.lengths.tolist() == [3, 4, 4, 1]


def test_masks_stop_at_the_first_of_several_stop_tokens():
    response = torch.tensor([[5, 9, 6, EOS], [EOS, 9, 9, 9]])
    masks = core.build_response_masks(response, [EOS, 9])
    assert masks.terminal_index.tolist() == [1, 0]
    assert masks.lengths.tolist() == [2, 1]


def test_position_ids_start_at_zero_on_the_first_real_token_of_left_padded_rows():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert core.position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_terminal_score_is_added_once_on_the_last_valid_action():
    response = torch.tensor([[5, EOS, PAD], [5, 6, 7], [EOS, PAD, PAD]])
    masks = core.build_response_masks(response, [EOS])
    kl = torch.tensor([[0.1, 0.2, 9.0], [0.3, -0.1, 0.5], [0.4, 9.0, 9.0]])
    scores = torch.tensor([1.0, -2.0, 3.0])

    rewards = core.shape_rewards(scores, kl * masks.action_mask, masks, kl_coef=0.5)

    expected = torch.tensor(
        [
            [-0.05, -0.1 + 1.0, 0.0],
            [-0.15, 0.05, -0.25 - 2.0],
            [-0.2 + 3.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(rewards, expected)
    # The score appears exactly once per sequence: remove the KL part and sum.
    torch.testing.assert_close((rewards + 0.5 * kl * masks.action_mask).sum(dim=1), scores)


def test_whitening_uses_valid_tokens_only():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -50.0, 7.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])

    whitened = core.masked_whiten(values, mask)

    valid = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    expected = (valid - valid.mean()) / valid.std()
    torch.testing.assert_close(whitened[mask], expected, atol=1e-6, rtol=1e-6)
    assert whitened[~mask].eq(0).all()
    # Changing padding changes nothing.
    other = values.masked_fill(~mask, 1e6)
    torch.testing.assert_close(core.masked_whiten(other, mask), whitened)
    # shift_mean=False rescales but keeps the mean.
    kept = core.masked_whiten(values, mask, shift_mean=False)
    assert float(kept[mask].mean()) == pytest.approx(float(valid.mean()), rel=1e-5)


def test_whitening_can_use_statistics_summed_over_processes():
    # given two "processes" whose sums are added by the reducer
    a = torch.tensor([[1.0, 2.0]])
    b = torch.tensor([[3.0, 4.0]])
    ones = torch.ones(1, 2, dtype=torch.bool)

    def stats(x):
        return torch.stack([x.sum(), x.square().sum(), torch.tensor(float(x.numel()))])

    whitened_a = core.masked_whiten(a, ones, reduce=lambda s: s + stats(b))
    everything = torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected = (a - everything.mean()) / everything.std()
    torch.testing.assert_close(whitened_a, expected)


def test_gae_matches_a_hand_computed_example():
    # given one response of 3 valid actions and one padding slot
    rewards = torch.tensor([[0.5, -1.0, 2.0, 7.0]])
    values = torch.tensor([[1.0, 0.5, -0.5, 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    gamma, lam = 0.9, 0.8

    advantages, returns = core.compute_gae(rewards, values, mask, gamma=gamma, lam=lam)

    # by hand: nothing is bootstrapped past the last valid action
    delta2 = 2.0 - (-0.5)  # 2.5
    delta1 = -1.0 + 0.9 * (-0.5) - 0.5  # -1.95
    delta0 = 0.5 + 0.9 * 0.5 - 1.0  # -0.05
    a2 = delta2
    a1 = delta1 + gamma * lam * a2  # -1.95 + 0.72 * 2.5 = -0.15
    a0 = delta0 + gamma * lam * a1  # -0.05 + 0.72 * -0.15 = -0.158
    expected = torch.tensor([[a0, a1, a2, 0.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values * mask)


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.1, 0.2, 0.3, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.3, 0.1, 0.2, 0.4, 0.0], [0.2, 0.6, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    advantages, returns = core.compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = (rewards * mask).flip(1).cumsum(1).flip(1) * mask
    torch.testing.assert_close(returns, reward_to_go)
    torch.testing.assert_close(advantages, (reward_to_go - values) * mask)


def test_adaptive_kl_controller_follows_ziegler_formula():
    controller = core.AdaptiveKLController(0.2, target=6.0, horizon=10_000)
    controller.update(current_kl=7.5, n_steps=256)
    # e = clip(7.5 / 6 - 1, -0.2, 0.2) = 0.2 (clipped from 0.25)
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10_000))
    controller.update(current_kl=5.7, n_steps=64)
    previous = 0.2 * (1 + 0.2 * 256 / 10_000)
    assert controller.value == pytest.approx(previous * (1 + (5.7 / 6 - 1) * 64 / 10_000))
    restored = core.AdaptiveKLController(1.0, target=1.0, horizon=1)
    restored.load_state_dict(controller.state_dict())
    assert restored.state_dict() == controller.state_dict()
    fixed = core.FixedKLController(0.1)
    fixed.update(100.0, 64)
    assert fixed.value == 0.1


def test_policy_loss_at_ratio_one_is_minus_mean_advantage_without_clipping():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, -2.0, 4.0]])
    mask = torch.tensor([[True, True, False]])
    out = core.clipped_policy_loss(logprobs, logprobs.detach(), advantages, mask, 0.2)
    assert float(out.loss.detach()) == pytest.approx(-(1.0 - 2.0) / 2)
    assert float(out.clip_fraction) == 0.0
    assert float(out.approx_kl) == pytest.approx(0.0)
    assert float(out.ratio_mean) == pytest.approx(1.0)
    out.loss.backward()
    assert logprobs.grad[0, 2] == 0  # padding gets no gradient


def test_policy_loss_clips_a_ratio_beyond_one_plus_epsilon_for_positive_advantages():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0]])
    out = core.clipped_policy_loss(new, old, advantages, torch.ones(1, 2, dtype=torch.bool), 0.2)
    # token 0: min(1.5, 1.2) * A -> clipped, no gradient; token 1: min(0.5, 0.8) -> unclipped
    assert float(out.loss.detach()) == pytest.approx(-(1.2 + 0.5) / 2)
    assert float(out.clip_fraction) == pytest.approx(0.5)
    out.loss.backward()
    assert new.grad[0, 0] == 0
    assert new.grad[0, 1] != 0
    # approx KL k3 = (r - 1) - log r, averaged
    expected = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert float(out.approx_kl) == pytest.approx(expected)


def test_value_loss_takes_the_larger_of_clipped_and_unclipped_errors():
    old = torch.tensor([[0.0, 0.0]])
    new = torch.tensor([[1.0, 0.1]])
    returns = torch.tensor([[1.0, 0.1]])
    loss, clip_fraction = core.clipped_value_loss(
        new, old, returns, torch.ones(1, 2, dtype=torch.bool), 0.2
    )
    # token 0: unclipped error 0, clipped value 0.2 -> error 0.64; token 1: both 0
    assert float(loss) == pytest.approx(0.5 * (0.64 + 0.0) / 2)
    assert float(clip_fraction) == pytest.approx(0.5)


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    torch.testing.assert_close(core.kl_per_token(logp, ref, "k1"), logp - ref)
    k3 = core.kl_per_token(logp, ref, "k3")
    assert (k3 >= 0).all()
    torch.testing.assert_close(k3, (ref - logp).exp() - 1 - (ref - logp))


def test_warp_logits_matches_transformers_top_k_top_p_and_temperature():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    ours = core.warp_logits(logits, temperature=0.7, top_k=10, top_p=0.8)
    theirs = TemperatureLogitsWarper(0.7)(None, logits.clone())
    theirs = TopKLogitsWarper(10)(None, theirs)
    theirs = TopPLogitsWarper(0.8)(None, theirs)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    torch.testing.assert_close(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)])


def test_warp_logits_keeps_the_sampled_token_in_the_support():
    logits = torch.tensor([[5.0, 4.0, 3.0, -9.0]])
    kept = core.warp_logits(logits, top_k=1, keep_ids=torch.tensor([3]))
    assert torch.isfinite(kept[0, [0, 3]]).all()
    assert torch.isinf(kept[0, [1, 2]]).all()
    logprob = core.selected_logprobs(kept, torch.tensor([3]))
    assert torch.isfinite(logprob).all()


def test_entropy_ignores_removed_tokens_and_has_finite_gradients():
    logits = torch.tensor([[0.0, 0.0, float("-inf")]], requires_grad=True)
    entropy = core.entropy_from_logits(logits)
    assert float(entropy.detach()) == pytest.approx(math.log(2))
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_running_moments_match_numpy_over_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=n) for n in (5, 17, 1, 40)]
    moments = core.RunningMoments()
    for batch in batches:
        moments.update(torch.tensor(batch))
    everything = np.concatenate(batches)
    assert moments.mean == pytest.approx(everything.mean())
    assert moments.std == pytest.approx(everything.std())
    assert moments.count == everything.size


def test_explained_variance_is_one_for_perfect_values_and_ignores_padding():
    target = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[True, True, True, False]])
    assert core.explained_variance(target, target, mask) == pytest.approx(1.0)
    assert core.explained_variance(torch.zeros_like(target), target, mask) < 1.0
