"""Projects, prompts, candidates, items, assignments and judgments.

Canonical order: an item's candidates have fixed positions 0..K-1 (`ItemCandidate.position`).
Annotators see them in a per-assignment shuffled `display_order` (display slot -> canonical
position). Judgments are stored in canonical terms, with the displayed side kept beside them.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from annotation.querysets import JudgmentQuerySet


class TaskKind(models.TextChoices):
    PAIRWISE = "pairwise", "Pairwise (A/B)"
    RANKING = "ranking", "K-way ranking"


class Choice(models.TextChoices):
    A = "A", "A better"
    B = "B", "B better"
    TIE = "tie", "Tie"
    BOTH_BAD = "both_bad", "Both bad"


class LabelSource(models.TextChoices):
    HUMAN = "human"
    IMPORTED = "imported"
    SIMULATED = "simulated"
    AI = "ai"


class Project(models.Model):
    name = models.CharField(
        max_length=200, unique=True, help_text="Shown to annotators in their project list."
    )
    rubric = models.TextField(blank=True, help_text="Guidelines shown to annotators.")
    task_kind = models.CharField(
        max_length=16,
        choices=TaskKind.choices,
        default=TaskKind.PAIRWISE,
        help_text="Pick the better of two answers, or rank k answers.",
    )
    k = models.PositiveSmallIntegerField(default=2, help_text="Candidates per item (2 for A/B).")
    overlap = models.PositiveSmallIntegerField(default=3, help_text="Annotators per item.")
    gold_rate = models.FloatField(default=0.0, help_text="Share of served items that are gold.")
    repeat_rate = models.FloatField(default=0.0, help_text="Share of served items re-shown.")
    repeat_min_gap = models.PositiveIntegerField(
        default=5, help_text="Judgments an annotator makes before an item may be repeated."
    )
    lease_seconds = models.PositiveIntegerField(
        default=300, help_text="Seconds an annotator holds an item before it is served again."
    )
    max_skip_fraction = models.FloatField(
        default=0.2,
        help_text="Share of an annotator's served items they may skip (1 for no limit).",
    )
    max_skips_in_row = models.PositiveIntegerField(
        default=10, help_text="Skips in a row an annotator may make (0 for no limit)."
    )
    skip_fraction_min_served = models.PositiveIntegerField(
        default=20, help_text="Items an annotator is served before their skip share is judged."
    )
    allow_tie = models.BooleanField(default=True, help_text="Offer a Tie answer.")
    allow_both_bad = models.BooleanField(default=True, help_text="Offer a Both bad answer.")
    ask_strength = models.BooleanField(
        default=False,
        help_text="Ask how much better (slightly or much); exports use it as a margin.",
    )
    ask_confidence = models.BooleanField(
        default=False, help_text="Ask how sure the annotator is (1 guess to 5 certain)."
    )
    ask_rationale = models.BooleanField(
        default=False, help_text="Ask for a short written reason with each answer."
    )
    max_text_chars = models.PositiveIntegerField(
        default=100_000, help_text="Longest prompt or answer an import accepts, in characters."
    )
    # Archived instead of deleted: not served or listed to annotators, still readable and
    # exportable by its researchers, its judgments kept.
    archived = models.BooleanField(default=False)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="projects"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(k__gte=2) & Q(k__lte=8), name="project_k_2_8"),
            models.CheckConstraint(
                condition=Q(task_kind="ranking") | Q(k=2), name="project_pairwise_k_2"
            ),
            models.CheckConstraint(condition=Q(overlap__gte=1), name="project_overlap_ge_1"),
            models.CheckConstraint(
                condition=Q(gold_rate__gte=0) & Q(gold_rate__lte=1), name="project_gold_rate_0_1"
            ),
            models.CheckConstraint(
                condition=Q(repeat_rate__gte=0) & Q(repeat_rate__lte=1),
                name="project_repeat_rate_0_1",
            ),
            models.CheckConstraint(condition=Q(lease_seconds__gte=10), name="project_lease_ge_10"),
            models.CheckConstraint(
                condition=Q(max_skip_fraction__gte=0) & Q(max_skip_fraction__lte=1),
                name="project_max_skip_fraction_0_1",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        ANNOTATOR = "annotator"
        REVIEWER = "reviewer"
        RESEARCHER = "researcher"

    class Status(models.TextChoices):
        ACTIVE = "active"
        PAUSED = "paused"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.ANNOTATOR)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    flagged = models.BooleanField(default=False, help_text="Needs a researcher's attention.")
    status_reason = models.TextField(blank=True)
    # Judgments made in this project; drives the spacing of planned repeats.
    judgment_count = models.PositiveIntegerField(default=0)
    # Skips counted against the project's skip budget (a researcher's resume clears them).
    skip_count = models.PositiveIntegerField(default=0)
    skips_in_row = models.PositiveIntegerField(default=0)
    # Server time on task starts no earlier than the annotator's last submit or skip, so an
    # item leased ahead (in another project) is timed from when it could be shown.
    last_finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class Round(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="rounds")
    number = models.PositiveIntegerField()
    model_version = models.ForeignKey(
        "training.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="rounds",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    # Key of the job that created the round, so a redelivered job does not create it twice.
    source_key = models.CharField(max_length=200, blank=True)
    # Archived instead of deleted; an archived round is closed (never served).
    archived = models.BooleanField(default=False)

    class Purpose(models.TextChoices):
        TRAIN = "train", "Training data"
        EVAL = "eval", "Human evaluation (never exported for training)"

    purpose = models.CharField(
        max_length=8,
        choices=Purpose.choices,
        default=Purpose.TRAIN,
        help_text="An evaluation round is served like any other but never exported for training.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["project", "number"]
        constraints = [
            models.UniqueConstraint(fields=["project", "number"], name="round_unique_number"),
            models.UniqueConstraint(
                fields=["project", "source_key"],
                condition=~Q(source_key=""),
                name="round_unique_source_key",
            ),
            models.CheckConstraint(
                condition=Q(archived=False) | Q(status="closed"), name="round_archived_is_closed"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project} round {self.number}"


class Prompt(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="prompts")
    text = models.TextField(blank=True, help_text="Single-turn prompt text.")
    messages = models.JSONField(
        null=True, blank=True, help_text='Chat transcript: [{"role": ..., "content": ...}].'
    )
    content_hash = models.CharField(max_length=64, help_text="sha256 of the normalised content.")
    group_key = models.CharField(
        max_length=200, blank=True, help_text="Split group (defaults to the content hash)."
    )
    external_id = models.CharField(max_length=200, blank=True)

    class Split(models.TextChoices):
        TRAIN = "train", "Training"
        EVAL = "eval", "Evaluation (never used by a training round)"

    # Prompt pool: prompts imported to generate rounds from. The evaluation split is fixed at
    # import by a hash of the content, so a prompt keeps its side whatever else is imported.
    in_pool = models.BooleanField(default=False, help_text="Imported into the prompt pool.")
    split = models.CharField(max_length=8, choices=Split.choices, default=Split.TRAIN)
    tags = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["project", "in_pool", "split"])]
        constraints = [
            models.UniqueConstraint(fields=["project", "content_hash"], name="prompt_unique_hash"),
        ]

    def __str__(self) -> str:
        return f"prompt {self.pk}"


class Candidate(models.Model):
    prompt = models.ForeignKey(Prompt, on_delete=models.CASCADE, related_name="candidates")
    text = models.TextField()
    content_hash = models.CharField(max_length=64)
    model_name = models.CharField(max_length=200, blank=True)
    checkpoint_id = models.CharField(max_length=500, blank=True)
    policy_version = models.ForeignKey(
        "training.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="candidates",
    )
    # template, temperature, top_p, top_k, max_tokens, stop, seed, ...
    generation_config = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["prompt", "content_hash", "model_name"], name="candidate_unique"
            ),
        ]
        indexes = [models.Index(fields=["content_hash"])]

    def __str__(self) -> str:
        return f"candidate {self.pk}"


class Item(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="items")
    round = models.ForeignKey(Round, on_delete=models.CASCADE, related_name="items")
    prompt = models.ForeignKey(Prompt, on_delete=models.CASCADE, related_name="items")
    candidates = models.ManyToManyField(Candidate, through="ItemCandidate", related_name="items")
    is_gold = models.BooleanField(default=False)
    # Pairwise: a Choice value; ranking: list of ranks per canonical position (1 = best).
    gold_answer = models.JSONField(null=True, blank=True)
    # Live leases + submitted primary assignments; kept in step with Assignment rows under
    # the item's row lock so that concurrent `next` calls never over-serve.
    n_taken = models.PositiveIntegerField(default=0)
    n_done = models.PositiveIntegerField(default=0)
    external_id = models.CharField(max_length=200, blank=True)
    needs_review = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(is_gold=False) | Q(gold_answer__isnull=False),
                name="item_gold_has_answer",
            ),
            models.CheckConstraint(
                condition=Q(n_done__lte=models.F("n_taken")), name="item_done_le_taken"
            ),
            models.UniqueConstraint(
                fields=["round", "external_id"],
                condition=~Q(external_id=""),
                name="item_unique_external_id",
            ),
        ]
        indexes = [
            models.Index(fields=["project", "is_gold", "n_taken", "id"], name="item_serving_idx"),
        ]

    def __str__(self) -> str:
        return f"item {self.pk}"


class ItemCandidate(models.Model):
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="slots")
    candidate = models.ForeignKey(Candidate, on_delete=models.PROTECT, related_name="slots")
    position = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["item", "position"]
        constraints = [
            models.UniqueConstraint(fields=["item", "position"], name="itemcandidate_position"),
            models.UniqueConstraint(fields=["item", "candidate"], name="itemcandidate_candidate"),
        ]

    def __str__(self) -> str:
        return f"{self.item_id}[{self.position}]"


class Assignment(models.Model):
    class Status(models.TextChoices):
        LEASED = "leased"
        SUBMITTED = "submitted"
        SKIPPED = "skipped"
        EXPIRED = "expired"

    class Kind(models.TextChoices):
        PRIMARY = "primary"
        GOLD = "gold"
        REPEAT = "repeat"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="assignments")
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="assignments")
    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="assignments"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PRIMARY)
    repeat_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="repeats"
    )
    # display slot -> canonical candidate position
    display_order = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.LEASED)
    # The annotator's judgment count when served; spaces planned repeats.
    seq = models.PositiveIntegerField(default=0)
    leased_at = models.DateTimeField(auto_now_add=True)
    lease_expires = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # Held ahead by the annotator page (prefetch): served once the current item is done.
    ahead = models.BooleanField(default=False)

    class Meta:
        constraints = [
            # One live or finished assignment per person and item; repeats are separate rows.
            models.UniqueConstraint(
                fields=["item", "annotator"],
                condition=~Q(kind="repeat") & ~Q(status="expired"),
                name="assignment_once_per_annotator",
            ),
            models.UniqueConstraint(
                fields=["repeat_of"],
                condition=Q(kind="repeat") & ~Q(status="expired"),
                name="assignment_one_repeat",
            ),
            # At most one live lease per annotator and project, and one held ahead beside it.
            models.UniqueConstraint(
                fields=["project", "annotator", "ahead"],
                condition=Q(status="leased"),
                name="assignment_one_live_lease",
            ),
            models.CheckConstraint(
                condition=Q(kind="repeat") | Q(repeat_of__isnull=True),
                name="assignment_repeat_of_only_for_repeats",
            ),
        ]
        indexes = [
            models.Index(
                fields=["project", "status", "lease_expires"], name="assignment_lease_idx"
            ),
            # In `seq` order too: a planned repeat is the annotator's earliest eligible item.
            models.Index(
                fields=["annotator", "project", "status", "seq"], name="assignment_user_seq_idx"
            ),
            # The annotator's repeats alone, which a repeat claim leaves out: without it, that
            # read walked their whole history in the project to find the few repeats.
            models.Index(
                fields=["annotator", "project"],
                condition=Q(kind="repeat"),
                name="assignment_user_repeats_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"assignment {self.pk} ({self.status})"


class Judgment(models.Model):
    class Strength(models.TextChoices):
        SLIGHTLY = "slightly"
        MUCH = "much"

    # PROTECT everywhere: an acknowledged judgment is never deleted along with its project,
    # item, assignment or annotator (users are deactivated, projects and rounds archived).
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="judgments")
    item = models.ForeignKey(Item, on_delete=models.PROTECT, related_name="judgments")
    assignment = models.OneToOneField(
        Assignment, null=True, blank=True, on_delete=models.PROTECT, related_name="judgment"
    )
    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="judgments",
    )
    external_rater = models.CharField(max_length=200, blank=True)
    # Pairwise, canonical terms: A = candidate at position 0.
    choice = models.CharField(max_length=16, choices=Choice.choices, blank=True)
    # Ranking, canonical terms: ranks[i] is the rank of position i (1 = best, ties share).
    ranking = models.JSONField(null=True, blank=True)
    # What the annotator pressed, in display terms (for position-bias analysis).
    shown_choice = models.CharField(max_length=16, blank=True)
    strength = models.CharField(max_length=16, choices=Strength.choices, blank=True)
    confidence = models.PositiveSmallIntegerField(null=True, blank=True)
    rationale = models.TextField(blank=True)
    time_spent_ms = models.PositiveIntegerField(null=True, blank=True)
    # Measured on the server: from the later of the lease start and the annotator's previous
    # submit or skip, to this submit. Quality control trusts it over the client's figure.
    server_time_ms = models.PositiveIntegerField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=100, blank=True)
    source = models.CharField(max_length=16, choices=LabelSource.choices, default=LabelSource.HUMAN)
    is_gold = models.BooleanField(default=False)
    is_repeat = models.BooleanField(default=False)
    # QC marks: labels are flagged, never deleted.
    qc_flag = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = JudgmentQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["annotator", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="judgment_idempotency",
            ),
            models.CheckConstraint(
                condition=(Q(choice="") & Q(ranking__isnull=False))
                | (~Q(choice="") & Q(ranking__isnull=True)),
                name="judgment_choice_xor_ranking",
            ),
            models.CheckConstraint(
                condition=Q(confidence__isnull=True)
                | (Q(confidence__gte=1) & Q(confidence__lte=5)),
                name="judgment_confidence_1_5",
            ),
        ]
        indexes = [
            models.Index(fields=["project", "created_at"], name="judgment_project_time_idx"),
            models.Index(fields=["item", "source"], name="judgment_item_source_idx"),
        ]

    def __str__(self) -> str:
        return f"judgment {self.pk}"


class Skip(models.Model):
    assignment = models.OneToOneField(Assignment, on_delete=models.CASCADE, related_name="skip")
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"skip {self.pk}"


class Adjudication(models.Model):
    """A reviewer's verdict on a disputed item, stored beside the original labels."""

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="adjudications")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    choice = models.CharField(max_length=16, choices=Choice.choices, blank=True)
    ranking = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"adjudication {self.pk}"


class DatasetVersion(models.Model):
    """An immutable export snapshot: the rows, the policies that made them and a hash.

    A version is created `building`, its files are written once by `annotation.exports`, and
    it becomes `ready` (hash, counts, report filled) or `failed` (error). Nothing changes a
    ready version; a new export makes a new version number.
    """

    class Status(models.TextChoices):
        BUILDING = "building"
        READY = "ready"
        FAILED = "failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="dataset_versions")
    version = models.PositiveIntegerField()
    name = models.CharField(max_length=200, blank=True)
    format = models.CharField(
        max_length=32, default="trl", help_text="Row format: trl, hh, raw or unpaired."
    )
    policies = models.JSONField(default=dict)
    filters = models.JSONField(default=dict, blank=True)
    source_rounds = models.JSONField(default=list, blank=True)
    split_counts = models.JSONField(default=dict, blank=True)
    # Dedup counts and examples, rows dropped per reason, side-file counts.
    report = models.JSONField(default=dict, blank=True)
    content_hash = models.CharField(max_length=64, blank=True)
    path = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.BUILDING)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="dataset_versions",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["project", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["project", "version"], name="datasetversion_unique"),
            models.CheckConstraint(
                condition=Q(status__in=["building", "ready", "failed"]),
                name="datasetversion_status_valid",
            ),
            models.CheckConstraint(
                condition=~Q(status="ready") | ~Q(content_hash=""),
                name="datasetversion_ready_has_hash",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project} dataset v{self.version}"


class ImportJob(models.Model):
    """A large upload imported by a Celery task: its options, progress and outcome."""

    class Kind(models.TextChoices):
        ITEMS = "items", "Items (prompts + candidates)"
        PREFERENCES = "preferences", "Preference data"

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="import_jobs")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    # Validated request options: format, round id, batch, serve, near_duplicates.
    options = models.JSONField(default=dict, blank=True)
    file_name = models.CharField(max_length=255, blank=True)
    # The stored upload on the server; never shown to callers, removed once imported.
    path = models.CharField(max_length=500, blank=True)
    size_bytes = models.BigIntegerField(default=0)
    phase = models.CharField(max_length=16, default="queued")
    progress = models.FloatField(default=0.0)
    report = models.JSONField(default=dict, blank=True)
    # Every reported bad line, [{"line", "error"}], when the file was refused.
    errors = models.JSONField(default=list, blank=True)
    total_bad = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="import_jobs",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["project", "-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["queued", "running", "succeeded", "failed"]),
                name="importjob_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(progress__gte=0) & Q(progress__lte=1), name="importjob_progress_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project} {self.kind} import {self.pk} ({self.status})"
