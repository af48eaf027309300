#!/usr/bin/env bash
# The CUDA backend's whole hardware check in one call: build, GPU tests, compute-sanitizer, benchmark.
#
# 1. Here (no GPU needed), once per session, from the repository root:
#        bash bench/cuda_check.sh prepare
#    It puts what the device machine cannot fetch into .cuda_carry/ (ignored by git through .git/info/exclude):
#    the gguf wheel (the loader needs it; numpy, pyyaml, tokenizers, Cython, pytest are on the device image) and
#    SmolLM2 trimmed to its first 8 layers (the full 98 MB GGUF is over the 64 MiB a call may carry).
# 2. On the device machine, in one call (the device tool's `run`):
#        command: bash bench/cuda_check.sh      carry: [".cuda_carry"]      timeout_s: 600
#    Every stage has its own time limit and the script goes on after a failure; everything lands in $OUT
#    (8 files at most come back): summary.txt, check.log, build.log, pytest.log (the grammar-mask tests first, then
#    the rest), junit.xml, bench.log, cuda_bench.json, memcheck.log. The end of the output is the summary.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CARRY=$ROOT/.cuda_carry

if [ "${1:-}" = "prepare" ]; then
    set -ex
    grep -qx '/.cuda_carry/' .git/info/exclude 2>/dev/null || echo '/.cuda_carry/' >> .git/info/exclude
    mkdir -p "$CARRY/whl"
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
        -d "$CARRY/whl" "gguf==$(python3 -c 'import importlib.metadata as m; print(m.version("gguf"))')"
    if [ ! -f "$CARRY/smollm2-8l.gguf" ]; then
        src=$(python3 -c 'from inferd.model.pull import DEFAULT_MODEL, resolve; print(resolve(DEFAULT_MODEL, progress=False))')
        python3 bench/cuda.py trim-gguf "$src" "$CARRY/smollm2-8l.gguf" --layers 8
    fi
    du -sh "$CARRY"
    echo "carry .cuda_carry with: bash bench/cuda_check.sh (timeout_s 600)"
    exit 0
fi

OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1
set -x
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
declare -A STATUS
stage() {   # stage NAME SECONDS LOGFILE command...
    local name=$1 secs=$2 log=$3
    shift 3
    local t0=$SECONDS
    timeout -k 10 "$secs" "$@" > "$OUT/$log" 2>&1
    local rc=$?
    STATUS[$name]="rc=$rc ($((SECONDS - t0)) s, limit $secs s)"
    tail -n 25 "$OUT/$log"
    return 0
}

date
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
nvcc --version | tail -2 || true
$PY --version
compute-sanitizer --version | head -2 || true

# Python packages the image lacks, carried as wheels
if ls "$CARRY"/whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$CARRY"/whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
[ -f "$CARRY/smollm2-8l.gguf" ] && export INFERD_TEST_SMOLLM2=$CARRY/smollm2-8l.gguf

# build in place: inferd._cpu and inferd._cuda (sm_90 only here: the H200, and a shorter build)
export INFERD_CUDA=1 INFERD_CUDA_ARCHS=${INFERD_CUDA_ARCHS:-90}
stage build 150 build.log $PY setup.py build_ext --inplace -j 16
$PY -c "import inferd._cuda as c; print('devices', c.device_count(), c.device_info(), 'cublas', c.have_cublas())"

# grammar masks in the sampler first (masked tokens never drawn under temperature / top-k / top-p / min-p, all
# three together too, in the CPU's order: top-k, top-p over the top k's mass, min-p last; greedy = best allowed
# token; masked and free rows both against the numpy port of the CPU sampler, which test_mask_host.py and
# test_sample_host.py hold to the real CPU sampler on every row; masks refreshed between graph replays, free rows
# unaffected), so their result comes back even if the long stage below runs out of time
MASK_TESTS="tests/cuda/test_sample_mask.py tests/cuda/test_engine_mask.py tests/cuda/test_mask_host.py"
stage masks 50 pytest.log $PY -m pytest $MASK_TESTS -q -rs -p no:cacheprovider
cp "$OUT/pytest.log" "$OUT/pytest_masks.txt"

# every other CUDA test (test_compile included)
stage pytest 190 pytest.log $PY -m pytest tests/cuda -q -rs -p no:cacheprovider --junitxml="$OUT/junit.xml" \
    $(for t in $MASK_TESTS; do echo --ignore=$t; done)
cat "$OUT/pytest_masks.txt" "$OUT/pytest.log" > "$OUT/pytest_all.txt" && mv "$OUT/pytest_all.txt" "$OUT/pytest.log"
rm -f "$OUT/pytest_masks.txt"

# the benchmark
stage bench 110 bench.log $PY bench/cuda.py --out "$OUT" ${INFERD_TEST_SMOLLM2:+--smollm2 "$INFERD_TEST_SMOLLM2"}

# compute-sanitizer memcheck on a small slice of the tests (kernels run 10-100x slower under it)
stage memcheck 80 memcheck.log compute-sanitizer --tool memcheck --error-exitcode 99 --print-limit 20 \
    $PY -m pytest -q -x -p no:cacheprovider tests/cuda/test_gemv.py::test_gemv_swiglu \
    tests/cuda/test_sample_mask.py::test_a_row_with_nothing_allowed_gets_no_token \
    tests/cuda/test_engine_mask.py::test_each_replay_follows_its_own_mask \
    tests/cuda/test_attention.py::test_decode_attention_batch_invariant "tests/cuda/test_attention.py::test_rope_kv_write" \
    tests/cuda/test_sample.py::test_sampler_seeded_draws_repeat \
    "tests/cuda/test_sample.py::test_sampler_matches_cpu[1000-top_k_top_p_min_p]" \
    tests/cuda/test_engine.py::test_graph_equals_eager_decode

{
    echo "== inferd CUDA check, $(date)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
    for s in build masks pytest bench memcheck; do echo "$s: ${STATUS[$s]:-not run}"; done
    echo "== pytest (grammar masks, then the rest)"
    grep -E "passed|failed|error" "$OUT/pytest.log" | tail -4
    grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -30
    echo "== memcheck"
    grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3
    echo "== bench"
    grep -vE "^\s*$" "$OUT/bench.log" | tail -45
} > "$OUT/summary.txt" 2>&1
set +x
cat "$OUT/summary.txt"
