import argparse
import pathlib

import msgspec
import pytest

from inferd.config import (DOCS, ConfigError, Settings, add_arguments, describe, field_types, load_settings,
                           read_api_keys, read_toml)

REPO = pathlib.Path(__file__).resolve().parents[2]


def parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_shipped_toml_documents_every_setting_with_its_default(tmp_path):
    path = REPO / "config" / "inferd.toml"
    data = read_toml(str(path))
    assert sorted(data) == sorted(field_types())
    assert msgspec.convert(data, Settings) == Settings()
    text = path.read_text()
    for name in field_types():
        assert f"\n{name} = " in text
    assert sorted(DOCS) == sorted(field_types())


def test_precedence_file_then_env_then_command_line(tmp_path):
    cfg = tmp_path / "inferd.toml"
    cfg.write_text('port = 9001\nmax_running = 5\nhost = "0.0.0.0"\nenable_prefix_caching = false\n')
    env = {"INFERD_CONFIG": str(cfg), "INFERD_PORT": "9002", "INFERD_MAX_BATCH_TOKENS": "256",
           "INFERD_API_KEYS": "a, b", "INFERD_CPU_PATH": "scalar"}
    s = load_settings(parse(["--port", "9003"]), env)
    assert s.port == 9003                  # command line beats env and file
    assert s.max_batch_tokens == 256       # env beats default
    assert s.max_running == 5              # file beats default
    assert s.host == "0.0.0.0"
    assert s.api_keys == ["a", "b"]
    assert s.enable_prefix_caching is False
    s = load_settings(parse(["--enable-prefix-caching"]), env)
    assert s.enable_prefix_caching is True
    assert s.port == 9002
    # --config beats INFERD_CONFIG
    other = tmp_path / "other.toml"
    other.write_text("port = 7000\n")
    assert load_settings(parse(["--config", str(other)]), {"INFERD_CONFIG": str(cfg)}).port == 7000


def test_defaults_without_any_source():
    if pathlib.Path("/etc/inferd/inferd.toml").exists():
        pytest.skip("this machine has a system-wide config")
    assert load_settings(parse([]), {}) == Settings()


@pytest.mark.parametrize("content, message", [
    ("port = 'x'\n", "Expected `int`, got `str` - at `$.port`"),
    ("port = 70000\n", "Expected `int` <= 65535 - at `$.port`"),
    ("max_running = 0\n", "Expected `int` >= 1 - at `$.max_running`"),
    ("colour = 1\n", "unknown setting 'colour'"),
    ("port = \n", "Invalid value"),
    ("log_level = 'loud'\n", "log_level must be debug, info"),
    ("step_latency_factor = 0.5\n", "step_latency_factor must be 0 (off) or at least 1"),
])
def test_bad_file_names_file_and_field(tmp_path, content, message):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    with pytest.raises(ConfigError) as e:
        load_settings(parse(["--config", str(cfg)]), {})
    assert str(cfg) in str(e.value)
    assert message in str(e.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="config file /nonexistent.toml does not exist"):
        load_settings(parse(["--config", "/nonexistent.toml"]), {})


@pytest.mark.parametrize("env, message", [
    ({"INFERD_PORT": "eighty"}, "INFERD_PORT: expected int, got 'eighty'"),
    ({"INFERD_LOG_REQUESTS": "maybe"}, "INFERD_LOG_REQUESTS: expected true or false, got 'maybe'"),
    ({"INFERD_MAX_N": "0"}, "Expected `int` >= 1 - at `$.max_n`"),
])
def test_bad_env(env, message):
    with pytest.raises(ConfigError) as e:
        load_settings(parse([]), env)
    assert message in str(e.value)


def test_bad_option():
    with pytest.raises(ConfigError, match="--threads: expected int, got 'many'"):
        load_settings(parse(["--threads", "many"]), {})


def test_help_lists_every_setting(capsys):
    p = argparse.ArgumentParser()
    add_arguments(p)
    help_text = p.format_help()
    for name in field_types():
        assert "--" + name.replace("_", "-") in help_text
    assert "INFERD_MAX_BATCH_TOKENS" in " ".join(help_text.split())


def test_api_keys_from_file_and_masked_in_description(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# ops team\nkey-one\n\n  key-two  \n")
    s = load_settings(parse(["--api-keys", "cli-key", "--api-key-file", str(f)]), {})
    assert read_api_keys(s) == ["cli-key", "key-one", "key-two"]
    assert describe(s)["api_keys"] == "***"
    s = load_settings(parse(["--api-key-file", str(tmp_path / "none")]), {})
    with pytest.raises(ConfigError, match="No such file"):
        read_api_keys(s)


def test_lora_adapters_from_file_env_and_repeated_option(tmp_path):
    cfg = tmp_path / "inferd.toml"
    cfg.write_text('[lora_adapters]\nsql = "/srv/adapters/sql"\n')
    assert load_settings(parse(["--config", str(cfg)]), {}).lora_adapters == {"sql": "/srv/adapters/sql"}
    env = {"INFERD_LORA_ADAPTERS": "a=/x/a, b=/x/b.gguf"}
    assert load_settings(parse([]), env).lora_adapters == {"a": "/x/a", "b": "/x/b.gguf"}
    s = load_settings(parse(["--lora", "c=/x/c", "--lora-adapters", "d=/x/d"]), env)
    assert s.lora_adapters == {"c": "/x/c", "d": "/x/d"}     # the command line replaces the environment's
    with pytest.raises(ConfigError, match="expected a JSON object or NAME=VALUE"):
        load_settings(parse(["--lora", "nameless"]), {})
    with pytest.raises(ConfigError, match="a name of letters, digits"):
        load_settings(parse(["--lora", "a:b=/x"]), {})
