"""LoRA adapters in the CPU engine: read from PEFT folders and llama.cpp GGUFs (inferd/model/lora.py), applied in
the C forward pass on top of the base weights (ext/cpu/lora.c).

- With an adapter, the engine's logits equal tests/reference.py's float64 forward pass of the merged weights
  W + scale * B @ A, within the tolerances of tests/engine/test_forward_reference.py (the adapter moving the logits
  by far more than that, so the comparison means something).
- Several adapters in one step: each sequence's logits are bit for bit those it gets alone, whatever shares its
  step (and a sequence without an adapter gets the base model's bits).
- The scalar and the SIMD kernel paths give the same bits with adapters.
- A GGUF adapter written as convert_lora_to_gguf.py writes it, and the same adapter as a PEFT folder (F32, F16,
  BF16), load to the same matrices in the base model's row order."""

from __future__ import annotations

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.engine import Engine
from inferd.engine.types import SeqInput
from inferd.model.errors import ModelLoadError
from inferd.model.lora import load_adapter
from tests.engine.test_forward_reference import model_tol, row_errors
from tests.model.make_lora import GGUF_TENSOR, merged_tensors, random_lora, to_gguf_rows, write_gguf_lora, write_peft
from tests.reference import Reference, random_model

RANK, ALPHA = 4, 8.0  # the adapter's own scale: alpha / rank = 2
K_SHAPE = {"dim": 256, "hidden": 256, "n_heads": 4, "n_kv_heads": 2}  # rows of 256 for the K-quants, GQA


def engine_for(model, **kw) -> Engine:
    return Engine(model, num_kv_blocks=8, max_batch_tokens=256, max_seqs=8, threads=kw.pop("threads", 1),
                  max_logits_rows=256, **kw)


def tokens(cfg, n, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, cfg.vocab_size, n)]


def logits_of(eng: Engine, seqs: list[SeqInput]) -> list[np.ndarray]:
    return [o.logits for o in eng.step(seqs)]


@pytest.mark.parametrize("arch,weight_type", [("llama", "F32"), ("llama", "Q8_0"), ("qwen2", "Q4_K"),
                                              ("gemma3", "F16")])
def test_adapter_matches_merged_reference(tmp_path, arch, weight_type):
    shape = K_SHAPE if weight_type.endswith("_K") else {}
    model = random_model(arch=arch, weight_type=weight_type, seed=3, **shape)
    cfg = model.config
    matrices = random_lora(cfg, RANK, seed=5, gain=0.25)
    adapter = load_adapter(write_peft(tmp_path / "peft", matrices, alpha=ALPHA, rank=RANK), cfg)
    assert sorted(adapter.matrices) == sorted(matrices) and adapter.rank == RANK
    request_scale = 0.75
    eng = engine_for(model)
    index = eng.add_adapter(adapter)
    toks = tokens(cfg, 70, seed=1)                        # crosses the 64-position KV block
    got = eng.step([SeqInput(toks, 0, [3, 1], want_logits=True, lora=index, lora_scale=request_scale)])[0].logits
    base = eng.step([SeqInput(toks, 0, [4, 5], want_logits=True)])[0].logits
    merged = Reference(cfg, merged_tensors(model, matrices, request_scale * ALPHA / RANK))
    ref = merged.forward(toks, kv_dtype=np.float16).logits
    tol = model_tol(model)
    err = row_errors(got, ref)
    assert err.max() < tol, f"adapter vs merged reference: worst row error {err.max():.2e} (tolerance {tol})"
    moved = row_errors(base, ref)
    assert np.median(moved) > 5 * tol, f"the adapter hardly moves the logits ({np.median(moved):.2e})"
    if weight_type == "Q8_0":
        # exactly what the engine computes: 8-bit activations into the base matmuls, floats into the adapter's
        split = SplitReference(cfg, model.tensors, deltas(cfg, matrices, request_scale * ALPHA / RANK))
        exact = row_errors(got, split.forward(toks, kv_dtype=np.float16, act_quant=True).logits)
        assert np.median(exact) < 1e-5, f"median row error {np.median(exact):.2e} against the split reference"


class SplitReference(Reference):
    """The reference with the adapter beside the base weights, as the engine runs it: x @ W.T (x rounded to 8 bits
    for a quantized W with act_quant) + x @ (scale B A).T, x in floats."""

    def __init__(self, config, tensors, deltas: dict[str, np.ndarray]):
        super().__init__(config, tensors)
        self.deltas = deltas

    def mm(self, x, name, act_quant=False):
        out = super().mm(x, name, act_quant)
        return out + x @ self.deltas[name].T if name in self.deltas else out


def deltas(cfg, matrices, scale) -> dict[str, np.ndarray]:
    """GGUF tensor name -> scale * B @ A in the model's row order, float64."""
    return {f"blk.{layer}.{GGUF_TENSOR[t]}.weight": scale * to_gguf_rows(cfg, t, b).astype(np.float64) @ a
            for (layer, t), (a, b) in matrices.items()}


def test_every_target_alone_matches_reference(tmp_path):
    """Each adapted weight on its own (the fused Q|K|V and gate|up segments, Wo, Wdown) lands in its own rows and
    moves the logits exactly as the split reference says."""
    model = random_model(arch="llama", weight_type="Q8_0", seed=4)
    cfg = model.config
    eng = engine_for(model)
    toks = tokens(cfg, 20, seed=2)
    base = eng.step([SeqInput(toks, 0, [0], want_logits=True)])[0].logits
    for i, target in enumerate(("q", "k", "v", "o", "gate", "up", "down")):
        matrices = random_lora(cfg, 2, targets=(target,), seed=10 + i, gain=1.0, layers=[1])
        folder = write_peft(tmp_path / target, matrices, alpha=2.0, rank=2)
        index = eng.add_adapter(load_adapter(folder, cfg))
        got = eng.step([SeqInput(toks, 0, [0], want_logits=True, lora=index)])[0].logits
        ref = SplitReference(cfg, model.tensors, deltas(cfg, matrices, 1.0))
        exact = row_errors(got, ref.forward(toks, kv_dtype=np.float16, act_quant=True).logits)
        moved = row_errors(got, base)
        assert np.median(exact) < 1e-5 and np.median(moved) > 1e-2, (target, np.median(exact), np.median(moved))


def test_sequences_with_different_adapters_share_a_step(tmp_path):
    """Adapter 0, adapter 1 and none in one step (prefill chunks and decodes mixed): each sequence's logits are
    bit for bit what it gets alone."""
    model = random_model(arch="qwen2", weight_type="Q8_0", seed=6)
    cfg = model.config
    eng = engine_for(model, threads=2)
    a0 = eng.add_adapter(load_adapter(write_peft(tmp_path / "a0", random_lora(cfg, 4, seed=1), alpha=8, rank=4), cfg))
    a1 = eng.add_adapter(load_adapter(write_peft(tmp_path / "a1", random_lora(cfg, 8, seed=2, targets=("q", "v",
                                                 "down")), alpha=4, rank=8), cfg))  # fmt: skip
    prompts = [tokens(cfg, n, seed=s) for n, s in ((40, 1), (9, 2), (23, 3))]
    choices = [(a0, 1.0), (a1, 0.5), (-1, 1.0)]
    tables = [[0, 1], [2], [3]]

    def seq(i, n0, n1, table=None):
        lora, scale = choices[i]
        return SeqInput(prompts[i][n0:n1], n0, table or tables[i], want_logits=True, lora=lora, lora_scale=scale)

    together = logits_of(eng, [seq(0, 0, 40), seq(1, 0, 9), seq(2, 0, 23)])
    alone = [logits_of(eng, [seq(i, 0, len(prompts[i]), [4 + i])])[0] for i in range(3)]
    # a decode of sequence 0 beside a prefill of the others, against that decode alone
    mixed = logits_of(eng, [seq(1, 0, 9, [4]), seq(0, 39, 40), seq(2, 0, 23, [5])])
    for i in range(3):
        assert np.array_equal(together[i], alone[i]), f"sequence {i} depends on its batch"
    assert np.array_equal(mixed[1], together[0][-1:])
    assert np.array_equal(mixed[0], alone[1]) and np.array_equal(mixed[2], alone[2])
    base = logits_of(engine_for(model), [SeqInput(prompts[2], 0, [0], want_logits=True)])[0]
    assert np.array_equal(together[2], base), "a sequence without an adapter differs from the base model"
    assert not np.allclose(together[0], logits_of(eng, [SeqInput(prompts[0], 0, [6, 7], want_logits=True)])[0])


def test_scalar_and_simd_paths_agree(tmp_path):
    best = _cpu.best_path()
    if best == "scalar":
        pytest.skip("this CPU has no SIMD path")
    model = random_model(arch="llama", weight_type="Q4_K", seed=8, **K_SHAPE)
    cfg = model.config
    adapter = load_adapter(write_peft(tmp_path / "a", random_lora(cfg, 4, seed=3), alpha=8, rank=4), cfg)
    toks = tokens(cfg, 30, seed=4)
    out = {}
    try:
        for path in ("scalar", best):
            _cpu.set_path(path)
            eng = engine_for(model)
            index = eng.add_adapter(adapter)
            out[path] = logits_of(eng, [SeqInput(toks, 0, [0], want_logits=True, lora=index),
                                        SeqInput(toks[:7], 0, [1], want_logits=True)])
    finally:
        _cpu.set_path(best)
    for a, b in zip(out["scalar"], out[best]):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_gguf_and_peft_adapters_load_alike(tmp_path, arch, dtype):
    """The converter's GGUF (q/k rows of B permuted for llama) and the PEFT folder give the same matrices, in the
    base model's row order, and the same scale (alpha / rank)."""
    model = random_model(arch=arch, seed=9)
    cfg = model.config
    matrices = random_lora(cfg, RANK, seed=4)
    gguf_ad = load_adapter(write_gguf_lora(tmp_path / "a.gguf", cfg, matrices, alpha=ALPHA, dtype=dtype), cfg)
    peft_ad = load_adapter(write_peft(tmp_path / "peft", matrices, alpha=ALPHA, rank=RANK, dtype=dtype), cfg)
    assert gguf_ad.format == "gguf" and peft_ad.format == "peft"
    assert gguf_ad.alpha == peft_ad.alpha == ALPHA
    assert sorted(gguf_ad.matrices) == sorted(peft_ad.matrices) == sorted(matrices)
    for key, (a, b) in matrices.items():
        ga, gb, gs = gguf_ad.matrices[key]
        pa, pb, ps = peft_ad.matrices[key]
        assert gs == ps == ALPHA / RANK
        assert np.array_equal(ga, pa) and np.array_equal(gb, pb)
        want_b = to_gguf_rows(cfg, key[1], b)
        tol = 0 if dtype == "F32" else 1e-2 if dtype == "BF16" else 1e-3
        np.testing.assert_allclose(ga, a, atol=tol * np.abs(a).max())
        np.testing.assert_allclose(gb, want_b, atol=tol * np.abs(b).max())
    eng = engine_for(model)
    i, j = eng.add_adapter(gguf_ad), eng.add_adapter(peft_ad)
    toks = tokens(cfg, 12, seed=5)
    a, b = logits_of(eng, [SeqInput(toks, 0, [0], want_logits=True, lora=i),
                           SeqInput(toks, 0, [1], want_logits=True, lora=j)])
    assert np.array_equal(a, b)


def test_peft_rslora_and_alpha_pattern(tmp_path):
    model = random_model(arch="qwen2", seed=1)
    cfg = model.config
    matrices = random_lora(cfg, 4, targets=("q", "down"), seed=2)
    folder = write_peft(tmp_path / "p", matrices, alpha=6.0, rank=4,
                        extra_config={"use_rslora": True, "alpha_pattern": {"down_proj": 2.0}})
    ad = load_adapter(folder, cfg)
    assert ad.matrices[(0, "q")][2] == pytest.approx(6.0 / 2.0)     # alpha / sqrt(rank)
    assert ad.matrices[(1, "down")][2] == pytest.approx(2.0 / 2.0)


def test_moe_model_takes_attention_adapters_only(tmp_path):
    model = random_model(arch="qwen3moe", experts=4, experts_used=2, seed=2)
    cfg = model.config
    attn = random_lora(cfg, 4, targets=("q", "k", "v", "o"), seed=1)
    eng = engine_for(model)
    index = eng.add_adapter(load_adapter(write_peft(tmp_path / "attn", attn, alpha=8, rank=4), cfg))
    toks = tokens(cfg, 10, seed=3)
    got = logits_of(eng, [SeqInput(toks, 0, [0], want_logits=True, lora=index)])[0]
    ref = Reference(cfg, merged_tensors(model, attn, 2.0)).forward(toks, kv_dtype=np.float16).logits
    assert row_errors(got, ref).max() < model_tol(model)
    ffn = {(0, "gate"): (np.zeros((4, cfg.dim), np.float32), np.zeros((cfg.hidden_dim, 4), np.float32))}
    with pytest.raises(ModelLoadError, match="mixture of experts"):
        load_adapter(write_peft(tmp_path / "ffn", ffn, alpha=8, rank=4), cfg)


def test_bad_adapters_are_refused_with_their_reason(tmp_path):
    model = random_model(arch="llama", seed=1)
    cfg = model.config
    other = random_model(arch="llama", dim=128, hidden=96, n_heads=1, seed=1).config
    with pytest.raises(ModelLoadError, match=r"do not fit the base weight .*another base model"):
        load_adapter(write_peft(tmp_path / "other", random_lora(other, 4), alpha=8, rank=4), cfg)
    with pytest.raises(ModelLoadError, match="the base model has 2 layers"):
        load_adapter(write_peft(tmp_path / "deep", random_lora(cfg, 4, layers=[5]), alpha=8, rank=4), cfg)
    with pytest.raises(ModelLoadError, match="needs adapter_config.json"):
        (tmp_path / "empty").mkdir()
        load_adapter(tmp_path / "empty", cfg)
    with pytest.raises(ModelLoadError, match="no such adapter"):
        load_adapter(tmp_path / "missing", cfg)
    with pytest.raises(ModelLoadError, match="DoRA"):
        load_adapter(write_peft(tmp_path / "dora", random_lora(cfg, 4), alpha=8, rank=4,
                                extra_config={"use_dora": True}), cfg)
    # a GGUF that is a model, not an adapter
    from tests.model.make_tiny import write_tiny_gguf

    with pytest.raises(ModelLoadError, match="not a LoRA adapter"):
        load_adapter(write_tiny_gguf(tmp_path / "model.gguf"), cfg)
    qwen = random_model(arch="qwen2", seed=1).config
    with pytest.raises(ModelLoadError, match="an adapter for a llama model; the base model is qwen2"):
        load_adapter(write_gguf_lora(tmp_path / "l.gguf", cfg, random_lora(cfg, 4), alpha=8), qwen)
    eng = engine_for(model)
    with pytest.raises(ValueError, match="LoRA adapter 3"):
        eng.step([SeqInput([1, 2], 0, [0], lora=3)])


def test_prefix_cache_hashes_an_adapters_blocks_under_its_root():
    from inferd.engine.kv_cache import KVCacheManager
    from inferd.engine.types import LoraUse

    kv = KVCacheManager(16, 64)
    prompt = list(range(130))
    roots = [None, LoraUse(0, 1.0, "a\0d1").cache_root, LoraUse(0, 0.5, "a\0d1").cache_root,
             LoraUse(1, 1.0, "b\0d2").cache_root]
    assert len(set(roots)) == 4
    for i, root in enumerate(roots):                 # each computes and caches its two full blocks
        assert kv.match_prefix(("first", i), prompt, 129, root) == 0
        kv.allocate(("first", i), 130)
        kv.cache_blocks(("first", i), prompt, 130)
    for i, root in enumerate(roots):                 # and hits only its own
        assert kv.match_prefix(("again", i), prompt, 129, root) == 128
        assert kv.block_table(("again", i)) == kv.block_table(("first", i))[:2]
