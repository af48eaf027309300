"""Builds inferd._cpu (Cython + C kernels) always, and inferd._cuda when nvcc is available.

The C code is compiled for baseline x86-64 (no -march=native, so a wheel runs anywhere); the AVX2 and VNNI
kernels carry target attributes and are chosen at run time. -ffp-contract=off keeps the compiler from
fusing multiplies and adds differently in different paths: the kernels promise bit-identical results."""
import glob
import importlib.util
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

ROOT = os.path.dirname(os.path.abspath(__file__))

cpu = Extension(
    "inferd._cpu",
    sources=["ext/_cpu.pyx"] + sorted(glob.glob("ext/cpu/*.c")),
    include_dirs=["ext/cpu", np.get_include()],
    extra_compile_args=["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-pthread",
                        "-Wno-unused-function"],
    extra_link_args=["-pthread", "-lm"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)
# the event loop's wake-up write, apart from the kernels so that the scheduler's side needs no kernel build
waker = Extension("inferd._waker", sources=["ext/_waker.pyx"])
# a GGUF header's string arrays (the vocabulary), read before anything else of a load can start
gguf_strings = Extension("inferd._gguf", sources=["ext/_gguf.pyx"])
extensions = [cpu, waker, gguf_strings]

cuda_build = os.path.join(ROOT, "ext", "cuda", "build.py")
if os.path.exists(cuda_build):
    spec = importlib.util.spec_from_file_location("inferd_cuda_build", cuda_build)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cuda = module.cuda_extension(ROOT)
    if cuda is not None:
        extensions.append(cuda)

setup(ext_modules=cythonize(extensions, language_level=3, include_path=["ext"], compiler_directives={"embedsignature": True}))
