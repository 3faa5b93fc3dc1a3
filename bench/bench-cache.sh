#!/bin/sh
# On the GPU machine, from the repository root (carry .deps, see
# ../shared/device/README.md): builds with CUDA, runs the cache suites (the
# CUDA ones included) and bench-cache twice at 1, 2 and 4 outstanding requests, then
# prints a short summary last. OUT (optional) receives the JSON results.
set -eu
OUT=${OUT:-/tmp}
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
for run in 1 2; do for o in 1 2 4; do
  $B/bench/bench-cache --file /tmp/bench-cache.bin --device cuda --outstanding $o --keep \
    > $OUT/bench-cache-r$run-o$o.json
  summary="$summary
bench run $run outstanding=$o: $(python3 -c "import json; j=json.load(open('$OUT/bench-cache-r$run-o$o.json')); print('disk %.2f (%.2f, %.2f) GB/s pcie %.2f GB/s cache %.2f GB/s ratio %.3f stall/miss %.2f ms' % (j['disk_gbps'], j['disk_before_gbps'], j['disk_after_gbps'], j['pcie_gbps'], j['cache_miss_gbps'], j['ratio_vs_min_disk_pcie'], j['stall_ms_per_miss']))")"
done; done
rm -f /tmp/bench-cache.bin
echo "== summary$summary"
