from django.apps import AppConfig


class TrainingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "training"

    def ready(self) -> None:
        """Give simulated annotators the demo's true reward; check the generation settings."""
        from annotation import hooks
        from training import demo

        hooks.on_score_answer(demo.true_reward)

        from django.core import checks

        from training.generation.endpoints import generation_settings_check

        checks.register(generation_settings_check)
