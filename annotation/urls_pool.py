"""API of a project's prompt pool."""

urlpatterns: list = []
