"""Run the whole loop on this machine: SFT policy -> round 1 -> labels -> training -> round 2."""

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from annotation import services as annotation_services
from annotation.models import LabelSource, Membership, Project, Round
from annotation.simulation import parse_pool, run_pool
from training import demo, loop
from training.loop import control
from training.models import ModelVersion, TrainingRun

PROJECT_NAME = "Arithmetic demo"
DEMO_PPO_KL_BUDGET = 2.0  # nats per round (see handle)
RUBRIC = (
    "Pick the answer that is correct first, then polite and short.\n"
    "- A wrong number is always worse than a right one.\n"
    "- Rude or rambling answers lose to polite, direct ones.\n"
    "Use Tie when both are equally good, Both bad when neither answers correctly."
)


class Command(BaseCommand):
    help = (
        "Set up the demo (users, project, tiny SFT policy), serve the web app, open round 1, "
        "let simulated annotators label it (you can label too), train, open round 2."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--rounds",
            type=int,
            default=1,
            help="Loop iterations after round 1 (each trains and generates).",
        )
        parser.add_argument("--path", choices=["dpo", "rm_ppo"], default="dpo")
        parser.add_argument("--prompts", type=int, default=256, help="Prompts per round.")
        parser.add_argument("--sft-steps", type=int, default=1200)
        parser.add_argument(
            "--threads",
            type=int,
            default=1,
            help="Torch threads here and in training subprocesses (1 is fastest for these tiny "
            "models, many times faster on a busy machine).",
        )
        parser.add_argument("--pool", default="careful:3,noisy:1,always_left:1,random:1")
        parser.add_argument(
            "--speedup",
            type=float,
            default=0.0,
            help="Simulated annotators sleep time/speedup per item (0: none).",
        )
        parser.add_argument(
            "--serve",
            action=argparse_bool(),
            default=True,
            help="Keep the web server up at the end (Ctrl-C to stop).",
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--labels",
            choices=sorted(demo.LABEL_PREFERENCES),
            default="true",
            help="What the simulated annotators prefer: the true reward, or 'polite_only' (a "
            "polite opener, right or wrong: a deliberately hackable setting).",
        )
        parser.add_argument(
            "--loop-settings",
            type=json.loads,
            default={},
            help='Loop setting overrides as JSON, e.g. \'{"ppo": {"uncertainty_coef": 0}}\'.',
        )

    def handle(self, *args, **opts):
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        _limit_threads(opts["threads"])
        call_command("migrate", verbosity=0)
        admin_pw, annotator_pw = self._users()
        project = self._project()
        # The demo's own settings, all explicit: arithmetic prompts, simulated labels counted.
        overrides = dict(opts["loop_settings"])
        if opts["path"] == "rm_ppo":
            # PPO spends the gate's KL budget, and the demo's answers are one short sentence:
            # its PPO rounds that kept their accuracy moved 0.2-1.8 nats from their parent,
            # those that lost it 3.2-4.6 (benchmarks/loop_bench.py). So the demo project sets
            # its own budget instead of the gate's generous default.
            overrides["gate"] = {"kl_budget": DEMO_PPO_KL_BUDGET, **overrides.get("gate", {})}
        settings_ = loop.LoopSettings(
            path=opts["path"],
            n_prompts=opts["prompts"],
            seed=opts["seed"],
            min_new_judgments=0,
            prompt_source="demo",
            sources=[LabelSource.HUMAN.value, LabelSource.SIMULATED.value],
            **overrides,
        )
        # Stored on the project's loop, so the console's loop page shows them and each step.
        control.loop_update(project=project, settings=settings_.to_dict())

        self._say("1/5 tiny SFT policy on an imperfect corpus")
        mark = time.perf_counter()
        sft = self._sft_policy(opts["sft_steps"], opts["seed"])
        timings["sft"] = time.perf_counter() - mark
        self._say(f"    policy {sft.name}: {sft.artifact_path}")

        self._say("2/5 round 1: candidates from the SFT policy")
        mark = time.perf_counter()
        round1 = Round.objects.filter(project=project, number=1).first()
        if round1 is None or not round1.items.exists():
            round1 = loop.round_generate(
                project=project,
                model_version=sft,
                prompts=loop.prompts_select(project=project, settings=settings_),
                settings=settings_,
                source_key="demo:round-1",
            )
        timings["generate_r1"] = time.perf_counter() - mark
        self._say(f"    round {round1.number}: {round1.items.count()} items")

        server = self._serve(opts["port"])
        url = f"http://127.0.0.1:{opts['port']}"
        try:
            self._say(f"    web app on {url}  (annotator / {annotator_pw}, admin / {admin_pw})")
            for iteration in range(opts["rounds"]):
                current = Round.objects.filter(project=project).order_by("-number").first()
                self._say(
                    f"3/5 simulated annotators label round {current.number} over HTTP "
                    f"(you can label at {url}/ too)"
                )
                mark = time.perf_counter()
                self._label(
                    project,
                    url,
                    opts["pool"],
                    opts["speedup"],
                    opts["seed"] + iteration,
                    demo.LABEL_PREFERENCES[opts["labels"]],
                )
                timings[f"label_r{current.number}"] = time.perf_counter() - mark
                self._say(f"4/5 export -> {opts['path']} -> evaluate -> generate")
                mark = time.perf_counter()
                state = control.loop_tick_run(project_id=project.pk, sync=True, force=True)
                timings[f"train_r{current.number}"] = time.perf_counter() - mark
                for step in state.steps:
                    self._say(f"    {step.name:9s} {step.status:8s} {step.detail}")
                if state.new_round is None:
                    raise CommandError("The loop did not open a new round (see the steps above).")
            self._report(project, sft, url, timings, time.perf_counter() - t0)
            if opts["serve"]:
                self._say("Serving until Ctrl-C.")
                server.wait()
        except KeyboardInterrupt:
            pass
        finally:
            if server.poll() is None:
                server.terminate()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:  # a busy machine: stop it for good
                    server.kill()
                    server.wait()

    # ------------------------------------------------------------------ steps

    def _say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def _users(self) -> tuple[str, str]:
        users = get_user_model().objects
        passwords = []
        for username, staff in (("admin", True), ("annotator", False)):
            password = secrets.token_urlsafe(9)
            user = users.filter(username=username).first()
            if user is None:
                user = users.create_user(username=username, is_staff=staff, is_superuser=staff)
            # The same validators as the admin and createsuperuser (AUTH_PASSWORD_VALIDATORS).
            validate_password(password, user)
            user.set_password(password)
            user.save()
            passwords.append(password)
        return passwords[0], passwords[1]

    def _project(self) -> Project:
        project, _ = Project.objects.get_or_create(
            name=PROJECT_NAME,
            defaults={
                "rubric": RUBRIC,
                "overlap": 3,
                "repeat_rate": 0.05,
                "ask_strength": True,
                "ask_confidence": True,
            },
        )
        users = get_user_model().objects
        annotation_services.membership_set(project=project, user=users.get(username="annotator"))
        annotation_services.membership_set(
            project=project, user=users.get(username="admin"), role=Membership.Role.RESEARCHER
        )
        return project

    def _sft_policy(self, steps: int, seed: int) -> ModelVersion:
        existing = ModelVersion.objects.filter(name="demo-sft").first()
        if existing is not None:
            return existing
        from transformers import GPT2Config

        from training import services as training_services
        from training import supervisor as training_supervisor
        from training.trainers.tiny import build_tiny_causal_lm, train_tokenizer

        root = Path(settings.ARTIFACT_ROOT) / "demo"
        base = root / "base-policy"
        data = root / "sft-data"
        data.mkdir(parents=True, exist_ok=True)
        tokenizer = train_tokenizer(demo.tokenizer_training_texts(), vocab_size=512)
        # 2 layers x 64 dims (~0.13M parameters) learns the answer table faster per second
        # than wider or deeper models here. Dropout off (held-out accuracy 0.19 -> 0.29 at
        # 2,000 steps) and weight decay 0.1 (0.24 -> 0.29 at 1,200 steps) help it generalise
        # to the held-out operand pairs.
        build_tiny_causal_lm(
            tokenizer, base, n_layer=2, n_embd=64, n_head=4, n_positions=64, seed=seed
        )
        config = GPT2Config.from_pretrained(str(base))
        config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
        config.save_pretrained(str(base))
        with (data / "train.jsonl").open("w") as fh:
            for row in demo.imperfect_sft_corpus(8000, seed=seed):
                fh.write(json.dumps(row) + "\n")
        run = training_services.training_run_create(
            recipe="sft",
            config={
                "max_steps": steps,
                "learning_rate": 4e-3,
                "weight_decay": 0.1,
                "per_device_train_batch_size": 64,
                "max_length": 64,
                "logging_steps": 50,
                "save_steps": 400,
                "seed": seed,
            },
            dataset_path=str(data),
            base_model_path=str(base),
            enqueue=False,
        )
        run = training_supervisor.training_run_execute(run_id=run.pk)
        if run.status != TrainingRun.Status.SUCCEEDED:
            raise CommandError(f"SFT failed: {run.error[-2000:]}")
        version = run.model_version
        version.name = "demo-sft"
        version.save(update_fields=["name"])
        return version

    def _serve(self, port: int) -> subprocess.Popen:
        # The server runs on this command's own settings: config.wsgi alone would default to
        # production settings, which need a secret key the demo does not have.
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE}
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
                "1",
                "--log-level",
                "warning",
            ],
            cwd=settings.BASE_DIR,
            env=env,
        )
        for _ in range(300):
            try:
                requests.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=5)
                return server
            except requests.RequestException:
                if server.poll() is not None:
                    raise CommandError(
                        f"The web server did not start (port {port} busy?)."
                    ) from None
                time.sleep(0.2)
        server.terminate()
        raise CommandError("The web server did not answer.")

    def _label(
        self, project: Project, url: str, pool: str, speedup: float, seed: int, score
    ) -> None:
        annotators = []
        for i, (kind, profile) in enumerate(parse_pool(pool)):
            name = f"sim-{kind}-{i}"
            token = annotation_services.simulated_annotator_ensure(project=project, username=name)
            annotators.append((name, token, profile))
        for stat in run_pool(
            base_url=url,
            project_id=project.pk,
            annotators=annotators,
            score=score,
            speedup=speedup,
            seed=seed,
        ):
            self._say(
                f"    {stat.name:20s} {stat.submitted:4d} labels"
                + (f"  ({'; '.join(stat.errors[:1])})" if stat.errors else "")
            )

    def _report(self, project, sft, url, timings, total) -> None:
        from training.demo_eval import policy_true_reward

        if "true_reward" not in sft.eval_results:
            sft.eval_results = {**sft.eval_results, **policy_true_reward(sft.artifact_path)}
            sft.save(update_fields=["eval_results"])
        self._say("5/5 results (true reward on held-out prompts, 95% CI clustered by prompt)")
        for version in ModelVersion.objects.filter(kind="policy").order_by("id"):
            r = version.eval_results
            if "true_reward" in r:
                low, high = r["true_reward_ci95"]
                self._say(
                    f"    {version.name:24s} {r['true_reward']:+.3f} [{low:+.3f}, "
                    f"{high:+.3f}]  accuracy {r['accuracy']:.2f}"
                )
        self._say(
            "    time per stage: "
            + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items())
            + f"; total {total:.0f}s"
        )
        self._say(
            f"Look at: {url}/ (annotate), {url}/console/ and {url}/dashboard/ (researchers), "
            f"{url}/admin/ (staff), {url}/api/docs/ (API); artefacts in {settings.ARTIFACT_ROOT}"
        )


def _limit_threads(threads: int) -> None:
    """Use ``threads`` torch threads here and in the training subprocesses this starts."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)


def argparse_bool():
    import argparse

    return argparse.BooleanOptionalAction
