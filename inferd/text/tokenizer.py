"""Tokenizer: a Hugging Face `tokenizers.Tokenizer` built from GGUF metadata or read from tokenizer.json, plus
the per-token byte table used for (incremental) detokenization.

Encoding must equal llama.cpp's for GGUF models, so the HF tokenizer is assembled to mirror llama-vocab.cpp:
- byte-level BPE ("gpt2"): llama.cpp splits text with a list of regexes chosen by `tokenizer.ggml.pre`, applied one
  after the other, each match and each gap becoming a piece; that is a chain of HF `Split(..., "isolated")`
  followed by the GPT-2 byte mapping. Merges rank by position in `tokenizer.ggml.merges`.
- SentencePiece ("llama"): llama.cpp repeatedly merges the adjacent pair whose concatenation is the vocabulary
  token with the highest score; an HF BPE whose merges are every (left, right) split of every token, ranked by the
  merged token's score, performs the same merges. Spaces become "▁", one is prepended at the start and after every
  special token (HF's normalizer runs once per segment between special tokens, which gives exactly that), and
  characters outside the vocabulary fall back to <0xXX> byte tokens.
- Control, user-defined and unknown-type tokens are HF added tokens, so "<|im_start|>" in text is one token.

Decoding does not go through HF: every token id maps to the bytes it stands for (a table built once), and text is
those bytes decoded as UTF-8. The same table serves the incremental detokenizer, so streaming and one-shot decoding
always agree.
"""

from __future__ import annotations

import codecs
import json
import os
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterable, Mapping, Sequence

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# o200k's (gpt-oss, GPT-4o), as its tokenizer.json writes it: words split at a lower-to-upper case change
_O200K_WORD = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_O200K_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_O200K_SUFFIX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_O200K = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_O200K_WORD}*{_O200K_LOWER}+{_O200K_SUFFIX}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_O200K_WORD}+{_O200K_LOWER}*{_O200K_SUFFIX}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class _Pre:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # llama3-style: a piece that is a whole token is taken as is
    add_bos: bool = False  # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token


_DEFAULT = _Pre((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_LLAMA3_PRE = _Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
_SMOLLM = _Pre((r"\p{N}", _GPT2))
# tokenizer.ggml.pre -> pre-tokenization, as in llama-vocab.cpp (llm_tokenizer_bpe and load())
PRE_TOKENIZERS: dict[str, _Pre] = {
    "default": _DEFAULT,
    **{n: _LLAMA3_PRE for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral")},
    **{n: _Pre((_LLAMA3,)) for n in ("dbrx", "smaug-bpe", "chatglm-bpe")},
    **{n: _Pre((_GPT2,)) for n in ("gpt-2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe", "jina-v1-en")},
    **{n: _Pre((_QWEN2,)) for n in ("qwen2", "deepseek-r1-qwen", "stablelm2")},
    **{n: _SMOLLM for n in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")},
    **{n: _Pre((_O200K,)) for n in ("gpt-4o", "llama4")},
}
# Texts llama.cpp treats as end-of-generation when present as tokens (llama-vocab.cpp, "special_eog_ids")
EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
)
# Harmony (gpt-oss) ends a turn with <|return|> or a tool call with <|call|>; its <|end|> only closes one message of
# the turn (the thinking), after which the answer follows, so a vocabulary with both of them does not stop at it.
HARMONY_EOG_TEXTS = ("<|return|>", "<|call|>")


def eog_ids(token_id_of: Callable[[str], int | None]) -> set[int]:
    """The ids of the end-of-generation texts this vocabulary has (EOG_TEXTS, with harmony's rule)."""
    ids = {t: token_id_of(t) for t in (*EOG_TEXTS, *HARMONY_EOG_TEXTS)}
    harmony = all(ids[t] is not None for t in HARMONY_EOG_TEXTS)
    return {i for t, i in ids.items() if i is not None and not (harmony and t == "<|end|>")}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}
# str.translate table: each byte-mapped character to the byte it stands for (as a character < 256, so that
# encoding in latin-1 yields the byte); the other characters below 256 to one that latin-1 cannot encode, so that
# a token holding any character that is not byte-mapped fails the encoding, as every one above 255 does
_BYTE_TABLE = {**{c: "\ufffd" for c in range(256)}, **{ord(c): chr(b) for c, b in _BYTE_DECODER.items()}}


def _byte_level_bytes(text: str) -> bytes:
    """A byte-level token's bytes (translate + encode run in C: a vocabulary has 10^5 tokens to convert)."""
    try:
        return text.translate(_BYTE_TABLE).encode("latin-1")
    except UnicodeEncodeError:  # not byte-mapped (a stray literal token); take it as text
        return text.encode("utf-8")


def _spm_bytes(text: str) -> bytes:
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    return text.replace("▁", " ").encode("utf-8")


class Tokenizer:
    """Text <-> token ids for one model. Build with from_gguf() or from_hf_files()."""

    def __init__(
        self,
        hf: HFTokenizer,
        *,
        token_bytes: Sequence[bytes],
        special_ids: Iterable[int],
        bos_id: int | None,
        eos_id: int | None,
        eos_ids: Iterable[int],
        add_bos: bool,
        strip_first_space: bool,
        fim_ids: tuple[int, int, int] | None = None,
    ):
        self.hf = hf
        self._token_bytes = list(token_bytes)
        self.special_ids = frozenset(special_ids)  # control/unknown: no text when decoding with skip_special
        self.bos_id = bos_id
        self.eos_id = eos_id  # the model's own end token (what templates call eos_token)
        self.eos_ids = set(eos_ids) | ({eos_id} if eos_id is not None else set())  # every id that ends generation
        self.add_bos = add_bos and bos_id is not None
        # SentencePiece adds a space in front of the text; decoding drops it again from the first text token
        self.strip_first_space = strip_first_space
        # (prefix, suffix, middle) fill-in-the-middle tokens named by the file's metadata (GGUF), if any
        self.fim_ids = fim_ids

    @property
    def vocab_size(self) -> int:
        return len(self._token_bytes)

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_id is None else self.token_text(self.bos_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_id is None else self.token_text(self.eos_id)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; special-token texts such as <|im_start|> become their single token.

        add_special: prepend BOS when the model wants one.
        """
        try:
            ids = self.hf.encode(text, add_special_tokens=False).ids
        except TypeError:
            if isinstance(text, str):  # tokenizers refuses lone surrogates (valid in JSON, not in UTF-8)
                raise ValueError("text is not valid Unicode (it holds a lone surrogate code point)") from None
            raise TypeError(f"text must be a str, got {type(text).__name__}") from None
        if add_special and self.add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        detok = IncrementalDetokenizer(self, skip_special=skip_special)
        return "".join(detok.add(i) for i in ids) + detok.flush()

    def token_text(self, token_id: int) -> str:
        """The token's vocabulary string (e.g. 'Ġhello', '▁hello', '<0x0A>')."""
        self._check_id(token_id)
        return self.hf.id_to_token(token_id) or ""

    def token_bytes(self, token_id: int, skip_special: bool = True) -> bytes:
        """The bytes the token stands for in decoded text (b'' for special tokens when skip_special)."""
        self._check_id(token_id)
        if skip_special and token_id in self.special_ids:
            return b""
        return self._token_bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._token_bytes):
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{len(self._token_bytes) - 1})")

    # ---- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, fields: Mapping[str, Any]) -> Tokenizer:
        """From GGUF metadata (decoded values, or GGUFReader fields). Raises ValueError naming the problem."""
        meta = {
            k: (v.contents() if hasattr(v, "contents") else v)
            for k, v in fields.items()
            if k.startswith("tokenizer.ggml.")
        }
        kind = meta.get("tokenizer.ggml.model")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise ValueError("tokenizer.ggml.tokens is missing or empty")
        n = len(tokens)
        types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * n
        if len(types) != n:
            raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")

        def token_id(key: str) -> int | None:
            value = meta.get(key)
            if value is None:
                return None
            if not 0 <= int(value) < n:
                raise ValueError(f"{key} = {value} is outside the vocabulary of {n} tokens")
            return int(value)

        bos, eos = token_id("tokenizer.ggml.bos_token_id"), token_id("tokenizer.ggml.eos_token_id")
        vocab = {t: i for i, t in enumerate(tokens)}
        if kind == "gpt2":
            hf, pre = _gguf_bpe(meta, tokens, vocab)
            token_bytes = [
                t.encode("utf-8") if ty in (CONTROL, USER_DEFINED, UNKNOWN) else _byte_level_bytes(t)
                for t, ty in zip(tokens, types)
            ]
            add_bos_default, strip = pre.add_bos, False
        elif kind == "llama":
            add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
            hf = _gguf_spm(meta, tokens, vocab, types, add_prefix)
            token_bytes = [
                t.encode("utf-8") if ty in (CONTROL, USER_DEFINED, UNKNOWN) else _spm_bytes(t)
                for t, ty in zip(tokens, types)
            ]
            add_bos_default, strip = True, add_prefix
        else:
            raise ValueError(f"tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
        # special tokens are matched in text before the model runs, longest first like llama.cpp
        specials = [
            (i, t, ty) for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (CONTROL, USER_DEFINED, UNKNOWN) and t
        ]
        hf.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for _, t, ty in specials if ty != USER_DEFINED]
        )
        hf.add_tokens([AddedToken(t, special=False, normalized=False) for _, t, ty in specials if ty == USER_DEFINED])
        eos_ids = {
            i
            for i in (eos, token_id("tokenizer.ggml.eot_token_id"), token_id("tokenizer.ggml.eom_token_id"))
            if i is not None
        }
        eos_ids |= eog_ids(vocab.get)
        f_pre, f_suf, f_mid = (token_id(f"tokenizer.ggml.fim_{k}_token_id") for k in ("pre", "suf", "mid"))
        if f_pre is None or f_suf is None or f_mid is None:  # older files
            f_pre, f_suf, f_mid = (token_id(f"tokenizer.ggml.{k}_token_id") for k in ("prefix", "suffix", "middle"))
        return cls(
            hf,
            token_bytes=token_bytes,
            special_ids=[i for i, _, ty in specials if ty != USER_DEFINED],
            bos_id=bos,
            eos_id=eos,
            eos_ids=eos_ids,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
            strip_first_space=strip,
            fim_ids=(f_pre, f_suf, f_mid) if f_pre is not None and f_suf is not None and f_mid is not None else None,
        )

    @classmethod
    def from_hf_files(
        cls,
        tokenizer_json: str | os.PathLike[str],
        tokenizer_config_json: str | os.PathLike[str] | None = None,
        generation_config_json: str | os.PathLike[str] | None = None,
        extra_eos_ids: Iterable[int] = (),
    ) -> Tokenizer:
        """From a Hugging Face tokenizer.json (+ tokenizer_config.json, generation_config.json when present)."""
        spec = _read_json(tokenizer_json)
        tcfg = _read_json(tokenizer_config_json) if tokenizer_config_json else {}
        gcfg = _read_json(generation_config_json) if generation_config_json else {}
        try:
            hf = HFTokenizer.from_str(json.dumps(spec))
        except Exception as e:
            raise ValueError(f"{os.fspath(tokenizer_json)}: tokenizers cannot load it: {e}") from e
        n = hf.get_vocab_size(with_added_tokens=True)
        added = {t["id"]: t for t in spec.get("added_tokens") or []}
        n = max([n, *[i + 1 for i in added]])
        kind, strip = _hf_decoder_kind(spec, tokenizer_json)
        to_bytes = _byte_level_bytes if kind == "byte_level" else _spm_bytes
        token_bytes = []
        for i in range(n):
            text = hf.id_to_token(i)
            if text is None:
                token_bytes.append(b"")  # a hole in the id space: decodes to nothing
            elif i in added:
                token_bytes.append(added[i]["content"].encode("utf-8"))  # added tokens decode verbatim
            else:
                token_bytes.append(to_bytes(text))

        def named_id(key: str) -> int | None:
            value = tcfg.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            return hf.token_to_id(value) if isinstance(value, str) else None

        bos, eos = named_id("bos_token"), named_id("eos_token")
        eos_ids = set(extra_eos_ids)
        gen_eos = gcfg.get("eos_token_id")
        eos_ids |= set(gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos])
        eos_ids |= eog_ids(lambda t: i if (i := hf.token_to_id(t)) in added else None)
        if bos is None and isinstance(gcfg.get("bos_token_id"), int):
            bos = gcfg["bos_token_id"]
        add_bos = tcfg.get("add_bos_token")
        if add_bos is None:  # no explicit setting: the post-processor decides, as in transformers
            add_bos = bos is not None and hf.encode("a", add_special_tokens=True).ids[:1] == [bos]
        return cls(
            hf,
            token_bytes=token_bytes,
            special_ids=[i for i, t in added.items() if t.get("special")],
            bos_id=bos,
            eos_id=eos,
            eos_ids={i for i in eos_ids if 0 <= i < n},
            add_bos=bool(add_bos),
            strip_first_space=strip,
        )


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back only text that is complete.

    Bytes go through an incremental UTF-8 decoder, so a character split across tokens (emoji, CJK as byte
    tokens) is emitted once its last byte arrives, never as a half; invalid bytes become U+FFFD.
    prompt_ids: the tokens before the first fed one; SentencePiece's artificial leading space is dropped only
    when no text precedes (a generated "▁Paris" after "The capital is" must keep its space).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Iterable[int] = (),
        skip_special: bool = True,
        shown: frozenset[int] = frozenset(),
    ):
        """shown: special tokens whose text is kept anyway (tool-call markers a parser reads)."""
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.shown = shown
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_start = not any(tokenizer.token_bytes(i, skip_special) for i in prompt_ids)

    def add(self, token_id: int) -> str:
        piece = self.tokenizer.token_bytes(token_id, self.skip_special and token_id not in self.shown)
        if self._at_start and piece:
            self._at_start = False
            if (
                self.tokenizer.strip_first_space
                and piece.startswith(b" ")
                and token_id not in self.tokenizer.special_ids
            ):
                piece = piece[1:]
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """At the end of the sequence: whatever incomplete bytes remain, as U+FFFD."""
        return self._utf8.decode(b"", final=True)


# ---- helpers ------------------------------------------------------------------------------------------------
def _gguf_bpe(meta: Mapping[str, Any], tokens: list[str], vocab: dict[str, int]) -> tuple[HFTokenizer, _Pre]:
    pre_name = meta.get("tokenizer.ggml.pre") or "default"
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise ValueError(
            f"tokenizer.ggml.pre {pre_name!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    raw = meta.get("tokenizer.ggml.merges") or []
    merges = [tuple(m.split(" ", 1)) for m in raw]
    try:  # tokenizers checks that both sides and the joined token are in the vocabulary, faster than Python can
        if any(len(m) != 2 for m in merges):
            raise ValueError("a merge without a space")
        bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges)
    except Exception:
        for m, pair in zip(raw, merges):  # which entry: for the message
            if len(pair) != 2 or pair[0] not in vocab or pair[1] not in vocab or pair[0] + pair[1] not in vocab:
                raise ValueError(
                    f"tokenizer.ggml.merges entry {m!r} does not join two vocabulary tokens into a third"
                ) from None
        raise
    hf = HFTokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    hf.decoder = decoders.ByteLevel()
    return hf, pre


def _gguf_spm(
    meta: Mapping[str, Any], tokens: list[str], vocab: dict[str, int], types: list[int], add_prefix: bool
) -> HFTokenizer:
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    if len(scores) != len(tokens):
        raise ValueError(f"tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
    # Every way to build a token from two vocabulary tokens is a merge; llama.cpp prefers the merge producing the
    # highest-scoring token (ties: lower id here, leftmost in llama.cpp — they differ only in contrived vocabularies).
    ranked = []
    for tok_id, tok in enumerate(tokens):
        if types[tok_id] == BYTE:
            continue
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[tok_id]), tok_id, k, left, right))
    ranked.sort()
    unk = next((t for t, ty in zip(tokens, types) if ty == UNKNOWN), None)
    hf = HFTokenizer(
        models.BPE(
            vocab=vocab, merges=[(l, r) for *_, l, r in ranked], unk_token=unk, byte_fallback=True, fuse_unk=True
        )
    )
    steps = [normalizers.Prepend("▁")] if add_prefix else []
    hf.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    hf.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if add_prefix else [])
    )
    return hf


def _hf_decoder_kind(spec: Mapping[str, Any], path: Any) -> tuple[str, bool]:
    """('byte_level' | 'spm', strip_first_space) from tokenizer.json's decoder."""
    dec = spec.get("decoder") or {}
    steps = dec.get("decoders", []) if dec.get("type") == "Sequence" else [dec]
    kinds = {s.get("type") for s in steps}
    if "ByteLevel" in kinds:
        return "byte_level", False
    if "Metaspace" in kinds:
        ms = next(s for s in steps if s.get("type") == "Metaspace")
        return "spm", ms.get("prepend_scheme", "always" if ms.get("add_prefix_space", True) else "never") != "never"
    if kinds & {"ByteFallback", "Replace"}:
        strip = any(s.get("type") == "Strip" and s.get("start", 0) >= 1 for s in steps)
        return "spm", strip
    raise ValueError(
        f"{os.fspath(path)}: tokenizer decoder {sorted(k for k in kinds if k)} is not supported "
        f"(supported: ByteLevel, SentencePiece-style Metaspace/ByteFallback)"
    )


def _read_json(path: str | os.PathLike[str]) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError(f"{os.fspath(path)}: cannot read: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{os.fspath(path)}: not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{os.fspath(path)}: expected a JSON object")
    return data
