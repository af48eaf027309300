"""Every setting of the daemon, in one msgspec Struct.

Precedence, lowest first: the defaults below < the TOML file (`--config`, else $INFERD_CONFIG, else
/etc/inferd/inferd.toml when it exists) < INFERD_<NAME> environment variables < command-line options.
config/inferd.toml documents each setting with its default; a test keeps it equal to the defaults here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
from typing import Annotated, Any
from collections.abc import Mapping, Sequence

import msgspec
from msgspec import Meta

from inferd.model.sampling_defaults import SOURCES as GENERATION_CONFIGS
from inferd.model.sampling_defaults import parse_overrides

ENV_PREFIX = "INFERD_"
SYSTEM_CONFIG = "/etc/inferd/inferd.toml"

DEFAULT_MODEL = "smollm2-135m-instruct"
DEVICES = ("cpu", "cuda")
QUANTIZE_TARGETS = ("q8_0", "q4_0")
CPU_PATHS = ("scalar", "avx2", "avx512vnni", "avxvnni", "vnni")  # vnni: whichever VNNI the CPU has
CUDA_WEIGHTS = ("auto", "bf16", "int8", "int4", "q8_0")
CUDA_KV = ("f16", "bf16")
KV_CACHE_DTYPES = ("f16", "bf16", "q8_0")
CUDA_GEMMS = ("cublas", "own")
# short options shared by every command that takes the setting
SHORT_FLAGS = {"model": "-m", "threads": "-t", "lora_adapters": "--lora"}

LORA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # an adapter's name, as requests spell it
PosInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]


class ModelSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One model of a many-model daemon (a `[models.NAME]` table): its file and the settings that differ from the
    daemon's. Zero and empty values mean the daemon's own setting (threads: the cores split between the models that
    fit in the memory budget at once)."""

    path: str = ""  # a GGUF file or model folder; empty: the file of this name in models_dir
    aliases: list[str] = []
    threads: NonNegInt = 0
    max_model_len: NonNegInt = 0
    kv_cache_mib: NonNegInt = 0
    num_kv_blocks: NonNegInt = 0
    kv_cache_dtype: str = ""
    quantize: str = ""
    generation_config: str = ""
    override_generation_config: str = ""
    pinned: bool = False  # loaded at start-up, never unloaded when idle nor evicted for another model
    lora_adapters: dict[str, str] = {}  # this model's adapters, as the one-model daemon's setting of that name


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # model
    model: str = DEFAULT_MODEL
    served_model_name: str = ""
    model_cache_dir: str = ""
    quantize: str = ""
    embedding_model: str = ""
    rerank_model: str = ""
    pooling: str = "none"
    rerank_prompt: str = "none"
    lora_adapters: dict[str, str] = {}
    # many models in one daemon (models_dir and/or [models.NAME] tables; empty: the one `model`)
    models_dir: str = ""
    models: dict[str, ModelSpec] = {}
    aliases: dict[str, str] = {}
    idle_unload_s: NonNegFloat = 0.0
    memory_budget_mib: NonNegInt = 0
    model_load_timeout_s: Annotated[float, Meta(gt=0)] = 300.0
    # network and security
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8000
    api_keys: list[str] = []
    api_key_file: str = ""
    max_body_bytes: PosInt = 1_048_576
    max_messages: PosInt = 256
    max_prompt_tokens: NonNegInt = 0
    max_tokens_limit: NonNegInt = 0
    max_n: PosInt = 8
    cors_allowed_origins: list[str] = []
    # structured output, the Responses API
    grammar_compile_timeout_s: Annotated[float, Meta(gt=0)] = 10.0
    responses_store_size: NonNegInt = 1000
    responses_ttl_s: Annotated[float, Meta(gt=0)] = 3600.0
    # engine and scheduler
    device: str = "cpu"
    threads: NonNegInt = 0
    kv_cache_mib: PosInt = 1024
    num_kv_blocks: NonNegInt = 0
    kv_cache_dtype: str = "f16"
    max_batch_tokens: PosInt = 512
    max_prefill_while_decoding: NonNegInt = 256
    max_step_latency_ms: NonNegFloat = 0.0
    step_latency_factor: NonNegFloat = 3.0
    max_running: PosInt = 64
    max_waiting: PosInt = 256
    max_model_len: NonNegInt = 0
    enable_prefix_caching: bool = True
    prompt_cache_disk_mib: NonNegInt = 1024
    prompt_cache_dir: str = ""
    speculative: bool = False
    generation_config: str = "model"
    override_generation_config: str = ""
    chat_template_kwargs: str = ""
    max_thinking_tokens: NonNegInt = 0
    cpu_path: str = ""
    cuda_device: NonNegInt = 0
    cuda_weights: str = "auto"
    cuda_kv: str = "f16"
    cuda_graphs: bool = True
    cuda_pdl: bool = True
    cuda_gemm: str = "cublas"
    # requests and lifecycle
    request_timeout_s: NonNegFloat = 600.0
    sse_keepalive_s: Annotated[float, Meta(gt=0)] = 15.0
    drain_timeout_s: NonNegFloat = 30.0
    drain_delay_s: NonNegFloat = 0.0
    measure_bandwidth: bool = True
    log_level: str = "info"
    log_requests: bool = True

    def __post_init__(self) -> None:
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ValueError(f"log_level must be debug, info, warning, error or critical, got {self.log_level!r}")
        for name, allowed in (
            ("device", DEVICES),
            ("quantize", ("",) + QUANTIZE_TARGETS),
            ("pooling", ("none", "last", "mean")),
            ("rerank_prompt", ("none", "qwen3")),
            ("cpu_path", ("",) + CPU_PATHS),
            ("cuda_weights", CUDA_WEIGHTS),
            ("cuda_kv", CUDA_KV),
            ("kv_cache_dtype", KV_CACHE_DTYPES),
            ("cuda_gemm", CUDA_GEMMS),
            ("generation_config", GENERATION_CONFIGS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                shown = ", ".join(repr(a) if a == "" else a for a in allowed)
                raise ValueError(f"{name} must be one of {shown}; got {value!r}")
        if 0 < self.step_latency_factor < 1:
            raise ValueError(
                f"step_latency_factor must be 0 (off) or at least 1 (a step with prompt tokens beside decodes takes "
                f"at least what the decodes take); got {self.step_latency_factor}"
            )
        for name, path in self.lora_adapters.items():
            if not LORA_NAME.fullmatch(name) or not path:
                raise ValueError(
                    f"lora_adapters: {name!r} = {path!r}: a name of letters, digits, '.', '_' or '-' and a path are "
                    f"needed"
                )
        if self.lora_adapters and self.many_models:
            raise ValueError(
                "lora_adapters are the one model's; in a many-model daemon give each model its own in its "
                '[models.NAME] table (lora_adapters = {name = "path"})'
            )
        if self.override_generation_config.strip():
            parse_overrides(self.override_generation_config)
        self.template_defaults()

    @property
    def many_models(self) -> bool:
        """Serving a folder or a list of models (loaded on demand) rather than the one `model`."""
        return bool(self.models_dir or self.models)

    def template_defaults(self) -> dict[str, Any]:
        """chat_template_kwargs as a dict (raises ValueError naming what is wrong)."""
        if not self.chat_template_kwargs.strip():
            return {}
        try:
            value = json.loads(self.chat_template_kwargs)
        except json.JSONDecodeError as e:
            raise ValueError(f"chat_template_kwargs is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError('chat_template_kwargs must be a JSON object, e.g. {"enable_thinking": false}')
        return value


# One line per setting: shown by `inferd serve --help` and mirrored in config/inferd.toml.
DOCS: dict[str, str] = {
    "model": "Model to serve: a name known to `inferd pull`, a Hugging Face repo id, or a local GGUF file or folder.",
    "served_model_name": "Name clients use in the `model` field; empty means the model's own name.",
    "model_cache_dir": "Where downloaded models are kept; empty means $CACHE_DIRECTORY (systemd) or ~/.cache/inferd.",
    "quantize": "Quantize a float (Hugging Face) model at load time: q8_0 or q4_0; empty keeps the file's types.",
    "embedding_model": (
        "A sentence-transformers folder or an embedding GGUF (bert, gemma-embedding) served at /v1/embeddings beside "
        "the chat model (empty: none)."
    ),
    "rerank_model": "A cross-encoder folder served at /v1/rerank and /v1/score beside the chat model (empty: none).",
    "rerank_prompt": (
        "Let the chat model rerank at /v1/rerank and /v1/score by its yes/no logits: qwen3 (Qwen3-Reranker's "
        "prompt); none: no."
    ),
    "pooling": (
        "Let the chat model embed too at /v1/embeddings: last or mean pooling of its final hidden state, "
        "L2-normalized; none: chat only."
    ),
    "lora_adapters": (
        "LoRA adapters of the chat model by name, each a PEFT folder or a llama.cpp adapter GGUF: NAME=PATH (TOML: a "
        'table {name = "path"}; option --lora NAME=PATH, repeated). Requests choose one with model "base:NAME" or '
        "a lora field."
    ),
    "models_dir": "A folder of models to serve from one daemon, each GGUF file (or model folder) under the name of "
    "its file stem, loaded on the first request that names it; empty: serve `model` alone.",
    "models": "One [models.NAME] table per model to serve by NAME (path, aliases, threads, max_model_len, "
    "kv_cache_mib, num_kv_blocks, kv_cache_dtype, quantize, generation_config, override_generation_config, pinned, "
    "lora_adapters); "
    "a table without a path sets the options of the models_dir file of that name. Env/flag: a JSON object.",
    "aliases": "More names for the models of models_dir and [models], as {alias = name}. Env/flag: a JSON object "
    "or alias=name pairs.",
    "idle_unload_s": "Unload a model no request has used for this many seconds (Ollama's keep_alive overrides it "
    "per request); 0 keeps models loaded until the memory budget needs the room. Pinned models stay.",
    "memory_budget_mib": "Most MiB the loaded models may take together (weights as in their files plus each KV "
    "cache); a load that would not fit first unloads the least recently used idle models. 0 means 80% of the "
    "machine's (or the cgroup's) memory.",
    "model_load_timeout_s": "Seconds a request waits for its model to load before a 503 (the load goes on).",
    "host": "Address to listen on. Keep 127.0.0.1 unless clients on other machines need the API.",
    "port": "TCP port to listen on (0 picks a free one).",
    "api_keys": (
        "Accepted API keys for /v1/*, /tokenize and /detokenize (Authorization: Bearer KEY); empty list "
        "disables auth. Env: comma-separated."
    ),
    "api_key_file": "File with more API keys, one per line (# comments allowed); keeps keys out of the command line.",
    "max_body_bytes": "Largest request body accepted; larger ones get 413.",
    "max_messages": "Most chat messages accepted in one request.",
    "max_prompt_tokens": "Most prompt tokens accepted in one request; 0 means the context length.",
    "max_tokens_limit": "Largest max_tokens a request may ask for; 0 means the context length.",
    "max_n": "Largest `n` (choices per request).",
    "cors_allowed_origins": (
        'Origins browsers may call the API from (e.g. https://app.example.com), or "*" for any; '
        "empty sends no CORS headers. Env: comma-separated."
    ),
    "grammar_compile_timeout_s": (
        "Seconds a request waits for its JSON schema, grammar or tools to compile before a "
        "400 (compiled grammars are cached)."
    ),
    "responses_store_size": (
        "Responses kept for previous_response_id and GET /v1/responses/{id} (the oldest go first); 0 stores none."
    ),
    "responses_ttl_s": "Seconds a stored response is kept.",
    "device": "Where the model runs: cpu, or cuda (an NVIDIA GPU; needs inferd built with nvcc).",
    "threads": "Compute threads; 0 means one per physical core.",
    "kv_cache_mib": (
        "Memory for the KV cache in MiB, a recurrent model's per-sequence states included (when num_kv_blocks is 0)."
    ),
    "num_kv_blocks": "KV cache size in blocks of 64 positions; 0 derives it from kv_cache_mib.",
    "kv_cache_dtype": (
        "KV cache format of the CPU engine: f16; bf16 (attention in bf16 products with float sums, about twice as "
        "fast at depth on CPUs with AVX-512 BF16); or q8_0 (int8 with a scale per 32 values: about twice the "
        "positions in the same kv_cache_mib, half the bytes attention reads; perplexity within half a percent of f16)."
    ),
    "max_batch_tokens": "Token budget of one engine step (decode tokens plus prefill chunks).",
    "max_prefill_while_decoding": "Most prompt tokens one step takes while other sequences are generating, so "
    "their streams keep their pace; 0 means the whole max_batch_tokens.",
    "max_step_latency_ms": "While sequences are generating, cut prompt chunks so a step should end within this "
    "many milliseconds (from the measured cost of recent steps; at least 16 prompt tokens a step); 0 means "
    "step_latency_factor bounds them instead.",
    "step_latency_factor": "While sequences are generating, cut prompt chunks so a step should take at most this "
    "many times a step of the decodes alone (from the measured cost of recent steps; at least 16 prompt tokens a "
    "step): a stream's slowest tokens come about this much later than its usual ones. max_step_latency_ms, when "
    "set, replaces it; both 0 means only max_prefill_while_decoding bounds the chunks.",
    "generation_config": "Sampling for the fields a request leaves out: model (what the model file recommends, "
    "else llama.cpp's temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), llama.cpp (those, whatever the file "
    "says) or openai (temperature 1, nothing truncated).",
    "override_generation_config": "A JSON object of sampling defaults over generation_config's, e.g. "
    '{"temperature": 0.7, "top_k": 20} (fields: temperature, top_k, top_p, min_p, repetition_penalty).',
    "chat_template_kwargs": "A JSON object of variables for the chat template of every request, e.g. "
    '{"enable_thinking": false}; a request\'s own chat_template_kwargs win key by key.',
    "max_thinking_tokens": "Most tokens a reasoning model may think before the end of its thinking is forced "
    "and it answers (a request's max_thinking_tokens overrides it); 0 means no limit.",
    "max_running": "Most sequences generating at once.",
    "max_waiting": "Most requests queued before new ones get 503 with Retry-After.",
    "max_model_len": "Context length to serve; 0 means the model's own (capped by the KV cache size).",
    "enable_prefix_caching": (
        "Reuse the KV cache of shared prompt prefixes between requests, to the token (device = cpu; whole blocks "
        "of 64 positions on cuda and for models with recurrent layers)."
    ),
    "prompt_cache_disk_mib": "Most MiB of prefix-cache blocks written to disk at shutdown and read back as cache "
    "hits by the next run (most recently hit first); also the cap of one named save. 0 turns the disk cache off. "
    "device = cpu only (off on cuda).",
    "prompt_cache_dir": "Folder of the prompt cache on disk; empty means .prompt-cache in the model cache folder "
    "(see model_cache_dir).",
    "cpu_path": (
        "Force a CPU kernel path (scalar, avx2, avx512vnni, avxvnni, vnni); empty picks the best this CPU "
        "runs. All paths give bit-identical results."
    ),
    "cuda_device": "Index of the GPU to use with device = cuda.",
    "cuda_weights": (
        "Weight format on the GPU: auto (the file's where a kernel reads it, else bf16), bf16, int8, int4 or q8_0."
    ),
    "cuda_kv": "KV cache format on the GPU: f16 or bf16.",
    "cuda_graphs": "Capture each decode step as a CUDA graph and replay it (off runs the same kernels eagerly).",
    "cuda_pdl": "Programmatic dependent launch between kernels of a captured graph.",
    "cuda_gemm": "Prefill matrix products on the GPU: cublas, or own (inferd's tensor-core kernel).",
    "speculative": (
        "Prompt-lookup speculative decoding for every request (same output, faster on repetitive text); a "
        "request's `speculative` field overrides it."
    ),
    "request_timeout_s": "A request still unfinished after this many seconds fails with 504; 0 disables.",
    "sse_keepalive_s": "Seconds between `: ping` comments on a stream that is waiting for tokens.",
    "drain_timeout_s": "On SIGTERM, seconds to let running requests finish before closing them.",
    "drain_delay_s": (
        "On SIGTERM, seconds /health answers 503 while new requests are still served, so a load balancer "
        "takes the replica out before it stops listening (more than its check interval x fall count); 0 "
        "stops listening at once."
    ),
    "measure_bandwidth": "Measure memory read bandwidth at start-up (for the bandwidth-utilisation metric).",
    "log_level": "Logging level: debug, info, warning, error or critical.",
    "log_requests": "Log one line per request (id, tokens in/out, cached, TTFT, tokens/s).",
}


class ConfigError(ValueError):
    """A setting could not be read; the message names its source (file, variable or option)."""


def field_types() -> dict[str, Any]:
    info = msgspec.inspect.type_info(Settings)
    assert isinstance(info, msgspec.inspect.StructType)
    return {f.name: f.type for f in info.fields}


def _is_list(t: Any) -> bool:
    return isinstance(t, msgspec.inspect.ListType)


def _is_dict(t: Any) -> bool:
    return isinstance(t, msgspec.inspect.DictType)


def _is_bool(t: Any) -> bool:
    return isinstance(t, msgspec.inspect.BoolType)


def _python_type(t: Any) -> type:
    return {msgspec.inspect.IntType: int, msgspec.inspect.FloatType: float, msgspec.inspect.BoolType: bool}.get(
        type(t), str
    )


def _parse_text(name: str, text: str, source: str) -> Any:
    """A setting's value from a string (environment variable or command-line option)."""
    t = field_types()[name]
    if _is_dict(t):  # a JSON object, or NAME=VALUE pairs, comma-separated
        if text.lstrip().startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{source}: expected a JSON object: {e}") from None
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: expected a JSON object, got {text!r}")
            return value
        out = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise ConfigError(f"{source}: expected a JSON object or NAME=VALUE, got {part!r}")
            out[key.strip()] = value.strip()
        return out
    if _is_list(t):
        return [part.strip() for part in text.split(",") if part.strip()]
    if _is_bool(t):
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{source}: expected true or false, got {text!r}")
    try:
        return _python_type(t)(text)
    except ValueError:
        raise ConfigError(f"{source}: expected {_python_type(t).__name__}, got {text!r}") from None


def read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config file {path}: {e}") from None
    fields = field_types()
    for key in data:
        if key not in fields:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
    try:
        msgspec.convert(data, Settings)  # types and ranges, with the file's name in the message
    except (msgspec.ValidationError, ValueError) as e:
        raise ConfigError(f"config file {path}: {e}") from None
    return data


def read_env(env: Mapping[str, str]) -> dict[str, Any]:
    fields = field_types()
    out: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX + "CONFIG":
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name not in fields:
            continue  # INFERD_CUDA (a build switch) and friends are not settings
        out[name] = _parse_text(name, value, key)
    return out


def add_arguments(parser: argparse.ArgumentParser, names: Sequence[str] | None = None) -> None:
    """One option per setting (--max-batch-tokens ...), or per setting in `names`; unset options stay None so
    lower layers show."""
    defaults = Settings()
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"TOML settings file (default: $INFERD_CONFIG, else {SYSTEM_CONFIG} if present)",
    )
    for name, t in field_types().items():
        if names is not None and name not in names:
            continue
        flags = ["--" + name.replace("_", "-")] + ([SHORT_FLAGS[name]] if name in SHORT_FLAGS else [])
        default = getattr(defaults, name)
        shown = ",".join(default) if isinstance(default, list) else default
        if _is_dict(t):  # repeatable: --lora a=PATH --lora b=PATH; or a JSON object
            dict_help = f"{DOCS[name]} (env {ENV_PREFIX}{name.upper()}=NAME=VALUE,...)".replace("%", "%%")
            parser.add_argument(*flags, dest=name, metavar="NAME=VALUE", action="append", default=None, help=dict_help)
            continue
        help_text = f"{DOCS[name]} (default: {shown!r}; env {ENV_PREFIX}{name.upper()})".replace("%", "%%")
        if _is_bool(t):
            parser.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(*flags, dest=name, metavar=name.upper(), default=None, help=help_text)


def load_settings(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    merged: dict[str, Any] = {}
    path = getattr(args, "config", None) or env.get(ENV_PREFIX + "CONFIG")
    if path:
        merged.update(read_toml(path))
    elif os.path.exists(SYSTEM_CONFIG):
        merged.update(read_toml(SYSTEM_CONFIG))
    merged.update(read_env(env))
    if args is not None:
        for name in field_types():
            value = getattr(args, name, None)
            if value is None:
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, list) and _is_dict(field_types()[name]):  # a repeated option's objects, merged
                merged[name] = {k: v for text in value for k, v in _parse_text(name, text, flag).items()}
                continue
            if isinstance(value, list):  # a repeated option's values
                value = ",".join(value)
            merged[name] = value if isinstance(value, bool) else _parse_text(name, value, flag)
    try:
        return msgspec.convert(merged, Settings)
    except (msgspec.ValidationError, ValueError) as e:
        raise ConfigError(f"invalid settings: {e}") from None


def read_api_keys(settings: Settings) -> list[str]:
    keys = [k for k in settings.api_keys if k]
    if settings.api_key_file:
        try:
            with open(settings.api_key_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise ConfigError(f"api_key_file {settings.api_key_file}: {e.strerror}") from None
        keys += [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    return keys


def describe(settings: Settings, hide: Sequence[str] = ("api_keys",)) -> dict[str, Any]:
    """Settings as a dict for logging, secrets masked."""
    out = msgspec.structs.asdict(settings)
    for name in hide:
        if out.get(name):
            out[name] = "***"
    return out
