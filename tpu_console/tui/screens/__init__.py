"""Full screens of the app, one per file."""
