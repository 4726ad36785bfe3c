"""Researcher-facing pages: the presentation layer, which may import every app below it."""
