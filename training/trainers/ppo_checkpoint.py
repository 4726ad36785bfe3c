"""PPO checkpoints: write and restore everything a resumed run needs.

``checkpoint-N/`` is an inference checkpoint (``from_pretrained`` loads the policy, tokenizer
and generation config) with ``ppo_state/`` beside it holding what a resume needs (critic,
optimizers, schedulers, KL controller, score statistics, RNG states, update step and data
position). No Django here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.trainers.common import ConfigError
from training.trainers.ppo_config import RECIPE, STATE_DIR
from training.trainers.ppo_models import ValueModel, is_peft, merged_copy
from training.trainers.provenance import library_versions
from training.trainers.run_log import atomic_write_json


class PPOCheckpointing:
    """Checkpoint writing and resuming of ``PPOTrainer`` (which supplies the attributes used)."""

    def generation_config(self):
        """Return the generation config that reproduces the rollout sampling."""
        from transformers import GenerationConfig

        config = self.config
        return GenerationConfig(
            do_sample=True,
            temperature=config.temperature,
            top_k=config.top_k if config.top_k > 0 else None,
            top_p=config.top_p,
            max_new_tokens=config.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            bos_token_id=self.tokenizer.bos_token_id,
        )

    def save_policy(self, directory: Path) -> None:
        """Write an inference checkpoint: policy (LoRA merged), tokenizer, generation config."""
        directory.mkdir(parents=True, exist_ok=True)
        policy = self.unwrapped_policy
        if is_peft(policy):
            policy.save_pretrained(str(directory / "adapter"))
            merged = merged_copy(policy)
            merged.generation_config = self.generation_config()
            merged.save_pretrained(str(directory))
        else:
            original = policy.generation_config
            policy.generation_config = self.generation_config()
            policy.save_pretrained(str(directory))
            policy.generation_config = original
        self.tokenizer.save_pretrained(str(directory))

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Write ``directory`` (inference checkpoint) and its ``ppo_state/`` (resume state).

        The folder is written under a temporary name and renamed, so a crash never leaves a
        half-written checkpoint-N that a resume would pick.
        """
        directory = Path(directory)
        self.accelerator.wait_for_everyone()
        if not self.accelerator.is_main_process:
            return directory
        tmp = directory.with_name(f".{directory.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.save_policy(tmp)
        state_dir = tmp / STATE_DIR
        self.unwrapped_value.save(state_dir / "value_model")
        torch.save(self.policy_optimizer.state_dict(), state_dir / "policy_optimizer.pt")
        torch.save(self.value_optimizer.state_dict(), state_dir / "value_optimizer.pt")
        torch.save(self.policy_scheduler.state_dict(), state_dir / "policy_scheduler.pt")
        torch.save(self.value_scheduler.state_dict(), state_dir / "value_scheduler.pt")
        torch.save(self.rng_state(), state_dir / "rng_state.pt")
        atomic_write_json(state_dir / "trainer_state.json", self.trainer_state())
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(tmp, directory)
        if self.logger is not None and hasattr(self.logger, "event"):
            self.logger.event("checkpoint", path=str(directory), update=self.update_step)
        self._prune_checkpoints(directory.parent)
        return directory

    def _prune_checkpoints(self, parent: Path) -> None:
        limit = self.config.save_total_limit
        if not limit:
            return
        found = sorted(
            (int(p.name.split("-")[1]), p)
            for p in parent.glob("checkpoint-*")
            if p.is_dir() and p.name.split("-")[1].isdigit()
        )
        for _, path in found[:-limit]:
            shutil.rmtree(path, ignore_errors=True)

    def trainer_state(self) -> dict[str, Any]:
        """Return the JSON part of the resume state."""
        return {
            "recipe": RECIPE,
            "update_step": self.update_step,
            "episodes": self.episodes,
            "data_epoch": self.data_epoch,
            "data_offset": self.data_offset,
            "ptx_position": [self.ptx_epoch, self.ptx_offset],
            "guards": self.guard.summary(),
            "num_train_prompts": len(self.train_prompts),
            "kl_controller": self.kl_controller.state_dict(),
            "score_moments": self.score_moments.state_dict(),
            "sampling": self.config.sampling_settings(),
            "stop_token_ids": self.stop_ids,
            "config": dataclasses.asdict(self.config),
            "versions": library_versions(),
            "world_size": self.accelerator.num_processes,
        }

    def rng_state(self) -> dict[str, Any]:
        """Return every random state a resume must restore."""
        # numpy's state is stored as plain values and a tensor so that the file loads with
        # torch.load(weights_only=True), which refuses arbitrary pickled objects.
        kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
        state = {
            "python": random.getstate(),
            "numpy": {
                "kind": str(kind),
                "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                "position": int(position),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached_gaussian),
            },
            "torch": torch.get_rng_state(),
            "rollout_generator": self.rollout_generator.get_state(),
            "shuffle_generator": self.shuffle_generator.get_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore the full training state from a ``checkpoint-N`` folder."""
        directory = Path(directory)
        state_dir = directory / STATE_DIR
        if not (state_dir / "trainer_state.json").exists():
            raise ConfigError(f"{directory} is not a resumable PPO checkpoint (no {STATE_DIR}/)")
        state = json.loads((state_dir / "trainer_state.json").read_text())
        if state["num_train_prompts"] != len(self.train_prompts):
            raise ConfigError(
                f"{directory}: saved with {state['num_train_prompts']} training prompts, the "
                f"dataset now has {len(self.train_prompts)}; the data position would not match"
            )
        policy = self.unwrapped_policy
        if is_peft(policy):
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            adapter = load_file(str(directory / "adapter" / "adapter_model.safetensors"))
            set_peft_model_state_dict(policy, adapter)
        else:
            from transformers import AutoModelForCausalLM

            saved = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
            policy.load_state_dict(saved.state_dict())
        saved_value = ValueModel.load(state_dir / "value_model")
        self.unwrapped_value.load_state_dict(saved_value.state_dict())

        def load(name: str):
            return torch.load(state_dir / name, weights_only=True)

        self.policy_optimizer.load_state_dict(load("policy_optimizer.pt"))
        self.value_optimizer.load_state_dict(load("value_optimizer.pt"))
        self.policy_scheduler.load_state_dict(load("policy_scheduler.pt"))
        self.value_scheduler.load_state_dict(load("value_scheduler.pt"))
        rng = load("rng_state.pt")
        random.setstate(rng["python"])
        saved_numpy = rng["numpy"]
        np.random.set_state(
            (
                saved_numpy["kind"],
                saved_numpy["keys"].numpy().astype(np.uint32),
                saved_numpy["position"],
                saved_numpy["has_gauss"],
                saved_numpy["cached_gaussian"],
            )
        )
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.rollout_generator.set_state(rng["rollout_generator"])
        self.shuffle_generator.set_state(rng["shuffle_generator"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.score_moments.load_state_dict(state["score_moments"])
        self.update_step = state["update_step"]
        self.episodes = state["episodes"]
        self.data_epoch = state["data_epoch"]
        self.data_offset = state["data_offset"]
        self.ptx_epoch, self.ptx_offset = state.get("ptx_position", [0, 0])
