"""Engine: the model's one owner. Turns a list of per-sequence inputs into the flat batch the C forward pass
takes, runs it (one nogil call: every layer, logits, sampling) and hands back sampled tokens."""

from __future__ import annotations

import logging
import os

import numpy as np

from inferd import _cpu
from inferd.engine.batch import EngineShape
from inferd.engine.host_plan import kv_format, penalty_history, sampled_rows, sampling_records, seq_output, step_masks
from inferd.engine.types import BLOCK_SIZE, MAX_LOGPROBS, SeqInput
from inferd.engine.weights import build_cpu_model

log = logging.getLogger("inferd.engine")

# the native-free types promise the C header's sizes
assert BLOCK_SIZE == _cpu.BLOCK_SIZE and MAX_LOGPROBS == _cpu.MAX_LOGPROBS


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
    supports_token_masks = True  # SeqInput.allowed: the C sampler applies a grammar's mask
    supports_lora = True  # SeqInput.lora: adapters added with add_adapter

    def __init__(
        self,
        model,
        *,
        num_kv_blocks: int,
        max_batch_tokens: int = 512,
        max_seqs: int = 64,
        threads: int | None = None,
        max_logits_rows: int | None = None,
        kv_cache_dtype: str = "f16",
        progress=None,
        huge_pages_now: bool = True,
    ):
        """kv_cache_dtype: "f16"; "bf16" (K and V rounded to bf16, attention in bf16 products with float sums:
        ext/cpu/attention_bf16.c); or "q8_0" (int8 K and V with an f16 scale per 32 values: ext/cpu/attention_q8.c).
        huge_pages_now: the weights move into 2 MB pages from the end of the build; else from start_huge_pages()."""
        super().__init__(
            model,
            num_kv_blocks=num_kv_blocks,
            max_batch_tokens=max_batch_tokens,
            max_seqs=max_seqs,
            max_logits_rows=max_logits_rows,
            kv_cache_dtype=kv_format("cpu", kv_cache_dtype),  # checked here, before the weights load
        )
        self.threads = threads or physical_cores()
        self._model = build_cpu_model(model, self.threads, progress, huge_pages_now)
        # a model with recurrent layers keeps a state per running sequence: one slot for each
        self.num_state_slots = max_seqs if model.config.is_recurrent else 0
        self._ctx = _cpu.Context(
            self._model,
            max_batch_tokens,
            self.max_logits_rows,
            num_kv_blocks,
            self.threads,
            kv_cache_dtype,
            self.num_state_slots,
        )
        self.weight_bytes = self._model.weight_bytes
        self.kernel_path = _cpu.get_path()
        if kv_cache_dtype == "bf16" and not _cpu.bf16_attention_native():
            log.warning(
                "kv_cache_dtype bf16: this CPU's %s path has no AVX-512 BF16, so attention runs as float fmas on "
                "bf16 values, slower than with the f16 cache and less precise; f16 is the better choice here",
                self.kernel_path,
            )
        self._loras: list[_cpu.LoraAdapter] = []  # each adapter's A and B once, whatever uses it

    @property
    def huge_pages(self) -> str:
        """Where the weights' move into 2 MB pages stands: "waiting", "collapsing", "all", "partly" or "none"
        (_cpu.Model.huge_pages)."""
        return self._model.huge_pages

    def start_huge_pages(self) -> None:
        """Starts the weights' move into 2 MB pages (of an engine built with huge_pages_now=False; once)."""
        self._model.start_huge_pages()

    def wait_huge_pages(self) -> str:
        """Blocks until the weights' move into 2 MB pages is done (without the GIL); returns `huge_pages`."""
        return self._model.wait_huge_pages()

    def add_adapter(self, adapter) -> int:
        """Makes a LoRA adapter (inferd.model.lora.Adapter, read for this model) available to SeqInput.lora;
        returns its index. Its matrices are held once in f32 beside the base weights, which stay as they are."""
        self._loras.append(_cpu.LoraAdapter(self._model, adapter.matrices))
        return len(self._loras) - 1

    @property
    def num_adapters(self) -> int:
        return len(self._loras)

    @property
    def adapter_bytes(self) -> int:
        return sum(a.nbytes for a in self._loras)

    def step(self, seqs: list[SeqInput], *, want_hidden: bool = False):
        """Runs one forward pass over all sequences and samples. Raises ValueError on a bad batch."""
        if not seqs:
            return []
        b = self.flatten(seqs)
        for s in seqs:
            if s.restore_state is not None:  # a prefix-cache hit: the state after its cached positions
                self._ctx.write_state(s.state_slot, s.restore_state, s.start_pos)
        params, history, bias_ids, bias_values, masks = self._sampling_arrays(seqs, b.rows_of_seq, len(b.out_rows))
        lora: dict = {}
        if any(s.lora >= 0 for s in seqs):
            bad = [i for i, s in enumerate(seqs) if not -1 <= s.lora < len(self._loras)]
            if bad:
                raise ValueError(
                    f"sequence {bad[0]}: LoRA adapter {seqs[bad[0]].lora} (the engine has {len(self._loras)})"
                )
            lora = {
                "loras": self._loras,
                "lora_of_seq": np.array([s.lora for s in seqs], np.int32),
                "lora_scale_of_seq": np.array([s.lora_scale for s in seqs], np.float32),
            }
        samples, logits, hidden = self._ctx.forward(
            b.tokens,
            b.positions,
            b.seq_of_token,
            b.block_tables,
            b.out_rows,
            b.sample_mask,
            params,
            history,
            bias_ids,
            bias_values,
            any(s.want_logits for s in seqs),
            want_hidden,
            token_masks=masks,
            **lora,
            state_slots=b.state_slots if self.num_state_slots else None,
        )
        vocab = self.vocab_size

        def top_logprobs(s: SeqInput, r: int, k: int) -> list[tuple[int, float]]:
            # under a grammar, fewer tokens than asked for may be allowed: the sampler marks the rest with id -1
            ids, lps = samples["top_ids"][r], samples["top_logprobs"][r]
            return [(int(ids[j]), float(lps[j])) for j in range(min(k, vocab)) if ids[j] >= 0]

        outputs = [
            seq_output(s, rows, samples["token"], samples["logprob"], top_logprobs, logits)
            for s, rows in zip(seqs, b.rows_of_seq)
        ]
        for s, out in zip(seqs, outputs):
            if s.snapshot_state:
                out.state = self._ctx.read_state(s.state_slot)[0]
        return (outputs, hidden) if want_hidden else outputs

    # ---- KV blocks in and out (the prompt cache on disk: prompt_cache_disk.py) ------------------------------

    def kv_layout(self) -> dict[str, object]:
        """What a KV block image depends on besides the weights: two engines with equal layouts read each
        other's images."""
        cfg = self.config
        return {
            "engine": "cpu",
            "kv_cache_dtype": self.kv_cache_dtype,
            "block_size": self.block_size,
            "n_layers": cfg.n_layers,
            "n_kv_heads": cfg.n_kv_heads,
            "head_dim": cfg.head_dim,
            "block_bytes": self._ctx.kv_block_bytes,
        }

    def read_kv_block(self, block_id: int) -> bytes:
        return self._ctx.read_kv_block(block_id)

    def write_kv_block(self, block_id: int, image: bytes) -> None:
        self._ctx.write_kv_block(block_id, image)

    def copy_kv_block(self, src: int, dst: int) -> None:
        self._ctx.copy_kv_block(src, dst)

    def _sampling_arrays(self, seqs: list[SeqInput], rows_of_seq: list[tuple[int, int, int]], n_out: int):
        """The sampler's records (one per logits row, _cpu.SAMPLE_PARAMS_DTYPE = the C sample_params_t), the flat
        history and logit-bias arrays they point into, and the grammars' mask rows (None when no row has one)."""
        rows = list(sampled_rows(seqs, rows_of_seq, self.vocab_size))
        p = sampling_records(_cpu.SAMPLE_PARAMS_DTYPE, n_out, rows)
        p["mask_row"] = -1
        p["num_logprobs"] = -1
        history: list[int] = []
        bias_ids: list[int] = []
        bias_values: list[float] = []
        bias_of: dict[int, tuple[int, int]] = {}  # per sequence: its logit-bias entries' (offset, length)
        for row in rows:
            sp = row.params
            if id(row.seq) not in bias_of:
                bias_of[id(row.seq)] = (len(bias_ids), len(sp.logit_bias or ()))
                for tok, val in (sp.logit_bias or {}).items():
                    bias_ids.append(int(tok))
                    bias_values.append(float(val))
            rec = p[row.row]
            rec["num_logprobs"] = -1 if sp.logprobs is None else sp.logprobs
            rec["bias_offset"], rec["bias_len"] = bias_of[id(row.seq)]
            rec["mask_row"] = row.mask_row
            if sp.has_penalties:
                hist = penalty_history(row.seq, row.k)
                rec["history_offset"], rec["history_len"] = len(history), len(hist)
                rec["num_prompt"] = row.seq.num_prompt
                history.extend(hist)
        return (
            p,
            np.asarray(history, np.int32),
            np.asarray(bias_ids, np.int32),
            np.asarray(bias_values, np.float32),
            step_masks(rows),
        )
