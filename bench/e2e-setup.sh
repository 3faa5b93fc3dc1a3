# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034  # the callers' variables, read and set here (see below)
# The phases bench/e2e.sh and bench/ceiling.sh share (sourced, not run): building ours and
# llama.cpp, the synthetic model and its pack, the RAM cap. Both scripts keep their results
# in the same --dir under the same names and .done markers, so on a warm machine whichever
# runs second builds nothing.
#
# The functions read the caller's variables: root, dir, out (logs go to $out/logs), build,
# tarball, arch, preset, layers, synth_args, ram_ratio; and call its say().

# --help: the script's header comment (its first lines after the shebang), without the "# ".
e2e_help() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$1"; }

# The tree the numbers come from, for the results' "git" field: $XPACK_TREE when set, else
# HEAD's short hash with "+changes" when tracked files differ from it (the device tool's copy
# of a checkout has the working tree's files beside a .git that may be older: without the
# mark its hash would name a tree that was not measured).
e2e_tree() {
  if [ -n "${XPACK_TREE:-}" ]; then echo "$XPACK_TREE"; return; fi
  local head
  head=$(git -C "$root" rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
  if [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | head -1)" ]; then
    echo "$head+changes"
  else
    echo "$head"
  fi
}

# llama.cpp's CMake flags for the e2e and ceiling baseline with CUDA for the GPU machine's
# sm_90 (a CPU build drops the first two); bench/llama-prebuild.sh changes only what a
# build off that machine needs.
e2e_llama_cuda_flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=OFF)

# llama.cpp from the tarball, in $dir/llama.cpp/SUBDIR, with GGML_CUDA=CUDA (ON: for sm_90,
# as on the GPU machine). Nothing is done when every TARGET is built already. The tarball
# may be bench/llama-prebuild.sh's bundle instead (b/ built on the CPU machine for sm_90):
# it is unpacked, not built, when its libraries load here.
# usage: e2e_build_llama SUBDIR ON|OFF TARGET...
e2e_build_llama() {
  local sub="$1" cuda="$2" t missing=no
  shift 2
  llama="$dir/llama.cpp"
  for t in "$@"; do [ -x "$llama/$sub/bin/$t" ] || missing=yes; done
  [ "$missing" = no ] && return 0
  [ -n "$tarball" ] || { echo "no llama.cpp tarball (--llama-tarball)"; return 1; }
  if tar tf "$tarball" 2>/dev/null | grep -x 'b/PREBUILT.txt' > /dev/null; then
    if [ "$sub" != b ] || [ "$cuda" != ON ]; then echo "$tarball is a CUDA build for the GPU machine, not $sub"; return 1; fi
    mkdir -p "$llama" && tar xf "$tarball" -C "$llama" || return 1
    for t in "$@"; do
      [ -x "$llama/b/bin/$t" ] || { echo "$tarball has no $t"; return 1; }
      if ldd "$llama/b/bin/$t" | grep 'not found'; then
        echo "the prebuilt $t cannot load the libraries above"; rm -rf "$llama/b"; return 1
      fi
    done
    return 0
  fi
  local flags=("${e2e_llama_cuda_flags[@]}")
  [ "$cuda" = ON ] || flags=(-DGGML_CUDA=OFF "${flags[@]:2}")
  tar xzf "$tarball" -C "$dir" &&
  cmake -S "$llama" -B "$llama/$sub" -G Ninja "${flags[@]}" > "$out/logs/llama-cmake.log" 2>&1 &&
  cmake --build "$llama/$sub" -j"${llama_jobs:-12}" --target "$@" > "$out/logs/llama-build.log" 2>&1
}

# xpack-run, xpack-synth and xpack-build in $build (meson, CUDA); exits on failure.
e2e_build_ours() {
  if [ ! -x "$build/examples/xpack-run" ]; then
    { [ -f "$build/build.ninja" ] || meson setup "$build" -Dcuda=enabled; } > "$out/logs/meson.log" 2>&1
  fi
  ninja -C "$build" -j6 examples/xpack-run tools/xpack-synth tools/xpack-build >> "$out/logs/meson.log" 2>&1 ||
    { tail -30 "$out/logs/meson.log"; exit 1; }
  say "built xpack-run"
}

# Room in $dir for a model of $1 bytes and its pack (about as much again, plus 1 GiB):
# the other models this cache holds (their .gguf.done markers) are removed, oldest
# first, until it fits, each said; exits when it cannot fit. The GPU machine's disk
# holds one full-width preset and its pack, not two: a Kimi-K3 ceiling after a
# DeepSeek-V4 one stopped at "No space left on device" (2026-12-03).
e2e_room() {
  local need=$(( 2 * $1 + (1 << 30) )) avail done_mark other
  avail=$(df --output=avail -B1 "$dir" | tail -1)
  while read -r done_mark; do
    [ "$avail" -ge "$need" ] && break
    other="${done_mark%.gguf.done}"
    [ "$other" = "$base" ] && continue
    say "removing $(basename "$other") (another model of $dir and its pack) to make room: $need bytes needed, $avail free"
    rm -f "$other.gguf" "$other.gguf.done" "$other.xpack" "$other.xpack.json" "$other.xpack.done" "$other.trunk.gguf"
    avail=$(df --output=avail -B1 "$dir" | tail -1)
  done < <(find "$dir" -maxdepth 1 -name '*.gguf.done' -printf '%T@ %p\n' | sort -n | cut -d' ' -f2-)
  [ "$avail" -ge "$need" ] ||
    { say "not enough disk in $dir for $(basename "$base") and its pack: $need bytes needed, $avail free"; exit 1; }
}

# The model (xpack-synth --preset, random weights) and its pack, unless their .done markers
# say they exist; sets model, base (the pack's path without .xpack), tag, model_bytes,
# pack_bytes and stride (the pack's object stride). Exits on failure.
e2e_model() {
  tag="$arch-$layers"
  [ -n "$synth_args" ] && tag="$tag-$(echo "$synth_args" | md5sum | cut -c1-8)"
  model="$dir/$tag.gguf" base="$dir/$tag"
  if [ ! -f "$model.done" ]; then
    rm -f "$model" "$base.xpack" "$base.xpack.json" "$base.trunk.gguf"
    local planned
    # shellcheck disable=SC2086
    planned=$("$build/tools/xpack-synth" --preset "$preset" --layers "$layers" $synth_args -o "$model" --dry-run 2>&1 |
      grep -oE '[0-9]+ bytes$' | cut -d' ' -f1) || { say "xpack-synth --dry-run gave no size"; exit 1; }
    e2e_room "$planned"
    # shellcheck disable=SC2086
    "$build/tools/xpack-synth" -q --preset "$preset" --layers "$layers" $synth_args -o "$model" > "$out/logs/synth.log" 2>&1 ||
      { tail -5 "$out/logs/synth.log"; exit 1; }
    touch "$model.done"
  fi
  say "model $(du -h "$model" | cut -f1)"
  if [ ! -f "$base.xpack.done" ]; then
    "$build/tools/xpack-build" "$model" -o "$base" > "$out/logs/pack.log" 2>&1 || { tail -5 "$out/logs/pack.log"; exit 1; }
    touch "$base.xpack.done"
  fi
  say "pack $(du -h "$base.xpack" | cut -f1), trunk $(du -h "$base.trunk.gguf" | cut -f1), disk free $(df -h --output=avail "$dir" | tail -1)"
  model_bytes=$(stat -c %s "$model")
  pack_bytes=$(stat -c %s "$base.xpack")
  stride=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['object_stride'])" "$base.xpack.json")
}

# The RAM cap: this shell and everything it starts from here on, in a memory cgroup of
# ram_ratio x model bytes without swap; sets cap (bytes) and capped (yes/no).
e2e_cap_ram() {
  cap=$(python3 -c "print(int($ram_ratio * $model_bytes))")
  local cg=/sys/fs/cgroup/xpack-e2e
  capped=no
  if mkdir -p "$cg" 2>/dev/null && echo "$cap" > "$cg/memory.max" 2>/dev/null && echo $$ > "$cg/cgroup.procs" 2>/dev/null; then
    echo 0 > "$cg/memory.swap.max" 2>/dev/null
    capped=yes
  fi
  say "RAM cap $(( cap >> 20 )) MiB: $capped"
}

# Drops the files' pages from the page cache (drop_caches may be refused).
evict() { sync; python3 -c "
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$@"; }
