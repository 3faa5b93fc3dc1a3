"""xpack-run --server on stories260K through the official openai Python client:
completion and chat, streamed and not; greedy /v1/completions with prompt "Once"
returns the CLI's text; chat returns -cnv's reply; seeds, stop strings and usage;
a refused request raises the client's BadRequestError; 50 sequential and 8
concurrent requests finish without error.

Usage: server_openai.py XPACK_RUN MODEL.gguf
"""
import concurrent.futures
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_harness import Server, cli_json, skip  # noqa: E402

try:
    import openai
except ImportError as e:
    skip("the openai Python package is not installed (tools/install-deps.sh installs it): %s" % e)

xpack_run, model = sys.argv[1:3]
srv = Server(xpack_run, model)
client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        srv.stop()
        raise AssertionError(what)


try:
    models = client.models.list()
    check([m.id for m in models.data] == ["stories260K.gguf"], "models: %s" % models)
    model_id = models.data[0].id

    # Greedy completion = the CLI's story (llama.cpp's, test/runtime/test_llama.cpp).
    ref = cli_json(xpack_run, model, "-p", "Once", "-n", "60")
    c = client.completions.create(model=model_id, prompt="Once", max_tokens=60, temperature=0)
    check(c.choices[0].text == ref["text"], "completion %r != CLI %r" % (c.choices[0].text, ref["text"]))
    check(c.usage.prompt_tokens == len(ref["prompt_ids"]), "usage %s" % c.usage)
    check(c.usage.completion_tokens == len(ref["gen_ids"]), "usage %s vs %d ids" % (c.usage, len(ref["gen_ids"])))
    check(c.choices[0].finish_reason == ("length" if ref["finish_reason"] == "length" else "stop"), c.choices[0])
    check(c.object == "text_completion" and c.model == model_id, c)
    print("completion:", repr(c.choices[0].text[:60]), c.usage)

    # Streamed: the same text, in several chunks, the last with the finish reason.
    chunks = list(client.completions.create(model=model_id, prompt="Once", max_tokens=60, temperature=0, stream=True))
    check(len(chunks) > 10, "only %d chunks" % len(chunks))
    check("".join(ch.choices[0].text for ch in chunks) == ref["text"], "streamed text differs")
    check(chunks[-1].choices[0].finish_reason == c.choices[0].finish_reason, chunks[-1])
    check(all(ch.choices[0].finish_reason is None for ch in chunks[:-1]), "finish_reason before the end")

    # A long whole answer (about 1 s): sent with the leading spaces that probe for a closed
    # connection every 50 ms, which the client's JSON parser skips.
    long = client.completions.create(model=model_id, prompt="Once", max_tokens=600, temperature=0,
                                     extra_body={"ignore_eos": True})
    check(long.usage.completion_tokens == 600 and long.choices[0].finish_reason == "length", long.usage)
    check(long.choices[0].text.startswith(ref["text"]), "the long answer does not start with the story")

    # include_usage: a last chunk with the usage and no choices.
    chunks = list(client.completions.create(model=model_id, prompt="Once", max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5, chunks[-1])

    # Chat: the reply -cnv gives for the same user turn (plain format: no template in stories260K).
    turn = "Tell me a story."
    r = subprocess.run([xpack_run, "-m", model, "-t", "1", "-cnv", "--json", "-n", "24"], input=turn + "\n",
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, r.stderr)
    import json
    cnv = json.loads(r.stdout)["turns"][0]
    m = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": turn}], max_tokens=24,
                                       temperature=0)
    check(m.object == "chat.completion", m)
    check(m.choices[0].message.role == "assistant", m)
    check(m.choices[0].message.content == cnv["reply"], "chat %r != -cnv %r" % (m.choices[0].message.content,
                                                                                cnv["reply"]))
    check(m.usage.prompt_tokens == cnv["prompt_tokens"], "chat usage %s vs %s" % (m.usage, cnv["prompt_tokens"]))
    print("chat:", repr(m.choices[0].message.content))

    chunks = list(client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": turn}],
                                                 max_tokens=24, temperature=0, stream=True))
    check(chunks[0].choices[0].delta.role == "assistant", chunks[0])
    check("".join(ch.choices[0].delta.content or "" for ch in chunks) == cnv["reply"], "streamed chat differs")
    check(chunks[-1].choices[0].finish_reason in ("stop", "length"), chunks[-1])

    # A conversation resent with the reply: the server keeps the evaluated prefix.
    reused_before = srv.metric("xpack_server_prompt_tokens_reused_total")
    client.chat.completions.create(model=model_id, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": turn}, {"role": "assistant", "content": m.choices[0].message.content.strip()},
        {"role": "user", "content": "And then?"}])
    check(srv.metric("xpack_server_prompt_tokens_reused_total") > reused_before, "no prompt tokens reused")

    # Sampling from the request: a seed reproduces, penalties and top-k/p/min-p pass through.
    kw = dict(model=model_id, prompt="Once", max_tokens=30, temperature=0.9, top_p=0.95, seed=1234,
              frequency_penalty=0.3, presence_penalty=0.2, extra_body={"top_k": 40, "min_p": 0.02,
                                                                       "repeat_penalty": 1.1})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    check(a.choices[0].text == b.choices[0].text, "the same seed gave %r and %r" % (a.choices[0].text,
                                                                                     b.choices[0].text))
    kw["seed"] = 99
    texts = {client.completions.create(**dict(kw, seed=s)).choices[0].text for s in (1, 2, 3, 4)}
    check(len(texts) > 1, "four seeds gave one text")
    ref_stop = ref["text"].find("girl")
    check(ref_stop > 0, "the reference story has no 'girl'")
    s = client.completions.create(model=model_id, prompt="Once", max_tokens=60, temperature=0, stop=["girl"])
    check(s.choices[0].text == ref["text"][:ref_stop] and s.choices[0].finish_reason == "stop", s.choices[0])

    # Refused requests raise the client's errors with the server's message.
    try:
        client.completions.create(model=model_id, prompt="Once", max_tokens=-1)
        check(False, "max_tokens -1 accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "max_tokens" in str(e), str(e))
    try:
        client.completions.create(model=model_id, prompt="Once " * 3000, max_tokens=4)
        check(False, "a prompt over the context accepted")
    except openai.BadRequestError as e:
        check("context" in str(e), str(e))

    # 50 sequential requests, alternating endpoints and streaming.
    for i in range(50):
        if i % 2:
            out = client.completions.create(model=model_id, prompt="Once", max_tokens=6, temperature=0,
                                            stream=bool(i % 4 == 1))
            text = "".join(ch.choices[0].text for ch in out) if i % 4 == 1 else out.choices[0].text
        else:
            out = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hi %d" % i}],
                                                 max_tokens=6, temperature=0)
            text = out.choices[0].message.content
        check(isinstance(text, str), "request %d: %r" % (i, out))

    # 8 concurrent requests (one runs, the others wait in the queue of 8): all answered, greedy ones alike.
    def one(i):
        return client.completions.create(model=model_id, prompt="Once", max_tokens=20, temperature=0).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(8)))
    check(len(set(got)) == 1 and got[0] == ref["text"][:len(got[0])], "concurrent answers differ: %r" % got)

    check(srv.metric("xpack_server_completion_tokens_total") > 0, "no tokens counted")
    check(srv.metric("xpack_server_decode_tokens_per_second") > 0, "no decode speed")
    check(srv.metric("xpack_server_queue_waiting") == 0, "requests still waiting")
    status, health = srv.get("/health")
    check(status == 200 and "ok" in health, health)
finally:
    if srv.alive():
        srv.stop()
print("server_openai: %d checks passed" % checks)
