"""Training runs and the model registry."""

from django.conf import settings
from django.db import models


class Recipe(models.TextChoices):
    SFT = "sft", "SFT"
    REWARD = "reward", "Reward model"
    DPO = "dpo", "DPO"
    PPO = "ppo", "PPO"
    GRPO = "grpo", "GRPO"
    RLOO = "rloo", "RLOO"


class TrainingRun(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    recipe = models.CharField(max_length=16, choices=Recipe.choices)
    config = models.JSONField(default=dict, blank=True)
    dataset_version = models.ForeignKey(
        "annotation.DatasetVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="training_runs",
    )
    base_model = models.ForeignKey(
        "training.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="derived_runs",
    )
    base_model_path = models.CharField(max_length=500, blank=True)
    dataset_path = models.CharField(
        max_length=500, blank=True, help_text="Snapshot folder when there is no dataset version."
    )
    project = models.ForeignKey(
        "annotation.Project",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="training_runs",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.FloatField(default=0.0)
    current_metrics = models.JSONField(default=dict, blank=True)
    log_tail = models.TextField(blank=True)
    error = models.TextField(blank=True)
    output_dir = models.CharField(max_length=500, blank=True)
    checkpoint_path = models.CharField(max_length=500, blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    worker_host = models.CharField(max_length=255, blank=True)
    worker_pid = models.IntegerField(null=True, blank=True)
    # Process group of the training subprocess (its leader's pid), killed on cancel.
    child_pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # One entry per resumed attempt: {"attempt", "checkpoint", "step", "at"}.
    resumes = models.JSONField(default=list, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(
        null=True, blank=True, help_text="When the run's task was last sent to the broker."
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(progress__gte=0) & models.Q(progress__lte=1),
                name="trainingrun_progress_0_1",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.recipe} run #{self.pk} ({self.status})"


class ModelVersion(models.Model):
    class Kind(models.TextChoices):
        POLICY = "policy"
        REWARD = "reward"
        # A policy served by an OpenAI-compatible server the deployment declares
        # (PREFLOOP_GENERATION_ENDPOINTS): no weights here, named by endpoint and model.
        ENDPOINT = "endpoint", "Policy behind an endpoint"

    name = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.POLICY)
    artifact_path = models.CharField(max_length=500)
    base_model_path = models.CharField(max_length=500, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    training_run = models.OneToOneField(
        TrainingRun, null=True, blank=True, on_delete=models.PROTECT, related_name="model_version"
    )
    dataset_version = models.ForeignKey(
        "annotation.DatasetVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="model_versions",
    )
    eval_results = models.JSONField(default=dict, blank=True)
    endpoint_name = models.CharField(
        max_length=100,
        blank=True,
        help_text="Kind endpoint: a name declared in PREFLOOP_GENERATION_ENDPOINTS.",
    )
    endpoint_model = models.CharField(
        max_length=200, blank=True, help_text="Kind endpoint: one of that endpoint's models."
    )
    project = models.ForeignKey(
        "annotation.Project",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="model_versions",
        help_text="The project that registered it, when no training run of a project made it.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(kind="endpoint")
                    & ~models.Q(endpoint_name="")
                    & ~models.Q(endpoint_model="")
                )
                | (
                    ~models.Q(kind="endpoint")
                    & models.Q(endpoint_name="")
                    & models.Q(endpoint_model="")
                ),
                name="modelversion_endpoint_fields_iff_endpoint_kind",
            ),
        ]

    def __str__(self) -> str:
        return self.name
