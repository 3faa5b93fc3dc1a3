#!/bin/bash
# A kernel change against its baseline in one call (GPU machine): bench-kernels of this
# tree and of another, built side by side, run alternately, joined into one table of
# speed-ups by bench/kernels_ab.py; or (--switch) one build with and without a switch of
# bench-kernels. The A/B that doc/kernels.md's measurements need.
set -uo pipefail

usage() {
  cat <<'EOF'
A kernel change against its baseline in one call (GPU machine): bench-kernels of this tree
(B) and of another (A, the baseline), built side by side, run alternately, and one table of
each measurement's median per side and B's speed-up (bench/kernels_ab.py). With --switch,
one build against itself: B adds a bench-kernels switch (a layout or a variant).

usage: bench/kernels-ab.sh --against TREE [--build DIR] [--rounds R] [--out DIR]
                           [--jobs N] [-- BENCH_KERNELS_ARGS...]
       bench/kernels-ab.sh --switch FLAGS [--bench EXE] [--rounds R] [--out DIR]
                           [-- BENCH_KERNELS_ARGS...]
  --against TREE: the baseline's sources: a directory with meson.build, or a tarball of
    one (git archive --format=tar.gz REV > FILE; carry it to the GPU machine), unpacked
    in DIR/kernels-ab-base (again only when the tarball changed, so a warm machine does
    not build it twice); built with -Dcuda=enabled in its own build-ab
  --switch FLAGS: instead of another tree, one build against itself: A runs
    BENCH_KERNELS_ARGS, B the same and FLAGS (one word list, e.g. "--f32-variant 1": a
    bench-kernels switch that leaves the bits alone); built as B is, or --bench's
  --bench EXE: with --switch, this bench-kernels executable (built elsewhere, e.g. on the
    CPU machine and carried; nothing is built)
  --build DIR: this tree's CUDA build (default build-gpu; configured if new)
  --rounds R: runs per side, alternating A, B, A, B, ... (default 2)
  --out DIR: the logs and the table (default: $OUT/kernels-ab where OUT is set, else
    DIR/kernels-ab)
  --jobs N: ninja jobs per build (default: half the cores each, both builds at once)
  after --: bench-kernels' own arguments, the same for both (e.g. --quick --type q2_K)
Needs meson, ninja and nvcc (on the GPU machine: sh .deps/install-debs.sh first, as in
../shared/device/README.md). Exit status: 0; 1 when a build or run failed (its log named);
2 on a usage error.
EOF
}

against="" build="" rounds=2 out="" jobs="" switch="" switch_set=0 bench=""
root=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --against) against=${2:-}; shift 2 || { usage >&2; exit 2; } ;;
    --switch) switch=${2:-}; switch_set=1; shift 2 || { usage >&2; exit 2; } ;;
    --bench) bench=${2:-}; shift 2 || { usage >&2; exit 2; } ;;
    --build) build=${2:-}; shift 2 || { usage >&2; exit 2; } ;;
    --rounds) rounds=${2:-}; shift 2 || { usage >&2; exit 2; } ;;
    --out) out=${2:-}; shift 2 || { usage >&2; exit 2; } ;;
    --jobs) jobs=${2:-}; shift 2 || { usage >&2; exit 2; } ;;
    --) shift; break ;;
    *) echo "kernels-ab: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
fail_usage() { echo "kernels-ab: $1" >&2; exit 2; }
case "$rounds" in ''|*[!0-9]*|0) fail_usage "--rounds: a whole number from 1 (got '$rounds')" ;; esac
if [ $switch_set = 1 ]; then
  [ -z "$against" ] || fail_usage "--switch or --against, not both"
  [ -n "$switch" ] || fail_usage "--switch: the flags B adds (got nothing: A and B would be the same run)"
  [ -z "$bench" ] || [ -x "$bench" ] || fail_usage "--bench $bench: not an executable file"
else
  [ -z "$bench" ] || fail_usage "--bench goes with --switch (--against builds both sides)"
  [ -n "$against" ] || fail_usage "--against TREE or --switch FLAGS is required: the baseline's sources (a directory or a tarball), or the flags B adds"
  [ -e "$against" ] || fail_usage "--against $against: no such file or directory"
fi
if [ -n "$jobs" ]; then case "$jobs" in *[!0-9]*|0) fail_usage "--jobs: a whole number from 1 (got '$jobs')" ;; esac; fi
build=${build:-$root/build-gpu}
out=${out:-${OUT:-$build}/kernels-ab}
mkdir -p "$out" || { echo "kernels-ab: cannot create $out" >&2; exit 1; }
out=$(cd "$out" && pwd)
[ -n "$jobs" ] || jobs=$(( ($(nproc) + 1) / 2 ))

# Alternately, so both sides meet the same machine state; a side's arguments are the
# rest of the command line. run_rounds EXE_A EXE_B FLAGS_B...
run_rounds() {
  local exe_a=$1 exe_b=$2 exe side r; shift 2
  for r in $(seq 1 "$rounds"); do
    for side in a b; do
      if [ $side = a ]; then exe=$exe_a; else exe=$exe_b; fi
      if [ $side = a ]; then "$exe" "${args[@]}"; else "$exe" "${args[@]}" "$@"; fi > "$out/$side-$r.log" 2>&1 || {
        echo "kernels-ab: side $side, round $r failed: $out/$side-$r.log" >&2; tail -5 "$out/$side-$r.log" >&2; exit 1; }
      echo "kernels-ab: round $r, side $side done ($(( $(date +%s) - t0 )) s)"
    done
  done
  a_logs=() b_logs=()
  for r in $(seq 1 "$rounds"); do a_logs+=("$out/a-$r.log"); b_logs+=("$out/b-$r.log"); done
  python3 "$root/bench/kernels_ab.py" --label-a A --label-b B --a "${a_logs[@]}" --b "${b_logs[@]}" > "$out/ab.txt" || {
    cat "$out/ab.txt"; exit 1; }
  cat "$out/ab.txt"
}
args=("$@")
t0=$(date +%s)

if [ $switch_set = 1 ]; then
  if [ -z "$bench" ]; then
    { [ -f "$build/build.ninja" ] || meson setup "$build" "$root" -Dcuda=enabled; } > "$out/build-b.log" 2>&1 &&
      ninja -C "$build" bench/bench-kernels >> "$out/build-b.log" 2>&1 || {
      echo "kernels-ab: the build failed: $out/build-b.log" >&2; tail -5 "$out/build-b.log" >&2; exit 1; }
    bench="$build/bench/bench-kernels"
  fi
  read -r -a flags_b <<< "$switch"
  run_rounds "$bench" "$bench" "${flags_b[@]}"
  echo "A: $bench ${args[*]}; B: the same with $switch; logs in $out"
  exit 0
fi

# The baseline's tree: the directory itself, or the tarball unpacked (its top folder, if
# it has exactly one, else the unpacked files themselves) beside this tree's build, not
# under OUT (whose files travel back).
if [ -d "$against" ]; then
  src_a=$(cd "$against" && pwd)
else
  base="$build/kernels-ab-base"
  sum=$(sha256sum < "$against" | cut -d' ' -f1)
  if [ "$(cat "$base.sha256" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$base" "$base.sha256" && mkdir -p "$base" || exit 1
    tar xzf "$against" -C "$base" || { echo "kernels-ab: cannot unpack $against" >&2; exit 1; }
    echo "$sum" > "$base.sha256"
  fi
  src_a="$base"
  tops=$(ls -A "$src_a")
  [ "$(echo "$tops" | wc -l)" = 1 ] && [ -d "$src_a/$tops" ] && src_a="$src_a/$tops"
fi
[ -f "$src_a/meson.build" ] || { echo "kernels-ab: $against holds no meson.build: not a source tree" >&2; exit 1; }
build_a="$src_a/build-ab"
[ "$(cd "$src_a" && pwd)" != "$root" ] || fail_usage "--against names this tree itself: nothing to compare"

# Both builds at once (each a half of the cores): bench-kernels only.
build_one() {  # SRC BUILD LOG
  { [ -f "$2/build.ninja" ] || meson setup "$2" "$1" -Dcuda=enabled; } > "$3" 2>&1 &&
    ninja -C "$2" -j"$jobs" bench/bench-kernels >> "$3" 2>&1
}
build_one "$src_a" "$build_a" "$out/build-a.log" & pa=$!
build_one "$root" "$build" "$out/build-b.log" & pb=$!
wait $pa; ra=$?
wait $pb; rb=$?
[ $ra = 0 ] || { echo "kernels-ab: the baseline's build failed: $out/build-a.log" >&2; tail -5 "$out/build-a.log" >&2; exit 1; }
[ $rb = 0 ] || { echo "kernels-ab: this tree's build failed: $out/build-b.log" >&2; tail -5 "$out/build-b.log" >&2; exit 1; }
echo "kernels-ab: both built in $(( $(date +%s) - t0 )) s"

run_rounds "$build_a/bench/bench-kernels" "$build/bench/bench-kernels"
echo "A: $against; B: this tree ($root); logs in $out"
