"""Talking to workers: persistent SSH connections, run-on-all, streaming, file transfer."""
