"""A chat model used as a reranker (the `rerank_prompt` setting), as Qwen3-Reranker is meant to run: each (query,
document) pair goes into the model card's prompt, which asks for a "yes" or a "no", and the score is the
probability of "yes" against "no" at the last position: softmax over those two logits.

It has the Reranker's interface (tokenize_pairs, embed, dimensions, model.*), so the embedding queue and the
/v1/rerank and /v1/score handlers serve it like a cross-encoder. Its forward passes run on a context of their own
(scratch and a KV cache just big enough for one batch) that shares the chat engine's weights; the queue's steps
run on the engine loop's thread, between the chat model's steps, so the two never run at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import _cpu
from .embedder import pack_batches

RERANK_PROMPTS = ("none", "qwen3")
# Qwen3-Reranker's model card: the system turn, the user turn's layout, an empty thinking block before the answer
QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass
class LLMRerankModel:
    """What the server reads of a reranker's model for a chat model."""

    name: str
    max_seq_length: int
    labels: list[str] = field(default_factory=lambda: ["yes"])


class LLMReranker:
    dimensions = 1

    def __init__(
        self,
        engine,
        tokenizer,
        *,
        name: str,
        threads: int,
        max_batch_tokens: int = 2048,
        max_batch_seqs: int = 16,
        instruction: str = QWEN3_INSTRUCTION,
    ):
        cpu_model = getattr(engine, "_model", None)
        if not isinstance(cpu_model, _cpu.Model):
            raise ValueError("reranking with the chat model needs the CPU engine")
        self.yes, self.no = (self._single_token(tokenizer, t) for t in ("yes", "no"))
        self.tokenizer = tokenizer
        self.instruction = instruction
        self.prefix = tokenizer.encode(QWEN3_PREFIX, add_special=False)
        self.suffix = tokenizer.encode(QWEN3_SUFFIX, add_special=False)
        self.block_size = engine.block_size
        self.max_batch_tokens = max(1, min(max_batch_tokens, engine.context_length))
        self.max_batch_seqs = max_batch_seqs
        if len(self.prefix) + len(self.suffix) + 8 > self.max_batch_tokens:
            raise ValueError(f"a batch of {self.max_batch_tokens} tokens cannot hold the reranking prompt")
        blocks = -(-self.max_batch_tokens // self.block_size) + max_batch_seqs
        self.ctx = _cpu.Context(cpu_model, self.max_batch_tokens, max_batch_seqs, blocks, threads)
        self.model = LLMRerankModel(name, self.max_batch_tokens)

    @staticmethod
    def _single_token(tokenizer, text: str) -> int:
        ids = tokenizer.encode(text, add_special=False)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens in this vocabulary; the reranking prompt needs one")
        return ids[0]

    @property
    def max_seq_length(self) -> int:
        return self.model.max_seq_length

    def tokenize_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[list[int]]:
        """The prompt of each pair; the middle (instruction, query, document) cut at its end to fit the length."""
        room = self.max_seq_length - len(self.prefix) - len(self.suffix)
        out = []
        for query, doc in pairs:
            middle = self.tokenizer.encode(
                f"<Instruct>: {self.instruction}\n<Query>: {query}\n<Document>: {doc}", add_special=False
            )
            out.append(self.prefix + middle[:room] + self.suffix)
        return out

    def last_logits(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """(len(seqs), vocab) the logits after each sequence's last token, from the C forward pass."""
        rows: list[np.ndarray] = []
        for lo, hi in pack_batches([len(s) for s in seqs], self.max_batch_tokens, self.max_batch_seqs):
            batch = seqs[lo:hi]
            lens = [len(s) for s in batch]
            nblocks = [-(-n // self.block_size) for n in lens]
            tables = np.zeros((len(batch), max(nblocks)), np.int32)
            first = np.cumsum([0] + nblocks)
            for i, n in enumerate(nblocks):
                tables[i, :n] = np.arange(first[i], first[i] + n)
            tokens = np.fromiter((t for s in batch for t in s), np.int32)
            positions = np.concatenate([np.arange(n, dtype=np.int32) for n in lens])
            seq_of = np.repeat(np.arange(len(batch), dtype=np.int32), lens)
            out_rows = (np.cumsum(lens) - 1).astype(np.int32)
            params = np.zeros(len(batch), _cpu.SAMPLE_PARAMS_DTYPE)  # greedy, nothing adjusted: logits only
            params["top_p"], params["repetition_penalty"], params["mask_row"], params["num_logprobs"] = 1.0, 1.0, -1, -1
            none = np.zeros(1, np.int32)
            _, logits, _ = self.ctx.forward(
                tokens,
                positions,
                seq_of,
                tables,
                out_rows,
                np.zeros(len(batch), np.int32),
                params,
                none,
                none,
                np.zeros(1, np.float32),
                True,
            )
            rows.append(np.asarray(logits, np.float32)[: len(batch)])
        return np.concatenate(rows)

    def embed(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """(len(seqs), 1) P(yes) against P(no) after each prompt, float32."""
        logits = self.last_logits(seqs).astype(np.float64)
        yes, no = logits[:, self.yes], logits[:, self.no]
        return (1.0 / (1.0 + np.exp(no - yes)))[:, None].astype(np.float32)
