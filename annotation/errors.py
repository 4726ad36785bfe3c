"""Service errors: what a request could not do, with the HTTP status and code to answer with.

Every app raises these; `annotation.apis.exception_handler` renders them as
``{"detail", "code"}`` (plus ``"field"`` when the error names one).
"""


class ServiceError(Exception):
    """A request that cannot be carried out; `status` is the HTTP status to answer with."""

    status = 400
    code = "invalid"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class SkipBudgetSpent(Forbidden):
    """The annotator skipped more than the project allows; a researcher's resume lifts it."""

    status = 429
    code = "skip_budget"
