#!/usr/bin/env bash
# Runs, on the same file, block size, depth and pattern, interleaved so the disk's
# drift shows: fio (ioengine=io_uring, direct=1, fixedbufs, registerfiles),
# xpack-fio uring-fixed with huge-page staging, the same with 4 KiB pages forced
# (--small-pages), fio again, then xpack-fio buffered. Prints the throughput
# ratios xpack-fio/fio (against each fio run and their best), huge/4K pages, and
# the CPU-seconds-per-GB ratio uring-fixed/buffered.
#
# usage: bench/compare-fio.sh [--file PATH] [--size 4G] [--bs 1M] [--qd 32]
#                             [--pattern rand|seq] [--runtime 10] [--build DIR]
#                             [--no-buffered]
# Environment: FIO=PATH picks the fio binary (default: fio on PATH);
# FIO_EXTRA adds fio options.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
file=""
size="4G"
bs="1M"
qd="32"
pattern="rand"
runtime="10"
build="${here}/../build"
buffered=1

while [ $# -gt 0 ]; do
  case "$1" in
    --file) file="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --bs) bs="$2"; shift 2 ;;
    --qd) qd="$2"; shift 2 ;;
    --pattern) pattern="$2"; shift 2 ;;
    --runtime) runtime="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --no-buffered) buffered=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "compare-fio.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

fio_bin="${FIO:-$(command -v fio || true)}"
xfio="${build}/bench/xpack-fio"
[ -n "$fio_bin" ] || { echo "compare-fio.sh: fio not found (apt-get install fio)" >&2; exit 2; }
[ -x "$xfio" ] || { echo "compare-fio.sh: $xfio not built (meson compile -C $build xpack-fio)" >&2; exit 2; }
[ -n "$file" ] || file="${build}/compare-fio.bin"

case "$pattern" in
  rand) rw="randread" ;;
  seq) rw="read" ;;
  *) echo "compare-fio.sh: --pattern must be rand or seq" >&2; exit 2 ;;
esac

# xpack-fio creates the file (random data, --size) if it is missing.
if [ ! -e "$file" ]; then
  "$xfio" --file "$file" --size "$size" --bs "$bs" --qd 1 --ios 1 --mode uring-fixed --json >/dev/null
fi
echo "file: $file ($(stat -c %s "$file") bytes) on $(df -T "$file" | awk 'NR==2{print $2" "$1}')"
echo "bs $bs  qd $qd  pattern $pattern  runtime ${runtime}s  kernel $(uname -r)  cpus $(nproc)"
echo "fio: $("$fio_bin" --version)  THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo absent)  hugetlb 2M free: $(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0)"
# The device's segment limit: with 4 KiB pages a read of more than
# max_segments x 4 KiB is split by the block layer.
dev="$(df --output=source "$file" | awk 'NR==2')"
blk="$(basename "$(readlink -f "$dev")" 2>/dev/null || true)"
for q in "/sys/class/block/$blk/queue" "/sys/class/block/$blk/../queue"; do
  if [ -r "$q/max_segments" ]; then
    echo "device $dev: max_segments $(cat "$q/max_segments")  max_sectors_kb $(cat "$q/max_sectors_kb")"
    break
  fi
done

drop_caches() {
  if [ "$(id -u)" = 0 ]; then
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(could not drop the page cache)"
  else
    echo "(not root: page cache not dropped)"
  fi
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fio_cmd=("$fio_bin" --name=xpack-compare --filename="$file" --ioengine=io_uring --direct=1
         --fixedbufs --registerfiles
         --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=1 --runtime="$runtime" --time_based
         --group_reporting --output-format=json ${FIO_EXTRA:-})
x_cmd=("$xfio" --file "$file" --bs "$bs" --qd "$qd" --pattern "$pattern" --runtime "$runtime"
       --mode uring-fixed --json)
echo "fio command: ${fio_cmd[*]}"
echo "xpack-fio command: ${x_cmd[*]} [--small-pages]"

drop_caches
"${fio_cmd[@]}" > "$tmp/fio1.json"
drop_caches
"${x_cmd[@]}" > "$tmp/xhuge.json"
drop_caches
"${x_cmd[@]}" --small-pages > "$tmp/xsmall.json"
drop_caches
"${fio_cmd[@]}" > "$tmp/fio2.json"

if [ "$buffered" = 1 ]; then
  b_cmd=("$xfio" --file "$file" --bs "$bs" --qd "$qd" --pattern "$pattern" --runtime "$runtime"
         --mode buffered --json)
  echo "xpack-fio command: ${b_cmd[*]}"
  "${b_cmd[@]}" > "$tmp/xbuf.json"
else
  : > "$tmp/xbuf.json"
fi

python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
def fio_row(path):
    job = json.load(open(path))["jobs"][0]
    rd = job["read"]
    runtime_s = job["job_runtime"] / 1000.0 if job.get("job_runtime") else rd["runtime"] / 1000.0
    gb = rd["io_bytes"] / 1e9
    pct = rd.get("clat_ns", {}).get("percentile", {})
    p = lambda k: pct[k] / 1e3 if k in pct else float("nan")
    return {"read_gbps": rd["bw_bytes"] / 1e9, "iops": rd["iops"], "lat_p50_us": p("50.000000"),
            "lat_p99_us": p("99.000000"),
            "cpu_s_per_gb": (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * runtime_s / gb if gb else 0,
            "pages": "-"}
def x_row(path):
    text = open(path).read().strip()
    if not text:
        return None
    r = json.loads(text.splitlines()[-1])
    pb = r.get("staging_page_bytes", 0)
    r["pages"] = (f"{pb >> 20}M" if pb >= 1 << 20 else f"{pb >> 10}K") + f" {100 * r.get('staging_huge_fraction', 0):.0f}%"
    return r
fio1, fio2 = fio_row(f"{d}/fio1.json"), fio_row(f"{d}/fio2.json")
huge, small, buf = x_row(f"{d}/xhuge.json"), x_row(f"{d}/xsmall.json"), x_row(f"{d}/xbuf.json")
print()
print(f"{'path':26s} {'GB/s':>8s} {'IOPS':>10s} {'p50 us':>10s} {'p99 us':>10s} {'CPU s/GB':>9s} {'pages':>8s}")
rows = [("fio io_uring (1st)", fio1), ("xpack-fio uring-fixed", huge), ("xpack-fio 4K pages forced", small),
        ("fio io_uring (2nd)", fio2), ("xpack-fio buffered", buf)]
for name, r in rows:
    if r is None:
        continue
    print(f"{name:26s} {r['read_gbps']:8.3f} {r['iops']:10.0f} {r['lat_p50_us']:10.1f} {r['lat_p99_us']:10.1f} {r['cpu_s_per_gb']:9.3f} {r['pages']:>8s}")
print()
best = max(fio1["read_gbps"], fio2["read_gbps"])
spread = abs(fio1["read_gbps"] - fio2["read_gbps"]) / best if best else float("nan")
div = lambda a, b: a / b if b else float("nan")
print(f"fio drift between its two runs = {100 * spread:.1f}%")
print(f"throughput ratio uring-fixed / fio best = {div(huge['read_gbps'], best):.3f}  (goal >= 1.00; vs 1st {div(huge['read_gbps'], fio1['read_gbps']):.3f}, vs 2nd {div(huge['read_gbps'], fio2['read_gbps']):.3f})")
print(f"throughput ratio huge pages / 4K pages = {div(huge['read_gbps'], small['read_gbps']):.3f}  (staging {huge['staging_pages']} vs {small['staging_pages']})")
if buf:
    print(f"CPU s/GB ratio uring-fixed / buffered = {div(huge['cpu_s_per_gb'], buf['cpu_s_per_gb']):.3f}  (goal <= 0.50)")
PY
