"""inferd/model/sampling_defaults.py: a request's missing sampling fields come from the model file, else
llama.cpp's defaults, with the settings over both."""

import json

import pytest

from inferd.config import Settings
from inferd.model import sampling_defaults as sd
from inferd.model.loader import load_model
from tests.model.make_tiny import write_tiny_gguf


def test_the_gguf_keys_the_file_has_are_its_recommendation():
    md = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.top_p": 0.95,
          "general.sampling.mirostat": 0, "general.sampling.min_p": "x", "general.name": "m"}
    assert sd.from_gguf(md) == {"temperature": 0.6, "top_k": 20.0, "top_p": 0.95}


def test_a_folder_recommends_what_its_generation_config_says(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05, "bos": 1}))
    assert sd.from_hf_folder(tmp_path) == {"temperature": 0.7, "top_k": 20.0, "top_p": 0.8,
                                           "repetition_penalty": 1.05}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7}))
    assert sd.from_hf_folder(tmp_path) == {"temperature": 0.0}   # greedy
    (tmp_path / "generation_config.json").write_text("not json")
    assert sd.from_hf_folder(tmp_path) == {}
    assert sd.from_hf_folder(tmp_path / "absent") == {}


def test_without_a_recommendation_the_defaults_are_llama_cpps():
    d = sd.resolve("model", {})
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.repetition_penalty) == (0.8, 40, 0.95, 0.05, 1.0)
    assert d.source == "llama.cpp"


def test_the_models_recommendation_goes_over_llama_cpps_and_the_settings_over_both():
    d = sd.resolve("model", {"temperature": 0.6, "top_k": 20.0})
    assert (d.temperature, d.top_k, d.top_p, d.min_p) == (0.6, 20, 0.95, 0.05) and d.source == "model"
    assert isinstance(d.top_k, int)
    d = sd.resolve("model", {"temperature": 0.6}, '{"temperature": 0.2, "min_p": 0}')
    assert (d.temperature, d.min_p, d.source) == (0.2, 0.0, "model + settings")
    d = sd.resolve("llama.cpp", {"temperature": 0.6})   # the file is not asked
    assert d.temperature == 0.8 and d.source == "llama.cpp"
    d = sd.resolve("openai", {"temperature": 0.6})
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.source) == (1.0, 0, 1.0, 0.0, "openai")


def test_a_recommendation_the_sampler_cannot_take_is_left_out():
    d = sd.resolve("model", {"top_p": 0.0, "top_k": -1.0, "temperature": 0.5})
    assert (d.top_p, d.top_k, d.temperature) == (0.95, 40, 0.5)


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ("[1]", "must be a JSON object"),
    ('{"temp": 1}', "unknown field 'temp'"),
    ('{"top_p": 0}', r"top_p must be in \(0, 1\]"),
    ('{"top_k": 2.5}', "top_k must be 0 \\(off\\) or a positive whole number"),
    ('{"temperature": "hot"}', "temperature must be between 0 and 100"),
])
def test_bad_overrides_are_refused_with_the_field_named(text, message):
    with pytest.raises(ValueError, match=message):
        sd.resolve("model", {}, text)
    with pytest.raises(ValueError, match=message):
        Settings(override_generation_config=text)


def test_the_setting_names_its_choices():
    with pytest.raises(ValueError, match="generation_config must be one of model, llama.cpp, openai"):
        Settings(generation_config="vllm")


def test_a_loaded_gguf_carries_its_recommendation(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", sampling={"temp": 0.6, "top_k": 20, "top_p": 0.9})
    assert load_model(path).sampling == {"temperature": pytest.approx(0.6), "top_k": 20.0,
                                         "top_p": pytest.approx(0.9)}
    assert load_model(write_tiny_gguf(tmp_path / "plain.gguf")).sampling == {}
