"""A LoRA adapter made and saved by PEFT itself on a tiny random Hugging Face Llama and Qwen2, read by inferd from
the folder PEFT wrote: the engine's logits with the adapter equal those of PEFT's merged model
(`merge_and_unload()`, transformers in float32), and the GGUF base (q/k rows permuted by llama.cpp's converter)
takes the same adapter to the same logits.

Needs torch, transformers and peft, which are not test dependencies (CPU torch alone is hundreds of MB): skipped
where they are not installed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PEFT comparison needs torch (not a test dependency)")
transformers = pytest.importorskip("transformers", reason="the PEFT comparison needs transformers")
peft = pytest.importorskip("peft", reason="the PEFT comparison needs peft")

from inferd.engine.engine import Engine  # noqa: E402
from inferd.engine.types import SeqInput  # noqa: E402
from inferd.model.loader import load_model  # noqa: E402
from inferd.model.lora import load_adapter  # noqa: E402
from tests.engine.test_forward_reference import row_errors  # noqa: E402
from tests.model.make_tiny import TinySpec, write_tiny_gguf, write_tiny_hf  # noqa: E402

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOL = 2e-3  # F32 weights on both sides; what is left is float32 arithmetic and the f16 K/V cache's rounding


def peft_adapter(hf_folder, out, seed: int):
    """PEFT's own adapter on the HF model (random A and B: PEFT starts B at zero), saved; the merged model's
    logits function."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_folder, torch_dtype=torch.float32)
    config = peft.LoraConfig(r=4, lora_alpha=12, target_modules=MODULES, lora_dropout=0.0, init_lora_weights=False)
    torch.manual_seed(seed)
    pm = peft.get_peft_model(model, config)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * (0.4 / p.shape[1] ** 0.5))
    pm.save_pretrained(out)
    merged = pm.merge_and_unload()
    merged.eval()

    def logits(ids):
        with torch.no_grad():
            return merged(torch.tensor([ids])).logits[0].double().numpy()

    return logits, model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_engine_with_a_peft_adapter_equals_peft_merged_model(tmp_path, arch):
    spec = TinySpec(arch=arch, seed=3)
    hf = write_tiny_hf(tmp_path / "hf", spec, dtype="f32")
    merged_logits, _ = peft_adapter(hf, tmp_path / "adapter", seed=1)
    ids = [int(t) for t in np.random.default_rng(2).integers(3, spec.vocab_size, 40)]
    want = merged_logits(ids)
    for base_path in (hf, write_tiny_gguf(tmp_path / "base.gguf", spec, weight_type="F32")):
        base = load_model(base_path)
        adapter = load_adapter(tmp_path / "adapter", base.config)
        assert adapter.format == "peft" and adapter.matrices[(0, "q")][2] == pytest.approx(12 / 4)
        eng = Engine(base, num_kv_blocks=4, max_batch_tokens=64, max_seqs=2, threads=1, max_logits_rows=64)
        index = eng.add_adapter(adapter)
        got = eng.step([SeqInput(ids, 0, [0], want_logits=True, lora=index)])[0].logits
        plain = eng.step([SeqInput(ids, 0, [1], want_logits=True)])[0].logits
        err = row_errors(got, want)
        assert err.max() < TOL, f"{base_path}: worst row error {err.max():.2e} against PEFT's merged model"
        assert np.median(row_errors(plain, want)) > 20 * TOL, "the adapter hardly changes the model"
