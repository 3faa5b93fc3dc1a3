#!/usr/bin/env python3
"""The reference side of test_chat_template.cpp: renders chat cases through jinja2
as Hugging Face transformers' apply_chat_template does (sandboxed, trim_blocks,
lstrip_blocks, loopcontrols, raise_exception, its tojson), so xpack-run's native
renderers can be compared with the template strings models ship.

usage: render_chat_jinja.py TEMPLATE.jinja CASES.json OUT.json
CASES.json: [{"messages": [...], "kwargs": {...}}, ...]; OUT.json gets a JSON list
with {"text": ...} or {"error": ...} per case. Exit 77 (meson's SKIP) without jinja2.
"""
import json
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    print(f"python3 has no jinja2 ({e}): apt-get install python3-jinja2", file=sys.stderr)
    sys.exit(77)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    template_path, cases_path, out_path = sys.argv[1:4]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.filters["from_json"] = json.loads
    env.globals["raise_exception"] = raise_exception
    with open(template_path, encoding="utf-8") as f:
        template = env.from_string(f.read())
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for case in cases:
        try:
            out.append({"text": template.render(messages=case["messages"], **case["kwargs"])})
        except Exception as e:  # the C++ side checks that it refuses the same cases
            out.append({"error": f"{type(e).__name__}: {e}"})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
