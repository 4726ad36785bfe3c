"""Admin registrations for researchers: list displays, filters and search."""

from django.contrib import admin

from annotation.models import (
    Adjudication,
    Assignment,
    Candidate,
    DatasetVersion,
    Item,
    ItemCandidate,
    Judgment,
    Membership,
    Project,
    Prompt,
    Round,
    Skip,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]
    fields = ["user", "role", "status", "flagged", "status_reason", "judgment_count"]
    readonly_fields = ["judgment_count"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "task_kind", "k", "overlap", "gold_rate", "repeat_rate", "created_at"]
    list_filter = ["task_kind"]
    search_fields = ["name", "rubric"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "project", "role", "status", "flagged", "judgment_count"]
    list_filter = ["role", "status", "flagged", "project"]
    search_fields = ["user__username", "project__name"]
    list_editable = ["status", "flagged"]


@admin.register(Round)
class RoundAdmin(admin.ModelAdmin):
    list_display = ["project", "number", "status", "model_version", "created_at", "closed_at"]
    list_filter = ["status", "project"]


@admin.register(Prompt)
class PromptAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "short_text", "group_key", "created_at"]
    list_filter = ["project"]
    search_fields = ["text", "content_hash", "external_id"]

    @admin.display(description="text")
    def short_text(self, obj):
        return (obj.text or str(obj.messages))[:80]


@admin.register(Candidate)
class CandidateAdmin(admin.ModelAdmin):
    list_display = ["id", "prompt", "model_name", "checkpoint_id", "policy_version", "created_at"]
    list_filter = ["model_name"]
    search_fields = ["text", "model_name", "checkpoint_id"]
    raw_id_fields = ["prompt"]


class ItemCandidateInline(admin.TabularInline):
    model = ItemCandidate
    extra = 0
    raw_id_fields = ["candidate"]


@admin.register(Item)
class ItemAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "round", "is_gold", "n_taken", "n_done", "needs_review"]
    list_filter = ["project", "is_gold", "needs_review", "round__status"]
    search_fields = ["external_id", "prompt__text"]
    raw_id_fields = ["prompt", "round"]
    inlines = [ItemCandidateInline]


@admin.register(Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "item", "annotator", "kind", "status", "lease_expires"]
    list_filter = ["status", "kind", "project"]
    search_fields = ["annotator__username"]
    raw_id_fields = ["item", "repeat_of"]


@admin.register(Judgment)
class JudgmentAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "project",
        "item",
        "annotator",
        "choice",
        "ranking",
        "source",
        "is_gold",
        "is_repeat",
        "qc_flag",
        "created_at",
    ]
    list_filter = ["source", "choice", "is_gold", "is_repeat", "project"]
    search_fields = ["annotator__username", "rationale", "qc_flag"]
    raw_id_fields = ["item", "assignment"]


@admin.register(Skip)
class SkipAdmin(admin.ModelAdmin):
    list_display = ["id", "assignment", "reason", "created_at"]
    search_fields = ["reason"]


@admin.register(Adjudication)
class AdjudicationAdmin(admin.ModelAdmin):
    list_display = ["id", "item", "reviewer", "choice", "created_at"]
    raw_id_fields = ["item"]


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ["project", "version", "name", "status", "content_hash", "created_at"]
    list_filter = ["project", "status"]
    readonly_fields = ["content_hash", "split_counts", "policies", "filters", "source_rounds"]
