"""Writes ext/cpu/iq_grids.c (run from the repository root) from gguf-py's quants module (its grids are llama.cpp's, stored compressed)."""
import numpy as np
from gguf import quants

def table(cls, ctype, bytes_per_entry, signed=False):
    cls.init_grid()
    g = np.asarray(cls.grid, np.float32).reshape(cls.grid_shape).astype(np.int64)
    rows = []
    for e in g:
        v = 0
        for j, b in enumerate(e):
            v |= (int(b) & 0xFF) << (8 * j)
        rows.append(v)
    width = 2 * bytes_per_entry
    per_line = 5 if bytes_per_entry == 8 else 8
    suffix = "ull" if bytes_per_entry == 8 else "u"
    lines = []
    for i in range(0, len(rows), per_line):
        lines.append("    " + ", ".join(f"0x{v:0{width}x}{suffix}" for v in rows[i:i + per_line]) + ",")
    return len(rows), "\n".join(lines)

out = ["/* The codebooks of the IQ1, IQ2 and IQ3 weight types: each entry's values as bytes, value j in byte j (little",
       " * endian). IQ2's and IQ3's are the magnitudes (their signs come from the block's sign bits), IQ1_S's are int8 in",
       " * {-1, 0, 1} (IQ1_M shares it). Generated from gguf-py's quants module, whose grids are llama.cpp's. */",
       "#include \"iq_grids.h\"", ""]
for name, cls, ctype, nb in [("IQ2XXS_GRID", quants.IQ2_XXS, "uint64_t", 8), ("IQ2XS_GRID", quants.IQ2_XS, "uint64_t", 8),
                             ("IQ2S_GRID", quants.IQ2_S, "uint64_t", 8), ("IQ3XXS_GRID", quants.IQ3_XXS, "uint32_t", 4),
                             ("IQ3S_GRID", quants.IQ3_S, "uint32_t", 4), ("IQ1S_GRID", quants.IQ1_S, "uint64_t", 8)]:
    n, body = table(cls, ctype, nb)
    out.append(f"const {ctype} {name}[{n}] = {{\n{body}\n}};\n")
    print(name, n)
open("ext/cpu/iq_grids.c", "w").write("\n".join(out))
