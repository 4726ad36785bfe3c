"""Does the loop learn? Issue #8's figures: SFT, then rounds of labels -> training, per path.

Runs the README demo's own code path, ``manage.py demo --no-serve`` (simulated annotators over
HTTP, ``training.loop.loop_advance``), on a fresh private SQLite database and artefact folder:

1. ``base/``: the tiny SFT policy and round 1 (``--rounds 0``), made once;
2. per path (``dpo``, ``rm_ppo``): a copy of that database, then ``--rounds N`` iterations of
   label -> export -> train (DPO, or reward model then PPO) -> evaluate -> generate, so both
   paths start from the same policy and the same round-1 answers;
3. every policy version answers the held-out questions (operand pairs never trained on)
   ``--eval-samples`` times with the same seeds; the true reward is printed per round with a
   prompt-clustered bootstrap 95% CI, and the paired difference to the SFT policy (per
   prompt, bootstrap over prompts), with the time per stage the demo printed.

    .venv/bin/python benchmarks/loop_bench.py --path both   # ~5 min on 2 idle cores, ~20 busy
    .venv/bin/python benchmarks/loop_bench.py --path dpo --rounds 1

Results are printed and written to ``<out>/results.json``; each demo's output is in
``<out>/<stage>/demo.log``.

Reference run (``--path both``, defaults, seed 0; 2 CPU cores, load 0-2; 0.13M-parameter
GPT-2, 256 prompts a round, 16 answers per held-out question). True reward on the 30
held-out questions [95% CI], and round-3 policy minus SFT paired per question:
SFT -0.596 [-0.764, -0.396], accuracy 0.29, rude 0.35.
DPO rounds 1-3: -0.453, -0.360, -0.299 [-0.520, -0.048]; gain +0.297 [+0.161, +0.445]
(accuracy 0.35, rude 0.01). RM + PPO rounds 1-3: -0.270, -0.311, -0.321 [-0.469, -0.156];
gain +0.275 [+0.066, +0.477] (accuracy 0.24, rude 0.00, polite 1.00: the reward model
learns style, not arithmetic). Seconds: SFT 49, round-1 generation 1; per round, labels
10-14, then export + train + evaluate + generate 9-10 (DPO) or 23-26 (RM + PPO). Under load
8-22 the same stages took SFT 155-183, labels 58-153, DPO round 11-35, RM + PPO round 58-138.
Labelling order varies between runs (annotators race), so round figures vary by ~0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TIMINGS_LINE = re.compile(r"time per stage: (.*); total (\d+)s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=["dpo", "rm_ppo", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3, help="loop iterations after round 1")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: temp dir)")
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="reuse an earlier run's base/ folder (SFT policy + round 1) instead of making one",
    )
    parser.add_argument("--port", type=int, default=8870, help="web app port of the demos")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=None, help="prompts per round (demo's)")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (demo's default)")
    parser.add_argument(
        "--eval-samples", type=int, default=16, help="answers per held-out question and policy"
    )
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a shared CPU)"
    )
    return parser.parse_args(argv)


def demo_env(folder: Path, threads: int, base: Path | None = None) -> dict[str, str]:
    """Return the environment of one demo: a private SQLite database and artefact folder.

    ``base`` is the folder whose SFT policy the demo's copied database names: its artefacts
    are a model root, since a run may only read models under the configured roots.
    """
    return {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{folder / 'db.sqlite3'}",
        "PREFLOOP_ARTIFACT_ROOT": str(folder / "art"),
        "PREFLOOP_MODEL_ROOTS": str(base / "art") if base is not None else "",
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DJANGO_DEBUG": "0",
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_demo(
    folder: Path, args, *, rounds: int, path: str, port: int, base: Path | None = None
) -> dict[str, float]:
    """Run ``manage.py demo --no-serve`` in ``folder``; return its time per stage (seconds)."""
    command = [
        sys.executable,
        "manage.py",
        "demo",
        "--no-serve",
        "--port",
        str(port),
        "--rounds",
        str(rounds),
        "--path",
        path,
        "--seed",
        str(args.seed),
    ]
    if args.prompts is not None:
        command += ["--prompts", str(args.prompts)]
    if args.sft_steps is not None:
        command += ["--sft-steps", str(args.sft_steps)]
    print(f"$ {' '.join(command[1:])}   [{folder}]", flush=True)
    with (folder / "demo.log").open("w") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=demo_env(folder, args.threads, base),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for line in process.stdout:
            log.write(line)
            log.flush()
            if line.startswith(("1/5", "2/5", "3/5", "4/5", "5/5", "    ")):
                print(f"  [{folder.name}] {line.rstrip()}", flush=True)
        if process.wait() != 0:
            raise SystemExit(f"demo failed in {folder} (see {folder / 'demo.log'})")
    return logged_timings(folder / "demo.log")


def logged_timings(log: Path) -> dict[str, float]:
    """Return the time per stage (seconds) that a demo printed into its log."""
    timings: dict[str, float] = {}
    for line in log.read_text().splitlines():
        match = TIMINGS_LINE.search(line)
        if match:
            for part in match.group(1).split(", "):
                name, _, value = part.rpartition(" ")
                timings[name] = float(value.rstrip("s"))
            timings["total"] = float(match.group(2))
    return timings


def model_versions(folder: Path, threads: int) -> list[dict]:
    """Return the folder's model registry (``manage.py models --json``), oldest first."""
    output = subprocess.run(
        [sys.executable, "manage.py", "models", "--json"],
        cwd=REPO,
        env=demo_env(folder, threads),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def training_seconds(artifact_path: str) -> float | None:
    """Return a run's training time from its metrics.jsonl (first to last event)."""
    import datetime as dt

    metrics = Path(artifact_path).parent / "metrics.jsonl"
    if not metrics.exists():
        return None
    times = []
    for line in metrics.read_text().splitlines():
        stamp = json.loads(line).get("time")
        if stamp:
            times.append(dt.datetime.fromisoformat(stamp))
    return (max(times) - min(times)).total_seconds() if times else None


class Scorer:
    """Score policies on the held-out questions; every policy answers with the same seeds."""

    def __init__(self, samples: int, temperature: float, seed: int):
        from training.demo_eval import held_out_prompts

        self.prompts = held_out_prompts()
        self.samples = samples
        self.temperature = temperature
        self.seed = seed
        self.cache: dict[str, dict] = {}

    def score(self, model_path: str) -> dict:
        """Return per-prompt mean true reward, accuracy, rude share and an example answer."""
        if model_path in self.cache:
            return self.cache[model_path]
        import numpy as np

        from training import demo
        from training.generation import GenerationSettings, generate_candidates

        settings = GenerationSettings(
            temperature=self.temperature, max_new_tokens=24, seed=self.seed, batch_size=64
        )
        answers = generate_candidates(model_path, self.prompts, k=self.samples, settings=settings)
        texts = [[c["text"] for c in cands] for cands in answers]
        rewards = np.array(
            [
                [demo.true_reward(p, t) for t in ts]
                for p, ts in zip(self.prompts, texts, strict=True)
            ]
        )
        correct = [
            demo.stated_answer(t) == demo.parse_prompt(p).answer
            for p, ts in zip(self.prompts, texts, strict=True)
            for t in ts
        ]
        rude = [
            bool(set(re.findall(r"[a-z]+", t.lower())) & set(demo.RUDE_WORDS))
            for ts in texts
            for t in ts
        ]
        polite = [t.startswith(demo.POLITE_OPENERS) for ts in texts for t in ts]
        result = {
            "per_prompt": rewards.mean(axis=1).tolist(),
            "accuracy": float(np.mean(correct)),
            "rude": float(np.mean(rude)),
            "polite": float(np.mean(polite)),
            "example": f"{self.prompts[0]} -> {texts[0][0]}",
        }
        self.cache[model_path] = result
        return result


def summarise(scorer: Scorer, sft: dict, versions: list[dict]) -> list[dict]:
    """Return one row per policy: true reward with CI and the paired difference to SFT."""
    import numpy as np

    from training.demo_eval import bootstrap_mean_ci

    base = scorer.score(sft["artifact_path"])
    rows = []
    for round_, version in enumerate([sft, *versions]):
        scored = scorer.score(version["artifact_path"])
        mean, low, high = bootstrap_mean_ci(scored["per_prompt"], seed=scorer.seed)
        diff = np.asarray(scored["per_prompt"]) - np.asarray(base["per_prompt"])
        d_mean, d_low, d_high = bootstrap_mean_ci(diff.tolist(), seed=scorer.seed)
        loop_eval = version.get("eval_results") or {}
        rows.append(
            {
                "after_round": round_,
                "name": version["name"],
                "artifact_path": version["artifact_path"],
                "true_reward": mean,
                "ci95": [low, high],
                "diff_vs_sft": d_mean,
                "diff_ci95": [d_low, d_high],
                "accuracy": scored["accuracy"],
                "rude": scored["rude"],
                "polite": scored["polite"],
                "example": scored["example"],
                "loop_eval": {
                    k: loop_eval[k]
                    for k in ("true_reward", "true_reward_ci95", "accuracy")
                    if k in loop_eval
                },
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = (args.out or Path(tempfile.mkdtemp(prefix="loop_bench_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}", flush=True)
    paths = ["dpo", "rm_ppo"] if args.path == "both" else [args.path]
    started = time.perf_counter()

    if args.base is not None:
        base = args.base.resolve()
        base_timings = logged_timings(base / "demo.log")
    else:
        base = work / "base"
        base.mkdir(exist_ok=True)
        base_timings = run_demo(base, args, rounds=0, path=paths[0], port=args.port)
    sft = next(v for v in model_versions(base, args.threads) if v["name"] == "demo-sft")

    import torch

    from training.trainers.common import set_quiet_offline_env

    set_quiet_offline_env()
    torch.set_num_threads(args.threads)
    scorer = Scorer(args.eval_samples, args.eval_temperature, args.seed)
    results: dict = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "base_timings_s": base_timings,
        "paths": {},
    }
    for offset, path in enumerate(paths, start=1):
        folder = work / path
        folder.mkdir(exist_ok=True)
        shutil.copyfile(base / "db.sqlite3", folder / "db.sqlite3")
        timings = run_demo(
            folder, args, rounds=args.rounds, path=path, port=args.port + offset, base=base
        )
        versions = model_versions(folder, args.threads)
        policies = [v for v in versions if v["kind"] == "policy" and v["name"] != "demo-sft"]
        train_s = {v["name"]: training_seconds(v["artifact_path"]) for v in versions}
        results["paths"][path] = {
            "timings_s": timings,
            "training_run_s": train_s,
            "rows": summarise(scorer, sft, policies),
        }
        (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        print_path(path, results["paths"][path], args)
    results["wall_s"] = time.perf_counter() - started
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_summary(results, args)
    return 0


def print_path(path: str, result: dict, args) -> None:
    print(
        f"\n{path}: true reward on {len(Scorer(1, 1.0, 0).prompts)} held-out questions, "
        f"{args.eval_samples} answers each at T={args.eval_temperature} "
        "(95% CI: bootstrap over questions)"
    )
    print(
        f"{'after round':>11} {'policy':12} {'reward':>7} {'CI95':>17} {'vs SFT':>7} "
        f"{'paired CI95':>17} {'acc':>5} {'rude':>5} {'polite':>6} {'loop eval':>9}"
    )
    for row in result["rows"]:
        low, high = row["ci95"]
        d_low, d_high = row["diff_ci95"]
        loop_eval = row["loop_eval"].get("true_reward")
        print(
            f"{row['after_round']:>11} {row['name'][:12]:12} {row['true_reward']:+7.3f} "
            f"[{low:+.3f}, {high:+.3f}] {row['diff_vs_sft']:+7.3f} [{d_low:+.3f}, {d_high:+.3f}] "
            f"{row['accuracy']:5.2f} {row['rude']:5.2f} {row['polite']:6.2f} "
            + (f"{loop_eval:+9.3f}" if loop_eval is not None else f"{'-':>9}")
        )
    print("  (loop eval: the loop's own score, 2 answers per question, stored on the version)")
    print("  examples: " + " | ".join(row["example"] for row in result["rows"]))
    # SFT and round 1 come from base/ (reused here, so the demo printed ~0 s for them).
    stages = {k: v for k, v in result["timings_s"].items() if k not in ("sft", "generate_r1")}
    print("  time per stage (s): " + ", ".join(f"{k} {v:.0f}" for k, v in stages.items()))
    runs = ", ".join(
        f"{k} {v:.0f}" for k, v in result["training_run_s"].items() if v and k != "demo-sft"
    )
    print(f"  training runs (s): {runs}")


def print_summary(results: dict, args) -> None:
    print(f"\nsummary: round-{args.rounds} policy minus SFT (paired, per held-out question)")
    for path, result in results["paths"].items():
        last = result["rows"][-1]
        low, high = last["diff_ci95"]
        verdict = "improves" if low > 0 else "no clear improvement"
        print(f"  {path:7} {last['diff_vs_sft']:+.3f} [{low:+.3f}, {high:+.3f}]  {verdict}")
    base = results["base_timings_s"]
    print(
        "  SFT + round 1 (s): "
        + ", ".join(f"{k} {v:.0f}" for k, v in base.items())
        + f"; bench wall time {results['wall_s']:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
