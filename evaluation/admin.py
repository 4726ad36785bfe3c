"""Admin registrations for QC: policies editable, assessments read-only, pauses through QC."""

from django import forms
from django.contrib import admin

from annotation.admin import MembershipAdmin as AnnotationMembershipAdmin
from annotation.models import Membership
from evaluation import services
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


class MembershipStatusForm(forms.ModelForm):
    """Take the reason a researcher gives for pausing or resuming an annotator."""

    note = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why you pause or resume this person; kept with the QC record and shown to "
        "them when paused.",
    )

    class Meta:
        model = Membership
        fields = ["user", "project", "role", "status"]


admin.site.unregister(Membership)


@admin.register(Membership)
class MembershipQCAdmin(AnnotationMembershipAdmin):
    """Pause and resume annotators through the QC services when the status switch flips."""

    # Resuming stores the ``resumed`` assessment from which the next QC check counts, and
    # pausing ends the live lease and flags the labels, as a QC pause does.

    form = MembershipStatusForm

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "user", "project"] if obj is not None else fields

    def save_model(self, request, obj, form, change):
        wanted = obj.status
        # The services below make the switch; the row is saved with the status it had.
        obj.status = form.initial.get("status") or Membership.Status.ACTIVE
        super().save_model(request, obj, form, change)
        if wanted == obj.status:
            return
        note = form.cleaned_data.get("note", "")
        if wanted == Membership.Status.ACTIVE:
            services.annotator_resume(
                project=obj.project, annotator_id=obj.user_id, by=request.user, note=note
            )
        else:
            services.annotator_pause(
                project=obj.project,
                annotator_id=obj.user_id,
                failed_checks=["manual"],
                reasons=[note or f"paused by {request.user.get_username()} in the admin"],
            )
        obj.refresh_from_db()
