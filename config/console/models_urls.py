"""Console pages of a project's models (registry, uploads, validation, promotion)."""

from django.urls import path

from config.console import models

urlpatterns = [
    path("", models.models_home, name="models"),
    path("table/", models.models_table, name="models-table"),
    path("upload/", models.models_upload, name="models-upload"),
    path("folder/", models.models_folder, name="models-folder"),
    path("<int:version_id>/register/", models.models_register, name="models-register"),
    path("<int:version_id>/validate/", models.models_validate, name="models-validate"),
]
