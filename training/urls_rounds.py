"""API of round generation jobs: a round from one or more registered policies."""

urlpatterns: list = []
