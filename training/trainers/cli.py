"""Command line: run one recipe on one dataset snapshot.

    python -m training.trainers.cli --recipe reward --config cfg.json \\
        --data DATASET_DIR --out OUTPUT_DIR [--resume]
    python -m training.trainers.cli --recipe dpo --describe

Exit codes: 0 success, 2 bad config or data (message on stderr), 1 any other failure.
The final metrics are printed on stdout as one JSON object; progress goes to stderr.
Works unchanged under ``accelerate launch -m training.trainers.cli ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2

# recipe name -> (module, config class, train function); imported on first use.
RECIPES: dict[str, tuple[str, str, str]] = {
    "sft": ("training.trainers.sft", "Config", "train"),
    "reward": ("training.trainers.reward", "Config", "train"),
    "dpo": ("training.trainers.dpo", "Config", "train"),
    "grpo": ("training.trainers.online", "GRPORecipeConfig", "train_grpo"),
    "rloo": ("training.trainers.online", "RLOORecipeConfig", "train_rloo"),
    "ppo": ("training.trainers.ppo", "Config", "train"),
}


class UsageError(Exception):
    """Bad command-line input: exit code 2."""


def get_recipe(name: str) -> tuple[type, Callable[..., dict]]:
    """Return ``(Config class, train function)`` of a recipe."""
    if name not in RECIPES:
        raise UsageError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    module_name, config_name, train_name = RECIPES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise RuntimeError(f"recipe {name!r} is not available: {module_name} is missing") from exc
    return getattr(module, config_name), getattr(module, train_name)


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a JSON or YAML config file into a mapping."""
    if not path.is_file():
        raise UsageError(f"config file not found: {path}")
    text = path.read_text()
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text)
        else:
            values = json.loads(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError
        raise UsageError(f"{path}: cannot parse config ({exc})") from exc
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise UsageError(f"{path}: the config must be a mapping of field names to values")
    return values


def describe(config_cls: type) -> str:
    """Return the fields of a config class with their defaults and help."""
    lines = [f"{config_cls.__module__}.{config_cls.__qualname__}"]
    for item in dataclasses.fields(config_cls):
        if item.default is not dataclasses.MISSING:
            default = item.default
        elif item.default_factory is not dataclasses.MISSING:
            default = item.default_factory()
        else:
            default = "(required)"
        lines.append(f"  {item.name} = {json.dumps(default, default=str)}")
        lines.append(f"      {item.metadata.get('help', '')}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.trainers.cli",
        description="Train a Prefloop recipe on a dataset snapshot.",
    )
    parser.add_argument("--recipe", required=True, help=", ".join(RECIPES))
    parser.add_argument("--config", type=Path, help="JSON or YAML file with the config fields")
    parser.add_argument("--data", type=Path, help="dataset snapshot folder (train.jsonl ...)")
    parser.add_argument("--out", type=Path, help="output folder (checkpoints, final/, logs)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint-N in --out"
    )
    parser.add_argument(
        "--describe", action="store_true", help="print the recipe's config fields and exit"
    )
    args = parser.parse_args(argv)
    if not args.describe and not (args.config and args.data and args.out):
        parser.error("--config, --data and --out are required")
    return args


def build_config(config_cls: type, values: dict[str, Any], *, resume: bool):
    """Build and validate a recipe config from a mapping."""
    from training.trainers.common import config_from_dict

    if resume:
        if "resume" not in {f.name for f in dataclasses.fields(config_cls)}:
            raise UsageError(f"{config_cls.__name__} does not support --resume")
        values = {**values, "resume": True}
    return config_from_dict(config_cls, values)


def _mark_failed(logger, exc: BaseException) -> None:
    """Tell a supervisor reading progress.json that the run ended badly."""
    if logger is None:
        return
    try:
        logger.event("failed", error=f"{type(exc).__name__}: {exc}")
        logger.finish(status="failed")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, usage errors are 2
        return int(exc.code or 0)

    from training.trainers.common import ConfigError, set_quiet_offline_env
    from training.trainers.data import DatasetError

    set_quiet_offline_env()
    bad_input = (UsageError, ConfigError, DatasetError)
    logger = None
    try:
        config_cls, train = get_recipe(args.recipe)
        if args.describe:
            print(describe(config_cls))
            return EXIT_OK
        config = build_config(config_cls, read_config_file(args.config), resume=args.resume)
        if not args.data.is_dir():
            raise DatasetError(f"dataset folder not found: {args.data}")
        from training.trainers.run_log import RunLogger

        logger = RunLogger(args.out)
        metrics = train(config, args.data, args.out, logger)
    except bad_input as exc:
        print(f"error: {exc}", file=sys.stderr)
        _mark_failed(logger, exc)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        _mark_failed(logger, exc)
        return EXIT_FAILURE
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        _mark_failed(logger, exc)
        return EXIT_FAILURE
    print(json.dumps(metrics, default=str, sort_keys=True))
    _leave_process_group()
    return EXIT_OK


def _leave_process_group() -> None:
    """Tear down torch.distributed after a finished multi-process run.

    A gloo group still alive at interpreter exit can abort the process ("terminate called
    without an active exception", SIGABRT) after its work is done, and torchrun then reports
    the whole run as failed. Only on success: after a failure the other processes may be gone.
    """
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
