"""The terminal app. One screen or widget per file; styles in app.tcss."""
