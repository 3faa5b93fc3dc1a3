#!/usr/bin/env bash
# Build throughput of xpack-build against `cp` of the same bytes on the same disk.
#
# usage: bench/bench-build.sh [BUILD_DIR] [WORK_DIR] [LAYERS] [EXPERTS]
#   BUILD_DIR  meson build dir holding tools/xpack-build and tools/xpack-synth (default build)
#   WORK_DIR   scratch dir on the disk to measure (default: a new dir under /tmp)
#   LAYERS, EXPERTS  size of the synthetic deepseek4-shaped MXFP4 model
#              (default 8 x 64, ~3.4 GB: 2048-wide experts, 6.7 MB per object)
#
# Both runs start with a cold page cache when run as root (sync + drop_caches) and
# both end durable (cp is followed by sync of the copy; xpack-build fsyncs itself).
# Throughput = source bytes / wall seconds. Prints both and the ratio (goal >= 0.8).
set -euo pipefail

BUILD=${1:-build}
WORK=${2:-$(mktemp -d /tmp/xpack-bench-build.XXXXXX)}
LAYERS=${3:-8}
EXPERTS=${4:-64}
SYNTH="$BUILD/tools/xpack-synth"
XBUILD="$BUILD/tools/xpack-build"
[ -x "$SYNTH" ] && [ -x "$XBUILD" ] || { echo "build $SYNTH and $XBUILD first" >&2; exit 2; }
mkdir -p "$WORK"
trap 'rm -rf "$WORK/model.gguf" "$WORK/copy.gguf" "$WORK"/out.*' EXIT

drop_caches() {
  sync
  if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ]; then
    echo 3 > /proc/sys/vm/drop_caches
    echo cold
  else
    echo "warm (not root: page cache not dropped)"
  fi
}
now() { date +%s.%N; }

echo "generating model: deepseek4, $LAYERS layers x $EXPERTS experts, embd 2048, ff 2048 (MXFP4)" >&2
"$SYNTH" -q --arch deepseek4 --layers "$LAYERS" --experts "$EXPERTS" --embd 2048 --ff 2048 -o "$WORK/model.gguf"
BYTES=$(stat -c %s "$WORK/model.gguf")

cache=$(drop_caches)
t0=$(now)
cp "$WORK/model.gguf" "$WORK/copy.gguf"
sync "$WORK/copy.gguf"
t1=$(now)
rm -f "$WORK/copy.gguf"

drop_caches > /dev/null
t2=$(now)
"$XBUILD" "$WORK/model.gguf" -o "$WORK/out" --json > "$WORK/build.json"
t3=$(now)

python3 - "$BYTES" "$t0" "$t1" "$t2" "$t3" "$cache" "$WORK/build.json" <<'PY'
import json, sys
nbytes = int(sys.argv[1]); t0, t1, t2, t3 = map(float, sys.argv[2:6]); cache = sys.argv[6]
rep = json.load(open(sys.argv[7]))
cp_s, b_s = t1 - t0, t3 - t2
mib = 1 << 20
cp_tp, b_tp = nbytes / cp_s / mib, nbytes / b_s / mib
print(f"source        {nbytes} bytes ({nbytes / 2**30:.2f} GiB), page cache {cache}")
print(f"cp + sync     {cp_s:8.2f} s  {cp_tp:8.1f} MiB/s")
print(f"xpack-build   {b_s:8.2f} s  {b_tp:8.1f} MiB/s  (copy phase {rep['copy_seconds']:.2f} s, "
      f"{rep['throughput_mib_s']:.1f} MiB/s; pack {rep['pack_bytes']} B, trunk {rep['trunk_bytes']} B)")
print(f"ratio         {b_tp / cp_tp:.2f}  (xpack-build / cp; goal >= 0.8)")
PY
