from django.apps import AppConfig


class TrainingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "training"

    def ready(self) -> None:
        """Let simulated annotators score demo prompts with the demo domain's true reward."""
        from annotation import hooks
        from training import demo

        hooks.on_score_answer(demo.true_reward)
