"""Fuzzing the model readers: a valid tiny GGUF file and a valid tiny Hugging Face folder, mutated many times
(bit flips and random bytes in the header, every count/length/type/dim/offset field set to edge values,
same-size type confusion, truncation, inserted and deleted bytes; for safetensors, JSON-level mutations of
every entry, absurd header lengths, deep nesting, huge entry counts; config.json and tokenizer files with
wrong types and values). Every mutant must load or raise ModelLoadError naming the file and the problem:
never another exception, never a crash, never a hang, and never an allocation larger than the file justifies.

Mutants run in a worker subprocess (a crash there names the case instead of killing pytest) under an
address-space limit, with tracemalloc measuring each load's peak. The cases are drawn from a fixed seed;
INFERD_FUZZ_CASES sets how many per format (default 40).

The worker: python tests/model/test_fuzz_readers.py KIND BASE WORKDIR SEED START COUNT (JSON lines out).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SEED = int(os.environ.get("INFERD_FUZZ_SEED", "4242"))
CASES = int(os.environ.get("INFERD_FUZZ_CASES", "40"))   # more for a deeper run: INFERD_FUZZ_CASES=1000
ADDRESS_SPACE_LIMIT = 6 << 30      # a runaway allocation becomes a MemoryError (reported) instead of swapping
CASE_TIMEOUT_S = 30
PEAK_SLACK = 16 << 20              # allowance on top of what the unmutated file needs
PEAK_PER_FILE_BYTE = 16            # parsing a JSON header costs about 10 bytes of Python objects per byte


# ---- mapping the fields of a GGUF header -------------------------------------------------------------------

@dataclass
class Field:
    offset: int
    size: int      # bytes
    kind: str      # count | strlen | vtype | arrtype | arrlen | value | ndims | dim | ttype | toffset
    label: str


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_fields(data: bytes) -> tuple[list[Field], int]:
    """Every numeric field of a (valid) GGUF header, and where the header ends."""
    fields: list[Field] = []
    pos = 8

    def u(fmt, kind, label):
        nonlocal pos
        n = struct.calcsize(fmt)
        fields.append(Field(pos, n, kind, label))
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += n
        return v

    def string(label):
        nonlocal pos
        n = u("<Q", "strlen", label)
        s = data[pos:pos + n].decode()
        pos += n
        return s

    n_tensors = u("<Q", "count", "tensor count")
    n_kv = u("<Q", "count", "metadata count")
    for _ in range(n_kv):
        key = string("key length")
        vtype = u("<I", "vtype", f"type of {key}")
        if vtype in _SCALAR:
            fields.append(Field(pos, _SCALAR[vtype], "value", key))
            pos += _SCALAR[vtype]
        elif vtype == 8:
            string(f"length of {key}")
        else:
            itype = u("<I", "arrtype", f"item type of {key}")
            count = u("<Q", "arrlen", f"length of {key}")
            if itype == 8:
                for i in range(count):
                    if i < 3:
                        string(f"{key}[{i}] length")
                    else:
                        (n,) = struct.unpack_from("<Q", data, pos)
                        pos += 8 + n
            else:
                pos += count * _SCALAR[itype]
    for _ in range(n_tensors):
        name = string("tensor name length")
        n_dims = u("<I", "ndims", f"dims of {name}")
        for d in range(n_dims):
            u("<Q", "dim", f"dim {d} of {name}")
        u("<I", "ttype", f"type of {name}")
        u("<Q", "toffset", f"offset of {name}")
    return fields, pos


def _edge_values(size: int, file_size: int, rng: random.Random) -> list[int]:
    top = (1 << (8 * size)) - 1
    vals = [0, 1, 2, 3, top, top - 1, 1 << (8 * size - 1), rng.randrange(top + 1)]
    if size >= 4:
        vals += [0x7F800000, 0x7FC00000, 0xFF800000, 1 << 16, 1 << 20, 1 << 24, 1 << 31, 31, 63]
    if size == 8:
        vals += [file_size, file_size + 1, file_size * 2, 1 << 32, (1 << 32) + 1, 1 << 40, 1 << 62, 1 << 63,
                 0x7FF0000000000000, 0x7FF8000000000000]
    return [v & top for v in vals]


def mutate_gguf(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    fields, header_end = gguf_fields(data)
    buf = bytearray(data)
    op = rng.choice(["field", "field", "field", "retype", "bitflip", "garbage", "truncate", "insert", "delete",
                     "tensor-data"])
    if op == "field":
        f = rng.choice(fields)
        if rng.random() < 0.3:
            old = int.from_bytes(buf[f.offset:f.offset + f.size], "little")
            value = (old + rng.choice([-2, -1, 1, 2, 32, 64])) % (1 << (8 * f.size))
        else:
            value = rng.choice(_edge_values(f.size, len(data), rng))
        buf[f.offset:f.offset + f.size] = value.to_bytes(f.size, "little")
        return bytes(buf), f"{f.label} ({f.kind}) := {value}"
    if op == "retype":   # a scalar read as another scalar type of the same size (u32 as f32, ...)
        vt = [f for f in fields if f.kind == "vtype" and struct.unpack_from("<I", data, f.offset)[0] in _SCALAR]
        f = rng.choice(vt)
        size = _SCALAR[struct.unpack_from("<I", data, f.offset)[0]]
        new = rng.choice([t for t, s in _SCALAR.items() if s == size])
        struct.pack_into("<I", buf, f.offset, new)
        return bytes(buf), f"{f.label} := type {new}"
    if op == "bitflip":
        flips = [rng.randrange(header_end * 8) for _ in range(rng.randint(1, 8))]
        for bit in flips:
            buf[bit // 8] ^= 1 << (bit % 8)
        return bytes(buf), f"flip header bits {flips}"
    if op == "garbage":
        at, n = rng.randrange(header_end), rng.randint(1, 16)
        buf[at:at + n] = bytes(rng.randrange(256) for _ in range(n))
        return bytes(buf), f"random bytes at {at}..{at + n}"
    if op == "truncate":
        at = rng.randrange(header_end + 64) if rng.random() < 0.7 else rng.randrange(len(data))
        return bytes(buf[:at]), f"truncate to {at} bytes"
    if op == "insert":
        at, n = rng.randrange(header_end), rng.randint(1, 9)
        return bytes(buf[:at] + bytes(rng.randrange(256) for _ in range(n)) + buf[at:]), f"insert {n} at {at}"
    if op == "delete":
        at, n = rng.randrange(header_end), rng.randint(1, 9)
        return bytes(buf[:at] + buf[at + n:]), f"delete {n} at {at}"
    at = rng.randrange(header_end, len(data))   # tensor-data: weights are not validated, but must not crash
    n = rng.randint(1, 64)
    buf[at:at + n] = bytes(rng.choice([0xFF, 0x7F, 0x80, 0x00, rng.randrange(256)]) for _ in range(n))
    return bytes(buf), f"tensor bytes at {at}..{at + n}"


# ---- mutating a Hugging Face folder ------------------------------------------------------------------------

_WEIRD = [0, -1, 1, 2 ** 31, 2 ** 63, 2 ** 64 + 5, 10 ** 30, 1.5, -0.0, float("inf"), "7", "", None, True, [],
          [1], {}, {"a": 1}, "x" * 100]


def mutate_safetensors(header_len: int, header: dict, data: bytes, rng: random.Random) -> tuple[bytes, str]:
    names = [n for n in header if n != "__metadata__"]
    op = rng.choice(["entry", "entry", "entry", "entry", "length", "bitflip", "garbage", "truncate", "nesting",
                     "many", "metadata"])
    h = json.loads(json.dumps(header))

    def pack(obj, length=None):
        text = json.dumps(obj).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text) if length is None else length) + text + data

    if op == "entry":
        name = rng.choice(names)
        e = h[name]
        what = rng.choice(["shape", "shape-dim", "offsets", "offset", "dtype", "whole", "drop-key", "rename"])
        if what == "shape":
            e["shape"] = rng.choice([[2 ** 62, 2 ** 62], [0], [], [-1], [1.5], ["a"], None, 5, [2 ** 64], [0, 2 ** 40],
                                     [1] * 100, [e["shape"][0]] if e["shape"] else [1]])
        elif what == "shape-dim" and e["shape"]:
            i = rng.randrange(len(e["shape"]))
            e["shape"][i] = rng.choice(_WEIRD)
        elif what == "offsets":
            b, end = e["data_offsets"]
            e["data_offsets"] = rng.choice([[end, b], [b, b], [0, 2 ** 64], [-1, end], [b, end + 1], [b + 1, end + 1],
                                            [0, len(data) + 8], [b], [b, end, 0], ["0", end], None, [b * 1.0, end]])
        elif what == "offset":
            e["data_offsets"][rng.randrange(2)] = rng.choice(_WEIRD)
        elif what == "dtype":
            e["dtype"] = rng.choice(["F64", "I32", "BOOL", "F16", "BF16", "F8_E4M3", "Q4", "", None, 7, ["F32"]])
        elif what == "whole":
            h[name] = rng.choice(_WEIRD)
        elif what == "drop-key":
            e.pop(rng.choice(["dtype", "shape", "data_offsets"]))
        else:
            h[rng.choice(["model.layers.0.mlp.experts.weight", "", "../../etc/passwd", "x" * 10000,
                          "model.layers.99999999999.mlp.up_proj.weight"])] = h.pop(name)
        return pack(h), f"{name}: {what} -> {json.dumps(h.get(name))[:120]}"
    if op == "length":
        n = rng.choice([0, 1, 7, header_len - 1, header_len + 1, header_len + len(data), 2 ** 63, 2 ** 64 - 1,
                        100 * 1024 * 1024 + 1, 2 ** 32])
        return pack(h, n), f"header length := {n}"
    raw = pack(h)
    if op == "bitflip":
        buf = bytearray(raw)
        flips = [rng.randrange(8 * 8, (8 + header_len) * 8) for _ in range(rng.randint(1, 6))]
        for bit in flips:
            buf[bit // 8] ^= 1 << (bit % 8)
        return bytes(buf), f"flip header bits {flips}"
    if op == "garbage":
        buf = bytearray(raw)
        at, n = rng.randrange(8, 8 + header_len), rng.randint(1, 12)
        buf[at:at + n] = bytes(rng.randrange(256) for _ in range(n))
        return bytes(buf), f"random header bytes at {at}..{at + n}"
    if op == "truncate":
        at = rng.randrange(len(raw))
        return raw[:at], f"truncate to {at} bytes"
    if op == "nesting":
        depth = rng.choice([1000, 100_000])
        text = ("[" * depth + "]" * depth) if rng.random() < 0.5 else ('{"a":' * depth + "1" + "}" * depth)
        body = text.encode()
        return struct.pack("<Q", len(body)) + body + data, f"nesting depth {depth}"
    if op == "many":   # many entries: the header is big, and so is the file, so memory may follow the file
        count = rng.choice([10_000, 60_000])
        for i in range(count):
            h[f"extra.{i}"] = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
        return pack(h), f"{count} extra entries"
    h["__metadata__"] = rng.choice(_WEIRD + [{"format": {"nested": [1, 2]}}])
    return pack(h), f"__metadata__ := {json.dumps(h['__metadata__'])[:60]}"


def mutate_json_file(text: str, rng: random.Random) -> tuple[str, str]:
    obj = json.loads(text)
    op = rng.choice(["value", "value", "value", "drop", "truncate", "garbage", "nesting", "type"])
    if op in ("value", "drop") and isinstance(obj, dict) and obj:
        key = rng.choice(sorted(obj))
        if op == "drop":
            obj.pop(key)
            return json.dumps(obj), f"drop {key}"
        obj[key] = rng.choice(_WEIRD)
        return json.dumps(obj), f"{key} := {json.dumps(obj[key])[:60]}"
    if op == "truncate":
        at = rng.randrange(len(text))
        return text[:at], f"truncate to {at} chars"
    if op == "garbage":
        at = rng.randrange(len(text))
        return text[:at] + "".join(chr(rng.randrange(1, 0x3000)) for _ in range(4)) + text[at + 4:], f"garbage at {at}"
    if op == "nesting":
        depth = rng.choice([1000, 100_000])
        return "[" * depth + "]" * depth, f"nesting depth {depth}"
    return json.dumps(rng.choice([[], "x", 5, None, [obj]])), "not an object"


def mutate_hf(base: Path, dest: Path, rng: random.Random) -> str:
    shutil.copytree(base, dest)
    r = rng.random()
    if r < 0.6:
        st = dest / "model.safetensors"
        raw = st.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        new, what = mutate_safetensors(n, json.loads(raw[8:8 + n]), raw[8 + n:], rng)
        st.write_bytes(new)
        return f"model.safetensors: {what}"
    name = "config.json" if r < 0.85 else rng.choice(["tokenizer.json", "tokenizer_config.json",
                                                       "generation_config.json"])
    path = dest / name
    new, what = mutate_json_file(path.read_text(encoding="utf-8"), rng)
    path.write_text(new, encoding="utf-8")
    return f"{name}: {what}"


# ---- the worker (subprocess) ---------------------------------------------------------------------------------

def case_rng(seed: int, i: int) -> random.Random:
    return random.Random(seed * 1_000_003 + i)


def worker(kind: str, base: Path, workdir: Path, seed: int, start: int, count: int) -> None:
    import resource
    import signal
    import tracemalloc
    import traceback

    from inferd.model.errors import ModelLoadError
    from inferd.model.loader import load_model

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

    def on_alarm(signum, frame):
        raise TimeoutError(f"no result after {CASE_TIMEOUT_S} s")
    signal.signal(signal.SIGALRM, on_alarm)
    base_data = base.read_bytes() if kind == "gguf" else None
    for i in range(start, start + count):
        dest = workdir / f"case{i}"
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        if i < 0:
            what = "unmutated"
            if kind == "gguf":
                dest.write_bytes(base_data)
            else:
                shutil.copytree(base, dest)
        elif kind == "gguf":
            data, what = mutate_gguf(base_data, case_rng(seed, i))
            dest.write_bytes(data)
        else:
            what = mutate_hf(base, dest, case_rng(seed, i))
        size = dest.stat().st_size if kind == "gguf" else sum(p.stat().st_size for p in dest.iterdir())
        print(json.dumps({"start": i}), flush=True)
        tracemalloc.start()
        signal.alarm(CASE_TIMEOUT_S)
        result, message = "ok", ""
        try:
            load_model(dest)
        except ModelLoadError as e:
            result, message = "error", str(e)
            if not (e.path.startswith(str(dest)) and e.message.strip()):
                result = "unnamed"
        except BaseException as e:   # noqa: BLE001 -- exactly what the test is looking for
            result = "exception"
            message = f"{type(e).__name__}: {e}"[:500] + " | " + \
                " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)[-4:])
        finally:
            signal.alarm(0)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        print(json.dumps({"case": i, "what": what, "result": result, "message": message[:600], "peak": peak,
                          "size": size}), flush=True)
        shutil.rmtree(dest) if dest.is_dir() else dest.unlink()


# ---- the test ----------------------------------------------------------------------------------------------

def run_cases(kind: str, base: Path, workdir: Path, seed: int, cases: list[int]) -> list[dict]:
    """Run the cases in worker processes; a worker that dies is replaced and its case recorded as a crash."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    results: list[dict] = []
    todo = list(cases)
    while todo:
        start = todo[0]
        count = len(todo)
        proc = subprocess.run([sys.executable, __file__, kind, str(base), str(workdir), str(seed), str(start),
                               str(count)], env=env, capture_output=True, text=True, timeout=1800)
        started = None
        for line in proc.stdout.splitlines():
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
            else:
                results.append(msg)
                started = None
        done = {r["case"] for r in results}
        if proc.returncode != 0:
            crashed = started
            if crashed is None:
                raise AssertionError(f"fuzz worker failed outside a case:\n{proc.stderr[-3000:]}")
            results.append({"case": crashed, "what": "?", "result": "crash",
                            "message": f"worker died with status {proc.returncode}: {proc.stderr[-800:]}",
                            "peak": 0, "size": 0})
            done.add(crashed)
        todo = [c for c in todo if c not in done]
    return results


def _check(kind: str, results: list[dict]) -> None:
    baseline = next(r for r in results if r["case"] == -1)
    assert baseline["result"] == "ok", baseline
    bad, greedy = [], []
    for r in results:
        if r["result"] not in ("ok", "error"):
            bad.append(r)
        limit = PEAK_PER_FILE_BYTE * max(r["size"], baseline["size"]) + baseline["peak"] + PEAK_SLACK
        if r["peak"] > limit:
            greedy.append(r)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    messages = {r["message"].split(": ", 1)[-1][:70] for r in results if r["result"] == "error"}
    print(f"{kind}: {len(results) - 1} mutants: {counts}; {len(messages)} distinct error messages; peak "
          f"allocation {max(r['peak'] for r in results) >> 10} KiB (unmutated {baseline['peak'] >> 10} KiB)")
    assert not bad, f"{len(bad)} mutants broke the contract:\n" + "\n".join(
        f"case {r['case']} [{r['what']}]: {r['result']}: {r['message']}" for r in bad[:25])
    assert not greedy, "allocations beyond what the file justifies:\n" + "\n".join(
        f"case {r['case']} [{r['what']}]: {r['peak']} bytes for a {r['size']}-byte model" for r in greedy[:25])


def test_mutated_gguf_files(tmp_path):
    from tests.model.make_tiny import TinySpec, write_tiny_gguf
    base = write_tiny_gguf(tmp_path / "base.gguf", TinySpec(n_layers=1), "Q8_0")
    _check("gguf", run_cases("gguf", base, tmp_path / "work", SEED, [-1] + list(range(CASES))))


def test_mutated_hf_folders(tmp_path):
    from tests.model.make_tiny import TinySpec, write_tiny_hf
    base = write_tiny_hf(tmp_path / "base", TinySpec(n_layers=1), "f32")
    _check("hf", run_cases("hf", base, tmp_path / "work", SEED, [-1] + list(range(CASES))))


if __name__ == "__main__":
    kind_, base_, workdir_, seed_, start_, count_ = sys.argv[1:7]
    worker(kind_, Path(base_), Path(workdir_), int(seed_), int(start_), int(count_))
