"""Engine: the model's one owner. Turns a list of per-sequence inputs into the flat batch the C forward pass
takes, runs it (one nogil call: every layer, logits, sampling) and hands back sampled tokens."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from inferd import _cpu
from inferd.engine.batch import BLOCK_SIZE, EngineShape, penalty_history
from inferd.engine.weights import build_cpu_model

assert BLOCK_SIZE == _cpu.BLOCK_SIZE
MAX_LOGPROBS = _cpu.MAX_LOGPROBS


@dataclass
class SamplingParams:
    temperature: float = 1.0          # 0 = greedy
    top_k: int = 0                    # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None           # random numbers depend only on (seed, position)
    logprobs: int | None = None       # None: none; 0: the chosen token's; k <= 20: also the top k

    def validate(self) -> None:
        """Raises ValueError naming the first bad field."""
        checks = [
            ("temperature", 0.0 <= self.temperature <= 100.0, "between 0 and 100"),
            ("top_k", self.top_k >= 0, "0 (off) or positive"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "in [0, 1]"),
            ("repetition_penalty", 0.0 < self.repetition_penalty <= 10.0, "in (0, 10]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "in [-2, 2]"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, f"in [0, {MAX_LOGPROBS}]"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass
class SeqInput:
    """One sequence's part of a step."""
    token_ids: Sequence[int]          # a prefill chunk, 1 decode token, or 1 + draft tokens
    start_pos: int                    # position of token_ids[0]; earlier positions are in the KV cache
    block_table: Sequence[int]        # KV blocks covering [0, start_pos + len(token_ids)), BLOCK_SIZE each
    num_sampled: int = 1              # sample after the last num_sampled tokens (0: non-final prefill chunk)
    params: SamplingParams | None = None
    history: Sequence[int] = ()       # prompt + generated tokens so far (for penalties)
    num_prompt: int = 0               # history[:num_prompt] is the prompt
    want_logits: bool = False         # return the logits of every token in token_ids


@dataclass
class SeqOutput:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    logits: np.ndarray | None = None


def physical_cores() -> int:
    """Physical cores this process may run on (hyperthreads share a core's matmul units)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    try:
        cpu = None
        with open("/proc/cpuinfo") as f:
            phys = core = None
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "processor":
                    cpu = int(value)
                elif key == "physical id":
                    phys = value.strip()
                elif key == "core id":
                    core = value.strip()
                    if cpu in allowed:
                        cores.add((phys, core))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores) or len(allowed), len(allowed)))


class Engine(EngineShape):
    def __init__(self, model, *, num_kv_blocks: int, max_batch_tokens: int = 512, max_seqs: int = 64,
                 threads: int | None = None, max_logits_rows: int | None = None, progress=None):
        super().__init__(model, num_kv_blocks=num_kv_blocks, max_batch_tokens=max_batch_tokens, max_seqs=max_seqs,
                         max_logits_rows=max_logits_rows)
        self.threads = threads or physical_cores()
        self._model = build_cpu_model(model, self.threads, progress)   # progress: see weights.build_cpu_model
        self._ctx = _cpu.Context(self._model, max_batch_tokens, self.max_logits_rows, num_kv_blocks, self.threads)
        self.weight_bytes = self._model.weight_bytes
        self.kernel_path = _cpu.get_path()

    def step(self, seqs: list[SeqInput], *, want_hidden: bool = False):
        """Runs one forward pass over all sequences and samples. Raises ValueError on a bad batch."""
        if not seqs:
            return []
        b = self.flatten(seqs)
        params, history, bias_ids, bias_values = self._sampling_arrays(seqs, b.rows_of_seq, len(b.out_rows))
        samples, logits, hidden = self._ctx.forward(
            b.tokens, b.positions, b.seq_of_token, b.block_tables, b.out_rows, b.sample_mask, params, history,
            bias_ids, bias_values, any(s.want_logits for s in seqs), want_hidden)
        outputs = [self._output(s, first, count, first_sampled, samples, logits, self.vocab_size)
                   for s, (first, count, first_sampled) in zip(seqs, b.rows_of_seq)]
        return (outputs, hidden) if want_hidden else outputs

    def _sampling_arrays(self, seqs, rows_of_seq, n_out):
        p = {name: np.zeros(n_out, np.float64) for name in _cpu.SAMPLE_FIELDS}
        p["temperature"][:] = 0.0
        p["top_p"][:] = 1.0
        p["repetition_penalty"][:] = 1.0
        p["num_logprobs"][:] = -1
        p["seed"] = np.zeros(n_out, np.uint64)
        history: list[int] = []
        bias_ids: list[int] = []
        bias_values: list[float] = []
        for s, (first, count, first_sampled) in zip(seqs, rows_of_seq):
            sp = s.params or SamplingParams(temperature=0.0)
            seed = sp.seed if sp.seed is not None else random.getrandbits(64)
            bias_offset = len(bias_ids)
            if sp.logit_bias:
                for tok, val in sp.logit_bias.items():
                    if not 0 <= int(tok) < self.vocab_size:
                        raise ValueError(f"logit_bias token {tok} is outside the vocabulary of {self.vocab_size}")
                    bias_ids.append(int(tok))
                    bias_values.append(float(val))
            n = len(s.token_ids)
            for r in range(first + first_sampled, first + count):
                k = n - (first + count - r)                  # index of this row's token in token_ids
                p["temperature"][r] = sp.temperature
                p["top_p"][r] = sp.top_p
                p["min_p"][r] = sp.min_p
                p["top_k"][r] = sp.top_k
                p["repetition_penalty"][r] = sp.repetition_penalty
                p["presence_penalty"][r] = sp.presence_penalty
                p["frequency_penalty"][r] = sp.frequency_penalty
                p["seed"][r] = seed & 0xFFFFFFFFFFFFFFFF
                p["num_logprobs"][r] = -1 if sp.logprobs is None else sp.logprobs
                p["bias_offset"][r] = bias_offset
                p["bias_len"][r] = len(bias_ids) - bias_offset
                if sp.has_penalties:
                    hist = penalty_history(s, k)
                    p["history_offset"][r] = len(history)
                    p["history_len"][r] = len(hist)
                    p["num_prompt"][r] = s.num_prompt
                    history.extend(hist)
        return (p, np.asarray(history, np.int32), np.asarray(bias_ids, np.int32),
                np.asarray(bias_values, np.float32))

    @staticmethod
    def _output(s: SeqInput, first: int, count: int, first_sampled: int, samples, logits, vocab: int) -> SeqOutput:
        out = SeqOutput()
        rows = range(first + first_sampled, first + count)
        out.tokens = [int(samples["token"][r]) for r in rows]
        sp = s.params
        if sp is not None and sp.logprobs is not None:
            out.logprobs = [float(samples["logprob"][r]) for r in rows]
            out.top_logprobs = [[(int(samples["top_ids"][r, j]), float(samples["top_logprobs"][r, j]))
                                 for j in range(min(sp.logprobs, vocab))] for r in rows]
        if s.want_logits:
            out.logits = logits[first:first + count]
        return out
