"""Prefloop's training library (no Django): recipes on top of TRL, transformers and PEFT.

Modules: ``data`` (dataset snapshots), ``common`` (configs, run logging, run.json,
checkpoints), ``tiny`` (hub-free tokenizer and models), recipes ``sft``, ``reward``,
``dpo``, ``online`` (GRPO, RLOO) and ``ppo``, and ``cli`` (``python -m training.trainers.cli``).
"""
