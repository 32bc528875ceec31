#!/usr/bin/env python3
"""make_chat_refs.py - reference renderings of the Qwen3.5 chat template by transformers.

  python3 tools/make_chat_refs.py requests          writes tests/fixtures/chat/requests.json and
                                                    qwen35-small-chat-template.jinja (no deps)
  python3 tools/make_chat_refs.py render OUTDIR     renders every request with transformers and
                                                    writes OUTDIR/expected.json (GPU machine)

Each case is an OpenAI chat request as strata's server receives it. It is turned into the
arguments of transformers' apply_chat_template the way chat.h documents: messages and tools
as given, add_generation_prompt (default True), enable_thinking / add_vision_id only when the
request sets them (chat_template_kwargs first), and tool-call arguments given as a JSON string
holding an object parsed to that object first (what vLLM and llama.cpp do before rendering;
transformers alone would refuse a string with "Can only get item pairs from a mapping.").

Rendering: tokenizer.apply_chat_template(tokenize=False) on a PreTrainedTokenizerFast made from
data/qwen3-tokenizer/tokenizer.json, and transformers.utils.chat_template_utils.
render_jinja_template where it exists; both are recorded with the path used. Refusals are
recorded with the exception's type and text.
"""
import copy
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures", "chat")
MAIN_TEMPLATE = os.path.join(ROOT, "data", "qwen35-chat-template.jinja")
SMALL_TEMPLATE = os.path.join(FIX, "qwen35-small-chat-template.jinja")

# The generation-prompt tail of the bundled (thinking by default) template and of the small
# checkpoints' variant (non-thinking by default).
TAIL_ON = ("    {%- if enable_thinking is defined and enable_thinking is false %}\n"
           "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
           "    {%- else %}\n"
           "        {{- '<think>\\n' }}\n"
           "    {%- endif %}")
TAIL_OFF = ("    {%- if enable_thinking is defined and enable_thinking is true %}\n"
            "        {{- '<think>\\n' }}\n"
            "    {%- else %}\n"
            "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
            "    {%- endif %}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web — returns «snippets».\nTwo lines.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "limit": {"type": ["integer", "null"], "default": 10},
        "threshold": {"type": "number", "default": 0.5, "examples": [1.0, 1e-05, 1e+100, -0.0, 0.1, 123456789012345680000.0, 1e16, 1e15, 0.0001, 2.5e-07]},
        "filters": {"type": "object", "properties": {"lang": {"type": "string"}}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "safe": {"type": "boolean", "default": True},
        "raw": {"description": "quote \" backslash \\ tab \t ctrl \u0001 \u001f del \u007f nbsp \u00a0 emoji 😀 cjk 中文"}},
        "required": ["query"]}}}

U = lambda c: {"role": "user", "content": c}
A = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)
S = lambda c: {"role": "system", "content": c}
T = lambda c: {"role": "tool", "content": c}


def call(name, args, wrap=True, id_="call_1"):
    f = {"name": name, "arguments": args}
    return {"id": id_, "type": "function", "function": f} if wrap else f


CASES = [
    ("user_only", {"messages": [U("Hello!")]}),
    ("system_user", {"messages": [S("You are a helpful assistant."), U("What is 2+2?")]}),
    ("thinking_off_kwargs", {"messages": [S("Be brief."), U("Hi")],
                             "chat_template_kwargs": {"enable_thinking": False}}),
    ("thinking_off_toplevel", {"messages": [U("Hi")], "enable_thinking": False}),
    ("thinking_on_explicit", {"messages": [U("Hi")], "chat_template_kwargs": {"enable_thinking": True}}),
    ("thinking_kwargs_wins", {"messages": [U("Hi")], "enable_thinking": True,
                              "chat_template_kwargs": {"enable_thinking": False}}),
    ("thinking_not_bool", {"messages": [U("Hi")], "chat_template_kwargs": {"enable_thinking": 0}}),
    ("no_generation_prompt", {"messages": [S("sys"), U("Hi"), A("Hello.")], "add_generation_prompt": False}),
    ("multi_turn_history", {"messages": [S("sys"), U("First?"), A("One."), U("Second?"), A("Two."), U("Third?")]}),
    ("history_inline_think", {"messages": [U("Q1"), A("<think>\nold reasoning\n</think>\n\nAnswer 1"), U("Q2")]}),
    ("final_assistant_reasoning_field", {"messages": [U("Q"), A("The answer.", reasoning_content="  Let me think.\n\n")],
                                         "add_generation_prompt": False}),
    ("final_assistant_inline_think", {"messages": [U("Q"), A("<think>\n\nstep 1\nstep 2\n\n</think>\n\n  The answer.")],
                                      "add_generation_prompt": False}),
    ("reasoning_field_wins", {"messages": [U("Q"), A("<think>inline</think>visible", reasoning_content="field")],
                              "add_generation_prompt": False}),
    ("reasoning_null_splits", {"messages": [U("Q"), A("a<think>r1<think>r2\n</think>b</think>\nc", reasoning_content=None)],
                               "add_generation_prompt": False}),
    ("think_close_only", {"messages": [U("Q"), A("just reasoning</think>\n\nthen answer")], "add_generation_prompt": False}),
    ("empty_reasoning_after_query", {"messages": [U("Q"), A("Answer")], "add_generation_prompt": False}),
    ("tools_with_system", {"messages": [S("You are a weather bot."), U("Weather in Paris?")], "tools": [WEATHER, SEARCH]}),
    ("tools_no_system", {"messages": [U("Find cats")], "tools": [SEARCH]}),
    ("tools_blank_system", {"messages": [S("  \n "), U("Hi")], "tools": [WEATHER]}),
    ("tools_empty_list", {"messages": [S("sys"), U("Hi")], "tools": []}),
    ("tool_call_object_args", {"messages": [U("Weather?"), A("", tool_calls=[call("get_weather", {
        "city": "Zürich", "days": 3, "ratio": 0.5, "tiny": 1e-05, "whole": 2.0, "big": 1e+100, "neg": -7,
        "flag": True, "off": False, "none": None, "list": [1, "two", 3.0, None, True],
        "obj": {"a": {"b": [1, 2]}, "s": "x\"y"}, "multiline": "line1\nline2\n", "empty": ""})])],
        "tools": [WEATHER]}),
    ("tool_call_with_content", {"messages": [U("Two cities"), A("Let me check both.", tool_calls=[
        call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Rome", "days": 2}, id_="call_2")])],
        "tools": [WEATHER]}),
    ("tool_call_json_string_args", {"messages": [U("Weather?"), A(None, tool_calls=[
        call("get_weather", "{\"city\": \"Oslo\", \"days\": 5, \"x\": 1.50, \"nested\": {\"k\": [true, null]}}")])],
        "tools": [WEATHER]}),
    ("tool_call_unwrapped", {"messages": [U("Weather?"), A("", tool_calls=[call("get_weather", {"city": "Lima"}, wrap=False)])]}),
    ("tool_call_no_arguments", {"messages": [U("Ping"), A("", tool_calls=[{"type": "function", "function": {"name": "ping"}}])]}),
    ("tool_call_empty_arguments", {"messages": [U("Ping"), A("", tool_calls=[call("ping", {})])]}),
    ("tool_round_trip", {"messages": [S("sys"), U("Weather in Paris and Rome?"),
        A("", tool_calls=[call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Rome"}, id_="c2")]),
        T("{\"temp\": 21}"), T("  {\"temp\": 25}\n"), A("Paris 21, Rome 25."), U("Thanks")], "tools": [WEATHER]}),
    ("multi_step_tools", {"messages": [U("Plan a trip"),
        A("<think>need weather</think>", tool_calls=[call("get_weather", {"city": "Paris"})]),
        T("sunny"),
        A("", reasoning_content="now search", tool_calls=[call("search", {"query": "Paris hotels", "limit": 3})]),
        T("hotel list")], "tools": [WEATHER, SEARCH]}),
    ("tool_message_last_no_prompt", {"messages": [U("Go"), A("", tool_calls=[call("ping", {})]), T("pong")],
                                     "add_generation_prompt": False}),
    ("user_tool_response_not_query", {"messages": [U("real question"), A("calling", tool_calls=[call("ping", {})]),
        U("<tool_response>\npong\n</tool_response>"), A("done", reasoning_content="r")], "add_generation_prompt": False}),
    ("tool_first_message", {"messages": [T("orphan result"), U("Hi")]}),
    ("parts_text", {"messages": [{"role": "user", "content": [{"type": "text", "text": " Hello "}, {"type": "text", "text": "world "}]}]}),
    ("parts_vision", {"messages": [{"role": "user", "content": [
        {"type": "image", "image": "a.png"}, {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": "http://x/b.png"}}, {"type": "video", "video": "c.mp4"},
        {"type": "text", "text": "describe"}]}]}),
    ("parts_vision_ids", {"add_vision_id": True, "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "Compare."}]},
        A("They differ."),
        {"role": "user", "content": [{"type": "video"}, {"image": "x"}, {"type": "text", "text": "And these?"}]}]}),
    ("parts_odd_items", {"messages": [{"role": "user", "content": ["a text item", ["text"], {"type": "text", "text": 5},
        {"type": "text", "text": None}, {"type": "text", "text": 1.5}, {"text": True}, "my video", ["image"]]}]}),
    ("parts_empty_and_null", {"messages": [S([]), {"role": "user", "content": []}, A(None), {"role": "user"}]}),
    ("unicode_whitespace_trim", {"messages": [S("\u3000 system \u00a0"), U("\u2003\u2028hello\u200b\u0085\n\x1c"), A("\tx\u202f")],
                                 "add_generation_prompt": True}),
    ("param_string_filter", {"messages": [U("Q"), A("", tool_calls=[call("f", {
        "i": 123456789012, "f": 0.1, "e": 1e16, "e2": 1e15, "s": 1e-4, "t": 2.5e-07, "b": False, "n": None, "neg0": -0.0,
        "uni": "naïve — 😀", "quote": "it's \"q\""})])], "add_generation_prompt": False}),
    ("tools_unicode_escapes", {"messages": [U("x")], "tools": [{"type": "function", "function": {
        "name": "t", "description": "a\"b\\c\nd\te\u0002f\u0008g\u000ch\u001bi\u2028j 中文 😀",
        "parameters": {"type": "object", "properties": {}}}}]}),
    ("small_default_off", {"template": "small", "messages": [S("sys"), U("Hi")]}),
    ("small_enable_true", {"template": "small", "messages": [U("Hi")], "chat_template_kwargs": {"enable_thinking": True}}),
    ("small_enable_false", {"template": "small", "messages": [U("Hi")], "chat_template_kwargs": {"enable_thinking": False}}),
    ("small_tools_history", {"template": "small", "messages": [U("Weather?"), A("", tool_calls=[call("get_weather", {"city": "Paris"})]),
        T("rain")], "tools": [WEATHER]}),
    ("assistant_and_tool_parts", {"add_vision_id": True, "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<think>look</think>"}, {"type": "text", "text": "A cat."}],
         "tool_calls": [call("search", {"query": "cat"})]},
        {"role": "tool", "content": [{"type": "text", "text": "result "}, {"type": "image_url", "image_url": {"url": "u"}}]},
        U("ok")]}),
    # refusals
    ("refuse_no_messages", {"messages": []}),
    ("refuse_system_not_first", {"messages": [U("Hi"), S("late system")]}),
    ("refuse_no_user", {"messages": [S("sys"), A("hello")]}),
    ("refuse_only_tool_responses", {"messages": [U("<tool_response>\nx\n</tool_response>"), T("y")]}),
    ("refuse_unknown_role", {"messages": [U("Hi"), {"role": "developer", "content": "x"}]}),
    ("refuse_missing_role", {"messages": [U("Hi"), {"content": "x"}]}),
    ("refuse_system_image", {"messages": [{"role": "system", "content": [{"type": "image"}]}, U("Hi")]}),
    ("refuse_system_video_tools", {"messages": [{"role": "system", "content": [{"type": "video", "video": "v"}]}, U("Hi")],
                                   "tools": [WEATHER]}),
    ("refuse_unknown_part", {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
    ("refuse_content_number", {"messages": [U("Hi"), A(42)]}),
    ("refuse_content_object", {"messages": [{"role": "user", "content": {"text": "hi"}}]}),
    ("refuse_bad_json_arguments", {"messages": [U("Q"), A("", tool_calls=[call("f", "{not json")])]}),
    ("refuse_array_arguments", {"messages": [U("Q"), A("", tool_calls=[call("f", [1, 2])])]}),
    ("refuse_tool_call_no_name", {"messages": [U("Q"), A("", tool_calls=[{"function": {"arguments": {}}}])]}),
    ("refuse_function_null", {"messages": [U("Q"), A("", tool_calls=[{"function": None}])]}),
    ("refuse_name_not_string", {"messages": [U("Q"), A("", tool_calls=[call(7, {})])]}),
    ("refuse_part_number", {"messages": [{"role": "user", "content": [7]}]}),
    ("refuse_part_null", {"messages": [{"role": "user", "content": [None]}]}),
]


def write_requests():
    main = open(MAIN_TEMPLATE, encoding="utf-8").read()
    assert main.count(TAIL_ON) == 1, "bundled template's thinking tail not found"
    os.makedirs(FIX, exist_ok=True)
    with open(SMALL_TEMPLATE, "w", encoding="utf-8") as f:
        f.write(main.replace(TAIL_ON, TAIL_OFF))
    cases = [{"name": n, "template": r.pop("template", "main"), "request": r} for n, r in copy.deepcopy(CASES)]
    assert len({c["name"] for c in cases}) == len(cases)
    with open(os.path.join(FIX, "requests.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} requests -> {FIX}/requests.json")


def template_args(req):
    """The request -> (messages, tools, add_generation_prompt, template kwargs), as chat.h says."""
    ctk = req.get("chat_template_kwargs") or {}
    kw = {}
    for k in ("enable_thinking", "add_vision_id"):
        if k in ctk:
            kw[k] = ctk[k]
        elif k in req:
            kw[k] = req[k]
    agp = ctk.get("add_generation_prompt", req.get("add_generation_prompt", True))
    messages = copy.deepcopy(req.get("messages"))
    for m in messages if isinstance(messages, list) else []:
        for tc in (m.get("tool_calls") or []) if isinstance(m, dict) and isinstance(m.get("tool_calls"), list) else []:
            f = tc.get("function", tc) if isinstance(tc, dict) else None
            if isinstance(f, dict) and isinstance(f.get("arguments"), str):
                try:
                    parsed = json.loads(f["arguments"])
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    f["arguments"] = parsed
    return messages, req.get("tools"), agp, kw


def render(outdir):
    import platform
    import jinja2
    import transformers
    from transformers.utils import chat_template_utils as ctu

    cases = json.load(open(os.path.join(FIX, "requests.json"), encoding="utf-8"))
    templates = {"main": open(MAIN_TEMPLATE, encoding="utf-8").read(),
                 "small": open(SMALL_TEMPLATE, encoding="utf-8").read()}
    tok = None
    try:
        from transformers import PreTrainedTokenizerFast
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(ROOT, "data", "qwen3-tokenizer", "tokenizer.json"))
    except Exception as e:  # noqa: BLE001
        print("no PreTrainedTokenizerFast:", repr(e))
    rjt = getattr(ctu, "render_jinja_template", None)
    if rjt is not None:
        import inspect
        print("render_jinja_template", inspect.signature(rjt))

    def run(fn):
        try:
            return {"ok": True, "text": fn()}
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "error_type": type(e).__name__, "error": str(e)}

    out = []
    for c in cases:
        messages, tools, agp, kw = template_args(c["request"])
        tmpl = templates[c["template"]]
        res = {}
        if tok is not None:
            def via_apply():
                r = tok.apply_chat_template(messages, tools=tools, chat_template=tmpl, tokenize=False,
                                            add_generation_prompt=agp, **kw)
                if not isinstance(r, str):
                    raise RuntimeError(f"apply_chat_template returned {type(r).__name__}")
                return r
            res["apply_chat_template"] = run(via_apply)
        if rjt is not None:
            def via_render():
                r = rjt(conversations=[messages], tools=tools, chat_template=tmpl, add_generation_prompt=agp, **kw)
                r = r[0] if isinstance(r, tuple) else r
                return r[0] if isinstance(r, list) else r
            res["render_jinja_template"] = run(via_render)
        # the template's own exceptions, as opposed to a wrapper failing before it runs
        template_errors = ("TemplateError", "UndefinedError", "TypeError", "TemplateRuntimeError")
        path = None
        for p in ("apply_chat_template", "render_jinja_template"):
            r = res.get(p)
            if r and (r["ok"] or r["error_type"] in template_errors):
                path = p
                break
        if path is None:
            def via_compiled():
                return ctu._compile_jinja_template(tmpl).render(messages=messages, tools=tools,
                                                                add_generation_prompt=agp, **kw)
            res["compiled_template"] = run(via_compiled)
            path = "compiled_template"
        e = dict(res[path])
        e["name"] = c["name"]
        e["path"] = path
        others = {p: r for p, r in res.items() if p != path}
        e["agree"] = all(r == res[path] for r in others.values())
        if not e["agree"]:
            e["others"] = others
        out.append(e)
        print(f"{c['name']:34s} {path:22s} {'ok ' if e['ok'] else 'ERR'} agree={e['agree']}"
              + ("" if e["ok"] else f" {e['error_type']}: {e['error']}"))
    meta = {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
            "python": platform.python_version(),
            "made_by": "tools/make_chat_refs.py render", "cases": out}
    with open(os.path.join(outdir, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "requests":
        write_requests()
    elif len(sys.argv) == 3 and sys.argv[1] == "render":
        render(sys.argv[2])
    else:
        sys.exit(__doc__)
