"""WSGI entry point for gunicorn."""

import os

from django.core.wsgi import get_wsgi_application

# A server started without a settings module gets production settings, which refuse to load
# without a secret key, never the development settings with DEBUG on and a known key.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
application = get_wsgi_application()
