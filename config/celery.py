"""Celery application: `gpu` queue for training and generation, `default` for light work."""

import os

from celery import Celery

# Workers and beat started without a settings module get production settings (which refuse
# to load without a secret key); manage.py keeps the local default for the demo commands.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")

app = Celery("prefloop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["training"], related_name="loop_tasks")
