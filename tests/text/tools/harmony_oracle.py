"""openai-harmony, OpenAI's own harmony parser, as the reference for inferd's: its encoding needs the o200k_base
vocabulary, which it downloads on first use; offline it is rebuilt here from the copy that the `quicktok-v1`
package ships (its binary list of byte strings and ranks, written back as tiktoken's text file), and
openai-harmony itself checks the file's sha256 against the published one before it loads it."""

from __future__ import annotations

import base64
import os
import struct
from pathlib import Path
from typing import Any


def harmony_encoding(cache: Path) -> Any:
    """The gpt-oss harmony encoding, or raises ImportError/FileNotFoundError when it cannot be had here."""
    import openai_harmony  # noqa: F401  (ImportError: not installed)

    target = cache / "o200k_base.tiktoken"
    if not target.exists():
        target.write_bytes(_tiktoken_text(_quicktok_vocab()))
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(cache)
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def _quicktok_vocab() -> bytes:
    import importlib.util

    spec = importlib.util.find_spec("quicktok")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("quicktok-v1 is not installed")
    return (Path(spec.origin).parent / "data" / "o200k.vocab").read_bytes()


def _tiktoken_text(vocab: bytes) -> bytes:
    """quicktok's layout: u32 count, then per token a u16 length, its bytes and a u32 rank (little-endian)."""
    (count,) = struct.unpack_from("<I", vocab, 0)
    at, lines = 4, []
    for _ in range(count):
        (n,) = struct.unpack_from("<H", vocab, at)
        piece = vocab[at + 2 : at + 2 + n]
        (rank,) = struct.unpack_from("<I", vocab, at + 2 + n)
        at += 6 + n
        lines.append(base64.b64encode(piece) + b" " + str(rank).encode())
    return b"\n".join(lines) + b"\n"
