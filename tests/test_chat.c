/* test_chat.c - the chat template renderer against transformers' renderings, and the output
 * parser on well-formed, malformed and truncated text, whole and streamed.
 *
 * Rendering: tests/fixtures/chat/requests.json holds the requests, expected.json what
 * transformers' apply_chat_template made of them on the GPU machine (tools/make_chat_refs.py,
 * versions inside). Tolerance: none - the prompt must be identical byte for byte, and a
 * refusal must carry the same text, because any difference changes the tokens the model sees.
 *
 * Parsing: exact expected content / reasoning / arguments strings written here from the rules
 * in chat.h; the streaming parser must give the same result as the whole-text parser for every
 * way of cutting the text into pieces; random tag soup must never crash (run also under ASan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "text/chat.h"
#include "harness.h"

#define FIX "tests/fixtures/chat"

static json_t *load_json(const char *path) {
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) fprintf(stderr, "%s: %s (line %d)\n", path, e.text, e.line);
    return j;
}

/* Prints where two renderings part, with some context, escaped. */
static void show_diff(const char *name, const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: first difference at byte %zu\n  got:  ", name, i);
    for (size_t k = from; got[k] && k < i + 40; k++) fputc(got[k] == '\n' ? '|' : got[k], stderr);
    fprintf(stderr, "\n  want: ");
    for (size_t k = from; want[k] && k < i + 40; k++) fputc(want[k] == '\n' ? '|' : want[k], stderr);
    fputc('\n', stderr);
}

static void test_fixtures(void) {
    struct error err;
    struct chat_template tmain, tsmall;
    char *main_text = read_file("data/qwen35-chat-template.jinja", NULL, &err);
    char *small_text = read_file(FIX "/qwen35-small-chat-template.jinja", NULL, &err);
    EXPECT(main_text && small_text, "templates: %s", err.msg);
    if (!main_text || !small_text) return;
    EXPECT(chat_template_from_text(&tmain, main_text, &err) == 0, "main template: %s", err.msg);
    EXPECT(tmain.thinking_default == CHAT_THINKING_DEFAULT_ON, "main template thinks by default");
    EXPECT(chat_template_from_text(&tsmall, small_text, &err) == 0, "small template: %s", err.msg);
    EXPECT(tsmall.thinking_default == CHAT_THINKING_DEFAULT_OFF, "small template does not think");
    free(main_text);
    free(small_text);

    json_t *reqs = load_json(FIX "/requests.json"), *exp = load_json(FIX "/expected.json");
    EXPECT(reqs && exp, "fixtures load");
    if (!reqs || !exp) return;
    json_t *cases = json_object_get(exp, "cases");
    EXPECT(json_array_size(reqs) == json_array_size(cases) && json_array_size(reqs) >= 30,
           "%zu requests, %zu expected (need >= 30, equal)", json_array_size(reqs), json_array_size(cases));
    EXPECT(json_is_string(json_object_get(exp, "transformers")) &&
               strstr(json_string_value(json_object_get(exp, "transformers")), "none") == NULL,
           "expected.json must come from transformers");
    int n_ok = 0, n_refused = 0;
    for (size_t i = 0; i < json_array_size(reqs) && i < json_array_size(cases); i++) {
        json_t *c = json_array_get(reqs, i), *e = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        EXPECT(!strcmp(name, json_string_value(json_object_get(e, "name"))), "case %zu order", i);
        const struct chat_template *t =
            !strcmp(json_string_value(json_object_get(c, "template")), "small") ? &tsmall : &tmain;
        char *got = NULL;
        int rc = chat_render(t, json_object_get(c, "request"), &got, &err);
        if (json_is_true(json_object_get(e, "ok"))) {
            const char *want = json_string_value(json_object_get(e, "text"));
            EXPECT(rc == 0, "%s: refused: %s", name, err.msg);
            if (rc == 0) {
                int same = !strcmp(got, want);
                EXPECT(same, "%s: rendering differs from transformers", name);
                if (!same) show_diff(name, got, want);
                n_ok += same;
                EXPECT(chat_prompt_opens_thinking(got) == (strlen(want) >= 8 && !strcmp(want + strlen(want) - 8, "<think>\n")),
                       "%s: opens_thinking", name);
            }
        } else {
            const char *want = json_string_value(json_object_get(e, "error"));
            EXPECT(rc < 0, "%s: rendered, but transformers refused with \"%s\"", name, want);
            if (rc < 0) {
                EXPECT(!strcmp(err.msg, want), "%s: refusal \"%s\", transformers \"%s\"", name, err.msg, want);
                n_refused += !strcmp(err.msg, want);
            }
        }
        free(got);
    }
    /* continue_final_message: for every case transformers rendered with a final assistant
     * message whose content is a string, transformers' cut of its own rendering (the text up to
     * the end of the content's last occurrence, or of the content stripped) is ours */
    int n_cont = 0;
    for (size_t i = 0; i < json_array_size(reqs) && i < json_array_size(cases); i++) {
        json_t *c = json_array_get(reqs, i), *e = json_array_get(cases, i);
        json_t *rq = json_object_get(c, "request"), *msgs = json_object_get(rq, "messages");
        const json_t *lastm = json_array_get(msgs, json_array_size(msgs) - 1);
        const json_t *content = json_object_get(lastm, "content");
        const json_t *agp = json_object_get(rq, "add_generation_prompt");
        if (!json_is_true(json_object_get(e, "ok")) || !json_is_string(content) || !json_is_false(agp) ||
            strcmp(json_string_value(json_object_get(lastm, "role")), "assistant") != 0 ||
            !json_string_value(content)[strspn(json_string_value(content), " \t\n\r")])
            continue; /* an empty final message is closed (chat_continues_final) */
        const char *ref = json_string_value(json_object_get(e, "text"));
        const char *fin = json_string_value(content);
        size_t flen = strlen(fin);
        const char *hit = NULL;
        for (int pass = 0; pass < 2 && !hit; pass++) {
            for (const char *q = ref; flen && (q = memmem(q, strlen(q), fin, flen)); q++) hit = q;
            if (!hit) {
                while (flen && strchr(" \t\n\r", fin[0])) fin++, flen--;
                while (flen && strchr(" \t\n\r", fin[flen - 1])) flen--;
            }
        }
        const struct chat_template *t =
            !strcmp(json_string_value(json_object_get(c, "template")), "small") ? &tsmall : &tmain;
        json_t *rq2 = json_deep_copy(rq);
        json_object_del(rq2, "add_generation_prompt");
        char *got = NULL;
        EXPECT(chat_continues_final(rq2), "%s: a final assistant message is continued by default",
               json_string_value(json_object_get(c, "name")));
        const int rc = chat_render_continued(t, rq2, &got, &err);
        if (hit) {
            const size_t want_len = (size_t)(hit - ref) + flen;
            EXPECT(rc == 0 && strlen(got) == want_len && !strncmp(got, ref, want_len),
                   "%s: continued prompt differs from transformers' cut", json_string_value(json_object_get(c, "name")));
        } else {
            EXPECT(rc < 0, "%s: continued though the content is not in the rendering",
                   json_string_value(json_object_get(c, "name")));
        }
        n_cont++;
        free(got);
        json_decref(rq2);
    }
    EXPECT(n_cont >= 5, "continue_final_message checked on %d fixture cases (want >= 5)", n_cont);
    printf("continue_final_message: %d fixture cases cut as transformers cuts its rendering\n", n_cont);
    printf("chat fixtures: %d renderings identical, %d refusals identical, of %zu (transformers %s)\n",
           n_ok, n_refused, json_array_size(cases), json_string_value(json_object_get(exp, "transformers")));
    json_decref(reqs);
    json_decref(exp);
}

/* Python repr / json.dumps of values (expected strings printed by CPython 3.11). */
static void test_pyformat(void) {
    static const struct { const char *json, *tojson, *pystr; } cases[] = {
        {"1.0", "1.0", "1.0"},
        {"1e-05", "1e-05", "1e-05"},
        {"1e+100", "1e+100", "1e+100"},
        {"-0.0", "-0.0", "-0.0"},
        {"0.1", "0.1", "0.1"},
        {"123456789012345680000.0", "1.2345678901234568e+20", "1.2345678901234568e+20"},
        {"1e16", "1e+16", "1e+16"},
        {"1e15", "1000000000000000.0", "1000000000000000.0"},
        {"0.0001", "0.0001", "0.0001"},
        {"2.5e-07", "2.5e-07", "2.5e-07"},
        {"0.3333333333333333", "0.3333333333333333", "0.3333333333333333"},
        {"-1.5e-300", "-1.5e-300", "-1.5e-300"},
        {"5e-324", "5e-324", "5e-324"},
        {"1.7976931348623157e308", "1.7976931348623157e+308", "1.7976931348623157e+308"},
        {"12345.678", "12345.678", "12345.678"},
        {"1152921504606846976.0", "1.152921504606847e+18", "1.152921504606847e+18"},
        {"-42", "-42", "-42"},
        {"true", "true", "True"},
        {"null", "null", "None"},
        {"\"a\\\"b\\\\c\\n\\u0001\\u007f\\u00e9\"", "\"a\\\"b\\\\c\\n\\u0001\x7f\xc3\xa9\"", "a\"b\\c\n\x01\x7f\xc3\xa9"},
        {"[1, \"it's\", {\"k\": null, \"q\": \"\\\"'\"}, [], {}, false]",
         "[1, \"it's\", {\"k\": null, \"q\": \"\\\"'\"}, [], {}, false]",
         "[1, \"it's\", {'k': None, 'q': '\\'\\'', [], {}, False]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
        EXPECT(v, "parse %s", cases[i].json);
        if (!v) continue;
        char *a = chat_tojson(v), *b = chat_pystr(v);
        EXPECT(!strcmp(a, cases[i].tojson), "tojson(%s) = %s, want %s", cases[i].json, a, cases[i].tojson);
        if (i < sizeof cases / sizeof *cases - 1)
            EXPECT(!strcmp(b, cases[i].pystr), "str(%s) = %s, want %s", cases[i].json, b, cases[i].pystr);
        free(a);
        free(b);
        json_decref(v);
    }
}

static void test_template_loading(void) {
    struct chat_template t;
    struct error err;
    EXPECT(chat_template_from_text(&t, "{{ messages }}", &err) < 0 && strstr(err.msg, "not the Qwen3.5"),
           "a foreign template is refused: %s", err.msg);
    char *main_text = read_file("data/qwen35-chat-template.jinja", NULL, &err);
    if (!main_text) return;
    size_t n = strlen(main_text);
    char *pres = xmalloc(n + 64);
    snprintf(pres, n + 64, "%s{%%- if preserve_thinking %%}{%%- endif %%}", main_text);
    EXPECT(chat_template_from_text(&t, pres, &err) < 0 && strstr(err.msg, "preserve_thinking"),
           "preserve_thinking is refused: %s", err.msg);
    free(pres);

    /* tokenizer_config.json forms: a string, and a list of named templates */
    char dir[] = "/tmp/strata_chat_XXXXXX";
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *cfg = json_pack("{s:s}", "chat_template", main_text);
    json_dump_file(cfg, path, 0);
    json_decref(cfg);
    EXPECT(chat_template_load(&t, dir, &err) == 0 && t.thinking_default == CHAT_THINKING_DEFAULT_ON,
           "tokenizer_config.json string form: %s", err.msg);
    cfg = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "chat_template", "name", "tool_use", "template", "{{x}}",
                    "name", "default", "template", main_text);
    json_dump_file(cfg, path, 0);
    json_decref(cfg);
    EXPECT(chat_template_load(&t, dir, &err) == 0, "tokenizer_config.json list form: %s", err.msg);
    /* chat_template.jinja wins over tokenizer_config.json */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "w");
    fputs("{{ messages }}", f);
    fclose(f);
    EXPECT(chat_template_load(&t, dir, &err) < 0 && strstr(err.msg, "chat_template.jinja"),
           "chat_template.jinja is read first and named in the error: %s", err.msg);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    unlink(path);
    EXPECT(chat_template_load(&t, dir, &err) < 0, "no template at all is an error");
    rmdir(dir);
    free(main_text);
}

/* ---- parsing ---------------------------------------------------------------------------- */

static const char *TOOLS_JSON =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"ratio\":{\"type\":\"number\"},\"metric\":{\"type\":\"boolean\"},\"extra\":{\"type\":\"object\"},"
    "\"list\":{\"type\":\"array\"},\"nothing\":{\"type\":\"null\"},\"maybe\":{\"type\":[\"integer\",\"null\"]},"
    "\"any\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"string\"}]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";

struct expect_parse {
    const char *text;
    int in_thinking;
    const char *reasoning; /* NULL: none */
    const char *content;
    int n_calls;
    const char *name0, *args0, *name1, *args1;
    int truncated;
};

/* Entries leave the tool-call fields they do not need zero. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const struct expect_parse PARSES[] = {
    {"Hello there.", 0, NULL, "Hello there.", 0},
    {"I think.\n</think>\n\nThe answer is 4.", 1, "I think.", "The answer is 4.", 0},
    {"<think>\nplan\n\n</think>\n\nDone.\n", 0, "plan", "Done.\n", 0},
    {"  <think>x</think>y", 0, "x", "y", 0},
    {"still thinking when cut off\n", 1, "still thinking when cut off\n", "", 0},
    {"Text with </think> but not thinking", 0, NULL, "Text with </think> but not thinking", 0},
    {"a <think> in the middle", 0, NULL, "a <think> in the middle", 0},
    {"", 1, "", "", 0},
    /* tool calls, typed by the schema */
    {"r\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan \"Fran\"\\cisco\n"
     "second line\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=ratio>\n0.25\n</parameter>\n"
     "<parameter=metric>\nTrue\n</parameter>\n<parameter=extra>\n{\"a\": [1, 2.0]}\n</parameter>\n"
     "<parameter=list>\n[\"x\", null]\n</parameter>\n<parameter=nothing>\nnull\n</parameter>\n"
     "<parameter=maybe>\nnull\n</parameter>\n<parameter=any>\n7\n</parameter>\n</function>\n</tool_call>",
     1, "r", "Let me check.", 1, "get_weather",
     "{\"city\": \"San \\\"Fran\\\"\\\\cisco\\nsecond line\", \"days\": 3, \"ratio\": 0.25, \"metric\": true, "
     "\"extra\": {\"a\": [1, 2.0]}, \"list\": [\"x\", null], \"nothing\": null, \"maybe\": null, \"any\": \"7\"}"},
    /* two calls, no content, no parameters on the second */
    {"<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n"
     "<tool_call>\n<function=ping>\n</function>\n</tool_call>",
     0, NULL, "", 2, "get_weather", "{\"city\": \"Paris\"}", "ping", "{}"},
    /* bad typed values stay strings */
    {"<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=extra>\n{broken\n"
     "</parameter>\n<parameter=metric>\nyes\n</parameter>\n</function>\n</tool_call>",
     0, NULL, "", 1, "get_weather", "{\"days\": \"three\", \"extra\": \"{broken\", \"metric\": \"yes\"}"},
    /* unknown parameter: string; missing </parameter> tolerated; stray text in the call dropped */
    {"<tool_call>\n<function=get_weather>\nstray<parameter=unknown>\n42\n<parameter=city>\nOslo\n</function>\n</tool_call>",
     0, NULL, "", 1, "get_weather", "{\"unknown\": \"42\", \"city\": \"Oslo\"}"},
    /* unknown function: the whole block stays content */
    {"Hi <tool_call>\n<function=launch_rockets>\n<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>", 0, NULL,
     "Hi <tool_call>\n<function=launch_rockets>\n<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>", 0},
    /* <tool_call> not followed by <function=...> */
    {"x\n\n<tool_call>{\"name\": \"ping\"}</tool_call>", 0, NULL, "x\n\n<tool_call>{\"name\": \"ping\"}</tool_call>", 0},
    /* truncated: inside the tag, inside the header, inside a value, inside the body */
    {"Sure\n<tool_ca", 0, NULL, "Sure\n<tool_ca", 0},
    {"Sure\n<tool_call>\n<function=get_wea", 0, NULL, "Sure\n<tool_call>\n<function=get_wea", 0},
    {"<tool_call>\n<function=get_weather>\n<parameter=city>\nBer", 0, NULL, "", 1, "get_weather",
     "{\"city\": \"Ber\"}", NULL, NULL, 1},
    {"<tool_call>\n<function=get_weather>\n<parameter=days>\n1", 0, NULL, "", 1, "get_weather", "{\"days\": 1}",
     NULL, NULL, 1},
    {"<tool_call>\n<function=ping>\n<param", 0, NULL, "", 1, "ping", "{}", NULL, NULL, 1},
    {"<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>", 0, NULL, "", 1,
     "get_weather", "{\"city\": \"Rome\"}"},
    /* text after a call stays content; a call inside reasoning is reasoning */
    {"<tool_call>\n<function=ping>\n</function>\n</tool_call>\n\nafter", 0, NULL, "after", 1, "ping", "{}"},
    {"<tool_call>\n<function=ping>\n</function>\n</tool_call>\n</think>\nok", 1,
     "<tool_call>\n<function=ping>\n</function>\n</tool_call>", "ok", 0},
    /* an empty name, a name with a newline */
    {"<tool_call>\n<function=>\n</function></tool_call>", 0, NULL, "<tool_call>\n<function=>\n</function></tool_call>", 0},
    {"<tool_call><function=pi\nng></function></tool_call>", 0, NULL, "<tool_call><function=pi\nng></function></tool_call>", 0},
};

struct collected {
    struct strbuf content, reasoning;
    struct strbuf args[4];
    char *names[4];
    int n_calls, bad_order;
};

static void on_delta(void *user, const struct chat_delta *d) {
    struct collected *c = user;
    switch (d->kind) {
    case CHAT_DELTA_CONTENT: strbuf_add(&c->content, d->text, d->len); break;
    case CHAT_DELTA_REASONING: strbuf_add(&c->reasoning, d->text, d->len); break;
    case CHAT_DELTA_TOOL_START:
        if (d->index != c->n_calls || c->n_calls >= 4) c->bad_order = 1;
        else c->names[c->n_calls++] = xstrdup(d->name);
        break;
    case CHAT_DELTA_TOOL_ARGS:
        if (d->index != c->n_calls - 1 || d->len == 0) c->bad_order = 1;
        else strbuf_add(&c->args[d->index], d->text, d->len);
        break;
    }
}

static void collected_free(struct collected *c) {
    free(c->content.s);
    free(c->reasoning.s);
    for (int i = 0; i < 4; i++) free(c->args[i].s), free(c->names[i]);
    memset(c, 0, sizeof *c);
}

static const char *or_empty(const char *s) { return s ? s : ""; }

/* Streams text cut at the given piece size (0: pseudo-random sizes from seed) and compares
 * with the whole-text parse. */
static int stream_matches(const char *text, int in_thinking, const json_t *tools, size_t piece,
                          unsigned seed, const struct chat_parsed *want) {
    struct collected c = {0};
    struct chat_stream *s = chat_stream_new(in_thinking, tools, "call_", on_delta, &c);
    size_t n = strlen(text);
    for (size_t i = 0; i < n;) {
        size_t k = piece;
        if (!k) {
            seed = seed * 1103515245u + 12345u;
            k = 1 + (seed >> 16) % 9;
        }
        if (k > n - i) k = n - i;
        chat_stream_push(s, text + i, k);
        i += k;
    }
    chat_stream_finish(s);
    int ok = !c.bad_order && c.n_calls == want->n_tool_calls &&
             !strcmp(or_empty(c.content.s), want->content) &&
             !strcmp(or_empty(c.reasoning.s), or_empty(want->reasoning_content)) &&
             chat_stream_truncated(s) == want->truncated;
    for (int i = 0; ok && i < c.n_calls; i++)
        ok = !strcmp(c.names[i], want->tool_calls[i].name) &&
             !strcmp(or_empty(c.args[i].s), want->tool_calls[i].arguments);
    chat_stream_free(s);
    collected_free(&c);
    return ok;
}

static void test_parse(void) {
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    CHECK(tools);
    for (size_t i = 0; i < sizeof PARSES / sizeof *PARSES; i++) {
        const struct expect_parse *e = &PARSES[i];
        struct chat_parsed p;
        chat_parse(e->text, strlen(e->text), e->in_thinking, tools, "call_", &p);
        EXPECT((e->reasoning == NULL) == (p.reasoning_content == NULL) &&
                   (!e->reasoning || !strcmp(e->reasoning, p.reasoning_content)),
               "parse %zu: reasoning [%s], want [%s]", i, or_empty(p.reasoning_content), or_empty(e->reasoning));
        EXPECT(!strcmp(p.content, e->content), "parse %zu: content [%s], want [%s]", i, p.content, e->content);
        EXPECT(p.n_tool_calls == e->n_calls, "parse %zu: %d tool calls, want %d", i, p.n_tool_calls, e->n_calls);
        EXPECT(p.truncated == e->truncated, "parse %zu: truncated %d", i, p.truncated);
        for (int k = 0; k < p.n_tool_calls && k < e->n_calls && k < 2; k++) {
            const char *name = k ? e->name1 : e->name0, *args = k ? e->args1 : e->args0;
            EXPECT(!strcmp(p.tool_calls[k].name, name), "parse %zu: call %d name %s", i, k, p.tool_calls[k].name);
            EXPECT(!strcmp(p.tool_calls[k].arguments, args), "parse %zu: call %d arguments\n  got  %s\n  want %s", i,
                   k, p.tool_calls[k].arguments, args);
            json_t *a = json_loads(p.tool_calls[k].arguments, 0, NULL);
            EXPECT(json_is_object(a), "parse %zu: call %d arguments are a JSON object", i, k);
            json_decref(a);
            char want_id[32];
            snprintf(want_id, sizeof want_id, "call_%d", k);
            EXPECT(!strcmp(p.tool_calls[k].id, want_id), "parse %zu: id %s", i, p.tool_calls[k].id);
        }
        /* every way of cutting the text streams to the same result */
        int all = 1;
        for (size_t piece = 1; piece <= 13 && all; piece++)
            all = stream_matches(e->text, e->in_thinking, tools, piece, 0, &p);
        for (unsigned seed = 1; seed <= 20 && all; seed++)
            all = stream_matches(e->text, e->in_thinking, tools, 0, seed, &p);
        EXPECT(all, "parse %zu: streamed result differs from the whole-text parse", i);
        chat_parsed_free(&p);
    }

    /* without tools: any name, every value a string */
    struct chat_parsed p;
    const char *t = "<tool_call>\n<function=anything>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>";
    chat_parse(t, strlen(t), 0, NULL, NULL, &p);
    EXPECT(p.n_tool_calls == 1 && !strcmp(p.tool_calls[0].arguments, "{\"n\": \"5\"}"), "untyped without tools");
    EXPECT(p.n_tool_calls == 1 && !strncmp(p.tool_calls[0].id, "call_", 5) && strlen(p.tool_calls[0].id) == 23,
           "random id form call_<16 hex>_0: %s", p.n_tool_calls ? p.tool_calls[0].id : "");
    json_t *tc = chat_parsed_tool_calls_json(&p);
    json_t *f0 = json_object_get(json_array_get(tc, 0), "function");
    EXPECT(json_array_size(tc) == 1 && !strcmp(json_string_value(json_object_get(json_array_get(tc, 0), "type")), "function") &&
               !strcmp(json_string_value(json_object_get(f0, "name")), "anything") &&
               !strcmp(json_string_value(json_object_get(f0, "arguments")), "{\"n\": \"5\"}"),
           "tool_calls JSON shape");
    json_decref(tc);
    chat_parsed_free(&p);
    json_decref(tools);
}

static void push(struct chat_stream *s, const char *t) { chat_stream_push(s, t, strlen(t)); }

/* What is held back while streaming: only possible tag starts (and the newlines before one). */
static void test_holdback(void) {
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    struct collected c = {0};
    struct chat_stream *s = chat_stream_new(0, tools, "call_", on_delta, &c);
    push(s, "Hel");
    EXPECT(c.content.len == 3, "plain text is emitted at once (%zu)", c.content.len);
    push(s, "lo <tool");
    EXPECT(!strcmp(or_empty(c.content.s), "Hello "), "a partial <tool_call> is held: [%s]", or_empty(c.content.s));
    push(s, "box>");
    EXPECT(!strcmp(or_empty(c.content.s), "Hello <toolbox>"), "released once it cannot be a tag");
    push(s, "\n");
    EXPECT(!strcmp(or_empty(c.content.s), "Hello <toolbox>"), "a newline before a possible tag is held");
    push(s, "\n<tool_call>\n<function=get_weather>\n");
    EXPECT(!strcmp(or_empty(c.content.s), "Hello <toolbox>") && c.n_calls == 1 && !strcmp(c.names[0], "get_weather"),
           "the call starts with its name as soon as the header is complete");
    push(s, "<parameter=city>\nNew Yo");
    EXPECT(!strcmp(or_empty(c.args[0].s), "{\"city\": \"New Yo"), "string values stream: [%s]", or_empty(c.args[0].s));
    push(s, "rk\n</para");
    EXPECT(!strcmp(or_empty(c.args[0].s), "{\"city\": \"New York"), "the value's last newline and a partial tag are held");
    push(s, "meter>\n<parameter=days>\n12");
    EXPECT(!strcmp(or_empty(c.args[0].s), "{\"city\": \"New York\""), "typed values wait for their end");
    push(s, "\n</parameter>\n</function>\n</tool_call>");
    EXPECT(!strcmp(or_empty(c.args[0].s), "{\"city\": \"New York\", \"days\": 12}"), "closed: %s", or_empty(c.args[0].s));
    chat_stream_finish(s);
    EXPECT(chat_stream_n_tool_calls(s) == 1 && !chat_stream_truncated(s), "one complete call");
    chat_stream_free(s);
    collected_free(&c);

    s = chat_stream_new(1, NULL, "call_", on_delta, &c);
    push(s, "Thinking hard");
    EXPECT(!strcmp(or_empty(c.reasoning.s), "Thinking hard"), "reasoning streams at once");
    push(s, "</thi");
    push(s, "nk>\n\nAns");
    EXPECT(!strcmp(or_empty(c.reasoning.s), "Thinking hard") && !strcmp(or_empty(c.content.s), "Ans"),
           "content after </think>: [%s]", or_empty(c.content.s));
    chat_stream_finish(s);
    chat_stream_free(s);
    collected_free(&c);
    json_decref(tools);
}

/* A parsed call rendered back as history gives the text the model wrote. */
static void test_round_trip(void) {
    struct error err;
    char *tmpl_text = read_file("data/qwen35-chat-template.jinja", NULL, &err);
    if (!tmpl_text) return;
    struct chat_template t;
    CHECK(chat_template_from_text(&t, tmpl_text, &err) == 0);
    free(tmpl_text);
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    const char *gen = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n\"quoted\"\n</parameter>\n"
                      "<parameter=days>\n3\n</parameter>\n<parameter=extra>\n{\"a\": [1, 2.5]}\n</parameter>\n"
                      "</function>\n</tool_call>";
    struct chat_parsed p;
    chat_parse(gen, strlen(gen), 0, tools, NULL, &p);
    json_t *req = json_pack("{s:[{s:s,s:s},{s:s,s:s,s:o}],s:b}", "messages", "role", "user", "content", "q",
                            "role", "assistant", "content", p.content, "tool_calls",
                            chat_parsed_tool_calls_json(&p), "add_generation_prompt", 0);
    char *out = NULL;
    EXPECT(chat_render(&t, req, &out, &err) == 0, "render: %s", err.msg);
    char want[1024];
    snprintf(want, sizeof want, "<|im_start|>assistant\n<think>\n\n</think>\n\n%s<|im_end|>\n", gen);
    EXPECT(out && strstr(out, want), "round trip:\n%s\nwant inside:\n%s", or_empty(out), want);
    free(out);
    json_decref(req);
    chat_parsed_free(&p);
    json_decref(tools);
}

/* Random tag soup, random cuts: never crashes, arguments always valid JSON objects. */
static void test_fuzz(void) {
    static const char *const frags[] = {
        "<tool_call>", "</tool_call>", "<function=get_weather>", "<function=ping>", "<function=", "</function>",
        "<parameter=city>", "<parameter=days>", "<parameter=", "</parameter>", "<think>", "</think>", "\n", "\n\n",
        "<", ">", "=", "x", "42", "{\"a\":", "}", "\"", "\\", "é", "<tool_", "</para", " ",
    };
    json_t *tools = json_loads(TOOLS_JSON, 0, NULL);
    unsigned seed = 12345;
    int ok = 1;
    for (int iter = 0; iter < 3000; iter++) {
        struct strbuf b = {0};
        seed = seed * 1103515245u + 12345u;
        int n = 1 + (int)((seed >> 16) % 40);
        for (int k = 0; k < n; k++) {
            seed = seed * 1103515245u + 12345u;
            strbuf_adds(&b, frags[(seed >> 16) % (sizeof frags / sizeof *frags)]);
        }
        struct chat_parsed p;
        int in_thinking = iter & 1;
        chat_parse(b.s, b.len, in_thinking, tools, "call_", &p);
        for (int k = 0; k < p.n_tool_calls; k++) {
            json_t *a = json_loads(p.tool_calls[k].arguments, 0, NULL);
            if (!json_is_object(a)) {
                ok = 0;
                fprintf(stderr, "fuzz: bad arguments %s from [%s]\n", p.tool_calls[k].arguments, b.s);
            }
            json_decref(a);
        }
        if (ok && !stream_matches(b.s, in_thinking, tools, 0, (unsigned)iter + 1, &p)) {
            ok = 0;
            fprintf(stderr, "fuzz: streamed parse differs for [%s]\n", b.s);
        }
        chat_parsed_free(&p);
        free(b.s);
    }
    EXPECT(ok, "3000 random tag soups parse, stream identically, and give JSON-object arguments");
    json_decref(tools);
}

/* continue_final_message on a literal case, and the switches that turn it off */
static void test_continue(void) {
    struct error err;
    char *text = read_file("data/qwen35-chat-template.jinja", NULL, &err);
    if (!text) return;
    struct chat_template t;
    CHECK(chat_template_from_text(&t, text, &err) == 0);
    free(text);
    json_t *rq = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                            "{\"role\":\"assistant\",\"content\":\"The answer is \"}]}", 0, NULL);
    char *out = NULL;
    EXPECT(chat_continues_final(rq) && chat_render_continued(&t, rq, &out, &err) == 0 && out &&
               !strcmp(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is"),
           "continued: %s", out ? out : err.msg);
    free(out);
    json_object_set_new(rq, "continue_final_message", json_false());
    EXPECT(!chat_continues_final(rq), "continue_final_message false closes the message");
    json_object_del(rq, "continue_final_message");
    json_object_set_new(rq, "chat_template_kwargs", json_pack("{s:b}", "add_generation_prompt", 1));
    EXPECT(!chat_continues_final(rq), "add_generation_prompt true closes the message");
    json_decref(rq);
    rq = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"\"}]}", 0, NULL);
    EXPECT(!chat_continues_final(rq), "an empty final message is closed, not continued");
    out = NULL;
    EXPECT(chat_render_continued(&t, rq, &out, &err) < 0 && strstr(err.msg, "cannot be continued"),
           "an empty final message cannot be continued: %s", out ? out : err.msg);
    free(out);
    json_decref(rq);
    rq = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 0, NULL);
    EXPECT(!chat_continues_final(rq), "a final user message is not continued");
    json_decref(rq);
}

int main(void) {
    test_fixtures();
    test_continue();
    test_pyformat();
    test_template_loading();
    test_parse();
    test_holdback();
    test_round_trip();
    test_fuzz();
    return TEST_DONE();
}
