"""Console page of a project's loop."""

urlpatterns: list = []
