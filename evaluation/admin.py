"""Admin registrations for QC: policies are editable, assessments and reports read-only."""

from django.contrib import admin

from evaluation.models import AgreementReport, AnnotatorAssessment, QualityPolicy


@admin.register(QualityPolicy)
class QualityPolicyAdmin(admin.ModelAdmin):
    list_display = [
        "project",
        "enabled",
        "check_every_n_judgments",
        "min_gold_accuracy",
        "min_stability",
        "max_position_bias",
        "consensus_alpha",
        "updated_at",
    ]
    list_filter = ["enabled"]
    search_fields = ["project__name"]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AnnotatorAssessment)
class AnnotatorAssessmentAdmin(ReadOnlyAdmin):
    list_display = [
        "created_at",
        "project",
        "annotator",
        "verdict",
        "applied",
        "failed_checks",
        "n_judgments",
        "trigger",
    ]
    list_filter = ["verdict", "applied", "trigger", "project"]
    search_fields = ["annotator__username", "project__name"]
    list_select_related = ["project", "annotator"]


@admin.register(AgreementReport)
class AgreementReportAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "project", "round", "n_judgments"]
    list_filter = ["project"]
    list_select_related = ["project", "round"]
