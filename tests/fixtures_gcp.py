"""Fixtures for the gcp provider tests: a TPU API emulator on 127.0.0.1 and a provider pointed at it.

Import the fixtures into a test module with `from tests.fixtures_gcp import *` style names, or by name.
"""

from __future__ import annotations

import os

import pytest

from tests.tpu_api_emulator import TpuApiEmulator
from tpu_console.providers.gcp import GcpProvider
from tpu_console.providers.gcp import client as gcp_client
from tpu_console.settings import load_settings

PROJECT = "test-proj"
ZONES = ["europe-west4-a", "us-east5-b", "us-central2-b"]


@pytest.fixture
def gcp_home(tmp_path, monkeypatch):
    """A private TPU_CONSOLE_HOME and an environment without other TPU console or gcloud settings."""
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(tmp_path))
    for name in list(os.environ):
        if name.startswith("TPU_CONSOLE_") and name != "TPU_CONSOLE_HOME":
            monkeypatch.delenv(name)
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.setattr(gcp_client, "RETRY_BASE_DELAY", 0.01)  # keep 5xx retries fast in tests
    # the person nodes are labelled with (tpu-console-user), given as a login name the labels must clean
    monkeypatch.setenv("LOGNAME", "Alice.Smith")
    monkeypatch.setenv("USER", "Alice.Smith")
    return tmp_path


@pytest.fixture
def emulator():
    api = TpuApiEmulator(create_delay=0.15, delete_delay=0.05, update_delay=0.02)
    api.start()
    yield api
    api.stop()


@pytest.fixture
def make_provider(emulator, gcp_home):
    """Build a GcpProvider against the emulator; keyword arguments become `[gcp]` settings."""
    providers: list[GcpProvider] = []

    def build(**gcp) -> GcpProvider:
        flags = {"project": PROJECT, "zones": ZONES, "api_endpoint": emulator.endpoint, **gcp}
        settings = load_settings({"gcp": flags})
        provider = GcpProvider(settings, poll_interval=0.02, create_timeout=10, delete_timeout=10,
                               host_key_wait=0.5)
        providers.append(provider)
        return provider

    yield build
    for provider in providers:
        if provider._api is not None:
            provider._api._client.transport.close()


@pytest.fixture
def gcp_cli_emulator(emulator, gcp_home, monkeypatch):
    """`cli.main` with a gcp project whose API is the emulator (polled every 20 ms); returns the emulator."""
    import json

    from tpu_console import cli

    (gcp_home / "config.toml").write_text(
        f'[gcp]\nproject = "{PROJECT}"\nzones = {json.dumps(ZONES)}\napi_endpoint = "{emulator.endpoint}"\n')

    def build(settings):
        return {"gcp": GcpProvider(settings, poll_interval=0.02, create_timeout=10, delete_timeout=10,
                                   host_key_wait=0.5)}

    monkeypatch.setattr(cli, "build_providers", build)
    return emulator
