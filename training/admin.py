"""Admin registrations for training runs and the model registry."""

from django.contrib import admin, messages

from annotation.errors import ServiceError
from training import services
from training.models import ModelVersion, TrainingRun


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "recipe",
        "project",
        "status",
        "progress",
        "attempts",
        "heartbeat_at",
        "created_at",
        "finished_at",
    ]
    list_filter = ["recipe", "status", "project"]
    # What a run trains on and with was checked by training_run_create; editing it here would
    # run a config the policy never saw. Cancel and resume are the actions below.
    readonly_fields = [
        "recipe",
        "config",
        "dataset_version",
        "dataset_path",
        "base_model",
        "base_model_path",
        "project",
        "created_by",
        "enqueued_at",
        "status",
        "progress",
        "current_metrics",
        "log_tail",
        "error",
        "output_dir",
        "checkpoint_path",
        "celery_task_id",
        "worker_host",
        "worker_pid",
        "child_pid",
        "exit_code",
        "attempts",
        "resumes",
        "started_at",
        "finished_at",
        "heartbeat_at",
    ]
    actions = ["cancel_runs", "resume_runs"]

    # A run is created and queued by training_run_create (console, API, loop); a row added
    # here would never be queued or checked against the config policy.
    def has_add_permission(self, request):
        return False

    @admin.action(description="Cancel the selected runs")
    def cancel_runs(self, request, queryset):
        self._apply(request, queryset, services.training_run_cancel, "cancelled")

    @admin.action(description="Resume the selected runs from their checkpoints")
    def resume_runs(self, request, queryset):
        self._apply(request, queryset, services.training_run_resume, "queued again")

    def _apply(self, request, queryset, service, done: str) -> None:
        count = 0
        for run_id in queryset.values_list("pk", flat=True):
            try:
                service(run_id=run_id)
                count += 1
            except ServiceError as exc:
                self.message_user(request, f"run {run_id}: {exc.message}", messages.WARNING)
        self.message_user(request, f"{count} run(s) {done}.")


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "parent", "training_run", "dataset_version", "created_at"]
    list_filter = ["kind"]
    search_fields = ["name", "artifact_path"]
    readonly_fields = ["training_run", "eval_results"]
