# Included by _cpu.pyx: the matmul kernel settings of a context (kernel_config_t, ext/cpu/inferd.h).

PREFILL_KERNELS = ("tiles", "avx512", "amx")
DECODE_KERNELS = ("tiles", "avx512")


cdef class KernelConfig:
    """Which matmul kernels a context may run, and a decode step's software prefetch. Every setting gives the same
    bits; tests and benchmarks force each. Context.kernels, Encoder.kernels and Weight.kernels are the settings those
    run with (a chat model's context and an embedding context over the same weights keep their own); one made here
    holds the defaults and changes nothing else."""
    cdef kernel_config_t own
    cdef kernel_config_t *k
    cdef object owner   # what holds *k, kept alive while this object is

    def __cinit__(self):
        kernel_config_default(&self.own)
        self.k = &self.own

    @staticmethod
    cdef KernelConfig of(kernel_config_t *k, object owner):
        cdef KernelConfig c = KernelConfig.__new__(KernelConfig)
        c.k = k
        c.owner = owner
        return c

    def set_prefill_kernels(self, str name):
        """The best prefill kernels the VNNI paths may use: 'tiles' (8-row ymm tiles), 'avx512' (pairs of tiles in
        zmm where the CPU has AVX-512 VNNI) or 'amx' (those with AMX for groups of 16 tokens where the CPU and OS
        allow; the default)."""
        if name not in PREFILL_KERNELS:
            raise ValueError(f"prefill kernels {name!r}: expected one of {PREFILL_KERNELS}")
        self.k.prefill = PREFILL_KERNELS.index(name)

    def prefill_kernels(self):
        """The prefill kernels these settings run with the active path on this CPU."""
        return PREFILL_KERNELS[matmul_prefill_kernels(self.k)]

    def set_decode_group(self, int tiles):
        """Tiles a single token's matmul walks in lockstep per kernel call: 1 to 4 (the default)."""
        if not 1 <= tiles <= 4:
            raise ValueError(f"decode group of {tiles} tiles: expected 1 to 4")
        self.k.decode_group = tiles

    def decode_group(self):
        return self.k.decode_group

    def set_decode_kernels(self, str name):
        """The single-token kernels of the quantized types but Q8_0 the VNNI paths may use: 'tiles' (8-row ymm
        tiles) or 'avx512' (pairs of tiles in zmm where the CPU has AVX-512 VNNI; the default)."""
        if name not in DECODE_KERNELS:
            raise ValueError(f"decode kernels {name!r}: expected one of {DECODE_KERNELS}")
        self.k.decode_zmm = DECODE_KERNELS.index(name)

    def decode_kernels(self):
        """The decode kernels these settings run with the active path on this CPU."""
        return DECODE_KERNELS[matmul_decode_kernels(self.k)]

    def set_decode_prefetch(self, max_tile_bytes):
        """Software prefetch in a decode step's kernels for tiles of at most max_tile_bytes (0: never, None: always).
        The default is the CPU's: always, but on AMD only tiles of up to 16 KB (its hardware prefetcher does better
        alone on longer ones)."""
        self.k.decode_prefetch_bytes = SIZE_MAX if max_tile_bytes is None else max_tile_bytes

    def decode_prefetch(self):
        """The largest tile a decode step prefetches for (None: every tile)."""
        cdef size_t n = self.k.decode_prefetch_bytes
        return None if n == SIZE_MAX else n
