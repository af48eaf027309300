"""`device` (cpu|cuda) and `speculative` settings, and the error when CUDA cannot be used: one clear line naming
the reason, from the settings, `inferd serve`, `inferd generate`/`perplexity` and a running server's /health."""

import argparse
import sys
import urllib.error
import urllib.request

import pytest

from inferd.config import ConfigError, Settings, add_arguments, load_settings
from inferd.engine.device import DeviceError, check_device, engine_class


def cuda_usable() -> bool:
    try:
        check_device("cuda")
        return True
    except DeviceError:
        return False


no_gpu = pytest.mark.skipif(cuda_usable(), reason="this machine has a usable GPU")


def parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_settings_device_and_speculative():
    assert Settings().device == "cpu" and Settings().speculative is False
    s = load_settings(parse([]), {"INFERD_DEVICE": "cuda", "INFERD_SPECULATIVE": "1"})
    assert s.device == "cuda" and s.speculative is True
    s = load_settings(parse(["--device", "cpu", "--no-speculative"]), {"INFERD_DEVICE": "cuda",
                                                                       "INFERD_SPECULATIVE": "1"})
    assert s.device == "cpu" and s.speculative is False
    with pytest.raises(ConfigError, match="device must be one of cpu, cuda; got 'gpu'"):
        load_settings(parse(["--device", "gpu"]), {})


def test_cpu_engine_class():
    from inferd.engine.engine import Engine
    assert engine_class("cpu") is Engine


@no_gpu
def test_cuda_without_a_device_names_the_reason():
    with pytest.raises(DeviceError) as e:
        engine_class("cuda")
    msg = str(e.value)
    assert msg.startswith("--device cuda: ")
    assert "no CUDA device is visible" in msg or "built without its CUDA backend" in msg or "runtime" in msg


def fake_cuda_module(monkeypatch, module):
    import inferd
    monkeypatch.delattr(inferd, "_cuda", raising=False)        # an earlier import left it on the package
    monkeypatch.setitem(sys.modules, "inferd._cuda", module)   # None: `from inferd import _cuda` fails


def test_cuda_backend_not_built(monkeypatch):
    fake_cuda_module(monkeypatch, None)
    with pytest.raises(DeviceError, match="inferd was built without its CUDA backend"):
        check_device("cuda")


def test_cuda_no_device(monkeypatch):
    import types
    fake_cuda_module(monkeypatch, types.SimpleNamespace(device_count=lambda: 0))
    with pytest.raises(DeviceError, match="no CUDA device is visible"):
        check_device("cuda")


@no_gpu
@pytest.mark.parametrize("argv", [["generate", "--device", "cuda", "Hello"],
                                  ["perplexity", "--device", "cuda", "-f", "/nonexistent.txt"]])
def test_cli_generate_and_perplexity_fail_in_one_line(argv, capsys, monkeypatch):
    from inferd import cli
    monkeypatch.setattr("inferd.model.pull.resolve", lambda *a, **k: pytest.fail("the model must not be loaded"))
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("inferd: error: --device cuda: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@no_gpu
def test_serve_fails_before_listening(capsys):
    from inferd.server.main import serve_main
    assert serve_main(["--device", "cuda", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("inferd serve: error: --device cuda: ") and "Traceback" not in err


@no_gpu
def test_server_health_reports_the_device_error(make_server):
    srv = make_server(device="cuda", wait_ready=False)
    srv.call(srv.state.ready_event.wait())
    assert srv.state.status == "failed"
    assert srv.state.failure.startswith("--device cuda: ")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(srv.url + "/health", timeout=10)
    assert e.value.code == 503 and b"--device cuda" in e.value.read()
