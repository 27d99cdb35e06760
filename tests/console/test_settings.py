"""Settings precedence: config.toml < TPU_CONSOLE_* environment < flags; unknown keys are rejected."""

import pytest

from tpu_console.errors import UserError
from tpu_console.settings import load_settings


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(tmp_path))
    for name in list(__import__("os").environ):
        if name.startswith("TPU_CONSOLE_") and name != "TPU_CONSOLE_HOME":
            monkeypatch.delenv(name)
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    return tmp_path


def write_config(home, text):
    (home / "config.toml").write_text(text)


def test_defaults_without_any_source():
    settings = load_settings()
    assert settings.local.enabled is True
    assert settings.gcp.project is None
    assert settings.ssh.nodes == []
    assert settings.default_provider is None


def test_config_file_is_read_from_home(isolated_home):
    write_config(isolated_home, '[gcp]\nproject = "from-file"\nzones = ["us-east5-b"]\n')
    settings = load_settings()
    assert settings.gcp.project == "from-file"
    assert settings.gcp.zones == ["us-east5-b"]


def test_environment_beats_file(isolated_home, monkeypatch):
    write_config(isolated_home, '[gcp]\nproject = "from-file"\nzones = ["us-east5-b"]\n')
    monkeypatch.setenv("TPU_CONSOLE_GCP__PROJECT", "from-env")
    settings = load_settings()
    assert settings.gcp.project == "from-env"
    assert settings.gcp.zones == ["us-east5-b"]  # untouched keys keep the file's value


def test_flags_beat_environment_and_file(isolated_home, monkeypatch):
    write_config(isolated_home, '[gcp]\nproject = "from-file"\ninternal_ip = false\n')
    monkeypatch.setenv("TPU_CONSOLE_GCP__PROJECT", "from-env")
    settings = load_settings({"gcp": {"project": "from-flag", "internal_ip": True}})
    assert settings.gcp.project == "from-flag"
    assert settings.gcp.internal_ip is True


def test_flags_left_unset_do_not_override(isolated_home):
    write_config(isolated_home, '[gcp]\nproject = "from-file"\n')
    settings = load_settings({"gcp": {"project": None}})
    assert settings.gcp.project == "from-file"


def test_short_endpoint_variable(monkeypatch):
    monkeypatch.setenv("TPU_CONSOLE_GCP_API_ENDPOINT", "http://127.0.0.1:8470")
    assert load_settings().gcp.api_endpoint == "http://127.0.0.1:8470"


def test_local_provider_can_be_disabled_from_env(monkeypatch):
    monkeypatch.setenv("TPU_CONSOLE_LOCAL__ENABLED", "false")
    assert load_settings().local.enabled is False


def test_ssh_nodes_from_file(isolated_home):
    write_config(
        isolated_home,
        '[[ssh.nodes]]\nname = "lab"\nhosts = ["10.0.0.1", "10.0.0.2:2222"]\nuser = "me"\n',
    )
    (node,) = load_settings().ssh.nodes
    assert node.name == "lab" and node.hosts == ["10.0.0.1", "10.0.0.2:2222"] and node.user == "me"


def test_unknown_key_in_file_is_rejected_by_name(isolated_home):
    write_config(isolated_home, '[gcp]\nprojcet = "typo"\n')
    with pytest.raises(UserError) as info:
        load_settings()
    assert "unknown setting 'gcp.projcet'" in str(info.value)


def test_unknown_top_level_key_is_rejected(isolated_home):
    write_config(isolated_home, 'colour = "blue"\n')
    with pytest.raises(UserError, match="unknown setting 'colour'"):
        load_settings()


def test_unknown_environment_key_is_rejected(monkeypatch):
    monkeypatch.setenv("TPU_CONSOLE_GCP__PROJCET", "typo")
    with pytest.raises(UserError, match="unknown setting 'gcp.projcet'"):
        load_settings()


def test_invalid_toml_names_the_file(isolated_home):
    write_config(isolated_home, "[gcp\n")
    with pytest.raises(UserError, match="is not valid TOML"):
        load_settings()


def test_duplicate_ssh_node_names_are_rejected(isolated_home):
    write_config(
        isolated_home,
        '[[ssh.nodes]]\nname = "a"\nhosts = ["h1"]\n[[ssh.nodes]]\nname = "a"\nhosts = ["h2"]\n',
    )
    with pytest.raises(UserError, match="give each a unique name"):
        load_settings()


def test_wrong_type_names_the_setting(isolated_home):
    write_config(isolated_home, '[local]\nenabled = "maybe"\n')
    with pytest.raises(UserError, match="setting 'local.enabled'"):
        load_settings()
