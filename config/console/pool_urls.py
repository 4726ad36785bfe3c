"""Console pages of a project's prompt pool and generated rounds."""

urlpatterns: list = []
