"""The weight-type table (ext/cpu/type_traits.c) and the per-context kernel settings (KernelConfig).

- the type names Python sees come from the table, in the WT_ order the engine's enum has;
- no C file but the table's switches over weight types;
- a weight's layout sizes follow its row: GGUF bytes per block and the tile block's bytes per 8 rows;
- kernel settings belong to their holder: two contexts over one model, a Weight and a free KernelConfig change
  only themselves.
"""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from inferd import _cpu
from inferd.engine.weights import build_cpu_model
from tests.reference import make_tensor, random_model

C_DIR = pathlib.Path(__file__).resolve().parents[2] / "ext" / "cpu"

# GGUF block (values, bytes) and the engine's tile block bytes per type
BLOCKS = {"Q4_0": (32, 18, 144), "Q4_1": (32, 20, 160), "Q5_0": (32, 22, 176), "Q5_1": (32, 24, 192),
          "Q8_0": (32, 34, 272), "Q4_K": (256, 144, 1184), "Q5_K": (256, 176, 1440), "Q6_K": (256, 210, 1680),
          "Q2_K": (256, 84, 672), "Q3_K": (256, 110, 912), "IQ4_NL": (32, 18, 144), "IQ4_XS": (256, 136, 1104),
          "MXFP4": (32, 17, 136),
          **{t: (256, b, 8 * b) for t, b in [("IQ2_XXS", 66), ("IQ2_XS", 74), ("IQ2_S", 82), ("IQ3_XXS", 98),
                                             ("IQ3_S", 110), ("IQ1_S", 50), ("IQ1_M", 56), ("TQ1_0", 54),
                                             ("TQ2_0", 66)]}}


def test_weight_types_come_from_the_table_in_enum_order():
    assert list(_cpu.WEIGHT_TYPES.items()) == [("F32", 0), ("F16", 1), ("BF16", 2), ("Q4_0", 3), ("Q4_1", 4),
                                               ("Q8_0", 5), ("Q4_K", 6), ("Q5_K", 7), ("Q6_K", 8), ("Q5_0", 9),
                                               ("Q5_1", 10), ("Q2_K", 11), ("Q3_K", 12), ("IQ4_NL", 13),
                                               ("IQ4_XS", 14), ("MXFP4", 15), ("IQ2_XXS", 16), ("IQ2_XS", 17),
                                               ("IQ2_S", 18), ("IQ3_XXS", 19), ("IQ3_S", 20), ("IQ1_S", 21),
                                               ("IQ1_M", 22), ("TQ1_0", 23), ("TQ2_0", 24)]
    assert _cpu.FLOAT_WEIGHT_TYPES == ("F32", "F16", "BF16")


def test_only_the_table_switches_over_weight_types():
    switching = [p.name for p in sorted(C_DIR.glob("*.[ch]"))
                 if re.search(r"case (WT_|GGML_TYPE)", p.read_text())]
    assert switching in ([], ["type_traits.c"])


@pytest.mark.parametrize("type_name", list(BLOCKS))
def test_layout_sizes_follow_the_row(type_name):
    values, gguf_bytes, tile_bytes = BLOCKS[type_name]
    rows, cols = 13, 2 * values                       # two tiles, the second of 5 rows
    t = make_tensor("w", np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32), type_name)
    assert t.data.nbytes == rows * 2 * gguf_bytes
    w = _cpu.Weight(type_name, rows, cols, t.data)
    assert w.nbytes == 2 * 2 * tile_bytes               # tiles x blocks per row x tile block


def test_kernel_settings_belong_to_their_holder():
    model = build_cpu_model(random_model(weight_type="Q8_0", vocab=300))
    a, b = _cpu.Context(model, 16, 4, 2, 1), _cpu.Context(model, 16, 4, 2, 1)
    free = _cpu.KernelConfig()
    t = make_tensor("w", np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32), "Q8_0")
    w = _cpu.Weight("Q8_0", 16, 64, t.data)
    defaults = (free.decode_group(), free.prefill_kernels(), free.decode_kernels(), free.decode_prefetch())
    assert defaults[0] == 4
    a.kernels.set_decode_group(1)
    a.kernels.set_prefill_kernels("tiles")
    a.kernels.set_decode_prefetch(0)
    w.kernels.set_decode_group(2)
    assert (a.kernels.decode_group(), a.kernels.prefill_kernels(), a.kernels.decode_prefetch()) == (1, "tiles", 0)
    assert w.kernels.decode_group() == 2
    for other in (b.kernels, free, _cpu.KernelConfig()):
        assert (other.decode_group(), other.prefill_kernels(), other.decode_kernels(),
                other.decode_prefetch()) == defaults
    kernels = a.kernels
    del a                                               # the settings object keeps its context alive
    assert kernels.decode_group() == 1
