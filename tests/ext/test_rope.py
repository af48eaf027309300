"""RoPE frequencies come from one place (rope.c) for both engines: _cpu.rope_frequencies, which the CUDA engine
uses, against the float64 reference's, plain and with llama3 scaling."""
import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.weights import engine_config
from tests.reference import random_model, rope_inv_freq

LLAMA3 = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["plain", "llama3"])
@pytest.mark.parametrize("theta,head_dim", [(10000.0, 64), (500000.0, 128)])
def test_rope_frequencies_match_the_reference(scaling, theta, head_dim):
    cfg = random_model(rope_theta=theta, rope_scaling=scaling, dim=2 * head_dim, n_heads=2, n_kv_heads=1).config
    got = _cpu.rope_frequencies(engine_config(cfg))
    want = rope_inv_freq(cfg)
    assert got.shape == (head_dim // 2,)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    if scaling:   # the lowest frequencies were stretched by the factor, the highest kept
        assert got[-1] == pytest.approx(theta ** (-(head_dim - 2) / head_dim) / 32.0, rel=1e-12)
        assert got[0] == 1.0


def test_rope_frequencies_refuse_an_odd_head_dim():
    cfg = engine_config(random_model().config)
    with pytest.raises(ValueError, match="head_dim 7"):
        _cpu.rope_frequencies({**cfg, "head_dim": 7})
