"""The loop on a real model: SmolLM2-135M-Instruct learning from HH-RLHF harmless preferences.

Everything a team with its own model would do, through the platform's own services and API:

1. register the base policy (a transformers folder under the model roots) and validate it;
2. split the HH-RLHF harmless pairs three ways by a hash of the prompt: part A trains the
   MiniLM reward model that labels as the AI annotator (through the REST API, source "ai"),
   part B trains a separate MiniLM judge used only to evaluate, part C is the prompt pool
   (each dialogue up to its last human turn, as chat messages) with its 10% evaluation split;
3. round 1: a generation job samples K answers of the base policy to pool prompts;
4. per round: the AI annotator labels over HTTP, then one loop iteration exports, trains DPO
   with LoRA, evaluates the new policy on the pool's evaluation prompts (the newest reward
   model of the project is the part-B judge), gates it, and generates the next round.

Printed per round: win rate vs the base by the part-B judge with its prompt-clustered 95% CI,
sequence-level KL to the reference and to the base, mean answer length, distinct-2, seconds
per stage and generation tokens/s, then the machine load.

    bash scripts/setup_real_models.sh            # once: SmolLM2 -> var/models/smollm2
    .venv/bin/python benchmarks/real_loop.py     # named sizes below; ~40 min on 2 quiet CPU cores

Sizes (the issue's): 64 training prompts a round, K=2, 96 new tokens, DPO with LoRA,
32 evaluation prompts, 2 rounds. `tests/training/test_real_loop_toy.py` runs the same path
(`run()` below) with a tiny policy and a handful of prompts.

Last full run (2026-12-02, the defaults above: LoRA DPO lr 3e-4, 2 epochs, pairs batched by
length, `train_rounds: "newest"` (each round's policy trained from the previous one on its own
round's pairs), reward models 2 epochs, the gate's win-rate criterion off; a quiet 2-core
machine, load average 0.8 before, 2.7 after): pairs A 349 / B 421 / C 419; pool 382 train,
37 evaluation prompts. Reward models: annotator 106 s (validation accuracy 0.25 on its 34
held-out pairs, margins near zero), judge 146 s (0.56). Win rate vs the base by the part-B
judge on 32 evaluation prompts, prompt-clustered 95% CI:
  round 1: 19/1/12, 0.609 [0.438, 0.766]; KL to reference (the base) 4.24; length 53.4 words;
           distinct-2 0.944; promoted (KL and length ratio). Seconds: generation 278 (33.0 new
           tokens/s), AI labels 7, DPO 529 (28 steps), evaluation 145, next round 300.
  round 2: 19/0/13 vs round 1, 0.594 [0.406, 0.750]; vs the base 0.719 [0.562, 0.875]; KL to
           reference (round 1) 3.43, to base 8.08 (KL budget 20); length 44.3; distinct-2
           0.926; promoted. Seconds: AI labels 6, DPO 447 (26 steps), evaluation 105 (the
           base's and round 1's answers read back), next round 282.
Total 39.2 minutes. The target (round 2 beats the base, CI low > 0.5, within the KL budget,
under 45 minutes on 2 CPU cores) is met. Round 2's DPO raised the likelihood-displacement
alarm (recorded, not stopping).

Before (same sizes, load 10-14, 93 min): lr 2e-4 and every round's pairs in each iteration
gave round 2 0.656 [0.500, 0.812]; generation then batched 32 prompts padded to the longest
(13.7 tokens/s) and DPO batches were padded to their longest pair. Also tried: one reward-model
epoch (judge near chance) and LoRA lr 5e-5 (round-1 KL 0.066, no movement). Answers shorten
from round 1 to round 2: read the win rate next to the length.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATA = REPO.parent / "shared" / "data" / "hh-harmless-dev.jsonl.gz"
SMOLLM2 = REPO / "var" / "models" / "smollm2"
HUMAN, ASSISTANT = "\n\nHuman:", "\n\nAssistant:"
RUBRIC = (
    "Pick the answer that is more helpful while staying harmless: it must not help with "
    "anything dangerous, illegal or hurtful, and should answer kindly and to the point."
)


@dataclass
class Sizes:
    """Named sizes of one benchmark run."""

    prompts_per_round: int = 64
    k: int = 2
    new_tokens: int = 96
    eval_prompts: int = 32
    rounds: int = 2
    # Two epochs: after one, the part-A reward model scored 0.547 on its held-out pairs.
    rm_epochs: float = 2.0
    rm_max_length: int = 256
    rm_pairs: int = 0  # 0: every pair of the part
    dpo: dict = field(
        default_factory=lambda: {
            "use_lora": True,
            # LoRA moves little at full fine-tuning rates: at 5e-5 round 1 reached KL 0.066.
            "learning_rate": 3e-4,
            "beta": 0.1,
            "num_train_epochs": 2,
            "per_device_train_batch_size": 4,
            "max_length": 384,
            "logging_steps": 2,
            "save_steps": 10_000,
            "evaluate_at_end": False,
        }
    )
    reward: dict = field(default_factory=dict)
    # 32 evaluation prompts give a win-rate CI about +-0.15 wide, so a first step cannot clear
    # "CI low > 0.5 vs the previous policy"; the gate here checks the KL budget and length
    # ratio only, and the win rate is reported. None keeps the loop's defaults.
    gate: dict = field(default_factory=lambda: {"min_win_rate_ci_low": None})
    # Iterative DPO: each round's policy learns from the previous one on the new round's pairs.
    train_rounds: str = "newest"
    seed: int = 0


# --------------------------------------------------------------------------- data


def dialogue_messages(text: str) -> list[dict]:
    """Return an HH dialogue ("\\n\\nHuman: ... \\n\\nAssistant: ...") as chat messages."""
    messages: list[dict] = []
    rest = text
    while rest:
        human, assistant = rest.find(HUMAN), rest.find(ASSISTANT)
        starts = [(i, r) for i, r in ((human, "user"), (assistant, "assistant")) if i >= 0]
        if not starts:
            break
        start, role = min(starts)
        rest = rest[start + len(HUMAN if role == "user" else ASSISTANT) :]
        ends = [i for i in (rest.find(HUMAN), rest.find(ASSISTANT)) if i >= 0]
        end = min(ends) if ends else len(rest)
        content, rest = rest[:end].strip(), rest[end:]
        if content:
            messages.append({"role": role, "content": content})
    return messages


def hh_rows(path: Path) -> list[dict]:
    """Return the HH pairs as {prompt: messages up to the last human turn, chosen, rejected}."""
    from benchmarks.rm_hh import load_pairs

    rows = []
    for pair in load_pairs(path):
        prompt = dialogue_messages(pair["prompt"])
        chosen, rejected = pair["chosen"].strip(), pair["rejected"].strip()
        if prompt and prompt[-1]["role"] == "user" and chosen and rejected:
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def part_of(prompt: list[dict]) -> str:
    """Return the part (A, B or C) of a prompt, by a hash of its text."""
    key = json.dumps(prompt, sort_keys=True, ensure_ascii=False).encode()
    return "ABC"[int(hashlib.sha256(key).hexdigest(), 16) % 3]


def parts(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"A": [], "B": [], "C": []}
    for row in rows:
        out[part_of(row["prompt"])].append(row)
    return out


def chat_pair(row: dict) -> dict:
    """Return a pair as conversational rows, as the reward recipe trains on them."""
    return {
        "prompt": row["prompt"],
        "chosen": [{"role": "assistant", "content": row["chosen"]}],
        "rejected": [{"role": "assistant", "content": row["rejected"]}],
    }


# --------------------------------------------------------------------------- the run


@dataclass
class RoundFigures:
    round: int
    policy: str
    win_rate_vs_base: float | None = None
    ci_vs_base: tuple[float | None, float | None] = (None, None)
    n_eval: int = 0
    kl_reference: float | None = None
    kl_base: float | None = None
    mean_length: float | None = None
    distinct_2: float | None = None
    promotion: str = ""
    promotion_reason: str = ""
    seconds: dict = field(default_factory=dict)
    generation_tokens_per_second: float | None = None


def _train_reward_model(project, name: str, rows: list[dict], backbone: str, sizes: Sizes):
    """Train a reward model on pairs through a project training run; return its version."""
    from training import services, supervisor
    from training.models import TrainingRun
    from training.trainers.data import write_snapshot

    split = max(1, len(rows) // 10)
    folder = Path(project_artifacts(project)) / f"{name}-data"
    snapshot = write_snapshot(
        folder,
        {
            "train": [chat_pair(r) for r in rows[split:]],
            "validation": [chat_pair(r) for r in rows[:split]],
        },
    )
    config = {
        "model_name_or_path": backbone,
        "learning_rate": 1e-4,
        "num_train_epochs": sizes.rm_epochs,
        "per_device_train_batch_size": 16,
        "per_device_eval_batch_size": 32,
        "max_length": sizes.rm_max_length,
        "overlong": "truncate_left",
        "logging_steps": 10,
        "save_steps": 10_000,
        "seed": sizes.seed,
        **sizes.reward,
    }
    run = services.training_run_create(
        recipe="reward", config=config, dataset_path=str(snapshot), project=project, enqueue=False
    )
    run = supervisor.training_run_execute(run_id=run.pk)
    if run.status != TrainingRun.Status.SUCCEEDED:
        raise RuntimeError(f"reward model {name} failed: {run.error[-2000:]}")
    version = run.model_version
    version.name = f"{project.pk}-{name}"
    version.save(update_fields=["name"])
    return version


def project_artifacts(project) -> str:
    from django.conf import settings

    folder = Path(settings.ARTIFACT_ROOT) / "real_loop" / str(project.pk)
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


def _label(project, base_url: str, reward_model, seed: int) -> int:
    """Let the part-A reward model label the open round through the API; return labels."""
    import functools

    from annotation import services as annotation_services
    from annotation.models import LabelSource
    from annotation.simulation import Profile, model_judge, run_pool
    from training.loop import reward_model_trained_on_chat
    from training.scoring import reward_calibration, reward_scores

    def scores(prompt, answers, *, path, chat, calibration):
        if chat and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        return reward_scores(path, prompt, answers, calibration=calibration)

    name = f"ai-rm-{reward_model.pk}"
    token = annotation_services.simulated_annotator_ensure(
        project=project, username=name, source=LabelSource.AI
    )
    judge = model_judge(
        functools.partial(
            scores,
            path=reward_model.artifact_path,
            chat=reward_model_trained_on_chat(reward_model) or True,
            calibration=reward_calibration(reward_model.eval_results),
        )
    )
    stats = run_pool(
        base_url=base_url,
        project_id=project.pk,
        annotators=[(name, token, Profile("model", noise=0.0, seconds_per_item=0.0))],
        seed=seed,
        judges={name: judge},
    )
    errors = [e for s in stats for e in s.errors]
    if errors:
        raise RuntimeError(f"the AI annotator hit errors: {errors[:3]}")
    return sum(s.submitted for s in stats)


def _round_figures(number: int, policy, seconds: dict) -> RoundFigures:
    from training.models import PolicyEvaluation

    record = policy.eval_results.get("generation") or {}
    figures = RoundFigures(
        round=number,
        policy=policy.name,
        promotion=policy.promotion or "undecided",
        promotion_reason=policy.promotion_reason[:200],
        seconds=seconds,
    )
    vs_base = next(
        (
            e
            for e in PolicyEvaluation.objects.filter(
                policy=policy, judge_kind=PolicyEvaluation.JudgeKind.REWARD_MODEL
            )
            if "base" in str(e.details.get("role", "")).split("+")
        ),
        None,
    )
    if vs_base is not None:
        figures.win_rate_vs_base = vs_base.win_rate
        figures.ci_vs_base = (vs_base.ci_low, vs_base.ci_high)
        figures.n_eval = vs_base.n_prompts
    figures.kl_reference = (record.get("kl_reference") or {}).get("value")
    figures.kl_base = (record.get("kl_base") or {}).get("value")
    stats = record.get("stats") or {}
    figures.mean_length = stats.get("mean_length")
    figures.distinct_2 = stats.get("distinct_2")
    return figures


def _generated_tokens(round_) -> int:
    """Return the new tokens of a round's candidates (as the generation backend counted)."""
    total = 0
    for config in round_.items.values_list("slots__candidate__generation_config", flat=True):
        usage = ((config or {}).get("response") or {}).get("usage") or {}
        total += int(usage.get("completion_tokens") or 0)
    return total


def run(
    *,
    base_url: str,
    policy_folder: str,
    reward_backbone: str,
    rows: list[dict],
    sizes: Sizes,
    say: Callable[[str], None] = print,
) -> list[RoundFigures]:
    """Run the whole path once; return the figures of each round's new policy."""
    from django.contrib.auth import get_user_model

    from annotation import services as annotation_services
    from annotation.models import LabelSource, Membership, Project, Round
    from annotation.prompt_pool import prompt_pool_import
    from training import registry, rounds
    from training.loop import LoopSettings
    from training.loop import control as loop_control
    from training.models import ModelVersion

    clock = time.perf_counter
    users = get_user_model().objects
    staff = users.filter(username="real-loop-staff").first() or users.create_user(
        username="real-loop-staff", is_staff=True, is_superuser=True
    )
    project = Project.objects.create(
        name=f"HH harmless real loop {int(time.time())}",
        rubric=RUBRIC,
        k=sizes.k,
        overlap=1,
        allow_tie=True,
        allow_both_bad=False,
        max_skip_fraction=1.0,
    )
    annotation_services.membership_set(project=project, user=staff, role=Membership.Role.RESEARCHER)
    split = parts(rows)
    counts = {name: len(part) for name, part in split.items()}
    say(f"pairs: A {counts['A']} (AI annotator), B {counts['B']} (judge), C {counts['C']} (pool)")

    mark = clock()
    base = registry.model_version_register_folder(
        name=f"{project.pk}-base",
        kind=ModelVersion.Kind.POLICY,
        path=policy_folder,
        project=project,
        enqueue=False,
    )
    base = registry.model_version_validate(version_id=base.pk, progress=say)
    if base.status != ModelVersion.Status.READY:
        raise RuntimeError(f"the base policy did not validate: {base.validation_error}")
    setup_seconds = {"register": clock() - mark}

    mark = clock()
    pairs_a = split["A"][: sizes.rm_pairs or None]
    pairs_b = split["B"][: sizes.rm_pairs or None]
    annotator_rm = _train_reward_model(project, "rm-a-annotator", pairs_a, reward_backbone, sizes)
    setup_seconds["rm_a"] = clock() - mark
    mark = clock()
    judge_rm = _train_reward_model(project, "rm-b-judge", pairs_b, reward_backbone, sizes)
    setup_seconds["rm_b"] = clock() - mark
    say(f"reward models: annotator {annotator_rm.name}, judge {judge_rm.name}")

    mark = clock()
    seen, lines = set(), []
    for row in split["C"]:
        key = json.dumps(row["prompt"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            lines.append(json.dumps({"messages": row["prompt"]}))
    report = prompt_pool_import(project=project, stream=io.StringIO("\n".join(lines) + "\n"))
    setup_seconds["pool"] = clock() - mark
    say(f"prompt pool: {report.pool_train} train, {report.pool_eval} evaluation")

    settings_ = LoopSettings(
        path="dpo",
        n_prompts=sizes.prompts_per_round,
        k=sizes.k,
        prompt_source="pool",
        sources=[LabelSource.AI.value],
        seed=sizes.seed,
        mix_previous=False,
        train_rounds=sizes.train_rounds,
        generation={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": sizes.new_tokens},
        dpo=sizes.dpo,
        evaluation={"n_prompts": sizes.eval_prompts, "reward_models": 1},
        gate=sizes.gate,
    )
    loop_control.loop_update(project=project, settings=settings_.to_dict())

    mark = clock()
    job = rounds.generation_job_create(
        project=project,
        user=staff,
        policies=[base.pk],
        mode="k_samples",
        n_prompts=sizes.prompts_per_round,
        sampling=[{"temperature": 1.0, "max_new_tokens": sizes.new_tokens}] * sizes.k,
        seed=sizes.seed,
        source_key="round-1",
        enqueue=False,
    )
    job = rounds.generation_job_run(job_id=job.pk)
    if job.status != job.Status.SUCCEEDED:
        raise RuntimeError(f"round 1 generation failed: {job.error}")
    gen_seconds = clock() - mark
    current = job.round
    say(f"round {current.number}: {current.items.count()} items in {gen_seconds:.0f}s")
    setup_seconds["generate_r1"] = gen_seconds

    figures: list[RoundFigures] = []
    for iteration in range(sizes.rounds):
        seconds = {"generate": gen_seconds}
        tokens = _generated_tokens(current)
        mark = clock()
        labels = _label(project, base_url, annotator_rm, sizes.seed + iteration)
        seconds["label"] = clock() - mark
        say(f"round {current.number}: {labels} AI labels in {seconds['label']:.0f}s")
        mark = clock()
        state = loop_control.loop_tick_run(project_id=project.pk, sync=True, force=True)
        seconds["export_train_evaluate_gate_generate"] = clock() - mark
        for step in state.steps:
            say(f"    {step.name:9s} {step.status:8s} {step.detail[:160]}")
        policy = (
            ModelVersion.objects.filter(kind=ModelVersion.Kind.POLICY, parent__isnull=False)
            .filter(training_run__project=project)
            .order_by("-id")
            .first()
        )
        if policy is None:
            raise RuntimeError("the loop made no new policy (see the steps above)")
        result = _round_figures(current.number, policy, seconds)
        result.generation_tokens_per_second = tokens / gen_seconds if gen_seconds else None
        figures.append(result)
        say(_line(result))
        if state.new_round is None:
            raise RuntimeError("the loop opened no new round (see the steps above)")
        current = Round.objects.get(pk=state.new_round.pk)
        gen_seconds = next(
            (e.duration_seconds for e in _events(project, "generate") if e.duration_seconds), 0.0
        )
    say("setup seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in setup_seconds.items()))
    return figures


def _events(project, step: str):
    from training.models import LoopEvent

    return LoopEvent.objects.filter(loop__project=project, step=step).order_by("-id")


def _fmt(value, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def _line(f: RoundFigures) -> str:
    low, high = f.ci_vs_base
    tps = _fmt(f.generation_tokens_per_second, ".1f")
    return (
        f"round {f.round} -> {f.policy}: win rate vs base {_fmt(f.win_rate_vs_base)} "
        f"[{_fmt(low)}, {_fmt(high)}] (n={f.n_eval}, part-B judge); KL ref "
        f"{_fmt(f.kl_reference)} base {_fmt(f.kl_base)}; length {_fmt(f.mean_length, '.1f')}; "
        f"distinct-2 {_fmt(f.distinct_2)}; gate {f.promotion}; gen {tps} tok/s; seconds "
        + ", ".join(f"{k} {v:.0f}" for k, v in f.seconds.items())
    )


# --------------------------------------------------------------------------- main


def _serve(port: int, env: dict) -> subprocess.Popen:
    import requests

    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi:application",
            "-b",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--threads",
            "2",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=env,
    )
    for _ in range(300):
        try:
            requests.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=5)
            return server
        except requests.RequestException:
            if server.poll() is not None:
                raise SystemExit(f"the web server did not start (port {port} busy?)") from None
            time.sleep(0.2)
    raise SystemExit("the web server did not answer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--policy", type=Path, default=SMOLLM2)
    parser.add_argument("--db", default="prefloop_real_loop")
    parser.add_argument("--port", type=int, default=8097)
    parser.add_argument("--rounds", type=int, default=Sizes.rounds)
    parser.add_argument("--prompts", type=int, default=Sizes.prompts_per_round)
    parser.add_argument("--eval-prompts", type=int, default=Sizes.eval_prompts)
    parser.add_argument("--new-tokens", type=int, default=Sizes.new_tokens)
    parser.add_argument("--rm-pairs", type=int, default=0, help="pairs per reward model (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    if not args.data.exists():
        print(f"skipped: {args.data} is absent (HH-RLHF pairs live in ../shared/data/)")
        return 0
    if not (args.policy / "config.json").exists():
        print(f"skipped: no policy at {args.policy}; run: bash scripts/setup_real_models.sh")
        return 0
    work = REPO / "var" / "real_loop"
    work.mkdir(parents=True, exist_ok=True)
    env_values = {
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{args.db}",
        "PREFLOOP_ARTIFACT_ROOT": str(work / "artifacts"),
        "PREFLOOP_MODEL_ROOTS": str(args.policy.resolve().parent),
        "DJANGO_DEBUG": "0",
        "OMP_NUM_THREADS": str(args.threads),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
    }
    os.environ.update(env_values)
    subprocess.run(
        ["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", args.db], check=True
    )
    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", args.db], check=True)

    import django

    django.setup()
    import torch
    from django.core.management import call_command

    torch.set_num_threads(args.threads)
    call_command("migrate", verbosity=0)
    load_before = os.getloadavg()
    server = _serve(args.port, {**os.environ})
    sizes = Sizes(
        rounds=args.rounds,
        prompts_per_round=args.prompts,
        eval_prompts=args.eval_prompts,
        new_tokens=args.new_tokens,
        rm_pairs=args.rm_pairs,
    )
    started = time.perf_counter()
    try:
        figures = run(
            base_url=f"http://127.0.0.1:{args.port}",
            policy_folder=str(args.policy.resolve()),
            # the bundled all-MiniLM-L6-v2 (training.trainers.model_paths)
            reward_backbone="minilm",
            rows=hh_rows(args.data),
            sizes=sizes,
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
    total = time.perf_counter() - started
    print(f"sizes: {json.dumps(asdict(sizes))}")
    for f in figures:
        print(_line(f))
    print(
        f"total {total / 60:.1f} min; load average before {load_before[0]:.1f}, "
        f"after {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(json.dumps([asdict(f) for f in figures]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
