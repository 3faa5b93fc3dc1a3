"""xpack-run --server on stories260K against malformed and hostile requests, over
plain sockets and http.client (no client library that would refuse to send them):
each gets a 4xx with an OpenAI error object (or, for a broken request line or an
oversized body, cpp-httplib's 4xx), a client closing mid-answer cancels its
generation, a full queue answers 503, and the server keeps serving throughout.

Usage: server_hostile.py XPACK_RUN MODEL.gguf
"""
import http.client
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_harness import Server  # noqa: E402

xpack_run, model = sys.argv[1:3]
failures = []
n_hostile = 0


def request(srv, method, path, body=None, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def raw(srv, data, timeout=10):
    """Sends bytes as they are; returns the status of the answer (0 = none)."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    try:
        s.sendall(data)
        got = b""
        while b"\r\n" not in got:
            part = s.recv(4096)
            if not part:
                break
            got += part
    except (ConnectionResetError, BrokenPipeError):
        return 0
    finally:
        s.close()
    line = got.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else 0


def expect(name, status, data, want_status, want_text=None, error_object=True):
    global n_hostile
    n_hostile += 1
    ok = status == want_status
    msg = ""
    if ok and error_object:
        try:
            err = json.loads(data)["error"]
            msg = err["message"]
            ok = isinstance(msg, str) and "type" in err and "param" in err and "code" in err
            if want_text and want_text not in msg:
                ok = False
        except (ValueError, KeyError, TypeError) as e:
            ok, msg = False, "not an error object (%s): %r" % (e, data[:200])
    print("%-46s %s %d %s" % (name, "ok  " if ok else "FAIL", status, msg[:90]))
    if not ok:
        failures.append("%s: status %d (want %d), %r" % (name, status, want_status, data[:300]))


def still_serving(srv, what):
    status, data = request(srv, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 3, "temperature": 0})
    if status != 200 or "choices" not in json.loads(data):
        failures.append("after %s: the server did not answer a good request: %d %r" % (what, status, data[:200]))


def wait_metric(srv, name, at_least, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if srv.metric(name) >= at_least:
            return True
        time.sleep(0.05)
    return False


srv = Server(xpack_run, model)
C, CC = "/v1/completions", "/v1/chat/completions"
try:
    # Malformed bodies and wrong types: 400 with the OpenAI error object.
    cases = [
        ("bad JSON", C, b'{"prompt": "Once",', 400, "not valid JSON"),
        ("empty body", C, b"", 400, "not valid JSON"),
        ("JSON array body", C, b"[1, 2, 3]", 400, "JSON object"),
        ("invalid UTF-8 in the JSON", C, b'{"prompt": "\xff\xfe"}', 400, None),
        ("100000-deep nesting", C, b"[" * 100000 + b"]" * 100000, 400, None),
        ("prompt of the wrong type", C, {"prompt": 12}, 400, "prompt"),
        ("no prompt", C, {"max_tokens": 3}, 400, "prompt"),
        ("negative max_tokens", C, {"prompt": "Once", "max_tokens": -5}, 400, "max_tokens"),
        ("max_tokens as a string", C, {"prompt": "Once", "max_tokens": "ten"}, 400, "max_tokens"),
        ("huge max_tokens", C, {"prompt": "Once", "max_tokens": 10 ** 9}, 400, "context"),
        ("max_tokens beyond int64", C, b'{"prompt": "Once", "max_tokens": 99999999999999999999999}', 400,
         "max_tokens"),
        ("temperature as a string", C, {"prompt": "Once", "temperature": "hot"}, 400, "temperature"),
        ("top_p above 1", C, {"prompt": "Once", "top_p": 7}, 400, "top_p"),
        ("negative seed", C, {"prompt": "Once", "seed": -3}, 400, "seed"),
        ("stop of the wrong type", C, {"prompt": "Once", "stop": {"a": 1}}, 400, "stop"),
        ("200 stop strings", C, {"prompt": "Once", "stop": ["x%d" % i for i in range(200)]}, 400, "stop"),
        ("n = 4", C, {"prompt": "Once", "n": 4}, 400, "'n'"),
        ("token ids outside the vocabulary", C, {"prompt": [1, 999999]}, 400, "vocabulary"),
        ("huge prompt (600 KB)", C, {"prompt": "Once upon a time " * 36000}, 400, "context"),
        ("prompt at the context's length", C, {"prompt": [1] * 2048}, 400, "context"),
        ("chat without messages", CC, {"prompt": "Once"}, 400, "messages"),
        ("chat message without a role", CC, {"messages": [{"content": "hi"}]}, 400, "role"),
        ("chat content of the wrong type", CC, {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
        ("chat with an image part", CC, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
         "content"),
        ("chat with a role the format lacks", CC, {"messages": [{"role": "wizard", "content": "hi"}]}, 400,
         "messages"),
        ("chat over the context", CC, {"messages": [{"role": "user", "content": "Once upon a time " * 3000}]}, 400,
         "context"),
        ("stream of the wrong type", CC, {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400,
         "stream"),
    ]
    for name, path, body, want, text in cases:
        status, data = request(srv, "POST", path, body)
        expect(name, status, data, want, text)
    still_serving(srv, "malformed bodies")

    status, data = request(srv, "GET", "/v1/nothing")
    expect("unknown route", status, data, 404, "no route")
    status, data = request(srv, "GET", C)
    expect("GET on a POST route", status, data, 404)
    status, data = request(srv, "DELETE", "/v1/models")
    expect("DELETE /v1/models", status, data, 404)
    # Larger than the 8 MiB limit: cpp-httplib answers 413 without reading it all.
    st = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 20000000\r\n\r\n" + b"{" * 65536)
    expect("body of 20 MB declared", st, b"", 413, error_object=False)
    expect("garbage request line", raw(srv, b"\x00\x01 GARBAGE\r\n\r\n"), b"", 400, error_object=False)
    expect("header line of 20 KB", raw(srv, b"GET /health HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"), b"", 400,
           error_object=False)
    still_serving(srv, "broken HTTP")

    # A client that sends half a request and goes silent does not block the others.
    slow = socket.create_connection(("127.0.0.1", srv.port))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
    still_serving(srv, "a half-sent request")
    # Nor one that declares a body and closes before it.
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    s.close()
    still_serving(srv, "a truncated body")

    # A client closing mid-stream cancels its generation (long: ignore_eos, 2000 tokens).
    long_req = {"prompt": "Once", "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
    cancelled = srv.metric("xpack_server_cancelled_total")
    tokens_before = srv.metric("xpack_server_completion_tokens_total")
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", C, body=json.dumps(dict(long_req, stream=True)), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    first = r.read(6)  # http.client undoes the chunked framing
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    global_ok = first.startswith(b"data: ") and wait_metric(srv, "xpack_server_cancelled_total", cancelled + 1)
    n_hostile += 1
    spent = srv.metric("xpack_server_completion_tokens_total") - tokens_before
    print("%-46s %s %d tokens generated" % ("client closing mid-stream", "ok  " if global_ok else "FAIL", spent))
    if not global_ok or spent >= 2000:
        failures.append("closing mid-stream: cancelled %s, %d tokens generated" % (global_ok, spent))
    still_serving(srv, "a client closing mid-stream")

    # ... and mid-way through a non-streamed answer (its probes find the socket closed).
    cancelled = srv.metric("xpack_server_cancelled_total")
    tokens_before = srv.metric("xpack_server_completion_tokens_total")
    s = socket.create_connection(("127.0.0.1", srv.port))
    body = json.dumps(long_req).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d"
              b"\r\n\r\n%s" % (len(body), body))
    s.recv(64)  # the headers: the generation is running
    s.close()
    ok = wait_metric(srv, "xpack_server_cancelled_total", cancelled + 1)
    n_hostile += 1
    spent = srv.metric("xpack_server_completion_tokens_total") - tokens_before
    print("%-46s %s %d tokens generated" % ("client closing mid-answer (not streamed)", "ok  " if ok else "FAIL",
                                            spent))
    if not ok:
        failures.append("closing a non-streamed answer did not cancel it (%d tokens generated)" % spent)
    still_serving(srv, "a client closing mid-answer")
    slow.close()

    status, data = request(srv, "GET", "/health")
    if status != 200:
        failures.append("/health after the hostile requests: %d" % status)
finally:
    if srv.alive():
        srv.stop()
    else:
        failures.append("the server died:\n" + "".join(srv.log))

# A full queue answers 503 (a server of its own: --queue 1 = one running, one waiting).
srv = Server(xpack_run, model, "--queue", "1")
try:
    holders = []
    for _ in range(2):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        c.request("POST", C, body=json.dumps({"prompt": "Once", "max_tokens": 2000, "ignore_eos": True,
                                              "stream": True}), headers={"Content-Type": "application/json"})
        holders.append(c)
        time.sleep(0.2)
    deadline = time.time() + 20
    while srv.metric("xpack_server_queue_waiting") < 1 and time.time() < deadline:
        time.sleep(0.05)
    status, data = request(srv, "POST", C, {"prompt": "Once", "max_tokens": 2})
    expect("a third request with --queue 1", status, data, 503, "busy")
    for c in holders:
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
    # Both generations end: the running one at its next write, the waiting one once it
    # has run its prompt and finds its client gone.
    if not wait_metric(srv, "xpack_server_cancelled_total", 2):
        failures.append("the two closed holders were not both cancelled")
    still_serving(srv, "a full queue")
finally:
    if srv.alive():
        srv.stop()
    else:
        failures.append("the --queue 1 server died:\n" + "".join(srv.log))

print("server_hostile: %d hostile requests, %d failures" % (n_hostile, len(failures)))
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures or n_hostile < 20 else 0)
