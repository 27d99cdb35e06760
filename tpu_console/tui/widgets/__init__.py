"""Widgets of the app, one per file, each with its CSS beside it (DEFAULT_CSS)."""
