"""Fixtures for training tests: a local tokenizer, tiny models and synthetic preference data.

Everything is built from a config in a few seconds, with no hub access. Session-scoped
fixtures return folders; copy one before a test changes it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from training.trainers.common import QUIET_OFFLINE_ENV

for _key, _value in QUIET_OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)


def arithmetic_rows(
    n: int, *, seed: int = 0, conversational: bool = False, with_extras: bool = False
) -> list[dict]:
    """Return ``n`` preference rows: a correct sum is chosen over a refusal.

    The chosen answer is always distinguishable, so a tiny reward model beats chance in
    seconds. ``with_extras`` adds margin / soft_label / group_id like the exporter does.
    """
    rng = random.Random(seed)
    refusals = ["I don't know.", "No idea.", "Ask someone else.", "Maybe later."]
    rows = []
    for index in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        prompt = f"What is {a} + {b}?"
        chosen = f"{a} + {b} = {a + b}."
        rejected = rng.choice(refusals)
        if conversational:
            row = {
                "prompt": [{"role": "user", "content": prompt}],
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        else:
            row = {"prompt": f"Q: {prompt}\nA:", "chosen": f" {chosen}", "rejected": f" {rejected}"}
        if with_extras:
            row["margin"] = float(rng.choice([0.5, 1.0, 2.0]))
            row["soft_label"] = rng.choice([0.75, 1.0])
            row["group_id"] = f"g{index // 2}"
        rows.append(row)
    return rows


def tokenizer_corpus() -> list[str]:
    """Return texts covering the arithmetic task and the chat layout."""
    texts = []
    for row in arithmetic_rows(400, seed=123):
        texts.append(row["prompt"] + row["chosen"])
        texts.append(row["prompt"] + row["rejected"])
    return texts


@pytest.fixture(autouse=True)
def _one_torch_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """Return a folder holding a byte-level BPE tokenizer (pad/bos/eos, chat template)."""
    from training.trainers.tiny import train_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(tokenizer_corpus(), out, vocab_size=400)
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Return a folder holding a 2-layer, 64-dim GPT-2 causal LM and its tokenizer."""
    from training.trainers.tiny import build_tiny_causal_lm

    out = tmp_path_factory.mktemp("policy")
    return build_tiny_causal_lm(tiny_tokenizer, out, n_layer=2, n_embd=64, n_head=2)


@pytest.fixture(scope="session")
def tiny_reward_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Return a folder holding a 2-layer GPT-2 sequence classifier (one output)."""
    from training.trainers.tiny import build_tiny_reward_model

    out = tmp_path_factory.mktemp("reward_model")
    return build_tiny_reward_model(tiny_tokenizer, out, n_layer=2, n_embd=64, n_head=2)


@pytest.fixture
def make_snapshot(tmp_path):
    """Return ``make(train=rows, validation=rows, test=rows, manifest=dict) -> Path``."""
    from training.trainers.data import write_snapshot

    counter = {"n": 0}

    def make(manifest: dict | None = None, **splits: list[dict]) -> Path:
        counter["n"] += 1
        return write_snapshot(tmp_path / f"snapshot{counter['n']}", splits, manifest)

    return make


def weights_changed(before_dir: Path, after_dir: Path, *, model_class=None) -> bool:
    """Return whether any shared parameter differs between two saved models."""
    import torch
    from transformers import AutoModelForCausalLM

    model_class = model_class or AutoModelForCausalLM
    before = model_class.from_pretrained(str(before_dir)).state_dict()
    after = model_class.from_pretrained(str(after_dir)).state_dict()
    shared = [k for k in after if k in before and before[k].shape == after[k].shape]
    assert shared, "the two models share no parameter"
    return any(not torch.equal(before[k], after[k]) for k in shared)


def read_metrics(output_dir: Path) -> list[dict]:
    """Return the records of ``output_dir/metrics.jsonl``."""
    import json

    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def last_logged(output_dir: Path, key: str):
    """Return the last value logged under ``key`` in metrics.jsonl."""
    values = [r[key] for r in read_metrics(output_dir) if key in r and "event" not in r]
    assert values, f"{key} was never logged"
    return values[-1]


def assert_run_json_complete(output_dir: Path, recipe: str) -> dict:
    """Check that run.json records everything that shapes the result; return it."""
    import json

    run = json.loads((Path(output_dir) / "run.json").read_text())
    assert run["recipe"] == recipe
    assert run["status"] == "finished"
    assert run["config"]["model_name_or_path"]
    assert len(run["data"]["hash"]) == 64
    assert run["seeds"]["seed"] == run["config"]["seed"]
    for library in ("torch", "transformers", "trl", "peft", "datasets", "accelerate"):
        assert run["versions"][library], library
    assert "git" in run
    assert run["host"]["hostname"]
    assert run["final_metrics"]["global_step"] > 0
    assert run["trl_config"]["seed"] == run["config"]["seed"]
    return run


SERVE_START_SECONDS = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def served_policy(tiny_policy_dir, tmp_path_factory):
    """Yield (base_url, model) of a `transformers serve` process serving a tiny policy."""
    folder = tmp_path_factory.mktemp("served") / "policy"
    shutil.copytree(tiny_policy_dir, folder)
    # transformers serve takes temperature from the request but do_sample from the model's
    # generation config, as a released instruct model's generation_config.json sets it.
    config_path = folder / "generation_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "do_sample": True}))
    port = free_port()
    log = (folder.parent / "serve.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [str(Path(sys.executable).with_name("transformers")), "serve"]
    command += ["--host", "127.0.0.1", "--port", str(port), str(folder)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_START_SECONDS
        while True:
            assert process.poll() is None, (folder.parent / "serve.log").read_text()[-2000:]
            try:
                if requests.get(f"{base_url}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "transformers serve did not come up"
            time.sleep(0.5)
        yield base_url, str(folder)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def label_first_round(project, base, loop_settings, *, choices: str = "AB"):
    """Generate round 1 from the base policy; one annotator labels it with `choices` in turn."""
    from annotation.models import Judgment
    from tests.factories import make_user
    from training.rounds import generate_round_now

    round1 = generate_round_now(
        project_id=project.pk,
        model_version_id=base.pk,
        source_key="round-1",
        settings=loop_settings.to_dict(),
    )
    annotator = make_user()
    for n, item in enumerate(round1.items.all()):
        Judgment.objects.create(
            project=project, item=item, annotator=annotator, choice=choices[n % len(choices)]
        )
    return round1
