"""xpack-run --server with the routed experts streamed from an Expert Pack through
libxpack's cache (stories260K in its 4-expert Mixtral form, a cache of one layer's
experts): the greedy completion equals the CLI's on the same pack, and /metrics
carries the engine's counters (hits, misses, evictions, pack_read_bytes, h2d_bytes,
io_errors, fallback_count) as they stand after the request.

Usage: server_pack.py XPACK_RUN XPACK_BUILD MAKE_MOE_FIXTURE.py MODEL.gguf WORKDIR
"""
import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_harness import Server, cli_json, skip  # noqa: E402

xpack_run, xpack_build, make_fixture, model, work = sys.argv[1:6]
r = subprocess.run([sys.executable, "-c", "import numpy, gguf"], capture_output=True, text=True)
if r.returncode != 0:
    skip("python3 cannot import numpy and gguf (llama.cpp's gguf-py), which make the MoE fixture: " +
         r.stderr.strip().splitlines()[-1])
if not os.path.exists(model):
    skip("the model %s is missing" % model)
# The build directory, not /tmp: the pack is read with O_DIRECT, which tmpfs refuses.
os.makedirs(work, exist_ok=True)
moe = os.path.join(work, "moe.gguf")
subprocess.run([sys.executable, make_fixture, model, moe], check=True, capture_output=True)
subprocess.run([xpack_build, moe, "-o", os.path.join(work, "moe"), "--force"], check=True, capture_output=True)
pack_args = ["--pack", os.path.join(work, "moe.xpack"), "--cache-mib", "0.2"]
trunk = os.path.join(work, "moe.trunk.gguf")

ref = cli_json(xpack_run, trunk, *pack_args, "-p", "Once", "-n", "60")
srv = Server(xpack_run, trunk, *pack_args)
failures = []
try:
    before = srv.metric("xpack_engine_cache_misses_total")
    req = urllib.request.Request(srv.base + "/v1/completions", data=json.dumps(
        {"prompt": "Once", "max_tokens": 60, "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        text = json.loads(resp.read())["choices"][0]["text"]
    if text != ref["text"]:
        failures.append("server %r != CLI %r" % (text, ref["text"]))
    _, page = srv.get("/metrics")
    print("\n".join(line for line in page.splitlines() if line.startswith("xpack_engine_")))
    value = {}
    for line in page.splitlines():
        if line.startswith("xpack_engine_") and "{" not in line:
            name, v = line.split()
            value[name] = float(v)
    if 'xpack_engine_info{source="pack-cache",cache_policy="adaptive"} 1' not in page:
        failures.append("no xpack_engine_info for the pack cache and its policy")
    for name in ["cache_hits", "cache_misses", "cache_evictions", "pack_read_bytes", "h2d_bytes", "io_errors",
                 "fallback_count"]:
        if "xpack_engine_%s_total" % name not in value:
            failures.append("/metrics lacks xpack_engine_%s_total" % name)
    m = value.get("xpack_engine_cache_misses_total", 0)
    # A cache of 4 objects for 5 layers x 4 experts: every step reads again.
    if before != 0 or m <= 20 * 10:
        failures.append("cache misses %s before, %s after one request of 60 tokens" % (before, m))
    if value.get("xpack_engine_cache_evictions_total", 0) <= 0:
        failures.append("no evictions counted")
    if value.get("xpack_engine_pack_read_bytes_total") != m * value.get("xpack_engine_object_bytes", -1):
        failures.append("pack_read_bytes != misses x object_bytes")
    if value.get("xpack_engine_io_errors_total") != 0 or value.get("xpack_engine_fallback_count_total") != 0:
        failures.append("io_errors or fallback_count nonzero")
finally:
    srv.stop()
for f in os.listdir(work):
    os.remove(os.path.join(work, f))
for f in failures:
    print("FAIL:", f)
print("server_pack: %d failures" % len(failures))
sys.exit(1 if failures else 0)
