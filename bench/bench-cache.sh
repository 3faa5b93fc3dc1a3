#!/bin/sh
# On the GPU machine, from the repository root (carry .deps, see
# ../shared/device/README.md): builds with CUDA, runs the cache suites (the
# CUDA ones included), then bench-cache once at 1, 2 and 4 outstanding requests,
# each with ROUNDS (default 5) interleaved disk/cache rounds, and prints a short
# summary last: per config the median, min and max of the per-round ratios
# cache / min(disk, pcie), the pooled ratio and the stall per miss.
# OUT (optional) receives the logs and the JSON results.
# When fio is on PATH, fio (io_uring, O_DIRECT, the same bytes in flight: block =
# object / 4 splits, depth = 12 staging x 4 splits) reads the same file right
# before and after each bench-cache run, as an independent disk baseline:
# fio_ratio = cache pooled GB/s / mean of the two fio rates.
set -eu
OUT=${OUT:-/tmp}
ROUNDS=${ROUNDS:-5}
[ -d .deps ] && sh .deps/install-debs.sh >/dev/null
B=build-gpu-cache
[ -d $B ] || meson setup $B -Dcuda=enabled -Dbuildtype=release >/dev/null
ninja -C $B test/cache/test_device test/cache/test_policy test/cache/test_stats \
  test/cache/test_expert_cache test/cache/test_cuda_cache bench/bench-cache >/dev/null
export XPACK_BUILD_ROOT=$PWD/$B XPACK_SOURCE_ROOT=$PWD
summary=""
for t in test_device test_policy test_stats test_expert_cache test_cuda_cache; do
  if $B/test/cache/$t > $OUT/$t.log 2>&1; then r=ok; else r=FAIL; fi
  summary="$summary
$t: $r $(grep 'test cases' $OUT/$t.log | tr -s ' ') $(grep -c SKIPPED $OUT/$t.log || true) skipped-msgs"
done
grep -h "cuda cache:" $OUT/test_cuda_cache.log || true
# The file is created by the first run (not timed) and kept for the others.
fio_rate() {  # prints GB/s (decimal) of one sequential O_DIRECT pass, or nothing
  command -v fio >/dev/null 2>&1 && [ -f /tmp/bench-cache.bin ] || return 0
  fio --name=baseline --filename=/tmp/bench-cache.bin --rw=read --direct=1 \
    --ioengine=io_uring --fixedbufs --bs=3342336 --iodepth=48 \
    --size=$(stat -c %s /tmp/bench-cache.bin) --output-format=json > $OUT/fio-$1.json 2>/dev/null &&
    python3 -c "import json; print('%.3f' % (json.load(open('$OUT/fio-$1.json'))['jobs'][0]['read']['bw_bytes'] / 1e9))"
}
for o in 1 2 4; do
  j=$OUT/bench-cache-o$o.json
  start=$(date +%s)
  fio_before=$(fio_rate before-o$o)
  if $B/bench/bench-cache --file /tmp/bench-cache.bin --device cuda --outstanding $o \
      --rounds $ROUNDS --keep > $j 2> $OUT/bench-cache-o$o.err; then
    line=$(python3 -c "
import json; j = json.load(open('$j'))
print('ratio median %.3f (min %.3f, max %.3f, pooled %.3f) stall/miss %.2f ms | disk %.2f GB/s (%.2f-%.2f) pcie %.1f GB/s cache %.2f GB/s | per round %s' % (
  j['ratio_vs_min_disk_pcie'], j['ratio_min'], j['ratio_max'], j['ratio_pooled'],
  j['stall_ms_per_miss'], j['disk_gbps'], j['disk_min_gbps'], j['disk_max_gbps'],
  j['pcie_gbps'], j['cache_miss_gbps'],
  ' '.join('%.3f' % r['ratio_vs_min_disk_pcie'] for r in j['rounds'])))")
    fio_after=$(fio_rate after-o$o)
    [ -n "$fio_before" ] || fio_before=$fio_after
    if [ -n "$fio_after" ]; then
      line="$line | fio $fio_before, $fio_after GB/s, fio_ratio $(python3 -c "
import json; j = json.load(open('$j')); print('%.3f' % (j['cache_miss_gbps'] / (($fio_before + $fio_after) / 2)))")"
    fi
  else
    line="FAIL: $(tail -n 3 $OUT/bench-cache-o$o.err)"
  fi
  summary="$summary
bench outstanding=$o rounds=$ROUNDS ($(($(date +%s) - start)) s): $line"
done
rm -f /tmp/bench-cache.bin
echo "== summary$summary"
