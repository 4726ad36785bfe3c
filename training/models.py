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
    # Reward-hacking alarms the supervisor computed as metrics arrived (training.alarms):
    # [{"step", "kind", "reason", "action": "recorded" | "stopped"}], first of each kind.
    alarms = models.JSONField(default=list, blank=True)
    alarms_checked_at = models.DateTimeField(null=True, blank=True)
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

    class Status(models.TextChoices):
        PENDING = "pending", "Waiting for validation"
        VALIDATING = "validating"
        READY = "ready", "Usable"
        FAILED = "failed", "Failed validation"

    class Source(models.TextChoices):
        RUN = "run", "Trained by a run"
        FOLDER = "folder", "Registered from a folder"
        UPLOAD = "upload", "Uploaded archive"
        ENDPOINT = "endpoint", "Declared endpoint"

    class Promotion(models.TextChoices):
        NONE = "", "Not decided"
        PROMOTED = "promoted"
        REJECTED = "rejected"

    # A registered version is usable only once its validation job passed (status ready).
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.READY)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.RUN)
    # Validation record: parameter count, dtype, architecture, prompt format and content
    # hashes of weights, tokenizer and chat template.
    validation = models.JSONField(default=dict, blank=True)
    validation_error = models.TextField(blank=True)
    # The promotion gate's verdict on a policy: criteria with their values, and who decided.
    promotion = models.CharField(
        max_length=16, choices=Promotion.choices, default=Promotion.NONE, blank=True
    )
    promotion_reason = models.TextField(blank=True)
    gate = models.JSONField(default=dict, blank=True)
    promoted_at = models.DateTimeField(null=True, blank=True)
    promoted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Empty when the gate decided.",
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


class GenerationJob(models.Model):
    """A round generated from one or more registered policies, on the gpu queue."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    project = models.ForeignKey(
        "annotation.Project", on_delete=models.CASCADE, related_name="generation_jobs"
    )
    round = models.OneToOneField(
        "annotation.Round",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="generation_job",
    )
    policies = models.ManyToManyField(ModelVersion, related_name="generation_jobs")
    # Everything the job was asked for: mode, prompts, per-candidate sampling settings.
    request = models.JSONField(default=dict, blank=True)
    source_key = models.CharField(max_length=200, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.FloatField(default=0.0)
    error = models.TextField(blank=True)
    n_prompts = models.PositiveIntegerField(default=0)
    n_items = models.PositiveIntegerField(default=0)
    celery_task_id = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"generation job #{self.pk} ({self.status})"


class Loop(models.Model):
    """A project's loop: its settings and the outcome of its last tick (never lost)."""

    project = models.OneToOneField(
        "annotation.Project", on_delete=models.CASCADE, related_name="loop"
    )
    config = models.JSONField(default=dict, blank=True, help_text="LoopSettings fields.")
    paused = models.BooleanField(default=False)
    last_tick_at = models.DateTimeField(null=True, blank=True)
    last_tick_status = models.CharField(max_length=16, blank=True)
    last_error = models.TextField(blank=True)
    last_steps = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"loop of {self.project}"


class LoopEvent(models.Model):
    """One step of one loop iteration (export, train, evaluate, gate, generate, tick)."""

    loop = models.ForeignKey(Loop, on_delete=models.CASCADE, related_name="events")
    key = models.CharField(max_length=200, help_text="The iteration, e.g. loop-3-r2.")
    step = models.CharField(max_length=32)
    status = models.CharField(max_length=16)
    detail = models.TextField(blank=True)
    round = models.ForeignKey(
        "annotation.Round", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    training_run = models.ForeignKey(
        TrainingRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    model_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["loop", "key"])]

    def __str__(self) -> str:
        return f"{self.key} {self.step} {self.status}"


class PolicyEvaluation(models.Model):
    """One judge's verdict on a policy against an opponent over evaluation prompts."""

    class JudgeKind(models.TextChoices):
        REWARD_MODEL = "reward_model"
        LLM = "llm", "LLM judge"
        HUMAN = "human"
        PROGRAMMATIC = "programmatic"

    policy = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="evaluations")
    opponent = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    judge_kind = models.CharField(max_length=16, choices=JudgeKind.choices)
    judge = models.CharField(max_length=300, help_text="Which judge, e.g. reward model 12.")
    wins = models.PositiveIntegerField(default=0)
    ties = models.PositiveIntegerField(default=0)
    losses = models.PositiveIntegerField(default=0)
    win_rate = models.FloatField(null=True, blank=True, help_text="(wins + ties / 2) / n.")
    ci_low = models.FloatField(null=True, blank=True)
    ci_high = models.FloatField(null=True, blank=True)
    n_prompts = models.PositiveIntegerField(default=0)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.policy} vs {self.opponent or '-'} by {self.judge}"
