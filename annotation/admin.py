"""Admin registrations for researchers: list displays, filters and search.

Judgments are read-only here and nothing that holds them can be deleted (their foreign keys
PROTECT): users are deactivated and projects and rounds archived, through the actions below.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from annotation import accounts, projects
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
    # Pausing and resuming go through the QC services (the Membership page), which keep the
    # record the next QC check reads; a switch here would skip it.
    readonly_fields = ["status", "flagged", "status_reason", "judgment_count"]


class ProjectForm(forms.ModelForm):
    """Check a project's settings by the same rules as the API's create view."""

    class Meta:
        model = Project
        fields = list(projects.PROJECT_SETTINGS)

    def clean(self):
        cleaned = super().clean()
        if set(projects.PROJECT_SETTINGS) <= set(cleaned):  # each field passed its own checks
            settings = {name: cleaned[name] for name in projects.PROJECT_SETTINGS}
            for field, text in projects.project_problems(settings=settings).items():
                self.add_error(field, text)  # NON_FIELD_ERRORS names the whole form
        return cleaned


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    form = ProjectForm
    list_display = [
        "name",
        "task_kind",
        "k",
        "overlap",
        "gold_rate",
        "repeat_rate",
        "archived",
        "created_at",
    ]
    list_filter = ["archived", "task_kind"]
    search_fields = ["name", "rubric"]
    readonly_fields = ["archived"]
    inlines = [MembershipInline]
    actions = ["archive_projects", "unarchive_projects"]

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        settings = {name: form.cleaned_data[name] for name in projects.PROJECT_SETTINGS}
        # The inline memberships are saved against this same object, so it takes the new row.
        obj.pk = projects.project_create(settings=settings).pk
        obj.refresh_from_db()

    @admin.action(description="Archive the selected projects (hide from annotators, keep data)")
    def archive_projects(self, request, queryset):
        for project in queryset:
            accounts.project_archive(project=project)
        self.message_user(request, f"{len(queryset)} project(s) archived.")

    @admin.action(description="Bring the selected projects back from the archive")
    def unarchive_projects(self, request, queryset):
        for project in queryset:
            accounts.project_archive(project=project, archived=False)
        self.message_user(request, f"{len(queryset)} project(s) taken out of the archive.")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "project", "role", "status", "flagged", "judgment_count"]
    list_filter = ["role", "status", "flagged", "project"]
    search_fields = ["user__username", "project__name"]
    # The status switch lives in evaluation/admin.py, which routes it through the QC services.
    readonly_fields = ["flagged", "status_reason", "judgment_count"]


@admin.register(Round)
class RoundAdmin(admin.ModelAdmin):
    list_display = [
        "project",
        "number",
        "status",
        "archived",
        "model_version",
        "created_at",
        "closed_at",
    ]
    list_filter = ["status", "archived", "project"]
    readonly_fields = ["archived"]
    actions = ["archive_rounds"]

    @admin.action(description="Archive the selected rounds (close for good, keep data)")
    def archive_rounds(self, request, queryset):
        for round_ in queryset:
            accounts.round_archive(round_=round_)
        self.message_user(request, f"{len(queryset)} round(s) archived.")


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

    # Labels are evidence: QC flags them through its own services, nobody edits or deletes.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Skip)
class SkipAdmin(admin.ModelAdmin):
    list_display = ["id", "assignment", "reason", "created_at"]
    search_fields = ["reason"]


@admin.register(Adjudication)
class AdjudicationAdmin(admin.ModelAdmin):
    list_display = ["id", "item", "reviewer", "choice", "created_at"]
    raw_id_fields = ["item"]

    # A verdict is made by adjudication_create (review page, QC API), which also takes the
    # item off the review queue; a row saved here would leave it queued.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ["project", "version", "name", "status", "content_hash", "created_at"]
    list_filter = ["project", "status"]
    readonly_fields = [
        "project",
        "version",
        "format",
        "status",
        "path",
        "error",
        "content_hash",
        "split_counts",
        "policies",
        "filters",
        "source_rounds",
    ]

    # An export is recorded and built by the export services (console, API); a row added
    # here would never be built.
    def has_add_permission(self, request):
        return False


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class AccountAdmin(UserAdmin):
    """Django's user admin, with deactivation and token revocation as actions."""

    actions = ["deactivate_users", "revoke_tokens"]

    @admin.action(description="Deactivate the selected users (keep their judgments)")
    def deactivate_users(self, request, queryset):
        for user in queryset:
            accounts.user_deactivate(user=user)
        self.message_user(request, f"{len(queryset)} user(s) deactivated.")

    @admin.action(description="Revoke the selected users' API tokens")
    def revoke_tokens(self, request, queryset):
        revoked = sum(accounts.token_revoke(user=user) for user in queryset)
        self.message_user(request, f"{revoked} token(s) revoked.", messages.SUCCESS)
