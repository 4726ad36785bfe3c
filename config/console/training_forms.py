"""The training form of each recipe, built from the recipe's config dataclass.

A field's label, type, default and help come from the dataclass (``field(metadata={"help":
...})``), so the page and ``python -m training.trainers.cli --describe`` never disagree. The
form offers exactly what ``training.config_policy`` accepts from a non-staff caller: model
and checkpoint paths become choices among the project's model versions and runs (sent as
ids), the reward function a choice among the deployment's registered names, ``trl_args``
takes only the recipe's allowed keys (checked by the policy), and ``resume`` is the runner's.
A field left blank keeps the recipe's default; the config holds only what the person set.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from django import forms
from django.db.models import QuerySet

from annotation.models import DatasetVersion, Project
from training import config_policy
from training.models import ModelVersion, Recipe, TrainingRun
from training.selectors import model_version_list_for_project

TRI_STATE = [("", "Default"), ("yes", "Yes"), ("no", "No")]
TRI_VALUE = {"yes": True, "no": False}
# Set by the runner, never by a person.
RUNNER_FIELDS = frozenset({"resume"})
# A path a request may not give -> the id field the form offers (and the config sends) instead.
MODEL_CHOICE_FIELDS = dict(config_policy.MODEL_ID_FIELDS)
MODEL_LIST_CHOICE_FIELDS = dict(config_policy.MODEL_ID_LIST_FIELDS)
RUN_CHOICE_FIELDS = dict(config_policy.RUN_ID_FIELDS)
REWARD_MODEL_FIELDS = frozenset(
    {"reward_model_id", "value_model_id", "judge_reward_model_id", "reward_model_ids"}
)


@dataclass(frozen=True)
class ConfigField:
    """One settable field of a recipe config: its name, type, default and help."""

    name: str
    # bool, int, float, str, list_str, list_int, json, reward_function, model, models, run
    kind: str
    optional: bool
    default: Any
    help: str


def recipe_config_class(recipe: str) -> type:
    """Return the config dataclass of ``recipe`` (the training library's own)."""
    from training.trainers import cli

    config_cls, _train = cli.get_recipe(recipe)
    return config_cls


def _kind(annotation: Any) -> tuple[str, bool]:
    """Return (kind, optional) of a dataclass field's type."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    optional = False
    if origin in (typing.Union, types.UnionType):
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _kind(rest[0])[0], optional
        if list[str] in rest and str in rest:
            return "list_str", optional
        return "json", optional
    if origin is list:
        return ("list_int" if args == (int,) else "list_str"), optional
    if origin is dict or annotation is dict:
        return "json", optional
    for python_type, kind in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if annotation is python_type:
            return kind, optional
    return "json", optional


def _default(item: dataclasses.Field) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None


def recipe_fields(recipe: str) -> list[ConfigField]:
    """Return the fields of ``recipe``'s config a non-staff caller may set, in class order."""
    config_cls = recipe_config_class(recipe)
    hints = typing.get_type_hints(config_cls)
    fields = []
    for item in dataclasses.fields(config_cls):
        name = item.name
        if name in RUNNER_FIELDS or name == "model_name_or_path":  # the form's base_model_id
            continue
        kind, optional = _kind(hints[name])
        help_text = item.metadata.get("help", "")
        if name in MODEL_CHOICE_FIELDS:
            name, kind = MODEL_CHOICE_FIELDS[name], "model"
        elif name in MODEL_LIST_CHOICE_FIELDS:
            name, kind = MODEL_LIST_CHOICE_FIELDS[name], "models"
        elif name in RUN_CHOICE_FIELDS:
            name, kind = RUN_CHOICE_FIELDS[name], "run"
        elif name == "reward_function":
            kind = "reward_function"
        elif name == "trl_args":
            allowed = sorted(config_policy.TRL_ARGS_ALLOWED.get(recipe, ()))
            if not allowed:
                continue
            help_text += " Allowed keys: " + ", ".join(allowed) + "."
        fields.append(ConfigField(name, kind, optional, _default(item), help_text))
    return fields


def project_model_versions(*, project: Project) -> QuerySet[ModelVersion]:
    """Return the project's usable registered models (its runs', its data's, its own)."""
    return model_version_list_for_project(project_id=project.pk).filter(
        status=ModelVersion.Status.READY
    )


def project_dataset_versions(*, project: Project) -> QuerySet[DatasetVersion]:
    """Return the project's exports a run can train on (ready ones)."""
    return DatasetVersion.objects.filter(
        project=project, status=DatasetVersion.Status.READY
    ).order_by("-version")


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


class TrainingRunForm(forms.Form):
    """The form of one recipe; ``config()`` returns the fields the person set."""

    def __init__(self, *args, recipe: str, project: Project, **kwargs):
        super().__init__(*args, **kwargs)
        self.recipe = recipe
        self.project = project
        self.config_fields = recipe_fields(recipe)
        datasets = project_dataset_versions(project=project)
        self.fields["dataset_version_id"] = forms.TypedChoiceField(
            label="Dataset version",
            coerce=int,
            choices=[(dv.pk, f"v{dv.version} {dv.name}".strip()) for dv in datasets],
            help_text="The export of this project the run trains on (the Data page makes them).",
        )
        models = list(project_model_versions(project=project))
        aliases = sorted(_model_aliases())
        self.fields["base_model_id"] = forms.ChoiceField(
            label="Base model",
            choices=[
                *((f"version:{v.pk}", f"{v.name} ({v.kind})") for v in models),
                *((f"alias:{name}", f"{name} (bundled)") for name in aliases),
            ],
            help_text="The model the run starts from: one this project trained or registered, "
            "or a model bundled with the server.",
        )
        for spec in self.config_fields:
            self.fields[spec.name] = self._form_field(spec, models)

    def _form_field(self, spec: ConfigField, models: list[ModelVersion]) -> forms.Field:
        help_text = spec.help
        if spec.kind not in ("model", "run", "reward_function", "json"):
            help_text = f"{help_text} Default: {_shown(spec.default)}."
        common = {"required": False, "help_text": help_text, "label": spec.name}
        if spec.kind == "bool":
            return forms.ChoiceField(choices=TRI_STATE, **common)
        if spec.kind == "int":
            return forms.IntegerField(**common)
        if spec.kind == "float":
            return forms.FloatField(**common)
        if spec.kind == "models":
            wanted = [v for v in models if v.kind == ModelVersion.Kind.REWARD]
            return forms.TypedMultipleChoiceField(
                coerce=int, choices=[(v.pk, v.name) for v in wanted], **common
            )
        if spec.kind == "model":
            wanted = [
                v
                for v in models
                if spec.name not in REWARD_MODEL_FIELDS or v.kind == ModelVersion.Kind.REWARD
            ]
            choices = [("", "None"), *((v.pk, f"{v.name} ({v.kind})") for v in wanted)]
            return forms.TypedChoiceField(coerce=int, empty_value=None, choices=choices, **common)
        if spec.kind == "run":
            runs = TrainingRun.objects.filter(project=self.project).order_by("-pk")
            labels = ((r.pk, f"run {r.pk} ({r.recipe}, {r.status})") for r in runs)
            choices = [("", "None"), *labels]
            return forms.TypedChoiceField(coerce=int, empty_value=None, choices=choices, **common)
        if spec.kind == "reward_function":
            names = sorted(config_policy.reward_function_registry())
            return forms.ChoiceField(choices=[("", "None"), *((n, n) for n in names)], **common)
        if spec.kind == "json":
            return forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), **common)
        widget = forms.TextInput(attrs={"placeholder": _shown(spec.default)})
        return forms.CharField(max_length=500, widget=widget, **common)

    def clean(self):
        cleaned = super().clean()
        for spec in self.config_fields:
            raw = cleaned.get(spec.name)
            if raw in (None, "", []) or spec.kind == "models":
                continue
            try:
                cleaned[spec.name] = _parse(spec, raw)
            except ValueError as exc:
                self.add_error(spec.name, str(exc))
        return cleaned

    def config(self) -> dict[str, Any]:
        """Return the config of the fields that were set (blank keeps the default)."""
        config = {}
        for spec in self.config_fields:
            value = self.cleaned_data.get(spec.name)
            if value in (None, "", []):
                continue
            config[spec.name] = value
        base = self.cleaned_data["base_model_id"]
        if base.startswith("alias:"):
            config["model_name_or_path"] = base.removeprefix("alias:")
        return config

    def base_model(self) -> ModelVersion | None:
        """Return the chosen base model version (None for a bundled model)."""
        kind, _sep, value = self.cleaned_data["base_model_id"].partition(":")
        if kind != "version":
            return None
        return ModelVersion.objects.get(pk=int(value))


def _model_aliases() -> set[str]:
    from training.trainers.model_paths import MODEL_ALIASES

    return {name for name in MODEL_ALIASES if "/" not in name}


def _parse(spec: ConfigField, raw: Any) -> Any:
    """Return the typed value of one field (ValueError with a plain message when it is not)."""
    if spec.kind == "bool":
        return TRI_VALUE[raw]
    if spec.kind == "list_int":
        try:
            return [int(part) for part in str(raw).replace(",", " ").split()]
        except ValueError:
            raise ValueError("expected whole numbers separated by commas.") from None
    if spec.kind == "list_str":
        parts = [part.strip() for part in str(raw).split(",") if part.strip()]
        return parts if "," in str(raw) else str(raw).strip()
    if spec.kind == "json":
        try:
            value = json.loads(raw)
        except ValueError:
            raise ValueError('expected a JSON object, e.g. {"warmup_steps": 10}.') from None
        if not isinstance(value, dict):
            raise ValueError('expected a JSON object, e.g. {"warmup_steps": 10}.')
        return value
    return raw


def recipes() -> list[tuple[str, str]]:
    """Return (recipe, label) of every recipe, in the registry's order."""
    return list(Recipe.choices)
