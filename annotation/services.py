"""Write-side business logic of annotation, one job a module; this module names them all.

- `annotation.serving`: the next item for an annotator (claims, leases, skips, heartbeats);
  its docstring states why serving is correct under concurrency;
- `annotation.submission`: an answer stored as a judgment, once;
- `annotation.members`: project roles, pauses, and the label source of machine accounts;
- `annotation.rounds`: opening and closing rounds.

Other apps and the API views import the services from here.
"""

from annotation.members import (
    SOURCE_GROUPS,
    label_source_for,
    membership_set,
    membership_set_status,
    simulated_annotator_ensure,
    user_label_source_remember,
)
from annotation.rounds import round_close, round_create
from annotation.serving import (
    SHUFFLE_WINDOW,
    assignment_expire,
    assignment_heartbeat,
    assignment_next,
    assignment_skip,
    leases_expire,
)
from annotation.submission import SubmitResult, judgment_submit

__all__ = [
    "SHUFFLE_WINDOW",
    "SOURCE_GROUPS",
    "SubmitResult",
    "assignment_expire",
    "assignment_heartbeat",
    "assignment_next",
    "assignment_skip",
    "judgment_submit",
    "label_source_for",
    "leases_expire",
    "membership_set",
    "membership_set_status",
    "round_close",
    "round_create",
    "simulated_annotator_ensure",
    "user_label_source_remember",
]
