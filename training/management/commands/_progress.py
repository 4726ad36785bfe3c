"""A tqdm progress bar fed from a run's progress.json (shared by `train` and `resume`)."""

from __future__ import annotations

from django.core.management.base import CommandError

from training import services, supervisor
from training.models import TrainingRun


class ProgressBar:
    """Callable for ``training_run_execute(on_progress=...)`` drawing one tqdm bar."""

    def __init__(self, stream):
        from tqdm import tqdm

        self.bar = tqdm(total=0, unit="step", file=stream, dynamic_ncols=True)

    def __call__(self, progress: supervisor.Progress) -> None:
        if progress.max_steps and self.bar.total != progress.max_steps:
            self.bar.total = progress.max_steps
        if progress.step != self.bar.n:
            self.bar.n = progress.step
        shown = {
            key: progress.metrics[key]
            for key in ("loss", "accuracy", "eval_accuracy", "reward")
            if isinstance(progress.metrics.get(key), int | float)
        }
        self.bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def run_sync(command, run_id: int) -> TrainingRun:
    """Execute a run in this process with a progress bar; raise CommandError unless it succeeds."""
    bar = ProgressBar(command.stderr._out)
    try:
        run = supervisor.training_run_execute(run_id=run_id, on_progress=bar)
    except KeyboardInterrupt:
        bar.close()
        services.training_run_cancel(run_id=run_id)
        raise CommandError(f"Interrupted: run {run_id} cancelled.") from None
    bar.close()
    if run is None:
        raise CommandError(f"Training run {run_id} does not exist.")
    report(command, run)
    if run.status != TrainingRun.Status.SUCCEEDED:
        raise CommandError(f"Run {run.pk} {run.status}: {run.error or '(no error recorded)'}")
    return run


def report(command, run: TrainingRun) -> None:
    """Print a run's outcome: status, model version, metrics."""
    command.stdout.write(f"run {run.pk} ({run.recipe}): {run.status}")
    version = getattr(run, "model_version", None)
    if run.status == TrainingRun.Status.SUCCEEDED and version is not None:
        command.stdout.write(f"model version: {version.name} -> {version.artifact_path}")
    metrics = {
        k: v
        for k, v in sorted(run.current_metrics.items())
        if k.startswith(("eval_", "test_", "train_loss", "global_step"))
    }
    for key, value in metrics.items():
        command.stdout.write(f"  {key} = {value}")
