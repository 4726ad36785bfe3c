"""API of the model registry: register policies and reward models, validate, promote."""

urlpatterns: list = []
