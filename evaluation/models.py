"""Quality control rows: per-project thresholds, stored annotator assessments, agreement reports.

The figures themselves come from the pure libraries (`evaluation.stats.agreement`,
`evaluation.stats.quality`); these models keep the policy that judges them and what each check
found, so the dashboard reads stored results instead of recomputing them per page view.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q


class QualityPolicy(models.Model):
    """A project's QC thresholds; a project without a row uses these defaults."""

    project = models.OneToOneField(
        "annotation.Project", on_delete=models.CASCADE, related_name="quality_policy"
    )
    enabled = models.BooleanField(
        default=True,
        help_text="Check annotators automatically after submits and pause those who fail.",
    )
    check_every_n_judgments = models.PositiveIntegerField(
        default=20,
        help_text="Queue an annotator's check after every N of their judgments; from their "
        "16 x N-th on, the gap doubles each time their count does (it stays within an eighth "
        "of it), since a check reads their whole history.",
    )
    # Gold items.
    min_gold_items = models.PositiveIntegerField(
        default=5, help_text="Gold answers needed before gold accuracy is judged."
    )
    min_gold_accuracy = models.FloatField(
        default=0.7, help_text="Pause when gold accuracy is (confidently) below this."
    )
    confidence = models.FloatField(
        null=True,
        blank=True,
        default=0.95,
        help_text="Pause on gold accuracy or self-agreement only when the Wilson upper bound "
        "at this confidence is below the floor: a clear failure needs few items, and a good "
        "annotator's unlucky streak is not one. Empty judges the plain rates.",
    )
    # Planned repeats (shown again with sides flipped).
    min_repeat_pairs = models.PositiveIntegerField(
        default=5, help_text="Repeats needed before self-agreement is judged."
    )
    min_stability = models.FloatField(
        default=0.6,
        help_text="Pause when the share of repeats answered the same way is (confidently) "
        "below this.",
    )
    # Position bias.
    min_position_decisions = models.PositiveIntegerField(
        default=20, help_text="A/B decisions needed before position bias is judged."
    )
    max_position_bias = models.FloatField(
        default=0.15,
        help_text="Pause when |share of left presses - 0.5| exceeds this and is significant.",
    )
    position_alpha = models.FloatField(
        default=0.001,
        help_text="Binomial test level, spent over all of an annotator's checks since they "
        "started or were resumed: the chance that this test ever pauses an unbiased annotator.",
    )
    # Speed.
    min_seconds_per_item = models.FloatField(
        default=1.0, help_text="A judgment faster than this is too fast, whatever the length."
    )
    reading_chars_per_second = models.FloatField(
        default=50.0,
        help_text="A judgment faster than (prompt + answers) chars / this is too fast to read.",
    )
    min_timed_judgments = models.PositiveIntegerField(
        default=10, help_text="Timed judgments needed before speed is judged."
    )
    max_fast_share = models.FloatField(
        default=0.2, help_text="Pause when more than this share of judgments is too fast."
    )
    # Skips.
    min_served_for_skip_rate = models.PositiveIntegerField(
        default=20, help_text="Items served (judged or skipped) before the skip rate is judged."
    )
    max_skip_excess = models.FloatField(
        default=0.2,
        help_text="Pause when the skip rate exceeds the other annotators' rate on the same "
        "items by more than this, and significantly.",
    )
    skip_alpha = models.FloatField(
        default=0.001,
        help_text="Binomial test level of the skip rate, spent over all of an annotator's "
        "checks: the chance that this test ever pauses an annotator who skips like the others.",
    )
    # Agreement with the other annotators' consensus.
    min_consensus_votes = models.PositiveIntegerField(
        default=20, help_text="Votes on shared items needed before the consensus test."
    )
    consensus_alpha = models.FloatField(
        default=0.001,
        help_text="Pause when agreement with the consensus is this improbable, the level spent "
        "over all of an annotator's checks: the chance that this test ever pauses an "
        "annotator who labels like the others.",
    )
    # Disagreement queue.
    disagreement_threshold = models.FloatField(
        default=2 / 3,
        help_text="Queue an item for review when its majority share among A/B votes (or of "
        "the top-ranked answer) is below this.",
    )
    disagreement_min_votes = models.PositiveIntegerField(
        default=2, help_text="Votes an item needs before it can be queued for review."
    )
    review_sources = models.JSONField(
        default=list,
        blank=True,
        help_text='Label sources whose splits queue items for review; empty means ["human"].',
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "quality policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(min_gold_accuracy__gte=0) & Q(min_gold_accuracy__lte=1),
                name="qualitypolicy_gold_accuracy_0_1",
            ),
            models.CheckConstraint(
                condition=Q(confidence__isnull=True) | (Q(confidence__gt=0) & Q(confidence__lt=1)),
                name="qualitypolicy_confidence_0_1",
            ),
            models.CheckConstraint(
                condition=Q(min_stability__gte=0) & Q(min_stability__lte=1),
                name="qualitypolicy_stability_0_1",
            ),
            models.CheckConstraint(
                condition=Q(max_position_bias__gte=0) & Q(max_position_bias__lte=0.5),
                name="qualitypolicy_position_bias_0_half",
            ),
            models.CheckConstraint(
                condition=Q(position_alpha__gt=0) & Q(position_alpha__lt=1),
                name="qualitypolicy_position_alpha_0_1",
            ),
            models.CheckConstraint(
                condition=Q(consensus_alpha__gt=0) & Q(consensus_alpha__lt=1),
                name="qualitypolicy_consensus_alpha_0_1",
            ),
            models.CheckConstraint(
                condition=Q(max_fast_share__gte=0) & Q(max_fast_share__lte=1),
                name="qualitypolicy_fast_share_0_1",
            ),
            models.CheckConstraint(
                condition=Q(min_seconds_per_item__gte=0), name="qualitypolicy_min_seconds_ge_0"
            ),
            models.CheckConstraint(
                condition=Q(max_skip_excess__gte=0) & Q(max_skip_excess__lte=1),
                name="qualitypolicy_skip_excess_0_1",
            ),
            models.CheckConstraint(
                condition=Q(skip_alpha__gt=0) & Q(skip_alpha__lt=1),
                name="qualitypolicy_skip_alpha_0_1",
            ),
            models.CheckConstraint(
                condition=Q(reading_chars_per_second__gt=0),
                name="qualitypolicy_reading_speed_gt_0",
            ),
            models.CheckConstraint(
                condition=Q(check_every_n_judgments__gte=1), name="qualitypolicy_every_n_ge_1"
            ),
            models.CheckConstraint(
                condition=Q(disagreement_threshold__gte=0) & Q(disagreement_threshold__lte=1),
                name="qualitypolicy_disagreement_0_1",
            ),
        ]

    def __str__(self) -> str:
        return f"QC policy of {self.project}"

    def sources_for_review(self) -> list[str]:
        """Return the label sources whose splits queue items for review."""
        return list(self.review_sources) or ["human"]


class AnnotatorAssessment(models.Model):
    """One QC verdict on an annotator, with the metrics behind it; never edited afterwards.

    A `resumed` row records a researcher clearing a pause; later checks judge only the
    annotator's judgments made after it.
    """

    class Verdict(models.TextChoices):
        PASS = "pass"
        PAUSE = "pause"
        RESUMED = "resumed"

    class Trigger(models.TextChoices):
        AUTO = "auto", "After submits"
        COMMAND = "command", "Management command"
        API = "api", "API request"
        MANUAL = "manual", "By a researcher"

    project = models.ForeignKey(
        "annotation.Project", on_delete=models.CASCADE, related_name="annotator_assessments"
    )
    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="qc_assessments"
    )
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    # True when this assessment paused the annotator (False for dry runs and passes).
    applied = models.BooleanField(default=False)
    failed_checks = models.JSONField(default=list, blank=True)
    reasons = models.JSONField(default=list, blank=True)
    notes = models.JSONField(default=list, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    n_judgments = models.PositiveIntegerField(default=0)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.AUTO)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="qc_assessments_made",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(verdict__in=["pass", "pause", "resumed"]),
                name="annotatorassessment_verdict_valid",
            ),
            models.CheckConstraint(
                condition=Q(applied=False) | Q(verdict="pause"),
                name="annotatorassessment_applied_only_pause",
            ),
        ]
        indexes = [
            models.Index(
                fields=["project", "annotator", "-created_at"], name="assessment_latest_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.annotator} in {self.project}: {self.verdict}"


class AgreementReport(models.Model):
    """A stored `evaluation.selectors.project_agreement` result for a project or one round."""

    project = models.ForeignKey(
        "annotation.Project", on_delete=models.CASCADE, related_name="agreement_reports"
    )
    round = models.ForeignKey(
        "annotation.Round",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="agreement_reports",
    )
    report = models.JSONField()
    n_judgments = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["project", "round", "-created_at"], name="agreement_latest_idx"),
        ]

    def __str__(self) -> str:
        scope = f"round {self.round_id}" if self.round_id else "all rounds"
        return f"agreement of {self.project} ({scope})"
