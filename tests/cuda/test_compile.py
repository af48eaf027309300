"""Runs without a GPU (CI): every ext/cuda/*.cu compiles with nvcc for sm_80 and sm_90 (the flags build.py uses),
and the Cython wrapper translates and compiles against inferd_cuda.h. Skips only when nvcc is absent."""
import importlib.util
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "ext" / "cuda"


def load_build():
    spec = importlib.util.spec_from_file_location("inferd_cuda_build_test", CUDA_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow   # nvcc over every .cu file for two architectures: minutes on two cores
def test_cuda_sources_compile(tmp_path):
    b = load_build()
    nvcc = b.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    assert b.cuda_home(nvcc), f"{nvcc} found, but no toolkit headers (include/cuda_runtime.h) beside it"
    archs = b.arch_flags("80,90", ptx=False)
    cublas = b.find_cublas(b.cuda_home(nvcc))
    jobs = []
    for src in b.sources():
        name = Path(src).stem
        jobs.append(b.nvcc_command(nvcc, src, str(tmp_path / f"{name}.o"), archs=archs, cublas_inc=None))
        if name == "gemm" and cublas:       # the cuBLAS path too, when the headers are here
            jobs.append(b.nvcc_command(nvcc, src, str(tmp_path / "gemm_cublas.o"), archs=archs,
                                       cublas_inc=cublas[0]))
    assert len(jobs) >= 6

    def run(cmd):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        return cmd, proc

    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        results = list(pool.map(run, jobs))
    failures = [f"{' '.join(cmd)}\n{p.stdout}{p.stderr}" for cmd, p in results if p.returncode != 0]
    assert not failures, "\n\n".join(failures)
    for cmd, _ in results:
        assert os.path.getsize(cmd[cmd.index("-o") + 1]) > 0


def test_cython_wrapper_compiles(tmp_path):
    c_file = tmp_path / "_cuda.c"
    proc = subprocess.run([sys.executable, "-m", "cython", "-3", "-I", str(ROOT / "ext"), "-o", str(c_file),
                           str(ROOT / "ext" / "_cuda.pyx")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cc = os.environ.get("CC", "cc")
    proc = subprocess.run([cc, "-c", "-fPIC", "-O0", "-Werror=implicit-function-declaration",
                           "-I", str(CUDA_DIR), "-I", sysconfig.get_paths()["include"], str(c_file),
                           "-o", str(tmp_path / "_cuda.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
