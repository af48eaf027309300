"""GGUFs made from sentence-transformers folders by llama.cpp's own converter (convert_hf_to_gguf.py from its
source tree, which needs torch), for the tests that check a GGUF embeds like the folder it came from.

    python -m tests.model.make_embedding_gguf FOLDER OUT.gguf [f32|f16|q8_0]

The converter is looked for in $INFERD_LLAMA_CPP, else ~/.cache/inferd-peers/llama.cpp-*; Dense layers
(EmbeddingGemma's) are converted too (--sentence-transformers-dense-modules).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def converter() -> Path | None:
    roots = [Path(os.environ["INFERD_LLAMA_CPP"])] if os.environ.get("INFERD_LLAMA_CPP") else \
        sorted((Path.home() / ".cache" / "inferd-peers").glob("llama.cpp-*"))
    for root in reversed(roots):
        if (root / "convert_hf_to_gguf.py").is_file():
            return root / "convert_hf_to_gguf.py"
    return None


def why_not() -> str | None:
    """None when a conversion can run here, else the reason it cannot."""
    if converter() is None:
        return "llama.cpp's convert_hf_to_gguf.py not found (set INFERD_LLAMA_CPP to its source tree)"
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return f"llama.cpp's converter needs torch and transformers: {e}"
    return None


def convert(folder: Path, out: Path, outtype: str = "f32") -> Path:
    script = converter()
    assert script is not None, why_not()
    env = {**os.environ, "PYTHONPATH": str(script.parent / "gguf-py")}   # the converter's own gguf-py
    cmd = [sys.executable, str(script), str(folder), "--outfile", str(out), "--outtype", outtype,
           "--sentence-transformers-dense-modules"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-4000:]}")
    return out


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "f32")
