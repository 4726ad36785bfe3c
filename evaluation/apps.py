from django.apps import AppConfig


class EvaluationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "evaluation"

    def ready(self) -> None:
        """Start quality control after each committed judgment (annotation calls out by hook)."""
        from annotation import hooks
        from evaluation.services import qc_after_submit

        hooks.on_judgment_submitted(qc_after_submit)
