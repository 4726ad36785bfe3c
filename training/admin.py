"""Admin registrations for training runs and the model registry."""

from django.contrib import admin

from training.models import ModelVersion, TrainingRun


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = ["id", "recipe", "project", "status", "progress", "created_at", "finished_at"]
    list_filter = ["recipe", "status", "project"]
    readonly_fields = ["log_tail", "error", "current_metrics"]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "parent", "training_run", "dataset_version", "created_at"]
    list_filter = ["kind"]
    search_fields = ["name", "artifact_path"]
