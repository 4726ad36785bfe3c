"""Runs stored with the demo reward's import path now name it by its registry key."""

from django.db import migrations

DEMO_NAME, DEMO_TARGET = "demo", "training.demo:true_reward"


def forwards(apps, schema_editor):
    # A queued or resumed run passes its reward function through the registry; the only
    # import path the default registry knows becomes its name, any other stays and fails
    # with a message listing the registered names.
    TrainingRun = apps.get_model("training", "TrainingRun")
    for run in TrainingRun.objects.filter(config__reward_function=DEMO_TARGET).only("config"):
        run.config = {**run.config, "reward_function": DEMO_NAME}
        run.save(update_fields=["config"])


def backwards(apps, schema_editor):
    TrainingRun = apps.get_model("training", "TrainingRun")
    for run in TrainingRun.objects.filter(config__reward_function=DEMO_NAME).only("config"):
        run.config = {**run.config, "reward_function": DEMO_TARGET}
        run.save(update_fields=["config"])


class Migration(migrations.Migration):
    dependencies = [("training", "0003_run_enqueued_at")]

    operations = [migrations.RunPython(forwards, backwards)]
