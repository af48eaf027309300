"""Where `inferd serve` spends its start: each stage's wall span and CPU seconds, up to /health's first 200.

    python bench/startup_stages.py [--model FILE.gguf] [--ctx 4096] [-t 2] [--cprofile N]

Runs `inferd serve` in this process with timers around the stages of its start (the functions named in STAGES,
wrapped where their callers look them up), stops the server the moment it is ready, and prints one row per stage:
its thread, when it began and ended (seconds since the interpreter started, so imports count) and the CPU seconds
that thread spent in it. `--cprofile N` also prints the N costliest functions (cumulative) of the main thread's
imports and of each stage that runs on a thread of its own. The CPU column is what to compare on a shared machine;
wall spans there stretch with the neighbours' load.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import os  # noqa: E402
import sys  # noqa: E402

# bench/profile.py would shadow the standard library's (cProfile imports it): this folder is not on the path
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import cProfile  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import importlib.abc  # noqa: E402
import inspect  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

DEFAULT_FILE = Path.home() / ".cache/inferd-test-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def _since_boot() -> float:
    """Seconds from this process' start (its exec) to now, by the kernel's clock: the interpreter's own start too."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start


OFFSET = _since_boot() - (time.perf_counter() - T_START)  # perf_counter at T_START is this many s after exec

# (module, attribute, label): the functions and classes each stage is; a class stands for its constructor
STAGES = [
    ("inferd.server.app", "is_embedding_folder", "is the file an encoder? (reads its header)"),
    ("inferd.model.embedding_gguf", "is_embedding_gguf", "is the file an encoder? (early load's check)"),
    ("inferd.model.loader", "load_gguf", "GGUF header walk (metadata, tensor index)"),
    ("inferd.text.tokenizer:Tokenizer", "from_gguf", "tokenizer build"),
    ("inferd.model.loader", "_check_vocab", "vocabulary check"),
    ("inferd.model.loader", "_convert", "tensor views (convert_all)"),
    ("inferd.engine.device", "build_engine", "build_engine (repack + context)"),
    ("inferd.engine.engine", "build_cpu_model", "  repack weights into tiles"),
    ("inferd.server.lora", "load_adapters", "LoRA adapters"),
    ("inferd.text.chat", "ChatTemplate", "chat template compile"),
    ("inferd.text.grammar", "GrammarCompiler", "grammar compiler (deferred vocabulary)"),
    ("inferd.engine.scheduler", "Scheduler", "scheduler"),
    ("inferd.engine.loop", "EngineLoop", "engine loop"),
    ("inferd.server.chat_engine", "open_prompt_cache", "prompt cache on disk"),
    ("inferd.server.chat_engine", "warm_up", "warm-up request"),
    ("inferd.server.metrics", "Metrics", "metrics"),
]

rows: list[tuple[str, str, float, float, float]] = []  # label, thread, start, end, cpu
profiles: dict[str, cProfile.Profile] = {}
PROFILE_THREADED = {"tokenizer build", "build_engine (repack + context)", "GGUF header walk (metadata, tensor index)"}


def stamp() -> float:
    return time.perf_counter() - T_START + OFFSET


def timed(fn, label: str, profile: bool):
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*a, **k):
            t0, c0 = stamp(), time.thread_time()
            try:
                return await fn(*a, **k)
            finally:
                rows.append((label, "main (async)", t0, stamp(), time.thread_time() - c0))

        return run_async

    @functools.wraps(fn)
    def run(*a, **k):
        t0, c0 = stamp(), time.thread_time()
        try:
            if profile and label in PROFILE_THREADED:
                prof = profiles[label] = cProfile.Profile()
                return prof.runcall(fn, *a, **k)
            return fn(*a, **k)
        finally:
            rows.append((label, threading.current_thread().name, t0, stamp(), time.thread_time() - c0))

    return run


# modules whose import is a stage of its own (everything they import, on the thread that imported them first)
IMPORT_STAGES = {
    "inferd.server.app": "import the server (aiohttp, APIs, parsers)",
    "inferd.model.loader": "import the loader (numpy, gguf, tokenizers, jinja2)",
}


class _StageHook(importlib.abc.MetaPathFinder):
    """Wraps the STAGES' functions as their modules are imported (nothing is imported ahead of the start, so the
    start's own order of imports is what is measured), and times the IMPORT_STAGES' imports."""

    def __init__(self, profile: bool):
        self.profile = profile
        self.modules = {where.partition(":")[0] for where, _, _ in STAGES} | set(IMPORT_STAGES)

    def find_spec(self, name, path, target=None):
        if name not in self.modules:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def run(module):
            t0, c0 = stamp(), time.thread_time()
            exec_module(module)
            if name in IMPORT_STAGES:
                thread = threading.current_thread().name
                rows.append((IMPORT_STAGES[name], thread, t0, stamp(), time.thread_time() - c0))
            self.patch(module)

        spec.loader.exec_module = run
        return spec

    def patch(self, module) -> None:
        for where, attr, label in STAGES:
            mod_name, _, cls_name = where.partition(":")
            if mod_name != module.__name__:
                continue
            owner = getattr(module, cls_name) if cls_name else module
            # a classmethod's bound method, set on its class and called through it, stays bound
            setattr(owner, attr, timed(getattr(owner, attr), label, self.profile))


def report(ready_at: float, profile: int) -> None:
    cpu = os.times()
    print(f"\nready (/health 200) at {ready_at:.3f} s after exec; process CPU {cpu.user + cpu.system:.2f} s "
          f"(user {cpu.user:.2f}, sys {cpu.system:.2f}); peak RSS {_vmhwm() / 1e9:.2f} GB")
    print("threads' CPU s (user+sys):", ", ".join(f"{name} {u:.2f}+{k:.2f}" for name, u, k in _threads_cpu()))
    print("\n| stage | thread | start s | end s | wall s | CPU s |\n| --- | --- | ---: | ---: | ---: | ---: |")
    print(f"| interpreter + imports to serve_main | MainThread | 0.000 | {IMPORTS_DONE:.3f} | {IMPORTS_DONE:.3f} | "
          f"{IMPORTS_CPU:.3f} |")
    for label, thread, t0, t1, c in sorted(rows, key=lambda r: r[2]):
        print(f"| {label} | {thread} | {t0:.3f} | {t1:.3f} | {t1 - t0:.3f} | {c:.3f} |")
    if profile:
        if MAIN_PROFILE is not None:
            MAIN_PROFILE.disable()
        for label, prof in [("main thread from serve_main to ready", MAIN_PROFILE), *profiles.items()]:
            if prof is None:
                continue
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(profile)
            print(f"\n---- cProfile: {label} ----\n{out.getvalue()}")
    sys.stdout.flush()


def _threads_cpu() -> list[tuple[str, float, float]]:
    """Every thread of this process (the pools' too) that has used CPU: its name, user and system seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = []
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        user, system = int(fields[11]) / ticks, int(fields[12]) / ticks
        if user + system:
            out.append((name, user, system))
    return out


def _vmhwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1000
    return 0


IMPORTS_DONE = IMPORTS_CPU = 0.0
MAIN_PROFILE: cProfile.Profile | None = None


def main() -> int:
    global IMPORTS_DONE, IMPORTS_CPU, MAIN_PROFILE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_FILE), help="a GGUF file (default: %(default)s)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--cprofile", type=int, default=0, metavar="N")
    args = ap.parse_args()
    path = Path(args.model).expanduser()
    sys.meta_path.insert(0, _StageHook(bool(args.cprofile)))
    from inferd.server import main as serve_module  # what `inferd serve` imports before it reads its options
    from inferd.server.systemd import Notifier

    IMPORTS_DONE, IMPORTS_CPU = stamp(), time.process_time()
    if args.cprofile:
        MAIN_PROFILE = cProfile.Profile()
        MAIN_PROFILE.enable()

    def ready(self, status: str = "") -> bool:
        report(stamp(), args.cprofile)
        os._exit(0)  # nothing after ready is measured

    Notifier.ready = ready  # type: ignore[method-assign]
    argv = ["-m", str(path), "-t", str(args.threads), "--num-kv-blocks", str(args.ctx // 64),
            "--max-model-len", str(args.ctx), "--port", "0", "--drain-timeout-s", "0", "--log-level", "warning"]
    return serve_module.serve_main(argv)


if __name__ == "__main__":
    sys.exit(main())
