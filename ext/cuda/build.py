"""Builds the CUDA backend: nvcc compiles ext/cuda/*.cu to objects, and setuptools links them with the Cython
wrapper ext/_cuda.pyx into inferd._cuda.

setup.py calls cuda_extension(root). The backend is opt-in until it has run on a GPU: INFERD_CUDA=1 builds it (a
missing nvcc is then an error); unset or 0, it is not built. cuBLAS (for prefill GEMMs) comes from the CUDA toolkit or
from PyPI's nvidia-cublas wheel when either has it (INFERD_CUBLAS=0 skips it); without it the engine uses its own
tensor-core GEMM. INFERD_CUDA_ARCHS (default "80,90") names the SASS targets; PTX for the newest is embedded too,
so later GPUs run it. Objects are rebuilt only when a source, a header or the flags changed.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))


def find_nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    for path in ("/usr/local/cuda/bin/nvcc", *sorted(glob.glob("/usr/local/cuda-*/bin/nvcc"), reverse=True)):
        if os.path.exists(path):
            return path
    return None


def cuda_home(nvcc: str) -> str | None:
    """The toolkit folder holding include/cuda_runtime.h (nvcc may be a wrapper script somewhere else)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                  os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))]
    try:  # a wrapper such as `exec /usr/local/cuda-13.0/bin/nvcc "$@"`
        with open(nvcc, "rb") as f:
            head = f.read(4096)
        if head.startswith(b"#!"):
            for word in head.decode(errors="replace").split():
                if word.endswith("/bin/nvcc"):
                    candidates.append(os.path.dirname(os.path.dirname(word)))
    except OSError:
        pass
    candidates += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    for home in candidates:
        if home and os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            return home
    return None


def _lib_dir(home: str) -> str:
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
        if os.path.exists(os.path.join(home, sub, "libcudart_static.a")):
            return os.path.join(home, sub)
    return os.path.join(home, "lib64")


def find_cublas(home: str | None) -> tuple[str, str, list[str]] | None:
    """(include dir, lib dir, [libcublas, libcublasLt] paths) from the nvidia-cublas wheel or the toolkit."""
    if os.environ.get("INFERD_CUBLAS", "1") == "0":
        return None
    roots = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            roots += [os.path.join(base, "cu13"), os.path.join(base, "cublas"), os.path.join(base, "cu12")]
    if home:
        roots.append(home)
    for root in roots:
        inc = os.path.join(root, "include")
        if not os.path.exists(os.path.join(inc, "cublas_v2.h")):
            continue
        for libdir in (os.path.join(root, "lib"), os.path.join(root, "lib64")):
            libs = []
            for name in ("libcublas", "libcublasLt"):
                hits = sorted(glob.glob(os.path.join(libdir, name + ".so*")), key=len)
                if hits:
                    libs.append(hits[0])
            if len(libs) == 2:
                return inc, libdir, libs
    return None


def arch_flags(archs: str | None = None, ptx: bool = True) -> list[str]:
    archs = archs or os.environ.get("INFERD_CUDA_ARCHS", "80,90")
    nums = [a.strip() for a in archs.split(",") if a.strip()]
    flags = []
    for a in nums:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    if ptx and nums:
        flags += ["-gencode", f"arch=compute_{nums[-1]},code=compute_{nums[-1]}"]
    return flags


def sources() -> list[str]:
    return sorted(glob.glob(os.path.join(HERE, "*.cu")))


def nvcc_command(nvcc: str, src: str, obj: str, *, archs: list[str], cublas_inc: str | None) -> list[str]:
    cmd = [nvcc, "-c", src, "-o", obj, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-I", HERE, *archs]
    if cublas_inc:
        cmd += ["-DINFERD_HAVE_CUBLAS", "-I", cublas_inc]
    return cmd


def compile_objects(nvcc: str, out_dir: str, *, archs: list[str], cublas_inc: str | None,
                    jobs: int | None = None, force: bool = False) -> list[str]:
    """Compiles every .cu file to out_dir; returns the object paths. Raises RuntimeError with nvcc's output."""
    os.makedirs(out_dir, exist_ok=True)
    headers = glob.glob(os.path.join(HERE, "*.h")) + glob.glob(os.path.join(HERE, "*.cuh"))
    deps_mtime = max([os.path.getmtime(p) for p in headers] + [os.path.getmtime(__file__)])
    todo, objs = [], []
    for src in sources():
        obj = os.path.join(out_dir, os.path.splitext(os.path.basename(src))[0] + ".o")
        cmd = nvcc_command(nvcc, src, obj, archs=archs, cublas_inc=cublas_inc)
        stamp = obj + ".cmd"
        key = hashlib.sha256(" ".join(cmd).encode()).hexdigest()
        fresh = (not force and os.path.exists(obj) and os.path.exists(stamp)
                 and os.path.getmtime(obj) >= max(os.path.getmtime(src), deps_mtime)
                 and open(stamp).read() == key)
        if not fresh:
            todo.append((cmd, stamp, key))
        objs.append(obj)

    def run(item):
        cmd, stamp, key = item
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            return f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        with open(stamp, "w") as f:
            f.write(key)
        return None

    if todo:
        print(f"nvcc: compiling {len(todo)} CUDA file(s) into {out_dir}", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=jobs or min(len(todo), os.cpu_count() or 1)) as pool:
            errors = [e for e in pool.map(run, todo) if e]
        if errors:
            raise RuntimeError("nvcc failed:\n" + "\n".join(errors))
    return objs


def cuda_extension(root: str):
    """The inferd._cuda Extension, or None when CUDA is off or absent. Compiles the .cu files as a side effect."""
    if os.environ.get("INFERD_CUDA", "").strip() != "1":
        return None
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("INFERD_CUDA=1 but nvcc was not found (set CUDA_HOME or put nvcc on PATH)")
    home = cuda_home(nvcc)
    if home is None:
        raise RuntimeError(f"INFERD_CUDA=1 but no CUDA toolkit with include/cuda_runtime.h was found for {nvcc}")
    from setuptools import Extension

    cublas = find_cublas(home)
    out_dir = os.path.join(root, "build", "cuda")
    objs = compile_objects(nvcc, out_dir, archs=arch_flags(), cublas_inc=cublas[0] if cublas else None)
    link_args = []
    if cublas:
        _, libdir, libs = cublas
        link_args += libs + [f"-Wl,-rpath,{libdir}"]
    print(f"inferd: building inferd._cuda with {home} ({'cuBLAS from ' + cublas[1] if cublas else 'no cuBLAS'})",
          file=sys.stderr)
    return Extension(
        "inferd._cuda",
        sources=[os.path.relpath(os.path.join(root, "ext", "_cuda.pyx"), root)],
        include_dirs=[os.path.relpath(HERE, root)],
        extra_objects=objs,
        library_dirs=[_lib_dir(home)],
        libraries=["cudart_static", "stdc++", "rt", "pthread", "dl"],
        extra_link_args=link_args,
        extra_compile_args=["-O2"],
    )
