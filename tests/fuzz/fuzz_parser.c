/* fuzz_parser.c - the output parser (reasoning, content, tool calls; text/chat_parse.c) on
 * arbitrary generated text: whole (chat_parse) against streamed in random pieces
 * (chat_stream_push). The first byte: bit 0 in_thinking, bit 1 tools given (a fixed schema
 * with typed parameters; otherwise any function name is taken); the second seeds the piece
 * sizes; the rest is the text, made valid UTF-8 first (the parser is fed detokenizer output,
 * which always is) and cut only between characters, as the detokenizer emits.
 * Properties: the streamed deltas concatenate to exactly the whole-text parse (content,
 * reasoning_content, each tool call's name and arguments); every tool call's arguments are a
 * JSON object. */
#include "fuzz.h"

#include <jansson.h>

#include "../utf8_lossy.h"
#include "text/chat.h"
#include "text/tokenizer.h"

static json_t *tools;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"hot\":{\"type\":"
        "\"boolean\"},\"t\":{\"type\":\"number\"},\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},"
        "\"u\":{\"type\":[\"integer\",\"null\"]}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"search\"}}]",
        0, NULL);
    FUZZ_CHECK(tools, "tools JSON");
    return 0;
}

struct acc {
    struct strbuf content, reasoning;
    int n_calls;
    char *names[64];
    struct strbuf args[64];
    int bad_index;
};

static void on_delta(void *user, const struct chat_delta *d) {
    struct acc *a = user;
    switch (d->kind) {
    case CHAT_DELTA_CONTENT: strbuf_add(&a->content, d->text, d->len); break;
    case CHAT_DELTA_REASONING: strbuf_add(&a->reasoning, d->text, d->len); break;
    case CHAT_DELTA_TOOL_START:
        if (d->index != a->n_calls || a->n_calls == 64) {
            a->bad_index = 1;
            break;
        }
        a->names[a->n_calls++] = strdup(d->name);
        break;
    case CHAT_DELTA_TOOL_ARGS:
        if (d->index != a->n_calls - 1 || d->index < 0) a->bad_index = 1;
        else strbuf_add(&a->args[d->index], d->text, d->len);
        break;
    }
}

static int same(const struct strbuf *b, const char *s, size_t n) {
    return b->len == n && (n == 0 || !memcmp(b->s, s, n));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int in_thinking = data[0] & 1;
    const json_t *tl = data[0] & 2 ? tools : NULL;
    uint32_t x = data[1] * 2654435761u + 1;
    unsigned char *text = calloc(3 * (size - 2) + 1, 1);
    size_t n = utf8_lossy(data + 2, size - 2, text);

    struct chat_parsed p;
    chat_parse((const char *)text, n, in_thinking, tl, "call_", &p);

    struct acc a;
    memset(&a, 0, sizeof a);
    struct chat_stream *s = chat_stream_new(in_thinking, tl, "call_", on_delta, &a);
    size_t i = 0;
    while (i < n) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        size_t k = 1 + x % 12, j = i;
        for (size_t c = 0; c < k && j < n; c++) {
            int l = utf8_char_len((const char *)text + j, n - j);
            j += l > 0 ? (size_t)l : 1;
        }
        chat_stream_push(s, (const char *)text + i, j - i);
        i = j;
    }
    chat_stream_finish(s);
    FUZZ_CHECK(!a.bad_index, "tool call deltas out of order");
    FUZZ_CHECK(same(&a.content, p.content, p.content_len), "streamed content != whole");
    FUZZ_CHECK(p.reasoning_content ? same(&a.reasoning, p.reasoning_content, p.reasoning_len) : a.reasoning.len == 0,
               "streamed reasoning != whole");
    FUZZ_CHECK(a.n_calls == p.n_tool_calls && chat_stream_n_tool_calls(s) == p.n_tool_calls,
               "%d tool calls streamed, %d whole", a.n_calls, p.n_tool_calls);
    FUZZ_CHECK(chat_stream_truncated(s) == p.truncated, "truncated differs");
    for (int c = 0; c < p.n_tool_calls && c < a.n_calls; c++) {
        const char *args = p.tool_calls[c].arguments ? p.tool_calls[c].arguments : "";
        FUZZ_CHECK(!strcmp(a.names[c], p.tool_calls[c].name), "tool call %d name", c);
        FUZZ_CHECK(same(&a.args[c], args, strlen(args)), "tool call %d arguments: streamed '%.*s', whole '%s'", c,
                   (int)a.args[c].len, a.args[c].s ? a.args[c].s : "", args);
        /* a NUL the model wrote is \u0000; jansson takes none in a key, so check a copy with
         * \u0001 instead (the same JSON, but for that character) */
        char *copy = strdup(args);
        for (char *q = copy; (q = strstr(q, "\\u0000")); q += 6) q[5] = '1';
        json_t *j = json_loads(copy, JSON_ALLOW_NUL, NULL);
        FUZZ_CHECK(json_is_object(j), "tool call %d arguments are not a JSON object: %s", c, args);
        json_decref(j);
        free(copy);
    }
    json_t *tc = chat_parsed_tool_calls_json(&p);
    FUZZ_CHECK(json_is_array(tc) && json_array_size(tc) == (size_t)p.n_tool_calls, "tool_calls JSON");
    json_decref(tc);
    chat_stream_free(s);
    chat_parsed_free(&p);
    for (int c = 0; c < a.n_calls; c++) free(a.names[c]), free(a.args[c].s);
    free(a.content.s), free(a.reasoning.s);
    free(text);
    return 0;
}
