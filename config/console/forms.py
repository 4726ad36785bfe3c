"""The console's forms: each checks its field types here and the rules in the service it feeds.

A rule a service refuses comes back on the field it names, so the page says which field is
wrong; nothing is written when a form is refused.
"""

from __future__ import annotations

import re

from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import NON_FIELD_ERRORS

from annotation import exports, projects
from annotation.imports import FORMATS as PREFERENCE_FORMATS
from annotation.models import ImportJob, LabelSource, Membership, Project

ITEM_FORMATS = ("jsonl", "csv")
TRI_STATE = [("", "Format default"), ("yes", "Yes"), ("no", "No")]
TRI_VALUE = {"": None, "yes": True, "no": False}


def add_errors(form: forms.Form, problems: dict[str, str]) -> None:
    """Put a service's {field: problem} onto the form, unknown names as form-wide errors."""
    for name, text in problems.items():
        form.add_error(name if name in form.fields else None, text)


def upload_form(request, form_class: type[forms.Form]) -> tuple[forms.Form, int | None]:
    """Bind an upload form; return it with the status of its refusal (413 for a body declared
    past the upload limit, 400 for form errors), or None when it is good."""
    from annotation.apis_imports import declared_upload_too_large

    refused = declared_upload_too_large(request)
    form = form_class(request.POST, request.FILES)
    if refused is not None:
        form.is_valid()
        form.add_error("file", refused.data["detail"])
        return form, 413
    return form, (None if form.is_valid() else 400)


class ProjectForm(forms.ModelForm):
    """Every setting a researcher chooses, labelled and explained by the model's help text."""

    class Meta:
        model = Project
        fields = list(projects.PROJECT_SETTINGS)
        widgets = {"rubric": forms.Textarea(attrs={"rows": 4})}

    def clean(self):
        cleaned = super().clean()
        settings = {name: cleaned[name] for name in projects.PROJECT_SETTINGS if name in cleaned}
        if len(settings) == len(projects.PROJECT_SETTINGS):
            problems = projects.project_problems(settings=settings)
            add_errors(
                self, {(None if k == NON_FIELD_ERRORS else k): v for k, v in problems.items()}
            )
        return cleaned


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150, help_text="The person's login name.")
    role = forms.ChoiceField(
        choices=Membership.Role.choices,
        initial=Membership.Role.ANNOTATOR,
        help_text="Annotators label; reviewers also read everyone's labels and settle "
        "disputes; researchers run the project.",
    )

    def clean_username(self):
        username = self.cleaned_data["username"].strip()
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise forms.ValidationError("No active user has this username.")
        self.user = user
        return username


class PauseForm(forms.Form):
    reason = forms.CharField(
        max_length=500, help_text="Shown to the annotator on their page, with whom to contact."
    )


class ResumeForm(forms.Form):
    note = forms.CharField(max_length=2000, required=False, help_text="Kept with the record.")
    clear_labels = forms.BooleanField(
        required=False,
        initial=True,
        help_text="Use the labels quality control set aside when it paused them.",
    )


class ImportForm(forms.Form):
    kind = forms.ChoiceField(
        choices=ImportJob.Kind.choices,
        initial=ImportJob.Kind.ITEMS,
        help_text="Prompts with answers to label, or preference data labelled elsewhere.",
    )
    format = forms.ChoiceField(
        choices=[(f, f) for f in ITEM_FORMATS + PREFERENCE_FORMATS],
        initial="jsonl",
        help_text="Items: jsonl or csv. Preference data: hh, trl or ranking (see below).",
    )
    file = forms.FileField(help_text="A .jsonl, .csv or gzip-compressed .jsonl.gz file.")

    def clean(self):
        cleaned = super().clean()
        kind, fmt = cleaned.get("kind"), cleaned.get("format")
        if kind == ImportJob.Kind.ITEMS and fmt not in ITEM_FORMATS:
            self.add_error("format", "Items are imported from jsonl or csv.")
        if kind == ImportJob.Kind.PREFERENCES and fmt not in PREFERENCE_FORMATS:
            self.add_error("format", "Preference data is imported from hh, trl or ranking lines.")
        return cleaned


class ExportForm(forms.Form):
    """The export policy's choices; `annotation.exports.ExportPolicy` checks their rules."""

    name = forms.CharField(max_length=200, required=False, help_text="A name to find it by.")
    format = forms.ChoiceField(
        choices=[(f, f) for f in exports.FORMATS],
        initial="trl",
        help_text="trl: prompt/chosen/rejected rows for reward models and DPO; hh: whole "
        "dialogues; unpaired: KTO rows; raw: one row per judgment.",
    )
    aggregation = forms.ChoiceField(
        choices=[(a, a) for a in exports.AGGREGATIONS],
        initial="per_judgment",
        help_text="One row per label, or one decision per answer pair by majority, by "
        "gold-trust weights, or by Dawid-Skene (Dawid and Skene 1979).",
    )
    ties = forms.ChoiceField(
        choices=[(t, t) for t in exports.TIE_POLICIES],
        initial="drop",
        help_text="Drop ties, keep them as soft labels (0.5), or keep them flagged.",
    )
    both_bad = forms.ChoiceField(
        choices=[(b, b) for b in exports.BOTH_BAD_POLICIES],
        initial="drop",
        help_text="Drop both-bad pairs, write them to a side file, or as KTO negatives.",
    )
    adjudicated_wins = forms.BooleanField(
        required=False,
        initial=True,
        help_text="An item a reviewer settled is decided by the verdict, not the votes.",
    )
    min_agreement = forms.FloatField(
        initial=0.0,
        min_value=0.0,
        max_value=1.0,
        help_text="Drop decisions whose winning share of the votes is lower (0 to 1).",
    )
    min_votes = forms.IntegerField(
        initial=1, min_value=1, help_text="Drop decisions with fewer votes."
    )
    sources = forms.MultipleChoiceField(
        choices=[(s, s) for s in LabelSource.values],
        initial=[LabelSource.HUMAN.value],
        widget=forms.CheckboxSelectMultiple,
        help_text="Whose labels count: only named sources are used.",
    )
    include_gold = forms.ChoiceField(
        choices=TRI_STATE, required=False, help_text="Include gold-check judgments."
    )
    include_repeats = forms.ChoiceField(
        choices=TRI_STATE, required=False, help_text="Include repeated (consistency) judgments."
    )
    include_qc_flagged = forms.ChoiceField(
        choices=TRI_STATE, required=False, help_text="Include labels quality control flagged."
    )
    train = forms.FloatField(initial=0.9, min_value=0.0, max_value=1.0, help_text="Train share.")
    validation = forms.FloatField(
        initial=0.05, min_value=0.0, max_value=1.0, help_text="Validation share."
    )
    test = forms.FloatField(initial=0.05, min_value=0.0, max_value=1.0, help_text="Test share.")
    seed = forms.IntegerField(
        initial=0, min_value=0, help_text="Fixes which prompts go to which split."
    )

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        policy = {
            name: cleaned[name]
            for name in (
                "format",
                "aggregation",
                "ties",
                "both_bad",
                "adjudicated_wins",
                "min_agreement",
                "min_votes",
                "sources",
                "seed",
            )
        }
        for name in ("include_gold", "include_repeats", "include_qc_flagged"):
            policy[name] = TRI_VALUE[cleaned.get(name) or ""]
        split = {name: cleaned[name] for name in ("train", "validation", "test")}
        policy["split"] = {name: share for name, share in split.items() if share}
        if policy["format"] == "raw":
            policy["adjudicated_wins"] = False  # raw lists every judgment as it is
        try:
            self.policy = exports.ExportPolicy.from_dict(policy)
        except exports.PolicyError as exc:
            self.add_error(_policy_field(exc.message, self.fields), exc.message)
        return cleaned


def _policy_field(message: str, fields) -> str | None:
    """Return the form field a policy refusal names (split rules name the train field)."""
    words = re.findall(r"\w+", message)
    if "split" in words or "train" in words:
        return "train"
    return next((word for word in words if word in fields), None)


class VerdictForm(forms.Form):
    """A reviewer's verdict on an item, in canonical terms (A = the first answer listed)."""

    note = forms.CharField(
        max_length=10_000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, **kwargs)
        self.ranking = project.task_kind == "ranking"
        self.k = project.k
        if self.ranking:
            for position in range(project.k):
                self.fields[f"rank_{position}"] = forms.IntegerField(
                    min_value=1,
                    max_value=project.k,
                    label=f"Rank of {'ABCDEFGH'[position]}",
                    help_text="1 = best; equal answers share a rank.",
                )
        else:
            choices = [("A", "A is better"), ("B", "B is better"), ("tie", "Tie")]
            choices.append(("both_bad", "Both bad"))
            self.fields["choice"] = forms.ChoiceField(choices=choices, widget=forms.RadioSelect)
        self.order_fields(["choice", *[f"rank_{i}" for i in range(project.k)], "note"])

    def label(self) -> dict:
        """Return the verdict as `adjudication_create` takes it."""
        if self.ranking:
            ranks = [self.cleaned_data[f"rank_{i}"] for i in range(self.k)]
            return {"ranking": ranks}
        return {"choice": self.cleaned_data["choice"]}
