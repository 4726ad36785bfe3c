"""Console pages of a project's models (registry, uploads, validation, promotion)."""

urlpatterns: list = []
