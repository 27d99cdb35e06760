"""Tables the CLI and the app both show: nodes and runs as rows and cells."""
