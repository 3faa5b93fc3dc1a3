"""Starts `xpack-run --server` on a free port of 127.0.0.1 for a test and stops it.

Exit statuses of the tests: 0 pass, 1 fail, 77 skipped (a build without the server,
or python3 without the package a test needs; under XPACK_REQUIRE_FIXTURES=1, as in CI,
which always has both, a failure instead).
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request


def skip(why):
    """77 (Meson's SKIP) naming the reason; a failure under XPACK_REQUIRE_FIXTURES=1."""
    required = os.environ.get("XPACK_REQUIRE_FIXTURES") == "1"
    print(("FAIL (XPACK_REQUIRE_FIXTURES=1): " if required else "SKIP: ") + why)
    sys.exit(1 if required else 77)


class Server:
    def __init__(self, xpack_run, model, *extra):
        if not os.path.exists(model):
            skip("the model %s is missing" % model)
        cmd = [xpack_run, "-m", model, "--server", "--host", "127.0.0.1", "--port", "0", "-t", "1", *extra]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 60
        for line in self.proc.stderr:
            self.log.append(line)
            if "this build has no server" in line:
                self.proc.wait()
                skip("xpack-run was built without --server (cpp-httplib absent at configure time)")
            m = re.search(r"server listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() > deadline:
                break
        if self.port is None:
            self.proc.kill()
            raise AssertionError("the server did not start:\n" + "".join(self.log))
        # Keep reading stderr so the server never blocks on a full pipe.
        self.reader = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self.reader.start()
        self.base = "http://127.0.0.1:%d" % self.port

    def alive(self):
        return self.proc.poll() is None

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return r.status, r.read().decode()

    def metric(self, name):
        """The value of an unlabelled sample of /metrics."""
        _, page = self.get("/metrics")
        for line in page.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError("no %s in /metrics:\n%s" % (name, page))

    def stop(self):
        """Stops the server; it must still have been running (nothing crashed it)."""
        assert self.alive(), "the server exited with %s:\n%s" % (self.proc.returncode, "".join(self.log))
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def cli_json(xpack_run, model, *args):
    """xpack-run's one-shot --json output for the same model, as the reference."""
    r = subprocess.run([xpack_run, "-m", model, "-t", "1", "--json", *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)
