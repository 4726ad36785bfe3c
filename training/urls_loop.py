"""API of a project's loop: state, timeline, actions."""

urlpatterns: list = []
