#!/usr/bin/python3
"""Reference chat-template renderer: jinja2 configured exactly as Hugging Face transformers does.

Run with Debian's /usr/bin/python3 (python3-jinja2). Reads JSON on stdin:
  {"cases": [{"name": str, "template": str, "messages": [...], "add_generation_prompt": bool,
              "tools": ... | null, "bos_token": str, "eos_token": str, "extra": {...}}]}
and writes {"results": [{"name": str, "output": str} | {"name": str, "error": str, "raised": bool}]}
where `raised` says the template called raise_exception (its message must match exactly).
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    pass


class AssistantTracker(Extension):
    """transformers' {% generation %} block, without the mask bookkeeping: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    # transformers.utils.chat_template_utils._compile_jinja_template
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_case(env, case):
    template = env.from_string(case["template"])
    context = {
        "messages": case.get("messages", []),
        "tools": case.get("tools"),
        "documents": None,
        "add_generation_prompt": case.get("add_generation_prompt", True),
    }
    for key in ("bos_token", "eos_token"):
        if case.get(key):
            context[key] = case[key]
    context.update(case.get("extra", {}))
    return template.render(**context)


def main():
    cases = json.load(sys.stdin)["cases"]
    env = make_env()
    results = []
    for case in cases:
        try:
            results.append({"name": case["name"], "output": render_case(env, case)})
        except RaisedByTemplate as e:
            results.append({"name": case["name"], "error": str(e), "raised": True})
        except Exception as e:  # noqa: BLE001 - every failure is a result to compare
            results.append({"name": case["name"], "error": f"{type(e).__name__}: {e}", "raised": False})
    json.dump({"results": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
