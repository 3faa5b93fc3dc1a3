#!/usr/bin/env bash
# Runs fio (ioengine=io_uring, direct=1) and xpack-fio (uring-fixed, then buffered)
# on the same file, block size, depth and pattern, and prints the throughput
# ratio xpack-fio/fio and the CPU-seconds-per-GB ratio uring-fixed/buffered.
#
# usage: bench/compare-fio.sh [--file PATH] [--size 4G] [--bs 1M] [--qd 32]
#                             [--pattern rand|seq] [--runtime 10] [--build DIR]
# Environment: FIO_EXTRA="--fixedbufs --registerfiles" adds fio options.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
file=""
size="4G"
bs="1M"
qd="32"
pattern="rand"
runtime="10"
build="${here}/../build"

while [ $# -gt 0 ]; do
  case "$1" in
    --file) file="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --bs) bs="$2"; shift 2 ;;
    --qd) qd="$2"; shift 2 ;;
    --pattern) pattern="$2"; shift 2 ;;
    --runtime) runtime="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "compare-fio.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

fio_bin="$(command -v fio || true)"
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

drop_caches() {
  if [ "$(id -u)" = 0 ]; then
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(could not drop the page cache)"
  else
    echo "(not root: page cache not dropped)"
  fi
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

drop_caches
fio_cmd=("$fio_bin" --name=xpack-compare --filename="$file" --ioengine=io_uring --direct=1
         --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=1 --runtime="$runtime" --time_based
         --group_reporting --output-format=json ${FIO_EXTRA:-})
echo "fio command: ${fio_cmd[*]}"
"${fio_cmd[@]}" > "$tmp/fio.json"

drop_caches
x_cmd=("$xfio" --file "$file" --bs "$bs" --qd "$qd" --pattern "$pattern" --runtime "$runtime"
       --mode uring-fixed --json)
echo "xpack-fio command: ${x_cmd[*]}"
"${x_cmd[@]}" > "$tmp/xfixed.json"

b_cmd=("$xfio" --file "$file" --bs "$bs" --qd "$qd" --pattern "$pattern" --runtime "$runtime"
       --mode buffered --json)
echo "xpack-fio command: ${b_cmd[*]}"
"${b_cmd[@]}" > "$tmp/xbuf.json"

python3 - "$tmp/fio.json" "$tmp/xfixed.json" "$tmp/xbuf.json" <<'PY'
import json, sys
fio = json.load(open(sys.argv[1]))
job = fio["jobs"][0]
rd = job["read"]
runtime_s = job["job_runtime"] / 1000.0 if job.get("job_runtime") else rd["runtime"] / 1000.0
fio_gbps = rd["bw_bytes"] / 1e9
fio_cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * runtime_s
fio_gb = rd["io_bytes"] / 1e9
pct = rd.get("clat_ns", {}).get("percentile", {})
def p(key):
    v = pct.get(key)
    return v / 1e3 if v is not None else float("nan")
fixed = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
buf = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
print()
print(f"{'path':22s} {'GB/s':>8s} {'IOPS':>10s} {'p50 us':>10s} {'p99 us':>10s} {'CPU s/GB':>9s}")
print(f"{'fio io_uring direct':22s} {fio_gbps:8.3f} {rd['iops']:10.0f} {p('50.000000'):10.1f} {p('99.000000'):10.1f} {fio_cpu_s / fio_gb if fio_gb else 0:9.3f}")
for name, r in (("xpack-fio uring-fixed", fixed), ("xpack-fio buffered", buf)):
    print(f"{name:22s} {r['read_gbps']:8.3f} {r['iops']:10.0f} {r['lat_p50_us']:10.1f} {r['lat_p99_us']:10.1f} {r['cpu_s_per_gb']:9.3f}")
print()
ratio = fixed["read_gbps"] / fio_gbps if fio_gbps else float("nan")
cpu_ratio = fixed["cpu_s_per_gb"] / buf["cpu_s_per_gb"] if buf["cpu_s_per_gb"] else float("nan")
print(f"throughput ratio uring-fixed / fio = {ratio:.3f}  (goal >= 1.00)")
print(f"CPU s/GB ratio uring-fixed / buffered = {cpu_ratio:.3f}  (goal <= 0.50)")
PY
