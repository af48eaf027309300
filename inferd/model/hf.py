"""A Hugging Face model folder: config.json, *.safetensors (single or sharded), tokenizer files.

Safetensors headers are validated here before any tensor is touched (header length, JSON, dtype, shape, byte
ranges inside the file, no overlaps), then tensors are numpy views over a read-only mmap of each file. The
safetensors library's numpy loader is not used for reading because numpy has no bfloat16 (it refuses BF16 files)
and it would copy every tensor; with a validated header, a view is a one-liner.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..text.tokenizer import Tokenizer
from .arch import BLOCK_TENSORS, HF_BLOCK_TENSORS, HF_MODEL_TENSORS, MODEL_TENSORS
from .layers import check_tensors
from .model_config import ModelConfig
from .errors import ModelLoadError
from .tensor import Tensor

# safetensors dtype -> (numpy dtype of the raw array we hand out, inferd type name)
DTYPES = {"BF16": (np.uint16, "BF16"), "F16": (np.uint16, "F16"), "F32": (np.float32, "F32")}
ITEM_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit
INDEX = "model.safetensors.index.json"

# HF name -> GGUF name, from the architecture table
_LAYER_NAMES = {hf: BLOCK_TENSORS[kind][role] for kind, roles in HF_BLOCK_TENSORS.items() for role, hf in roles.items()}
_TOP_NAMES = {hf: MODEL_TENSORS[role] for role, hf in HF_MODEL_TENSORS.items()}


@dataclass
class SafetensorsEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


@dataclass
class HFModel:
    path: str
    config: ModelConfig
    tensors: dict[str, Tensor]  # GGUF names
    tokenizer: Tokenizer
    chat_template: str | None


def gguf_name(hf_name: str) -> str | None:
    """GGUF name for an HF tensor name, or None for a name we do not know."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and parts[3] in _LAYER_NAMES:
        return f"blk.{int(parts[2])}.{_LAYER_NAMES[parts[3]]}"
    return None


def hf_name(name: str) -> str:
    """HF name for a GGUF tensor name (inverse of gguf_name)."""
    for hf, gg in _TOP_NAMES.items():
        if gg == name:
            return hf
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}." + next(hf for hf, gg in _LAYER_NAMES.items() if gg == rest)


def _to_hf_names(message: str) -> str:
    return re.sub(
        r"\b(?:blk\.\d+\.\w+|token_embd|output_norm|output)\.(?:weight|bias)\b", lambda m: hf_name(m.group(0)), message
    )


# The JSON types ModelConfig.from_hf and the tokenizer expect of config.json's keys (absent or null: their
# defaults). Checked first, so that a wrong type is named instead of surfacing as a TypeError deep inside.
_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "architectures": (list,),
    "hidden_size": (int,),
    "intermediate_size": (int,),
    "num_hidden_layers": (int,),
    "num_attention_heads": (int,),
    "num_key_value_heads": (int,),
    "head_dim": (int,),
    "vocab_size": (int,),
    "max_position_embeddings": (int,),
    "sliding_window": (int,),
    "rope_theta": (int, float),
    "rms_norm_eps": (int, float),
    "rope_scaling": (dict,),
    "rope_parameters": (dict,),
    "quantization_config": (dict,),
    "hidden_act": (str,),
    "tie_word_embeddings": (bool,),
    "use_sliding_window": (bool,),
    "attention_bias": (bool,),
    "mlp_bias": (bool,),
    "eos_token_id": (int, list),
    "bos_token_id": (int,),
}
# Each layer has at least this many tensors (norms, q/k/v/o, gate/up/down): a layer count beyond what the
# weights could hold is corrupt, and must be refused before anything loops over the layers.
TENSORS_PER_LAYER = 9


def check_config_types(path: Path, cfg: dict) -> None:
    for key, types in _CONFIG_TYPES.items():
        value = cfg.get(key)
        if value is None:
            continue
        ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
        if ok and isinstance(value, list):
            item = str if key == "architectures" else int
            ok = all(isinstance(v, item) and not isinstance(v, bool) for v in value)
        if not ok:
            names = " or ".join(
                {
                    int: "an integer",
                    float: "a number",
                    str: "a string",
                    bool: "true or false",
                    dict: "an object",
                    list: "a list",
                }[t]
                for t in types
            )
            raise ModelLoadError(path, f"{key} must be {names}, got {json.dumps(value)[:80]}")


def load_hf_dir(path: str | os.PathLike[str]) -> HFModel:
    root = Path(path)
    cfg_path = root / "config.json"
    raw_cfg = _json(cfg_path)
    check_config_types(cfg_path, raw_cfg)
    try:
        config = ModelConfig.from_hf(raw_cfg)
    except (ValueError, TypeError, KeyError, ArithmeticError) as e:  # the values inside rope_scaling & co.
        raise ModelLoadError(cfg_path, str(e) or type(e).__name__) from e

    entries: dict[str, tuple[Path, SafetensorsEntry]] = {}
    for file in safetensors_files(root):
        for entry in read_safetensors_header(file).values():
            if entry.name in entries:
                raise ModelLoadError(file, f"tensor {entry.name} also appears in {entries[entry.name][0].name}")
            entries[entry.name] = (file, entry)

    if config.n_layers * TENSORS_PER_LAYER > len(entries):
        raise ModelLoadError(
            cfg_path,
            f"num_hidden_layers {config.n_layers} needs at least "
            f"{config.n_layers * TENSORS_PER_LAYER} tensors; the weights have "
            f"{len(entries)}",
        )
    wanted: dict[str, tuple[Path, SafetensorsEntry]] = {}
    for hf_name, (file, entry) in entries.items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue  # old checkpoints store the rope table; it is recomputed from rope_theta
        name = gguf_name(hf_name)
        if name is None:
            raise ModelLoadError(file, f"unexpected tensor {hf_name} (not part of a {config.arch} model)")
        if name == "output.weight" and config.tie_embeddings:
            continue  # some tied checkpoints save lm_head anyway; it must equal embed_tokens
        if entry.dtype not in DTYPES:
            raise ModelLoadError(
                file,
                f"tensor {hf_name} has dtype {entry.dtype}, which is not supported (supported: {', '.join(DTYPES)})",
            )
        if not 1 <= len(entry.shape) <= 2:
            raise ModelLoadError(file, f"tensor {hf_name} has shape {list(entry.shape)}; expected 1-D or 2-D")
        wanted[name] = (file, entry)
    try:
        check_tensors(config, {n: _rows_cols(entry.shape) for n, (_, entry) in wanted.items()})
    except ValueError as err:
        raise ModelLoadError(root, _to_hf_names(str(err))) from err

    maps: dict[Path, mmap.mmap] = {}
    tensors = {}
    for name, (file, entry) in wanted.items():
        if file not in maps:
            with open(file, "rb") as f:
                maps[file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        np_dtype, type_name = DTYPES[entry.dtype]
        rows, cols = _rows_cols(entry.shape)
        data = np.frombuffer(maps[file], dtype=np_dtype, count=rows * cols, offset=entry.start).reshape(rows, cols)
        if entry.start % data.itemsize:
            data = data.copy()  # files from old writers may leave tensors unaligned; kernels want aligned rows
        tensors[name] = Tensor(name, type_name, rows, cols, data)

    tokenizer, template = load_hf_tokenizer(root, raw_cfg)
    return HFModel(str(root), config, tensors, tokenizer, template)


def load_hf_tokenizer(root: Path, raw_cfg: dict) -> tuple[Tokenizer, str | None]:
    tok_json = root / "tokenizer.json"
    if not tok_json.is_file():
        raise ModelLoadError(root, "no tokenizer.json (SentencePiece-only tokenizer.model folders are not supported)")
    tcfg_path = root / "tokenizer_config.json"
    gen_path = root / "generation_config.json"
    cfg_eos = raw_cfg.get("eos_token_id")
    extra_eos = cfg_eos if isinstance(cfg_eos, list) else [] if cfg_eos is None else [cfg_eos]
    # the small files are parsed here first so that a broken one is named (tokenizer.json is named below)
    for small in (tcfg_path, gen_path):
        if small.is_file():
            _json(small)
    try:
        tokenizer = Tokenizer.from_hf_files(
            tok_json,
            tcfg_path if tcfg_path.is_file() else None,
            gen_path if gen_path.is_file() else None,
            extra_eos_ids=extra_eos,
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as e:
        # tokenizer files come from strangers: wrong types or absurd nesting are their fault, said plainly
        raise ModelLoadError(tok_json, str(e) or type(e).__name__) from e
    return tokenizer, _chat_template(root, tcfg_path)


def _chat_template(root: Path, tcfg_path: Path) -> str | None:
    """The default chat template: tokenizer_config.json, else chat_template.jinja / chat_template.json."""
    template = _json(tcfg_path).get("chat_template") if tcfg_path.is_file() else None
    if template is None and (root / "chat_template.jinja").is_file():
        template = (root / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None and (root / "chat_template.json").is_file():
        template = _json(root / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ModelLoadError(tcfg_path, "chat_template is neither a string nor a list of named templates")
    return template


def safetensors_files(root: Path) -> list[Path]:
    index = root / INDEX
    if index.is_file():
        weight_map = _json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(index, "weight_map is missing or empty")
        names = sorted(set(weight_map.values()))
        for n in names:
            if not isinstance(n, str) or Path(n).name != n:
                raise ModelLoadError(index, f"weight_map names a file outside the folder: {n!r}")
            if not (root / n).is_file():
                raise ModelLoadError(index, f"shard {n} is missing")
        return [root / n for n in names]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(root, "no *.safetensors weights found")
    if len(files) > 1:
        raise ModelLoadError(root, f"{len(files)} .safetensors files but no {INDEX} saying how they fit together")
    return files


def read_safetensors_header(path: Path) -> dict[str, SafetensorsEntry]:
    """Parse and check a safetensors header; raise ModelLoadError for any inconsistency."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelLoadError(path, f"file is too short to be safetensors ({size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise ModelLoadError(path, f"header length {n} is impossible for a file of {size} bytes")
            raw = f.read(n)
    except OSError as e:
        raise ModelLoadError(path, f"cannot read file: {e.strerror or e}") from e
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(path, f"header is not valid JSON: {e}") from e
    except RecursionError:
        raise ModelLoadError(path, "header is not valid JSON: nested too deeply") from None
    if not isinstance(header, dict):
        raise ModelLoadError(path, "header is not a JSON object")
    base, data_size = 8 + n, size - 8 - n
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _entry(path, name, info, base, data_size)
    spans = sorted((e.start, e.end, e.name) for e in entries.values() if e.end > e.start)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise ModelLoadError(path, f"tensors {a} and {b} overlap")
    return entries


def _entry(path: Path, name: str, info: Any, base: int, data_size: int) -> SafetensorsEntry:
    if not isinstance(info, dict):
        raise ModelLoadError(path, f"header entry for {name} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEM_SIZES:
        raise ModelLoadError(path, f"tensor {name} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ModelLoadError(path, f"tensor {name} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise ModelLoadError(path, f"tensor {name} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise ModelLoadError(
            path,
            f"tensor {name} data_offsets [{begin}, {end}) fall outside the data "
            f"section of {data_size} bytes (file truncated or header corrupt)",
        )
    count = 1
    for d in shape:
        count *= d
    if count * ITEM_SIZES[dtype] != end - begin:
        raise ModelLoadError(
            path,
            f"tensor {name}: {dtype} {shape} needs {count * ITEM_SIZES[dtype]} bytes but "
            f"data_offsets span {end - begin}",
        )
    return SafetensorsEntry(name, dtype, tuple(shape), base + begin, base + end)


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    return (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])


def _json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ModelLoadError(path, "file not found") from None
    except OSError as e:
        raise ModelLoadError(path, f"cannot read file: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(path, f"not valid JSON: {e}") from e
    except RecursionError:
        raise ModelLoadError(path, "not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise ModelLoadError(path, "expected a JSON object")
    return data
