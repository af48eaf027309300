"""The catalog of a many-model daemon read from real files: names from a folder (GGUF stems, model folders, the
first part of a split GGUF), [models.NAME] tables and aliases, each model's own settings, its memory estimate, and
the settings' errors named plainly."""

from __future__ import annotations

import json

import pytest

from inferd.config import ConfigError, ModelSpec, Settings, load_settings
from inferd.server.catalog import MIB, alias_table, build_catalog, scan_folder
from inferd.server.main import build_parser
from tests.model.make_tiny import TinySpec, write_tiny_gguf


@pytest.fixture
def folder(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_gguf(models / "alpha.gguf", TinySpec())
    (models / "big-00001-of-00002.gguf").write_bytes(b"x" * 1000)
    (models / "big-00002-of-00002.gguf").write_bytes(b"y" * 3000)
    hf = models / "hf-model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"z" * 500)
    (models / "no-config").mkdir()
    (models / ".prompt-cache").mkdir()
    (models / "readme.md").write_text("")
    return models


def test_a_folder_names_each_model_by_its_stem(folder):
    found = scan_folder(str(folder))
    assert sorted(found) == ["alpha", "big", "hf-model"]
    assert found["big"].endswith("big-00001-of-00002.gguf")


def test_each_model_gets_its_own_settings_and_estimate(folder, tmp_path):
    s = Settings(
        models_dir=str(folder),
        kv_cache_mib=32,
        threads=2,
        prompt_cache_dir=str(tmp_path / "pc"),
        models={"alpha": ModelSpec(kv_cache_mib=8, threads=1, kv_cache_dtype="q8_0", pinned=True)},
    )
    catalog = build_catalog(s)
    alpha, big, hf = catalog["alpha"], catalog["big"], catalog["hf-model"]
    assert alpha.settings.threads == 1 and alpha.settings.kv_cache_dtype == "q8_0"
    assert alpha.estimate_bytes == (folder / "alpha.gguf").stat().st_size + 8 * MIB
    assert big.settings.threads == 2 and big.settings.kv_cache_mib == 32
    assert big.weights_bytes == 4000  # both parts
    assert hf.weights_bytes == 500
    assert alpha.settings.served_model_name == "alpha" and alpha.settings.model == str(folder / "alpha.gguf")
    assert alpha.settings.prompt_cache_dir == str(tmp_path / "pc" / "alpha")  # a folder per model
    assert not alpha.settings.many_models  # a model's own settings serve that one model


def test_aliases_point_at_models_and_never_hide_one(folder):
    s = Settings(models_dir=str(folder), aliases={"chat": "alpha"}, models={"alpha": ModelSpec(aliases=["a1"])})
    catalog = build_catalog(s)
    assert alias_table(s, catalog) == {"chat": "alpha", "a1": "alpha"}
    with pytest.raises(ConfigError, match="alias 'x' names 'nothing'"):
        alias_table(Settings(models_dir=str(folder), aliases={"x": "nothing"}), catalog)
    with pytest.raises(ConfigError, match="alias 'big' is already the name of a model"):
        alias_table(Settings(models_dir=str(folder), aliases={"big": "alpha"}), catalog)


@pytest.mark.parametrize(
    "models, message",
    [
        ({"ghost": ModelSpec()}, r"\[models.ghost\] has no file ghost.gguf or folder ghost in models_dir"),
        ({"x": ModelSpec(path="/nonexistent.gguf")}, r"\[models.x\]: path /nonexistent.gguf does not exist"),
        ({"alpha": ModelSpec(kv_cache_dtype="q4")}, r"\[models.alpha\]: kv_cache_dtype must be one of"),
    ],
)
def test_bad_tables_are_named(folder, models, message):
    with pytest.raises(ConfigError, match=message):
        build_catalog(Settings(models_dir=str(folder), models=models))


def test_tables_from_file_env_and_flag(tmp_path, folder):
    cfg = tmp_path / "inferd.toml"
    cfg.write_text(f'models_dir = "{folder}"\nidle_unload_s = 5\n\n[models.alpha]\nthreads = 3\npinned = true\n')
    s = load_settings(build_parser().parse_args(["--config", str(cfg)]), {})
    assert s.many_models and s.models["alpha"] == ModelSpec(threads=3, pinned=True) and s.idle_unload_s == 5
    env = {"INFERD_CONFIG": str(cfg), "INFERD_ALIASES": json.dumps({"chat": "alpha"})}
    args = build_parser().parse_args(["--models", json.dumps({"beta": {"path": str(folder / "alpha.gguf")}})])
    s = load_settings(args, env)
    assert s.aliases == {"chat": "alpha"} and list(s.models) == ["beta"]
    assert load_settings(None, {"INFERD_ALIASES": "chat=alpha, code=beta"}).aliases == {"chat": "alpha", "code": "beta"}
    with pytest.raises(ConfigError, match="INFERD_ALIASES: expected a JSON object or NAME=VALUE"):
        load_settings(None, {"INFERD_ALIASES": "chat"})
    with pytest.raises(ConfigError, match="INFERD_ALIASES: expected a JSON object"):
        load_settings(None, {"INFERD_ALIASES": '{"chat": '})
    assert not Settings().many_models  # `inferd serve PATH` stays the one-model daemon


def test_the_systemd_drop_in_sets_real_settings():
    from pathlib import Path

    from inferd.config import read_env

    conf = Path(__file__).resolve().parents[2] / "systemd" / "inferd.service.d" / "models-folder.conf"
    env = dict(
        line.removeprefix("Environment=").split("=", 1)
        for line in conf.read_text().splitlines()
        if line.startswith("Environment=")
    )
    values = read_env(env)
    assert sorted(values) == sorted(k.removeprefix("INFERD_").lower() for k in env)  # every one is a setting
    assert Settings(**values).many_models and values["models_dir"] == "/srv/inferd/models"


def test_threads_are_split_between_the_models_that_fit_at_once(folder):
    from inferd.engine.engine import physical_cores
    from inferd.server.catalog import most_loaded_at_once

    assert most_loaded_at_once([30, 10, 20], 35) == 2  # the two smallest
    assert most_loaded_at_once([50], 35) == 1
    # each model ~16 MiB (its KV cache): a 40 MiB budget holds two of the three at once
    s = Settings(models_dir=str(folder), kv_cache_mib=16, memory_budget_mib=40, models={"big": ModelSpec(threads=7)})
    catalog = build_catalog(s)
    assert catalog["alpha"].settings.threads == catalog["hf-model"].settings.threads == max(1, physical_cores() // 2)
    assert catalog["big"].settings.threads == 7
    assert build_catalog(Settings(models_dir=str(folder), threads=5))["alpha"].settings.threads == 5
