"""Request bodies of the annotator's hot calls: one declaration, checked in plain Python.

A DRF serializer costs about 0.45 ms per submit on a 2-core machine (it deep-copies its
declared fields for every request), as much as the rest of the view. The bodies of the calls
an annotator makes per item are declared here once: `InputSpec.validate` checks a parsed JSON
body against the declaration, and `InputSpec.serializer` builds the matching DRF serializer,
used only to describe the body in the OpenAPI schema. Types are JSON's own: a string field
takes a string, a whole-number field a number without a fraction, a flag true or false.
Errors come back as DRF's do, `{field: [message]}` with status 400.
"""

from dataclasses import dataclass, field
from typing import Any

from rest_framework import serializers
from rest_framework.exceptions import ValidationError

_MISSING = object()


@dataclass(frozen=True)
class Text:
    max_length: int
    default: Any = ""
    allow_null: bool = False
    allow_blank: bool = False
    trim: bool = True

    def clean(self, value):
        if value is None and self.allow_null:
            return None
        if not isinstance(value, str):
            return _Error("Not a valid string.")
        if "\x00" in value:  # PostgreSQL text cannot hold it (DRF refuses it alike)
            return _Error("Null characters are not allowed.")
        if self.trim:
            value = value.strip()
        if not value and not self.allow_blank:
            return _Error("This field may not be blank.")
        if len(value) > self.max_length:
            return _Error(f"Ensure this field has no more than {self.max_length} characters.")
        return value

    def drf(self):
        return serializers.CharField(
            max_length=self.max_length,
            required=False,
            default=self.default,
            allow_null=self.allow_null,
            allow_blank=self.allow_blank,
            trim_whitespace=self.trim,
        )


@dataclass(frozen=True)
class Whole:
    default: Any = None
    allow_null: bool = True
    min_value: int | None = None
    max_value: int | None = None

    def clean(self, value):
        if value is None and self.allow_null:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            return _Error("A valid integer is required.")
        if self.min_value is not None and value < self.min_value:
            return _Error(f"Ensure this value is greater than or equal to {self.min_value}.")
        if self.max_value is not None and value > self.max_value:
            return _Error(f"Ensure this value is less than or equal to {self.max_value}.")
        return value

    def drf(self):
        return serializers.IntegerField(
            required=False,
            default=self.default,
            allow_null=self.allow_null,
            min_value=self.min_value,
            max_value=self.max_value,
        )


@dataclass(frozen=True)
class Flag:
    default: bool = False

    def clean(self, value):
        if not isinstance(value, bool):
            return _Error("Must be a valid boolean.")
        return value

    def drf(self):
        return serializers.BooleanField(required=False, default=self.default)


@dataclass(frozen=True)
class WholeList:
    max_length: int
    default: Any = None
    allow_null: bool = True

    def clean(self, value):
        if value is None and self.allow_null:
            return None
        if not isinstance(value, list):
            return _Error(f'Expected a list of items but got type "{type(value).__name__}".')
        if len(value) > self.max_length:
            return _Error(f"Ensure this field has no more than {self.max_length} elements.")
        for entry in value:
            if not isinstance(entry, int) or isinstance(entry, bool):
                return _Error("A valid integer is required.")
        return list(value)

    def drf(self):
        return serializers.ListField(
            child=serializers.IntegerField(),
            required=False,
            allow_null=self.allow_null,
            default=self.default,
            max_length=self.max_length,
        )


@dataclass(frozen=True)
class _Error:
    message: str


@dataclass(frozen=True)
class InputSpec:
    """The fields of one request body, each optional with its default."""

    fields: dict = field(default_factory=dict)

    def validate(self, data) -> dict:
        """Return the checked body with defaults filled in; raise ValidationError (400)."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ValidationError(
                {
                    "non_field_errors": [
                        f"Invalid data. Expected a dictionary, but got {type(data).__name__}."
                    ]
                }
            )
        checked, problems = {}, {}
        for name, kind in self.fields.items():
            value = data.get(name, _MISSING)
            if value is _MISSING:
                checked[name] = kind.default
                continue
            value = kind.clean(value)
            if isinstance(value, _Error):
                problems[name] = [value.message]
            else:
                checked[name] = value
        if problems:
            raise ValidationError(problems)
        return checked

    def serializer(self, name: str) -> type[serializers.Serializer]:
        """Return a DRF serializer declaring the same fields (for the OpenAPI schema)."""
        declared = {field_name: kind.drf() for field_name, kind in self.fields.items()}
        return type(name, (serializers.Serializer,), declared)


SUBMIT = InputSpec(
    {
        "idempotency_key": Text(max_length=100),
        "choice": Text(max_length=16, default=None, allow_null=True),
        "ranking": WholeList(max_length=8),
        "strength": Text(max_length=16, allow_blank=True),
        "confidence": Whole(),
        "rationale": Text(max_length=10_000, allow_blank=True, trim=False),
        "time_spent_ms": Whole(min_value=0, max_value=86_400_000),
        # true: the answer carries the next assignment too (one round trip per judgment).
        "next": Flag(),
        # true (with next): the answer also carries the item after it, held ahead.
        "ahead": Flag(),
        # true: the items in the answer come rendered as the annotator page shows them.
        "html": Flag(),
    }
)

PREFETCH = InputSpec(
    {
        # true: the answer carries the item rendered as the annotator page shows it.
        "html": Flag(),
    }
)
