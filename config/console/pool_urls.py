"""Console pages of a project's prompt pool and generated rounds."""

from django.urls import path

from config.console import pool

urlpatterns: list = [
    path("", pool.pool_home, name="pool"),
    path("import/", pool.pool_import, name="pool-import"),
    path("generate/", pool.pool_generate, name="pool-generate"),
    path("jobs/<int:generation_job_id>/", pool.pool_job_live, name="pool-job"),
]
