"""Writers for tiny random models, as GGUF files and as Hugging Face folders, each with a small working tokenizer.

Usage (from any test):  from tests.model.make_tiny import make_variant, VARIANTS
    path = make_variant("llama-gguf-q8_0", tmp_path)      # a .gguf file or an HF folder
Or build your own:       write_tiny_gguf(path, TinySpec(...), weight_type="Q4_0")
                         write_tiny_hf(folder, TinySpec(...), dtype="bf16", shards=2)

Same spec + seed => same weights in both formats: the GGUF writer permutes Wq/Wk exactly like llama.cpp's
converter (llama arch only), so an HF folder (rope_neox=True) and a GGUF (rope_neox=False) of one spec are the same
model, and the engine can be checked on both. Weights are drawn per tensor from a generator seeded by (seed, name).
Quantized GGUF types come from gguf.quants (bit-exact with llama.cpp); K-quant tensors are random valid blocks
(gguf.quants cannot quantize K-quants) with small finite scales.
"""
from __future__ import annotations

import json
import random
import struct
import zlib
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, RopeScalingType, TokenType
from gguf import quants as gguf_quants
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from tests.model.kquant_ref import LANE_TYPES, random_blocks

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA2_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                   "{{ '[INST] ' + message['content'] + ' [/INST]' }}"
                   "{% else %}{{ ' ' + message['content'] + eos_token }}"
                   "{% endif %}{% endfor %}")
HYBRIDS = ("qwen35", "qwen35moe", "qwen3next")   # Gated DeltaNet beside gated attention
BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (as in SmolLM2)
SPM_SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 (as in Llama 2)
_HF_ARCH = {"llama": ("LlamaForCausalLM", "llama"), "mistral": ("MistralForCausalLM", "mistral"),
            "qwen2": ("Qwen2ForCausalLM", "qwen2"), "qwen3": ("Qwen3ForCausalLM", "qwen3")}


@dataclass(frozen=True)
class TinySpec:
    # llama | mistral | qwen2 (q/k/v biases) | qwen3 (QK-norm) | gemma3; GGUF only: the mixtures of experts qwen3moe,
    # qwen2moe (with a shared expert), olmoe (QK-norm over all of q and k), llama with n_experts (Mixtral), and
    # gpt-oss (sinks, biases everywhere, clamped SwiGLU, every other layer a sliding window, YaRN)
    arch: str = "llama"
    vocab_size: int = 512
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 2
    n_kv_heads: int = 1
    head_dim: int = 64
    hidden_dim: int = 192
    context_length: int = 512
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # llama3 keys
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    tokenizer: str = "bpe"  # bpe (byte-level, like SmolLM2/Qwen2) | spm (SentencePiece-style, like Llama 2)
    sliding_window: int = 0  # gemma3: the local layers' window (every 6th layer is global, as in Gemma 3)
    n_experts: int = 0  # > 0: a mixture of experts (hidden_dim is then each expert's width)
    n_experts_used: int = 0
    shared_expert_dim: int = 0  # qwen2moe: its shared expert's width
    # qwen35: every full_attention_interval-th layer gated attention (RoPE on rope_dims of each head), the others
    # Gated DeltaNet with ssm_k_heads key heads and ssm_v_heads value heads of ssm_head values, conv kernel ssm_conv
    rope_dims: int = 0
    full_attention_interval: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    ssm_head: int = 0
    ssm_conv: int = 0
    yarn: tuple[float, int] | None = None  # YaRN's factor and original context length (gpt-oss)
    router_gain: float = 1.0  # the routers' weights ~ N(0, gain^2 / dim)
    seed: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def qkv_bias(self) -> bool:
        return self.arch in ("qwen2", "qwen2moe", "gpt-oss")

    @property
    def qk_norm(self) -> bool:
        return self.arch in ("qwen3", "gemma3", "qwen3moe", "olmoe", "qwen35", "qwen35moe", "qwen3next")

    def is_recurrent(self, layer: int) -> bool:
        return self.arch in HYBRIDS and (layer + 1) % self.full_attention_interval != 0


# ---- tokenizer ---------------------------------------------------------------------------------------------
_WORDS = ("the of and to in is was for on that with as by at from his her they have this are not be one had "
          "which you were all we when there can an your their said each she do how if will up other about out many "
          "then them these so some would make like him into time has look two more write go see number no way could "
          "people my than first water been call who oil its now find long down day did get come made may part over "
          "new sound take only little work know place year live me back give most very after thing our just name good "
          "sentence man think say great where help through much before line right too mean old any same tell boy "
          "follow came want show also around form three small set put end does another well large must big even such "
          "because turn here why ask went men read need land different home us move try kind hand picture again "
          "change off play spell air away animal house point page letter mother answer found study still learn should "
          "America world high every near add food between own below country plant last school father keep tree never "
          "start city earth eye light thought head under story saw left don't few while along might close something "
          "seem next hard open example begin life always those both paper together got group often run important "
          "until children side feet car mile night walk white sea began grow took river four carry state once book "
          "hear stop without second later miss idea enough eat face watch far Indian really almost let above girl "
          "sometimes mountain cut young talk soon list song being leave family it's café naïve über straße").split()


def _corpus(seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for i in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        if i % 5 == 0:
            words.append(str(rng.randint(0, 99999)))
        if i % 7 == 0:
            words.insert(0, rng.choice(["def", "return", "print(x)", "x = 1", "    if", "\t", "# note:", "{", "}"]))
        lines.append(" ".join(words) + rng.choice([".", "!", "?", ",", "", ":\n", "\n\n"]))
    return lines


@cache
def _trained(kind: str, vocab_size: int) -> str:
    """A trained tokenizer as tokenizer.json text.

    bpe: byte-level BPE as HF's trainer writes it (GPT-2 regex pre-tokenizer), like SmolLM2/Qwen2 files.
    spm: a SentencePiece-style vocabulary (<unk> <s> </s>, 256 <0xXX> byte tokens, "▁" pieces) written the way
    transformers' LlamaConverter writes Llama 2's tokenizer.json: Prepend("▁") + Replace(" ", "▁") normalizer, no
    pre-tokenizer, merges = every split of every piece ranked by the piece's score, byte fallback.
    """
    if kind not in ("bpe", "spm"):
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    specials = BPE_SPECIALS if kind == "bpe" else SPM_SPECIALS + [f"<0x{b:02X}>" for b in range(256)]
    tok = HFTokenizer(models.BPE())
    if kind == "bpe":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        alphabet = []
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=alphabet)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    # pad to exactly vocab_size with placeholder tokens, which no merge produces
    for i in range(len(vocab), vocab_size):
        vocab[f"<|unused_{i}|>"] = i
    if len(vocab) != vocab_size:
        raise ValueError(f"cannot make a {kind} vocabulary of {vocab_size} (got {len(vocab)})")
    if kind == "bpe":
        return json.dumps(spec, ensure_ascii=False)

    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
    scores = _spm_scores(vocab, merges)
    ranked = sorted((-scores[left + right], vocab[left + right], vocab[left], left, right)
                    for piece in vocab for k in range(1, len(piece))
                    for left, right in [(piece[:k], piece[k:])] if left in vocab and right in vocab)
    spm = HFTokenizer(models.BPE(vocab=vocab, merges=[(l, r) for *_, l, r in ranked], unk_token="<unk>",
                                 byte_fallback=True, fuse_unk=True))
    spm.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    spm.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    spm.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPM_SPECIALS])
    return spm.to_str()


def _spm_scores(vocab: dict[str, int], merges: list[tuple[str, str]]) -> dict[str, float]:
    """SentencePiece-style scores: merged pieces by merge order (earlier = higher), everything else 0."""
    rank = {left + right: i for i, (left, right) in enumerate(merges)}
    return {t: (-float(rank[t]) if t in rank else 0.0) for t in vocab}


def tokenizer_json(spec: TinySpec) -> dict:
    return json.loads(_trained(spec.tokenizer, spec.vocab_size))


def gguf_tokenizer_metadata(spec: TinySpec) -> dict:
    """The same vocabulary as tokenizer_json(spec), in GGUF's tokenizer.ggml.* form."""
    tj = tokenizer_json(spec)
    vocab = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]
    if spec.tokenizer == "bpe":
        types = [TokenType.CONTROL if t in BPE_SPECIALS else TokenType.UNUSED if t.startswith("<|unused_")
                 else TokenType.NORMAL for t in tokens]
        return {"model": "gpt2", "tokens": tokens, "types": types, "merges": merges,
                "bos": 1, "eos": 2, "add_bos": False}
    # SentencePiece: the scores the merges of tokenizer.json were ranked by
    pieces = {t: i for i, t in enumerate(tokens)}
    ranked = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in tj["model"]["merges"]]
    best = {}
    for i, (left, right) in enumerate(ranked):
        best.setdefault(left + right, i)
    order = sorted(best, key=best.get)  # pieces in merge-rank order = score order
    score_of = {t: -float(i) for i, t in enumerate(order)}
    scores = [score_of.get(t, 0.0) for t in pieces]
    types = [TokenType.UNKNOWN if t == "<unk>" else TokenType.CONTROL if t in SPM_SPECIALS
             else TokenType.BYTE if t.startswith("<0x") else TokenType.UNUSED if t.startswith("<|unused_")
             else TokenType.NORMAL for t in tokens]
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores, "bos": 1, "eos": 2,
            "add_bos": True}


# ---- weights -------------------------------------------------------------------------------------------------
def tiny_weights(spec: TinySpec) -> dict[str, np.ndarray]:
    """float32 weights, GGUF-named, HF layout (rows = out features) and HF rope pairing (not permuted)."""
    shapes = {"token_embd.weight": (spec.vocab_size, spec.dim), "output_norm.weight": (spec.dim,)}
    if not spec.tie_embeddings:
        shapes["output.weight"] = (spec.vocab_size, spec.dim)
    q, kv = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    for i in range(spec.n_layers):
        b = f"blk.{i}."
        if spec.arch in HYBRIDS:
            shapes.update(_qwen35_shapes(spec, b, i))
            continue
        ffn_norm = "post_attention_norm.weight" if spec.arch == "gpt-oss" else "ffn_norm.weight"
        shapes.update({b + "attn_norm.weight": (spec.dim,), b + "attn_q.weight": (q, spec.dim),
                       b + "attn_k.weight": (kv, spec.dim), b + "attn_v.weight": (kv, spec.dim),
                       b + "attn_output.weight": (spec.dim, q), b + ffn_norm: (spec.dim,)})
        if spec.arch == "gpt-oss":     # Wo's bias, the sinks, the router's and experts' biases
            n, h = spec.n_experts, spec.hidden_dim
            shapes.update({b + "attn_output.bias": (spec.dim,), b + "attn_sinks.weight": (spec.n_heads,),
                           b + "ffn_gate_inp.bias": (n,), b + "ffn_gate_exps.bias": (n, h),
                           b + "ffn_up_exps.bias": (n, h), b + "ffn_down_exps.bias": (n, spec.dim)})
        if spec.n_experts:
            shapes.update(_expert_shapes(spec, b))
        else:
            shapes.update({b + "ffn_gate.weight": (spec.hidden_dim, spec.dim),
                           b + "ffn_up.weight": (spec.hidden_dim, spec.dim),
                           b + "ffn_down.weight": (spec.dim, spec.hidden_dim)})
        if spec.qkv_bias:
            shapes.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
        if spec.arch == "olmoe":      # its QK-norm is over all of q and all of k
            shapes.update({b + "attn_q_norm.weight": (q,), b + "attn_k_norm.weight": (kv,)})
        elif spec.qk_norm:
            shapes.update({b + "attn_q_norm.weight": (spec.head_dim,), b + "attn_k_norm.weight": (spec.head_dim,)})
        if spec.arch == "gemma3":      # sandwich norms; GGUF's Gemma norms hold 1 + w, as these do
            shapes.update({b + "post_attention_norm.weight": (spec.dim,), b + "post_ffw_norm.weight": (spec.dim,)})
    if spec.extra.get("mtp"):   # a multi-token prediction layer after the trunk, as Qwen3.5's converter writes it
        b, d, q, kv = f"blk.{spec.n_layers}.", spec.dim, spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
        shapes.update({b + "attn_norm.weight": (d,), b + "post_attention_norm.weight": (d,),
                       b + "attn_q.weight": (2 * q, d), b + "attn_k.weight": (kv, d), b + "attn_v.weight": (kv, d),
                       b + "attn_output.weight": (d, q), b + "attn_q_norm.weight": (spec.head_dim,),
                       b + "attn_k_norm.weight": (spec.head_dim,), b + "ffn_gate.weight": (spec.hidden_dim, d),
                       b + "ffn_up.weight": (spec.hidden_dim, d), b + "ffn_down.weight": (d, spec.hidden_dim),
                       b + "nextn.eh_proj.weight": (d, 2 * d), b + "nextn.enorm.weight": (d,),
                       b + "nextn.hnorm.weight": (d,)})
    out = {}
    for name, shape in shapes.items():
        rng = np.random.default_rng([spec.seed, zlib.crc32(name.encode())])
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif name.endswith("ssm_a"):            # the decay's rate, -exp(A_log) as llama.cpp's converter stores it
            w = -np.exp(rng.uniform(-1.0, 1.0, shape))
        elif name.endswith("ssm_dt.bias"):
            w = rng.uniform(-1.0, 1.0, shape)
        elif name.endswith("attn_sinks.weight"):   # about the scores' size: a share of every head's weight
            w = 1.0 + rng.standard_normal(shape)
        elif name.endswith(("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")):   # routers
            w = spec.router_gain * rng.standard_normal(shape) / np.sqrt(shape[-1])
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = w.astype(np.float32)
    return out


def _qwen35_shapes(spec: TinySpec, b: str, i: int) -> dict[str, tuple[int, ...]]:
    """A Qwen3.5 layer's tensors as llama.cpp's converter writes them: a Gated DeltaNet or a gated attention
    mixer (Wq's rows per head: q, then the output gate), the FFN's input norm named post_attention_norm."""
    d, q, kv = spec.dim, spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {b + "attn_norm.weight": (d,), b + "post_attention_norm.weight": (d,)}
    if spec.n_experts:   # Qwen3.5-MoE: routed experts and a gated shared expert
        shapes.update(_expert_shapes(spec, b))
    else:
        shapes.update({b + "ffn_gate.weight": (spec.hidden_dim, d), b + "ffn_up.weight": (spec.hidden_dim, d),
                       b + "ffn_down.weight": (d, spec.hidden_dim)})
    if spec.is_recurrent(i):
        nk, nv, hs = spec.ssm_k_heads, spec.ssm_v_heads, spec.ssm_head
        conv = 2 * nk * hs + nv * hs
        shapes.update({b + "ssm_conv1d.weight": (conv, spec.ssm_conv), b + "ssm_dt.bias": (nv,), b + "ssm_a": (nv,),
                       b + "ssm_norm.weight": (hs,), b + "ssm_out.weight": (d, nv * hs)})
        if spec.extra.get("ssm_in"):      # Qwen3-Next's older files: q|k|v|z fused, grouped per key head
            shapes[b + "ssm_in.weight"] = (conv + nv * hs, d)
        else:
            shapes.update({b + "attn_qkv.weight": (conv, d), b + "attn_gate.weight": (nv * hs, d)})
        if spec.arch == "qwen3next":      # beta|alpha fused, grouped per key head
            shapes[b + "ssm_ba.weight"] = (2 * nv, d)
        else:
            shapes.update({b + "ssm_beta.weight": (nv, d), b + "ssm_alpha.weight": (nv, d)})
    else:
        shapes.update({b + "attn_q.weight": (2 * q, d), b + "attn_k.weight": (kv, d), b + "attn_v.weight": (kv, d),
                       b + "attn_output.weight": (d, q), b + "attn_q_norm.weight": (spec.head_dim,),
                       b + "attn_k_norm.weight": (spec.head_dim,)})
    return shapes


def _expert_shapes(spec: TinySpec, b: str) -> dict[str, tuple[int, ...]]:
    """A mixture-of-experts layer's tensors as llama.cpp's converter writes them: the router, the experts as 3-D
    (n_experts, rows, cols), and qwen2moe's shared expert with its gate (one vector of dim)."""
    n, d, h = spec.n_experts, spec.dim, spec.hidden_dim
    shapes: dict[str, tuple[int, ...]] = {b + "ffn_gate_inp.weight": (n, d), b + "ffn_gate_exps.weight": (n, h, d),
                                          b + "ffn_up_exps.weight": (n, h, d), b + "ffn_down_exps.weight": (n, d, h)}
    if spec.shared_expert_dim:
        s = spec.shared_expert_dim
        shapes.update({b + "ffn_gate_inp_shexp.weight": (d,), b + "ffn_gate_shexp.weight": (s, d),
                       b + "ffn_up_shexp.weight": (s, d), b + "ffn_down_shexp.weight": (d, s)})
    return shapes


def permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's LlamaModel.permute: rotate-half pairs -> adjacent pairs, per head."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_kquant(rows: int, cols: int, type_name: str, seed: int) -> np.ndarray:
    """Valid random blocks of a K-quant, IQ or TQ type (random bits, finite small f16 scales), uint8 (rows, bytes)."""
    qtype = GGMLQuantizationType[type_name]
    block, size = GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ValueError(f"{type_name} needs cols divisible by {block}, got {cols}")
    rng = np.random.default_rng(seed)
    if type_name in LANE_TYPES:   # codebook and ternary types: their scales set where each keeps them
        return random_blocks(type_name, rows, cols, rng, scale=4e-4 / np.sqrt(cols / 256))
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    # where each type keeps its f16 scales: Q2_K d, dmin after 16 scales + 64 values; Q3_K d last
    scale_offsets = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (size - 2,), "Q2_K": (80, 82),
                     "Q3_K": (size - 2,), "IQ4_NL": (0,), "IQ4_XS": (0,)}[type_name]
    for off in scale_offsets:
        d = (rng.uniform(0.5, 1.0, size=(rows, cols // block)) * 2e-4 / np.sqrt(cols / 256)).astype(np.float16)
        data[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, -1)


# ---- writers -------------------------------------------------------------------------------------------------
# MXFP4: the experts in MXFP4 and the other matrices in Q8_0, as gpt-oss's published files
GGUF_WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "MXFP4") + LANE_TYPES
HARMONY = "harmony"   # chat_template: tests/text/harmony.py's GPT_OSS, with harmony's control tokens


def write_tiny_gguf(path: str | Path, spec: TinySpec = TinySpec(), weight_type: str = "Q8_0",
                    embd_type: str | None = None, chat_template: str | None = CHATML,
                    tokenizer_pre: str = "gpt-2", control_tokens: tuple[str, ...] = (),
                    sampling: dict[str, float] | None = None) -> Path:
    """A GGUF file of `spec`: 2-D weights in weight_type (token_embd in embd_type, default Q8_0 for K-quants and
    weight_type otherwise), norms/biases F32; llama3 rope scaling as a rope_freqs.weight tensor like llama.cpp.
    tokenizer_pre: tokenizer.ggml.pre for byte-level vocabularies (selects llama.cpp's pre-tokenizer regexes).
    control_tokens: extra CONTROL tokens (a chat format's markers) as the vocabulary's last ids; the trained part
    is that much smaller, so the vocabulary keeps spec.vocab_size. sampling: general.sampling.* keys (top_k as u32).
    """
    if weight_type not in GGUF_WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {GGUF_WEIGHT_TYPES}")
    if chat_template == HARMONY:
        from tests.text.harmony import CONTROL_TOKENS, GPT_OSS
        chat_template, control_tokens = GPT_OSS, tuple(control_tokens) + CONTROL_TOKENS
    path = Path(path)
    arch = spec.arch
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.dim)
    w.add_block_count(spec.n_layers + (1 if spec.extra.get("mtp") else 0))
    if spec.extra.get("mtp"):
        w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    w.add_feed_forward_length(spec.hidden_dim)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.norm_eps)
    w.add_rope_dimension_count(spec.rope_dims or spec.head_dim)
    if arch in HYBRIDS:
        w.add_uint32(f"{arch}.ssm.conv_kernel", spec.ssm_conv)
        w.add_uint32(f"{arch}.ssm.state_size", spec.ssm_head)
        w.add_uint32(f"{arch}.ssm.group_count", spec.ssm_k_heads)
        w.add_uint32(f"{arch}.ssm.time_step_rank", spec.ssm_v_heads)
        w.add_uint32(f"{arch}.ssm.inner_size", spec.ssm_v_heads * spec.ssm_head)
        w.add_uint32(f"{arch}.full_attention_interval", spec.full_attention_interval)
        pairs = (spec.rope_dims or spec.head_dim) // 2      # M-RoPE sections: text positions make them one RoPE
        if arch != "qwen3next":
            w.add_array(f"{arch}.rope.dimension_sections", [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0])
    if spec.head_dim * spec.n_heads != spec.dim:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    w.add_vocab_size(spec.vocab_size)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
    if spec.n_experts:
        w.add_expert_count(spec.n_experts)
        w.add_expert_used_count(spec.n_experts_used)
        if arch in ("qwen2moe", "qwen3moe", "qwen35moe", "qwen3next", "gpt-oss"):
            w.add_expert_feed_forward_length(spec.hidden_dim)
        if spec.shared_expert_dim:
            w.add_expert_shared_feed_forward_length(spec.shared_expert_dim)
    if spec.yarn:
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(spec.yarn[0])
        w.add_rope_scaling_orig_ctx_len(spec.yarn[1])
    tok = gguf_tokenizer_metadata(replace(spec, vocab_size=spec.vocab_size - len(control_tokens)))
    tok["tokens"] = tok["tokens"] + list(control_tokens)
    tok["types"] = tok["types"] + [TokenType.CONTROL] * len(control_tokens)
    w.add_tokenizer_model(tok["model"])
    if tok["model"] == "gpt2":
        w.add_tokenizer_pre(tokenizer_pre)
    w.add_token_list(tok["tokens"])
    w.add_token_types([int(t) for t in tok["types"]])
    if "merges" in tok and tok["model"] == "gpt2":
        w.add_token_merges(tok["merges"])
    if "scores" in tok:
        w.add_token_scores(tok["scores"])
        w.add_add_space_prefix(True)
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    w.add_add_bos_token(tok["add_bos"])
    if chat_template:
        w.add_chat_template(chat_template)
    for key, value in (sampling or {}).items():
        if key == "top_k":
            w.add_uint32(f"general.sampling.{key}", int(value))
        else:
            w.add_float32(f"general.sampling.{key}", value)

    weights = tiny_weights(spec)
    if spec.rope_scaling:
        from inferd.model.rope_scaling import llama3_freq_factors
        factors = llama3_freq_factors(spec.head_dim, spec.rope_theta, spec.rope_scaling).astype(np.float32)
        w.add_tensor("rope_freqs.weight", factors)
    embd_type = embd_type or ("Q8_0" if weight_type in ("Q4_K", "Q6_K", "MXFP4") + LANE_TYPES else weight_type)
    for name, x in weights.items():
        if arch in ("llama", "mistral") and name.endswith(("attn_q.weight", "attn_k.weight")):
            x = permute_for_gguf(x, spec.n_heads if "attn_q" in name else spec.n_kv_heads)
        # kept F32 as llama.cpp keeps them: vectors, biases, routers, the convolution's taps
        if x.ndim == 1 or name.endswith((".bias", "ffn_gate_inp.weight", "ssm_conv1d.weight")):
            w.add_tensor(name, x)
            continue
        ttype = embd_type if name in ("token_embd.weight", "output.weight") else weight_type
        if weight_type == "MXFP4" and "_exps." not in name:
            ttype = "Q8_0"
        _add_matrix(w, name, x, ttype, spec.seed)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_matrix(w: GGUFWriter, name: str, x: np.ndarray, ttype: str, seed: int) -> None:
    qtype = GGMLQuantizationType[ttype]
    if ttype == "F32":
        w.add_tensor(name, x)
    elif ttype == "F16":
        w.add_tensor(name, x.astype(np.float16))
    elif ttype in ("Q4_K", "Q6_K") + LANE_TYPES:   # random valid blocks; a 3-D tensor's matrices one after another
        data = random_kquant(int(np.prod(x.shape[:-1])), x.shape[-1], ttype, seed + zlib.crc32(name.encode()))
        w.add_tensor(name, data.reshape(*x.shape[:-1], -1), raw_dtype=qtype)
    else:
        w.add_tensor(name, gguf_quants.quantize(x, qtype), raw_dtype=qtype)


HF_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
            "output.weight": "lm_head.weight"}
HF_LAYER = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
            "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
            "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
            "attn_v.bias": "self_attn.v_proj.bias", "attn_output.weight": "self_attn.o_proj.weight",
            "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
            "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
            "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight"}


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in HF_NAMES:
        return HF_NAMES[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{HF_LAYER[rest]}"


def write_safetensors(path: str | Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Minimal safetensors writer (name -> (dtype, raw array)); BF16 arrays are uint16 bit patterns.

    Written by hand because safetensors' numpy API has no bfloat16.
    """
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data section 8-byte aligned, as the official writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even like torch."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_tiny_hf(folder: str | Path, spec: TinySpec = TinySpec(), dtype: str = "bf16", shards: int = 1,
                  chat_template: str | None = CHATML, generation_config: bool = True) -> Path:
    """An HF folder of `spec`: config.json, safetensors (sharded with an index when shards > 1), tokenizer files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    st_dtype = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[dtype]
    arrays = {}
    for name, x in tiny_weights(spec).items():
        raw = to_bf16_bits(x) if dtype == "bf16" else x.astype(np.float16) if dtype == "f16" else x
        arrays[hf_tensor_name(name)] = (st_dtype, raw)
    names = list(arrays)
    if shards == 1:
        write_safetensors(folder / "model.safetensors", arrays)
    else:
        weight_map, total = {}, 0
        for k in range(shards):
            fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: arrays[n] for n in names[k::shards]}
            write_safetensors(folder / fname, part)
            weight_map.update({n: fname for n in part})
            total += sum(a.nbytes for _, a in part.values())
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))

    hf_arch, model_type = _HF_ARCH[spec.arch]
    specials = BPE_SPECIALS if spec.tokenizer == "bpe" else SPM_SPECIALS
    config = {"architectures": [hf_arch], "model_type": model_type, "hidden_size": spec.dim,
              "intermediate_size": spec.hidden_dim, "num_hidden_layers": spec.n_layers,
              "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads,
              "max_position_embeddings": spec.context_length, "rms_norm_eps": spec.norm_eps,
              "rope_theta": spec.rope_theta, "tie_word_embeddings": spec.tie_embeddings,
              "vocab_size": spec.vocab_size, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]}
    if spec.head_dim * spec.n_heads != spec.dim:
        config["head_dim"] = spec.head_dim
    if spec.rope_scaling:
        config["rope_scaling"] = {"rope_type": "llama3", **spec.rope_scaling}
    if spec.arch == "mistral":
        config["sliding_window"] = None
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "tokenizer.json").write_text(_trained(spec.tokenizer, spec.vocab_size), encoding="utf-8")
    tcfg = {"bos_token": specials[1], "eos_token": specials[2], "add_bos_token": spec.tokenizer == "spm"}
    if chat_template:
        tcfg["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1, ensure_ascii=False))
    if generation_config:
        (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 0]}))
    return folder


# ---- named variants ------------------------------------------------------------------------------------------
_K = TinySpec(dim=256, n_heads=4, n_kv_heads=2, hidden_dim=512)  # K-quant blocks are 256 wide
_QWEN2 = TinySpec(arch="qwen2", dim=256, n_heads=4, n_kv_heads=2, hidden_dim=320)
# Qwen3: QK-norm, head_dim 128 != dim / n_heads. Gemma 3: head_dim 256, GQA 2, 7 layers (6 local, layer 5 global)
# with a window of 40 positions, which the tests' prompts outrun.
_QWEN3 = TinySpec(arch="qwen3", dim=256, n_heads=4, n_kv_heads=2, head_dim=128, hidden_dim=320, rope_theta=1e6,
                  norm_eps=1e-6)
_GEMMA3 = TinySpec(arch="gemma3", dim=256, n_heads=4, n_kv_heads=2, head_dim=256, hidden_dim=512, n_layers=7,
                   rope_theta=1e6, norm_eps=1e-6, sliding_window=40)
# The mixtures of experts: 8 experts (Qwen2-MoE's shared one beside them), 2 used per token, untied outputs as
# llama.cpp requires of OLMoE and Qwen2-MoE; dim 256 and experts of 256 for the K-quant files' blocks
_MOE = {"dim": 256, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 256, "n_experts": 8, "n_experts_used": 2,
        "tie_embeddings": False, "rope_theta": 1e6, "norm_eps": 1e-6}
MOE_SPECS = {
    "qwen3moe": TinySpec(arch="qwen3moe", head_dim=128, **_MOE),
    "qwen2moe": TinySpec(arch="qwen2moe", shared_expert_dim=512, **_MOE),
    "olmoe": TinySpec(arch="olmoe", **{**_MOE, "n_kv_heads": 4}),
    "mixtral": TinySpec(arch="llama", **_MOE),
}
# Qwen3.5's shape in small: 4 layers, the 2nd and 4th gated attention (head_dim 64, RoPE on 32 of it), the others
# Gated DeltaNet with 2 key heads and 4 value heads of 32, a kernel of 4
_QWEN35 = TinySpec(arch="qwen35", dim=128, n_layers=4, n_heads=2, n_kv_heads=1, head_dim=64, hidden_dim=192,
                   rope_theta=1e7, norm_eps=1e-6, rope_dims=32, full_attention_interval=2, ssm_k_heads=2,
                   ssm_v_heads=4, ssm_head=32, ssm_conv=4)
# Qwen3.5-MoE's: the same layers with 8 experts of 64 (2 per token, renormalized) and a gated shared expert of 96,
# untied
_QWEN35MOE = replace(_QWEN35, arch="qwen35moe", hidden_dim=64, n_experts=8, n_experts_used=2, shared_expert_dim=96,
                     tie_embeddings=False)
# Qwen3-Next's: the same again, its value heads grouped per key head and beta|alpha fused (ssm_ba); the older files'
# q|k|v|z fused as well (ssm_in)
_QWEN3NEXT = replace(_QWEN35MOE, arch="qwen3next")
# gpt-oss-20b in small: heads of 64, 4 of 8 experts per token, 4 layers alternating a sliding window (16 here, 128
# there) with full attention, its RoPE base and YaRN (32 over 4096), harmony's vocabulary markers and template. Its
# routers are sharper than the others' (gain 3): the 4th and 5th of 8 logits are closer than the 2nd and 3rd, and
# a prompt must route clear of near ties (tests/engine/test_llamacpp_moe.py)
GPTOSS_SPEC = TinySpec(arch="gpt-oss", dim=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256,
                       n_experts=8, n_experts_used=4, tie_embeddings=False, rope_theta=150000.0, norm_eps=1e-5,
                       sliding_window=16, yarn=(32.0, 4096), vocab_size=640, context_length=1024, router_gain=3.0)
_L3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
VARIANTS = {
    # GGUF files
    "llama-gguf-f32": ("gguf", TinySpec(), {"weight_type": "F32"}),
    "llama-gguf-f16": ("gguf", TinySpec(), {"weight_type": "F16"}),
    "llama-gguf-bf16": ("gguf", TinySpec(), {"weight_type": "BF16"}),
    "llama-gguf-q8_0": ("gguf", TinySpec(), {"weight_type": "Q8_0"}),
    "llama-gguf-q4_0": ("gguf", TinySpec(), {"weight_type": "Q4_0"}),
    "llama-gguf-q4_1": ("gguf", TinySpec(tie_embeddings=False), {"weight_type": "Q4_1"}),
    "llama-gguf-q5_0": ("gguf", TinySpec(), {"weight_type": "Q5_0"}),
    "llama-gguf-q4_k": ("gguf", _K, {"weight_type": "Q4_K"}),
    "llama-gguf-q6_k": ("gguf", _K, {"weight_type": "Q6_K"}),
    "llama-spm-gguf-q8_0": ("gguf", TinySpec(tokenizer="spm", vocab_size=640),
                            {"weight_type": "Q8_0", "chat_template": LLAMA2_TEMPLATE}),
    "qwen2-gguf-q8_0": ("gguf", _QWEN2, {}),
    "llama3rope-gguf-f32": ("gguf", TinySpec(rope_scaling=_L3), {"weight_type": "F32"}),
    # Llama 3.2's shape in small: tied, GQA 4, theta 500000, llama3 scaling as a rope_freqs tensor
    "llama32-gguf-f16": ("gguf", TinySpec(dim=256, n_heads=4, n_kv_heads=1, hidden_dim=384, rope_theta=500000.0,
                                          rope_scaling={**_L3, "factor": 32.0}), {"weight_type": "F16"}),
    "qwen3-gguf-f32": ("gguf", _QWEN3, {"weight_type": "F32"}),
    "qwen3-gguf-q8_0": ("gguf", _QWEN3, {"weight_type": "Q8_0"}),
    "gemma3-gguf-f32": ("gguf", _GEMMA3, {"weight_type": "F32"}),
    "gemma3-gguf-q8_0": ("gguf", _GEMMA3, {"weight_type": "Q8_0"}),
    **{f"{name}-gguf-{t.lower()}": ("gguf", spec, {"weight_type": t})
       for name, spec in MOE_SPECS.items() for t in ("F32", "Q8_0", "Q4_K")},
    "qwen35-gguf-f32": ("gguf", _QWEN35, {"weight_type": "F32"}),
    "qwen35-gguf-q8_0": ("gguf", _QWEN35, {"weight_type": "Q8_0"}),
    "qwen35moe-gguf-f32": ("gguf", _QWEN35MOE, {"weight_type": "F32"}),
    "qwen35moe-gguf-q8_0": ("gguf", _QWEN35MOE, {"weight_type": "Q8_0"}),
    "qwen35-mtp-gguf-q8_0": ("gguf", replace(_QWEN35, extra={"mtp": True}), {"weight_type": "Q8_0"}),
    "qwen35-conv3-gguf-f32": ("gguf", replace(_QWEN35, ssm_conv=3), {"weight_type": "F32"}),
    "qwen3next-gguf-f32": ("gguf", _QWEN3NEXT, {"weight_type": "F32"}),
    "qwen3next-gguf-q8_0": ("gguf", _QWEN3NEXT, {"weight_type": "Q8_0"}),
    "qwen3next-ssm_in-gguf-f32": ("gguf", replace(_QWEN3NEXT, extra={"ssm_in": True}), {"weight_type": "F32"}),
    **{f"gpt-oss-gguf-{t.lower()}": ("gguf", GPTOSS_SPEC, {"weight_type": t, "chat_template": HARMONY,
                                                           "tokenizer_pre": "gpt-4o"})
       for t in ("F32", "MXFP4")},
    # HF folders
    "llama-hf-bf16": ("hf", TinySpec(), {"dtype": "bf16"}),
    "llama-hf-f16": ("hf", TinySpec(), {"dtype": "f16"}),
    "llama-hf-f32": ("hf", TinySpec(), {"dtype": "f32"}),
    "llama-hf-bf16-sharded": ("hf", TinySpec(tie_embeddings=False), {"dtype": "bf16", "shards": 3}),
    "qwen2-hf-bf16": ("hf", _QWEN2, {"dtype": "bf16"}),
    "qwen3-hf-bf16": ("hf", _QWEN3, {"dtype": "bf16"}),
    "llama3rope-hf-bf16": ("hf", TinySpec(rope_scaling=_L3), {"dtype": "bf16"}),
    "mistral-hf-hd128": ("hf", TinySpec(arch="mistral", dim=256, n_heads=2, n_kv_heads=1, head_dim=128,
                                        hidden_dim=96 * 4), {"dtype": "bf16"}),
    "llama-hf-awkward": ("hf", TinySpec(vocab_size=1000, dim=96, n_heads=3, n_kv_heads=1, head_dim=64,
                                        hidden_dim=96 * 3, n_layers=3), {"dtype": "f16"}),
    "llama-spm-hf-f32": ("hf", TinySpec(tokenizer="spm", vocab_size=640),
                         {"dtype": "f32", "chat_template": LLAMA2_TEMPLATE}),
}


def make_variant(name: str, dest: str | Path) -> Path:
    """Write variant `name` under folder `dest`; returns the .gguf path or the HF folder."""
    kind, spec, kwargs = VARIANTS[name]
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if kind == "gguf":
        return write_tiny_gguf(dest / f"{name}.gguf", spec, **kwargs)
    return write_tiny_hf(dest / name, spec, **kwargs)


def variant_spec(name: str) -> TinySpec:
    return VARIANTS[name][1]


__all__ = ["TinySpec", "VARIANTS", "make_variant", "variant_spec", "write_tiny_gguf", "write_tiny_hf",
           "tiny_weights", "permute_for_gguf", "tokenizer_json", "gguf_tokenizer_metadata", "write_safetensors",
           "to_bf16_bits", "hf_tensor_name", "random_kquant", "MOE_SPECS", "GPTOSS_SPEC"]
