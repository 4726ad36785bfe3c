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

Issue #19's figure runs ``rm_ppo`` per seed (``--seeds 0 1 2``: one SFT policy and round 1 per
seed, shared by the settings) with the reward-hacking guards on (the loop's defaults) and off
(``GUARD_SETTINGS``), and ``--hackable`` makes the simulated annotators prefer a polite opener
only (``demo --labels polite_only``). Per setting and seed it prints the rounds as above and
the alarms stored on each training run (``TrainingRun.alarms``), then the mean over seeds and
whether each criterion holds:

    .venv/bin/python benchmarks/loop_bench.py --path rm_ppo --seeds 0 1 2 --guards both
    .venv/bin/python benchmarks/loop_bench.py --path rm_ppo --seeds 0 --guards both \
        --hackable --base <the first run's work folder>

Results are printed and written to ``<out>/results.json``; each demo's output is in
``<out>/seed<N>/<setting>/demo.log``.

The criteria judge the policy the loop serves after each round: its last promoted one (the
gate may keep a policy unpromoted; the next round then comes from, and trains on, the last
promoted one). Both it and the last policy trained are printed.

Issue #19's figure (``--path rm_ppo --seeds 0 1 2 --guards both --base <SFT folders>``, 2 CPU
cores, load 2-4 from the benchmark itself, wall time ~10 min). True reward of the policy served
after round 3 minus SFT, paired per held-out question [95% CI]:

    guards on:  seed 0 +0.181 [+0.081, +0.287]; seed 1 +0.210 [+0.139, +0.280];
                seed 2 +0.260 [+0.192, +0.326]; mean +0.217
    guards off: seed 0 +0.175 [+0.054, +0.310]; seed 1 +0.119 [+0.008, +0.237];
                seed 2 +0.079 [-0.012, +0.164]; mean +0.124
    mean true reward, SFT then rounds 1-3: on  -0.827, -0.627, -0.601, -0.610
                                           off -0.827, -0.629, -0.635, -0.703
    held-out accuracy (SFT 0.29 / 0.13 / 0.17 per seed) after round 3: on 0.26 / 0.11 / 0.21,
    off 0.28 / 0.06 / 0.11. Alarms: none fired on any run, on or off.

So with guards on the round-3 policy beats SFT on every seed, round 3 is not below round 1 in
the mean, the gain is at least the unguarded one, and the guarded runs stay quiet; guards off
loses true reward and accuracy in round 3. Guards on are the loop's defaults: the frozen
calibration, a 3-seed reward ensemble scored as mean - 1 std, PPO-ptx 1.0, the held-out judge
(PPO keeps its best-judged weights, the gate rejects a policy it finds clearly worse) and, for
the demo, a KL budget of 2 nats per round. What moved the figure was PPO-ptx: before it, the
settings gave round-3 gains from -0.24 to +0.24 over four runs of three seeds (held-out
accuracy 0.29 -> 0.11 in one round on seed 0: the reward models learn style, not arithmetic,
and PPO traded accuracy for style); with it accuracy holds. The figure varies between runs of
the same seeds (annotators race, so labels differ): of three runs of these settings, two met
every criterion; the third (before a fix to how reward-model judges score identical answers)
had seed 0 at +0.081 [-0.021, +0.182].

Hackable (``--hackable``: the simulated annotators prefer a polite opener only, same seeds,
guards on and off): the reward models learn politeness, and guards off makes every answer
polite (share 1.00 on every seed). That is hacking the proxy, but not a loss here, since the
true reward also pays for politeness: round-3 gains over SFT on +0.167 / +0.122 / +0.173
(every seed above zero), off +0.251 / +0.088 / +0.095; accuracy off 0.26 / 0.08 / 0.13 against
SFT's 0.29 / 0.13 / 0.17. The alarms did not fire on the guarded runs; unguarded, one PPO run
recorded value_loss_spike. So polite-only labels alone keep PPO's curves tame (KL, entropy,
length, update size in range). Made hackable in earnest, with polite-only labels and guards off
and no KL penalty (``--seeds 0 --guards off --hackable --loop-settings
'{"ppo": {"kl_coef": 0.0, "adaptive_kl": false}}'``), the policy fell below SFT (true reward
-0.725 after round 1, -0.650 after round 3, SFT -0.617; answers like "Sure! 0 + 5 + 6.") and
the alarms fired: kl_limit at step 25 of the round-1 PPO run and value_loss_spike at step 30
of round 3's, while the guarded runs above stayed quiet.

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
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TIMINGS_LINE = re.compile(r"time per stage: (.*); total (\d+)s")

# Loop setting overrides per guard setting. "on" is the loop's defaults (training.loop.settings);
# "off" switches every reward-hacking guard off: raw reward-model scores instead of the frozen
# calibration, one reward model and no uncertainty penalty, no KL budget (the gate's, which
# PPO also stops at), no held-out judge, no PPO-ptx, no stop on an alarm.
GUARD_SETTINGS: dict[str, dict] = {
    "on": {},
    "off": {
        "ppo": {
            "reward_calibration": {},
            "uncertainty_coef": 0.0,
            "ptx_coef": 0.0,
            "judge_reward_model_path": "",
            "stop_on_alarm": False,
        },
        "reward": {"ensemble_size": 1},
        "gate": {"kl_budget": None},
        "held_out_judge": False,
    },
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=["dpo", "rm_ppo", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3, help="loop iterations after round 1")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: temp dir)")
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="reuse an earlier run's work folder: its seed<N>/base (SFT policy + round 1)",
    )
    parser.add_argument("--port", type=int, default=8870, help="web app port of the demos")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="one SFT policy and run per seed"
    )
    parser.add_argument(
        "--guards",
        choices=["on", "off", "both"],
        default="on",
        help="rm_ppo reward-hacking guards: the loop's defaults (on), all off, or both",
    )
    parser.add_argument(
        "--hackable",
        action="store_true",
        help="simulated annotators prefer a polite opener only (demo --labels polite_only)",
    )
    parser.add_argument(
        "--loop-settings",
        type=json.loads,
        default={},
        help="JSON loop setting overrides applied under every guard setting's own "
        '(e.g. \'{"ppo": {"ptx_coef": 0.5}}\')',
    )
    parser.add_argument("--jobs", type=int, default=2, help="demos run at once")
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
    folder: Path,
    args,
    *,
    rounds: int,
    path: str,
    port: int,
    seed: int,
    base: Path | None = None,
    loop_settings: dict | None = None,
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
        str(seed),
    ]
    loop_settings = merged_settings(args.loop_settings, loop_settings or {})
    if loop_settings:
        command += ["--loop-settings", json.dumps(loop_settings)]
    if args.hackable:
        command += ["--labels", "polite_only"]
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
                print(f"  [{folder.parent.name}/{folder.name}] {line.rstrip()}", flush=True)
        failed = process.wait() != 0
    timings = logged_timings(folder / "demo.log")
    if failed and not timings:
        raise SystemExit(f"demo failed in {folder} (see {folder / 'demo.log'})")
    if failed:  # it reported its results, then failed stopping (e.g. its web server)
        print(f"  [{folder.parent.name}/{folder.name}] finished, then exited with an error")
    return timings


def merged_settings(extra: dict, guards: dict) -> dict:
    """Return loop setting overrides: ``extra`` under ``guards`` (dicts merged one level)."""
    merged = {**extra}
    for key, value in guards.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = {**merged[key], **value} if both else value
    return merged


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


def run_alarms(folder: Path) -> list[dict]:
    """Return each training run of a demo database with the alarms stored on it, oldest first."""
    with sqlite3.connect(folder / "db.sqlite3") as db:
        rows = db.execute(
            "SELECT id, recipe, status, alarms FROM training_trainingrun ORDER BY id"
        ).fetchall()
    return [
        {"run": pk, "recipe": recipe, "status": status, "alarms": json.loads(alarms or "[]")}
        for pk, recipe, status, alarms in rows
    ]


def guard_summary(artifact_path: str) -> dict:
    """Return what a PPO run's guards decided (the ``guards`` event of its metrics.jsonl)."""
    metrics = Path(artifact_path).parent / "metrics.jsonl"
    if not metrics.exists():
        return {}
    for line in reversed(metrics.read_text().splitlines()):
        record = json.loads(line)
        if record.get("event") == "guards":
            return {k: record.get(k) for k in ("stop_reason", "final_update", "last_kl")}
    return {}


class Scorer:
    """Score policies on the held-out questions; every policy answers with the same seeds."""

    def __init__(self, samples: int, temperature: float, seed: int):
        from training.demo_eval import held_out_prompts

        self.prompts = held_out_prompts()
        self.samples = samples
        self.temperature = temperature
        self.seed = seed
        self.cache: dict[str, dict] = {}

    def with_seed(self, seed: int) -> Scorer:
        """Return a scorer sampling with ``seed`` that shares this one's cache."""
        other = Scorer.__new__(Scorer)
        other.__dict__.update(self.__dict__, seed=seed)
        return other

    def score(self, model_path: str) -> dict:
        """Return per-prompt mean true reward, accuracy, rude share and an example answer."""
        key = f"{model_path}#{self.seed}"
        if key in self.cache:
            return self.cache[key]
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
        self.cache[key] = result
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
                "guards": guard_summary(version["artifact_path"]) if round_ else {},
                "promotion": version.get("promotion", "") if round_ else "base",
            }
        )
    # The policy the loop serves after each round: its last promoted one (SFT before any);
    # the next round is generated from it and the next policy trained from it.
    serving = 0
    for row in rows:
        if row["promotion"] == "promoted":
            serving = row["after_round"]
        row["serving"] = serving
    return rows


def served(rows: list[dict], round_: int) -> dict:
    """Return the row of the policy the loop serves after ``round_``."""
    return rows[rows[round_]["serving"]]


def run_label(guards: str, hackable: bool) -> str:
    """Return the folder name of one guard setting's runs."""
    return f"guards-{guards}" + ("-hackable" if hackable else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = (args.out or Path(tempfile.mkdtemp(prefix="loop_bench_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}", flush=True)
    paths = ["dpo", "rm_ppo"] if args.path == "both" else [args.path]
    guard_modes = ["on", "off"] if args.guards == "both" else [args.guards]
    # (seed, setting name, path, loop settings): DPO has no guards; rm_ppo runs per guard mode.
    runs = [
        (seed, path if path == "dpo" else run_label(mode, args.hackable), path, settings)
        for seed in args.seeds
        for path in paths
        for mode, settings in (
            [("on", {})] if path == "dpo" else [(m, GUARD_SETTINGS[m]) for m in guard_modes]
        )
    ]
    started = time.perf_counter()
    ports = {seed: args.port + 10 * i for i, seed in enumerate(args.seeds)}

    def base_of(seed: int) -> tuple[Path, dict]:
        if args.base is not None:
            base = args.base.resolve() / f"seed{seed}" / "base"
            return base, logged_timings(base / "demo.log")
        base = work / f"seed{seed}" / "base"
        if (base / "demo.log").exists() and logged_timings(base / "demo.log"):
            return base, logged_timings(base / "demo.log")  # made by an earlier call
        base.mkdir(parents=True, exist_ok=True)
        return base, run_demo(base, args, rounds=0, path=paths[0], port=ports[seed], seed=seed)

    def loop_run(index: int) -> dict:
        seed, name, path, settings = runs[index]
        folder = work / f"seed{seed}" / name
        if (folder / "demo.log").exists() and logged_timings(folder / "demo.log"):
            # finished by an earlier call with the same --out: score it, do not run it again
            return {"timings_s": logged_timings(folder / "demo.log"), "loop_settings": settings}
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bases[seed][0] / "db.sqlite3", folder / "db.sqlite3")
        timings = run_demo(
            folder,
            args,
            rounds=args.rounds,
            path=path,
            port=ports[seed] + 1 + index % 9,
            seed=seed,
            base=bases[seed][0],
            loop_settings=settings,
        )
        return {"timings_s": timings, "loop_settings": settings}

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        bases = dict(zip(args.seeds, pool.map(base_of, args.seeds), strict=True))
        finished = list(pool.map(loop_run, range(len(runs))))

    import torch

    from training.trainers.common import set_quiet_offline_env

    set_quiet_offline_env()
    torch.set_num_threads(args.threads)
    scorer = Scorer(args.eval_samples, args.eval_temperature, args.seeds[0])
    results: dict = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "base_timings_s": {str(seed): bases[seed][1] for seed in args.seeds},
        "runs": {},
    }
    for (seed, name, _path, _settings), done in zip(runs, finished, strict=True):
        folder = work / f"seed{seed}" / name
        base = bases[seed][0]
        sft = next(v for v in model_versions(base, args.threads) if v["name"] == "demo-sft")
        versions = model_versions(folder, args.threads)
        policies = [v for v in versions if v["kind"] == "policy" and v["name"] != "demo-sft"]
        train_s = {v["name"]: training_seconds(v["artifact_path"]) for v in versions}
        result = {
            **done,
            "training_run_s": train_s,
            "rows": summarise(scorer.with_seed(seed), sft, policies),
            "training_runs": run_alarms(folder),
        }
        results["runs"].setdefault(name, {})[str(seed)] = result
        (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        print_path(f"{name}, seed {seed}", result, args)
    results["summary"] = summary_over_seeds(results["runs"], args)
    results["wall_s"] = time.perf_counter() - started
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print_summary(results, args)
    return 0


def summary_over_seeds(runs: dict, args) -> dict:
    """Return, per setting, the mean over seeds of each round and the issue's criteria."""
    import numpy as np

    out: dict = {}
    for name, per_seed in runs.items():
        rows = [result["rows"] for result in per_seed.values()]
        rounds = min(len(r) for r in rows)
        trained = [float(np.mean([r[i]["true_reward"] for r in rows])) for i in range(rounds)]
        # The criteria judge the policy the loop serves after each round (see `served`).
        means = [float(np.mean([served(r, i)["true_reward"] for r in rows])) for i in range(rounds)]
        last = [served(r, rounds - 1) for r in rows]
        fired = {
            seed: [
                f"run {run['run']} ({run['recipe']}): {alarm['kind']}"
                for run in result["training_runs"]
                for alarm in run["alarms"]
            ]
            for seed, result in per_seed.items()
        }
        out[name] = {
            "seeds": list(per_seed),
            "mean_true_reward_by_round": means,
            "mean_true_reward_trained_by_round": trained,
            "mean_gain_vs_sft_trained": float(
                np.mean([r[rounds - 1]["diff_vs_sft"] for r in rows])
            ),
            "mean_gain_vs_sft": float(np.mean([row["diff_vs_sft"] for row in last])),
            "beats_sft_every_seed": all(row["diff_ci95"][0] > 0 for row in last),
            "last_not_below_round_1": rounds > 1 and means[-1] >= means[1],
            "alarms": fired,
            "no_alarms": not any(fired.values()),
        }
    for guarded in [name for name in out if name.startswith("guards-on")]:
        unguarded = guarded.replace("guards-on", "guards-off")
        if unguarded in out:
            out[guarded]["gain_at_least_unguarded"] = (
                out[guarded]["mean_gain_vs_sft"] >= out[unguarded]["mean_gain_vs_sft"]
            )
    return out


def print_path(path: str, result: dict, args) -> None:
    print(
        f"\n{path}: true reward on {len(Scorer(1, 1.0, 0).prompts)} held-out questions, "
        f"{args.eval_samples} answers each at T={args.eval_temperature} "
        "(95% CI: bootstrap over questions)"
    )
    print(
        f"{'after round':>11} {'policy':12} {'reward':>7} {'CI95':>17} {'vs SFT':>7} "
        f"{'paired CI95':>17} {'acc':>5} {'rude':>5} {'polite':>6} {'loop eval':>9} "
        f"{'gate':>8} {'serves':>6}"
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
            + f" {row['promotion'] or '-':>8} {row['serving']:>6}"
        )
    print(
        "  (loop eval: the loop's own score, 2 answers per question, stored on the version; "
        "serves: the round whose policy the loop serves after this one)"
    )
    print("  examples: " + " | ".join(row["example"] for row in result["rows"]))
    # SFT and round 1 come from base/ (reused here, so the demo printed ~0 s for them).
    stages = {k: v for k, v in result["timings_s"].items() if k not in ("sft", "generate_r1")}
    print("  time per stage (s): " + ", ".join(f"{k} {v:.0f}" for k, v in stages.items()))
    runs = ", ".join(
        f"{k} {v:.0f}" for k, v in result["training_run_s"].items() if v and k != "demo-sft"
    )
    print(f"  training runs (s): {runs}")
    guards = [
        f"round {row['after_round']}: {row['guards'].get('stop_reason') or 'no stop'}, final "
        f"update {row['guards'].get('final_update')}, KL {row['guards'].get('last_kl')}"
        for row in result["rows"]
        if row.get("guards")
    ]
    if guards:
        print("  guards: " + "; ".join(guards))
    fired = [
        f"run {run['run']} ({run['recipe']}, {run['status']}): "
        + ", ".join(f"{a['kind']} at step {a['step']} ({a['action']})" for a in run["alarms"])
        for run in result["training_runs"]
        if run["alarms"]
    ]
    print("  alarms: " + ("; ".join(fired) if fired else "none fired"))


def print_summary(results: dict, args) -> None:
    print(
        f"\nsummary over seeds {args.seeds}: the policy served after round {args.rounds} minus "
        f"SFT (paired), and the round-{args.rounds} policy trained"
    )
    for name, per_seed in results["runs"].items():
        for seed, result in per_seed.items():
            for label, row in (
                ("served ", served(result["rows"], -1)),
                ("trained", result["rows"][-1]),
            ):
                low, high = row["diff_ci95"]
                verdict = "improves" if low > 0 else "no clear improvement"
                print(
                    f"  {name:22} seed {seed} {label} (round {row['after_round']}): "
                    f"{row['diff_vs_sft']:+.3f} [{low:+.3f}, {high:+.3f}]  {verdict}"
                )
    for name, summary in results["summary"].items():
        means = ", ".join(f"{m:+.3f}" for m in summary["mean_true_reward_by_round"])
        trained = ", ".join(f"{m:+.3f}" for m in summary["mean_true_reward_trained_by_round"])
        print(f"  {name}: mean true reward SFT, rounds 1-{args.rounds}: served {means}")
        print(
            f"    trained {trained}; mean gain of the trained round-{args.rounds} policy "
            f"{summary['mean_gain_vs_sft_trained']:+.3f}"
        )
        print(
            f"    mean gain vs SFT {summary['mean_gain_vs_sft']:+.3f}; beats SFT on every seed: "
            f"{summary['beats_sft_every_seed']}; last round not below round 1: "
            f"{summary['last_not_below_round_1']}"
            + (
                f"; gain at least the unguarded one: {summary['gain_at_least_unguarded']}"
                if "gain_at_least_unguarded" in summary
                else ""
            )
            + f"; no alarms: {summary['no_alarms']}"
        )
    bases = results["base_timings_s"]
    print(
        "  SFT + round 1 (s): "
        + "; ".join(
            f"seed {seed}: " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items())
            for seed, timings in bases.items()
        )
        + f"; bench wall time {results['wall_s']:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
