"""The PPO trainer on a tiny random GPT-2: rollout masks, log-prob alignment, shaping, resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from training import demo
from training.trainers import ppo
from training.trainers import ppo_core as core
from training.trainers.common import ConfigError

PROMPTS = [p.prompt for p in demo.problems_in("train")[:12]]


def make_config(policy_dir: Path, **overrides) -> ppo.Config:
    values = {
        "model_name_or_path": str(policy_dir),
        "reward_function": "training.demo:true_reward",
        "prompt_format": "chat",
        "rollout_batch_size": 8,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 8,
        "max_new_tokens": 8,
        "max_steps": 4,
        "learning_rate": 1e-3,
        "num_ppo_epochs": 2,
        "num_sample_prompts": 2,
        "save_steps": 1000,
        "seed": 7,
    }
    values.update(overrides)
    config = ppo.Config(**values)
    config.validate()
    return config


def make_trainer(
    policy_dir: Path,
    tokenizer,
    *,
    reward=None,
    prompts=None,
    output_dir=None,
    **overrides,
) -> ppo.PPOTrainer:
    from transformers import AutoModel, AutoModelForCausalLM

    config = make_config(policy_dir, **overrides)
    torch.manual_seed(0)  # the critic's new head
    return ppo.PPOTrainer(
        config,
        policy=AutoModelForCausalLM.from_pretrained(str(policy_dir)),
        reference=AutoModelForCausalLM.from_pretrained(str(policy_dir)),
        value_model=ppo.ValueModel(AutoModel.from_pretrained(str(policy_dir))),
        tokenizer=tokenizer,
        reward=reward or ppo.FunctionReward(demo.true_reward),
        train_prompts=prompts or PROMPTS,
        output_dir=output_dir,
    )


class RecordingReward:
    """A reward function that returns a constant and remembers what it was asked."""

    def __init__(self, value: float = 1.0) -> None:
        self.value = value
        self.calls: list[tuple[list, list[str]]] = []

    def __call__(self, prompts, responses):
        self.calls.append((list(prompts), list(responses)))
        return torch.full((len(responses),), self.value)


def test_config_has_a_help_string_on_every_field_and_literature_defaults():
    for f in dataclasses.fields(ppo.Config):
        assert f.metadata.get("help"), f.name
    config = ppo.Config(model_name_or_path="x", reward_function="training.demo:true_reward")
    assert (config.gamma, config.lam, config.cliprange, config.cliprange_value) == (
        1.0,
        0.95,
        0.2,
        0.2,
    )
    assert (config.target_kl, config.kl_horizon, config.num_ppo_epochs) == (6.0, 10_000, 4)
    assert 0.05 <= config.kl_coef <= 0.2


@pytest.mark.parametrize(
    "overrides",
    [
        {"reward_function": ""},
        {"reward_model_path": "somewhere"},
        {"reward_function": "no_colon"},
        {"missing_eos": "ignore"},
        {"score_transform_order": "sideways"},
        {"temperature": 0.0},
        {"max_length": 8},
        {"trl_args": {"beta": 1}},
    ],
)
def test_config_rejects_settings_that_cannot_work(tiny_policy_dir, overrides):
    with pytest.raises(ConfigError):
        make_config(tiny_policy_dir, **overrides)


def test_rollout_left_pads_prompts_and_masks_prompt_response_and_padding(
    tiny_policy_dir, tiny_tokenizer
):
    long_prompt = [
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "1 + 1 = 2."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    trainer = make_trainer(tiny_policy_dir, tiny_tokenizer, max_new_tokens=6)
    rollout = trainer.make_rollout([PROMPTS[0], long_prompt, PROMPTS[1]])

    query_mask = rollout.query_mask.bool()
    # Left padding: once a row's mask turns on it stays on, and the last slot is real.
    assert (query_mask.long().diff(dim=1) >= 0).all()
    assert query_mask[:, -1].all()
    assert (rollout.query_ids[~query_mask] == tiny_tokenizer.pad_token_id).all()
    assert query_mask[1].all() and not query_mask[0].all()
    action = rollout.masks.action_mask
    assert torch.equal(rollout.attention_mask, torch.cat([rollout.query_mask, action.long()], 1))
    assert (rollout.response_ids[~action] == tiny_tokenizer.pad_token_id).all()
    for row, text in enumerate(rollout.texts):
        n = int(rollout.masks.lengths[row])
        ids = rollout.response_ids[row, :n].tolist()
        assert text == tiny_tokenizer.decode(ids, skip_special_tokens=True)
    # Padding slots carry nothing.
    for name in ("values", "kl", "rewards", "advantages", "returns"):
        assert getattr(rollout, name)[~action].eq(0).all(), name


def test_generation_stops_at_the_first_stop_token_and_truncates_at_max_new_tokens(
    tiny_policy_dir, tiny_tokenizer
):
    every_token = list(range(len(tiny_tokenizer)))
    trainer = make_trainer(tiny_policy_dir, tiny_tokenizer, stop_token_ids=every_token)
    query_ids, query_mask = trainer.encode_prompts(PROMPTS[:4])
    response = trainer.generate(query_ids, query_mask)
    assert response.shape == (4, 1)  # every row stopped at once, sampling ended early

    trainer = make_trainer(tiny_policy_dir, tiny_tokenizer, max_new_tokens=5)
    response = trainer.generate(*trainer.encode_prompts(PROMPTS))
    masks = core.build_response_masks(response, trainer.stop_ids)
    assert response.shape[1] <= 5
    assert (masks.lengths[masks.truncated] == 5).all()
    assert (response[masks.padding_mask] == tiny_tokenizer.pad_token_id).all()


@pytest.mark.parametrize(
    "sampling", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}]
)
def test_old_new_and_reference_logprobs_are_aligned_on_the_sampled_tokens(
    tiny_policy_dir, tiny_tokenizer, sampling
):
    trainer = make_trainer(tiny_policy_dir, tiny_tokenizer, **sampling)
    rollout = trainer.make_rollout(PROMPTS[:4])
    policy = trainer.unwrapped_policy

    # Old log-probs equal a plain, unpadded forward over prompt + response prefix.
    for row in range(4):
        prompt = rollout.query_ids[row][rollout.query_mask[row].bool()]
        response = rollout.response_ids[row]
        for t in range(int(rollout.masks.lengths[row])):
            ids = torch.cat([prompt, response[:t]])[None]
            with torch.no_grad():
                logits = policy(input_ids=ids).logits[:, -1]
            warped = core.warp_logits(
                logits,
                temperature=trainer.config.temperature,
                top_k=trainer.config.top_k,
                top_p=trainer.config.top_p,
                keep_ids=response[t : t + 1],
            )
            expected = core.selected_logprobs(warped, response[t : t + 1])
            assert float(rollout.logprobs[row, t]) == pytest.approx(float(expected), abs=1e-5)

    # The reference is the same SFT weights: same log-probs, zero KL.
    action = rollout.masks.action_mask
    torch.testing.assert_close(rollout.ref_logprobs[action], rollout.logprobs[action])
    assert rollout.kl.abs().max() < 1e-5
    # New log-probs from the trainable (prepared) policy match the old ones.
    new, _ = trainer.sequence_logprobs(
        trainer.policy, rollout.sequences, rollout.attention_mask, rollout.response_ids
    )
    torch.testing.assert_close(new[action], rollout.logprobs[action], atol=1e-5, rtol=0)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}])
def test_ratio_is_one_before_the_first_update(tiny_policy_dir, tiny_tokenizer, sampling):
    # given one epoch and one mini-batch (two accumulated micro-batches) per update, every
    # ratio is computed before the optimizer moves
    trainer = make_trainer(
        tiny_policy_dir,
        tiny_tokenizer,
        num_ppo_epochs=1,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        **sampling,
    )
    stats = trainer.optimize(trainer.make_rollout(PROMPTS[:8]))
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["clip_fraction"] == 0.0
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def _scripted_tokens(tokenizer) -> tuple[int, int, int, int]:
    ids = tokenizer("7 + 5 = 12", add_special_tokens=False)["input_ids"]
    assert len(ids) >= 4
    return ids[0], ids[1], ids[2], ids[3]


@pytest.mark.parametrize("missing_eos", ["penalty", "filter", "none"])
def test_eos_present_missing_at_the_end_and_empty_responses(
    tiny_policy_dir, tiny_tokenizer, monkeypatch, missing_eos
):
    # given scripted responses of width 4: EOS after two tokens, no EOS (cut by
    # max_new_tokens), EOS in the last slot, EOS first (empty)
    a, b, c, d = _scripted_tokens(tiny_tokenizer)
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    scripted = torch.tensor([[a, b, eos, pad], [a, b, c, d], [a, b, c, eos], [eos, pad, pad, pad]])
    reward = RecordingReward(0.5)
    trainer = make_trainer(
        tiny_policy_dir,
        tiny_tokenizer,
        reward=reward,
        max_new_tokens=4,
        missing_eos=missing_eos,
        missing_eos_penalty=2.0,
        kl_coef=0.3,
    )
    monkeypatch.setattr(trainer, "generate", lambda *args, **kwargs: scripted.clone())

    rollout = trainer.make_rollout(PROMPTS[:4])

    masks = rollout.masks
    assert masks.terminal_index.tolist() == [2, 3, 3, 0]
    assert masks.truncated.tolist() == [False, True, False, False]
    assert masks.empty.tolist() == [False, False, False, True]
    # The reward sees decoded text: special tokens dropped, empty response is "".
    _, texts = reward.calls[0]
    assert texts[3] == ""
    assert texts[0] == tiny_tokenizer.decode([a, b])
    assert texts[1] == tiny_tokenizer.decode([a, b, c, d])
    expected_scores = torch.full((4,), 0.5)
    if missing_eos == "penalty":
        expected_scores[1] -= 2.0
    torch.testing.assert_close(rollout.scores, expected_scores)
    # Terminal score exactly once, on the last valid action; -beta*KL everywhere valid.
    kl_part = -0.3 * rollout.kl
    score_part = rollout.rewards - kl_part
    for row, terminal in enumerate(masks.terminal_index.tolist()):
        assert float(score_part[row, terminal]) == pytest.approx(float(expected_scores[row]))
        others = torch.ones(4, dtype=torch.bool)
        others[terminal] = False
        assert score_part[row, others].abs().max() < 1e-6
    assert rollout.rewards[masks.padding_mask].eq(0).all()
    # Loss mask: filtered rows drop out; whitening and advantages ignore them and padding.
    if missing_eos == "filter":
        assert not rollout.loss_mask[1].any()
    else:
        assert torch.equal(rollout.loss_mask, masks.action_mask)
    assert rollout.advantages[~rollout.loss_mask].eq(0).all()
    valid = rollout.advantages[rollout.loss_mask]
    assert float(valid.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(valid.std()) == pytest.approx(1.0, abs=1e-4)


def test_kl_controller_adapts_beta_from_the_rollout_kl(tiny_policy_dir, tiny_tokenizer):
    trainer = make_trainer(
        tiny_policy_dir, tiny_tokenizer, kl_coef=0.1, target_kl=0.5, kl_horizon=100
    )
    metrics = trainer.step()
    assert metrics["kl_coef"] == 0.1
    error = min(max(metrics["kl/seq_mean"] / 0.5 - 1, -0.2), 0.2)
    assert metrics["kl_coef_next"] == pytest.approx(0.1 * (1 + error * 8 / 100))
    second = trainer.step()
    assert second["kl_coef"] == pytest.approx(metrics["kl_coef_next"])
    assert second["kl/seq_mean"] != 0.0  # the policy has moved away from the reference
    for key in ("kl/token_p95", "kl/seq_p95", "ppo/clip_fraction", "value/explained_variance"):
        assert key in second


def test_entropy_bonus_raises_the_policy_entropy(tiny_policy_dir, tiny_tokenizer):
    # given advantages of zero, the entropy bonus is the only policy gradient
    trainer = make_trainer(
        tiny_policy_dir, tiny_tokenizer, entropy_coef=1.0, learning_rate=1e-2, num_ppo_epochs=3
    )
    rollout = trainer.make_rollout(PROMPTS[:8])
    rollout.advantages.zero_()

    trainer.optimize(rollout)

    _, entropy = trainer.sequence_logprobs(
        trainer.policy,
        rollout.sequences,
        rollout.attention_mask,
        rollout.response_ids,
        with_entropy=True,
    )
    action = rollout.masks.action_mask
    assert float(core.masked_mean(entropy.detach(), action)) > float(
        core.masked_mean(rollout.entropy, action)
    )


def test_update_moves_policy_and_critic_and_never_the_frozen_reference(
    tiny_policy_dir, tiny_tokenizer
):
    trainer = make_trainer(tiny_policy_dir, tiny_tokenizer)
    reference_before = {k: v.clone() for k, v in trainer.reference.state_dict().items()}
    policy_before = {k: v.clone() for k, v in trainer.unwrapped_policy.state_dict().items()}
    value_before = {k: v.clone() for k, v in trainer.unwrapped_value.state_dict().items()}

    trainer.step()

    assert not trainer.reference.training
    assert not any(p.requires_grad for p in trainer.reference.parameters())
    for key, value in trainer.reference.state_dict().items():
        assert torch.equal(value, reference_before[key]), key
    policy_after = trainer.unwrapped_policy.state_dict()
    assert any(not torch.equal(policy_after[k], v) for k, v in policy_before.items())
    value_after = trainer.unwrapped_value.state_dict()
    assert any(not torch.equal(value_after[k], v) for k, v in value_before.items())


def test_resume_after_n_updates_gives_the_same_parameters_as_n_plus_m(
    tiny_policy_dir, tiny_tokenizer, tmp_path
):
    # Everything a resume must restore is in play: adaptive beta, running score statistics,
    # a decaying learning rate, two PPO epochs of shuffling, a data pass that wraps (12
    # prompts, 8 per update) and sampled rollouts.
    settings = {
        "kl_coef": 0.2,
        "target_kl": 0.1,
        "kl_horizon": 50,
        "normalize_score": True,
        "score_clip": 3.0,
        "lr_scheduler_type": "linear",
        "warmup_ratio": 0.2,
        "max_steps": 3,
    }
    straight = make_trainer(tiny_policy_dir, tiny_tokenizer, **settings)
    straight.train()

    first = make_trainer(tiny_policy_dir, tiny_tokenizer, **settings)
    first.train(num_updates=2)
    checkpoint = first.save_checkpoint(tmp_path / "checkpoint-2")

    resumed = make_trainer(tiny_policy_dir, tiny_tokenizer, **settings)
    resumed.load_checkpoint(checkpoint)
    assert resumed.update_step == 2
    resumed.train()

    assert resumed.update_step == straight.update_step == 3
    for mine, theirs in (
        (resumed.unwrapped_policy, straight.unwrapped_policy),
        (resumed.unwrapped_value, straight.unwrapped_value),
    ):
        expected = theirs.state_dict()
        for key, value in mine.state_dict().items():
            torch.testing.assert_close(value, expected[key], atol=0, rtol=0, msg=key)
    assert resumed.kl_controller.value == straight.kl_controller.value
    assert resumed.score_moments.state_dict() == straight.score_moments.state_dict()
    assert (resumed.data_epoch, resumed.data_offset) == (straight.data_epoch, straight.data_offset)
    assert resumed.policy_scheduler.get_last_lr() == straight.policy_scheduler.get_last_lr()
    assert torch.equal(
        resumed.rollout_generator.get_state(), straight.rollout_generator.get_state()
    )


def test_checkpoint_loads_for_inference_with_its_sampling_settings(
    tiny_policy_dir, tiny_tokenizer, tmp_path
):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    trainer = make_trainer(
        tiny_policy_dir, tiny_tokenizer, temperature=0.8, top_p=0.95, max_new_tokens=6
    )
    trainer.step()
    directory = trainer.save_checkpoint(tmp_path / "checkpoint-1")

    model = AutoModelForCausalLM.from_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    generation = GenerationConfig.from_pretrained(str(directory))
    assert generation.do_sample and generation.temperature == 0.8 and generation.top_p == 0.95
    assert generation.max_new_tokens == 6
    assert tokenizer.eos_token_id in list(generation.eos_token_id)
    assert tokenizer.chat_template
    for key, value in trainer.unwrapped_policy.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    state = json.loads((directory / ppo.STATE_DIR / "trainer_state.json").read_text())
    assert state["update_step"] == 1
    assert state["sampling"]["temperature"] == 0.8
    assert state["kl_controller"]["value"] == trainer.kl_controller.value
    assert state["versions"]["torch"]


def test_train_writes_metrics_samples_checkpoints_and_final_then_resumes(
    tiny_policy_dir, make_snapshot, tmp_path
):
    from transformers import AutoModelForCausalLM

    from training.trainers.run_log import RunLogger

    chat = [[{"role": "user", "content": p}] for p in PROMPTS]
    held_out = [[{"role": "user", "content": p.prompt}] for p in demo.problems_in("held_out")[:4]]
    snapshot = make_snapshot(
        train=[{"prompt": p} for p in chat], validation=[{"prompt": p} for p in held_out]
    )
    output_dir = tmp_path / "run"
    config = make_config(tiny_policy_dir, max_steps=2, save_steps=1, save_total_limit=1)

    metrics = ppo.train(config, snapshot, output_dir, RunLogger(output_dir, echo=False))

    assert metrics["updates"] == 2 and metrics["global_step"] == 2
    assert "eval_score_mean" in metrics
    assert metrics["seconds_per_update"] > 0
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "event" not in r]
    assert [r["step"] for r in updates] == [1, 2]
    for key in (
        "score/raw_mean",
        "kl/token_mean",
        "kl/token_p95",
        "kl/seq_mean",
        "kl/seq_p95",
        "entropy/rollout",
        "response/length_mean",
        "ppo/clip_fraction",
        "ppo/approx_kl",
        "ppo/value_loss",
        "value/explained_variance",
        "time/update_s",
    ):
        assert key in updates[-1], key
    samples = [json.loads(line) for line in (output_dir / ppo.SAMPLES_FILE).open()]
    assert {s["step"] for s in samples} == {1, 2}
    assert {json.dumps(s["prompt"]) for s in samples} == {json.dumps(p) for p in chat[:2]}
    assert sorted(p.name for p in output_dir.glob("checkpoint-*")) == ["checkpoint-2"]
    AutoModelForCausalLM.from_pretrained(str(output_dir / "final"))
    run = json.loads((output_dir / "run.json").read_text())
    assert run["recipe"] == "ppo" and run["status"] == "finished"
    assert run["sampling"]["temperature"] == 1.0
    assert len(run["data"]["hash"]) == 64

    # when resumed with a longer budget, it continues from checkpoint-2
    more = make_config(tiny_policy_dir, max_steps=3, save_steps=1, save_total_limit=1, resume=True)
    metrics = ppo.train(more, snapshot, output_dir, RunLogger(output_dir, echo=False))
    assert metrics["updates"] == 3
    events = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "resume" and e["update"] == 2 for e in events)


def test_lora_policy_uses_the_adapter_free_base_as_reference(tiny_policy_dir, tmp_path):
    config = make_config(
        tiny_policy_dir, use_lora=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, max_steps=1
    )
    models = ppo.load_models(config)
    assert models["reference"] is None
    trainer = ppo.PPOTrainer(
        config,
        policy=models["policy"],
        tokenizer=models["tokenizer"],
        reward=models["reward"],
        value_model=models["value_model"],
        reference=None,
        train_prompts=PROMPTS,
    )
    base_before = {
        k: v.clone() for k, v in trainer.unwrapped_policy.state_dict().items() if "lora" not in k
    }
    rollout = trainer.make_rollout(PROMPTS[:8])
    assert rollout.kl.abs().max() < 1e-6  # LoRA B starts at zero: policy == reference
    stats = trainer.optimize(rollout)
    assert stats["policy_grad_norm"] > 0

    state = trainer.unwrapped_policy.state_dict()
    for key, value in base_before.items():
        assert torch.equal(state[key], value), key
    assert any(state[k].abs().sum() > 0 for k in state if "lora_B" in k)
    directory = trainer.save_checkpoint(tmp_path / "checkpoint-1")
    assert (directory / "adapter" / "adapter_config.json").exists()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(directory))  # merged, loadable without PEFT

    again = ppo.load_models(config)
    resumed = ppo.PPOTrainer(
        config,
        policy=again["policy"],
        tokenizer=again["tokenizer"],
        reward=again["reward"],
        value_model=again["value_model"],
        train_prompts=PROMPTS,
    )
    resumed.load_checkpoint(directory)
    for key, value in resumed.unwrapped_policy.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_reward_model_scores_re_encoded_text_and_warm_starts_the_critic(
    tiny_policy_dir, tiny_reward_dir
):
    from transformers import AutoModelForSequenceClassification

    config = make_config(
        tiny_policy_dir, reward_function="", reward_model_path=str(tiny_reward_dir)
    )
    models = ppo.load_models(config)
    assert models["value_init"] == "reward"
    rm = AutoModelForSequenceClassification.from_pretrained(str(tiny_reward_dir))
    torch.testing.assert_close(models["value_model"].head.weight, rm.score.weight)
    reward = models["reward"]
    assert not any(p.requires_grad for p in reward.scorer.model.parameters())
    chat = [{"role": "user", "content": PROMPTS[0]}]
    scores = reward([chat, PROMPTS[0]], ["7 + 5 = 12.", "7 + 5 = 12."])
    expected = reward.scorer.score(
        [chat, PROMPTS[0]], [[{"role": "assistant", "content": "7 + 5 = 12."}], "7 + 5 = 12."]
    )
    torch.testing.assert_close(scores, torch.tensor(expected))

    trainer = ppo.PPOTrainer(
        config,
        policy=models["policy"],
        tokenizer=models["tokenizer"],
        reward=reward,
        value_model=models["value_model"],
        reference=models["reference"],
        train_prompts=PROMPTS,
    )
    rm_before = {k: v.clone() for k, v in reward.scorer.model.state_dict().items()}
    trainer.step()
    for key, value in reward.scorer.model.state_dict().items():
        assert torch.equal(value, rm_before[key]), key


def test_critic_cannot_warm_start_from_a_reward_model_with_another_tokenizer(
    tiny_policy_dir, tmp_path
):
    from training.trainers.tiny import build_tiny_reward_model, train_tokenizer

    other_tokenizer = train_tokenizer(demo.tokenizer_training_texts(), vocab_size=300)
    other_rm = build_tiny_reward_model(other_tokenizer, tmp_path / "rm", n_layer=1, n_embd=32)
    config = make_config(tiny_policy_dir, reward_function="", reward_model_path=str(other_rm))
    models = ppo.load_models(config)
    assert models["value_init"] == "policy"
    # The reward model reads text re-encoded with its own tokenizer.
    scores = models["reward"]([[{"role": "user", "content": PROMPTS[0]}]], ["7 + 5 = 12."])
    assert torch.isfinite(scores).all()
    with pytest.raises(ConfigError):
        ppo.load_models(dataclasses.replace(config, value_init="reward"))


def test_cli_runs_the_ppo_recipe_and_resumes(tiny_policy_dir, make_snapshot, tmp_path, capsys):
    from training.trainers import cli

    snapshot = make_snapshot(train=[{"prompt": p} for p in PROMPTS])
    config_path = tmp_path / "ppo.json"
    config = dataclasses.asdict(make_config(tiny_policy_dir, max_steps=1, save_steps=1))
    config_path.write_text(json.dumps(config))
    out = tmp_path / "out"
    argv = ["--recipe", "ppo", "--config", str(config_path), "--data", str(snapshot)]

    assert cli.main([*argv, "--out", str(out)]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["updates"] == 1
    assert (out / "final" / "config.json").exists() and (out / "checkpoint-1").is_dir()

    config_path.write_text(json.dumps({**config, "max_steps": 2}))
    assert cli.main([*argv, "--out", str(out), "--resume"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["updates"] == 2

    config_path.write_text(json.dumps({**config, "missing_eos": "drop"}))
    assert cli.main([*argv, "--out", str(tmp_path / "bad")]) == cli.EXIT_BAD_INPUT
