/* chat.h - the Qwen3.5 chat format: rendering an OpenAI chat request into the prompt text
 * (chat.c), and parsing generated text back into reasoning_content, content and tool_calls
 * (chat_parse.c), on a complete text or incrementally while streaming.
 *
 * The renderer is purpose-built for the Qwen3.5 template (data/qwen35-chat-template.jinja, the
 * one llama.cpp ships as Qwen3.5-4B.jinja); there is no general Jinja engine. The template file
 * of the model is still read (chat_template_load) because the thinking default depends on the
 * checkpoint: the template is recognised by its structure, and its generation-prompt tail picks
 * one of the two supported variants:
 *   CHAT_THINKING_DEFAULT_ON   `enable_thinking is false` -> "<think>\n\n</think>\n\n", else
 *                              "<think>\n" (large Qwen3.5 checkpoints, the bundled template)
 *   CHAT_THINKING_DEFAULT_OFF  `enable_thinking is true` -> "<think>\n", else the closed block
 *                              (the small checkpoints, documented as non-thinking by default)
 * Any other template (Qwen3.6's preserve_thinking, other families) is refused at load. */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "util.h"

/* ---- rendering ------------------------------------------------------------------------ */

enum chat_thinking_default { CHAT_THINKING_DEFAULT_ON, CHAT_THINKING_DEFAULT_OFF };

struct chat_template {
    enum chat_thinking_default thinking_default;
};

/* Recognises a template text as a supported Qwen3.5 variant; -1 + err if it is not. */
int chat_template_from_text(struct chat_template *t, const char *text, struct error *err);

/* Reads DIR/chat_template.jinja, else DIR/tokenizer_config.json's "chat_template" (a string,
 * or a list of {name, template} where "default" is taken), and recognises it. */
int chat_template_load(struct chat_template *t, const char *model_dir, struct error *err);

/* Renders an OpenAI chat request to exactly the text transformers' apply_chat_template makes
 * with the same template. Request fields read:
 *   messages                   system / user / assistant / tool; content a string, null, or a
 *                              list of parts ({"type":"text","text"}, image / image_url / video)
 *   messages[].reasoning_content, messages[].tool_calls[] ({"function":{"name","arguments"}};
 *                              arguments an object, or a JSON string holding an object, which
 *                              is parsed first as vLLM and llama.cpp do; any other string is
 *                              refused as the template refuses a non-mapping)
 *   tools                      rendered with tojson (Python json.dumps, ensure_ascii=False)
 *   add_generation_prompt      default true
 *   enable_thinking, add_vision_id   top level, or inside chat_template_kwargs (which wins)
 * On success returns 0 and *out is a malloc'd NUL-terminated string. On a request the template
 * refuses returns -1 and err->msg holds the template's own refusal text, e.g.
 * "System message must be at the beginning." or "No user query found in messages.". */
int chat_render(const struct chat_template *t, const json_t *request, char **out, struct error *err);

/* A final assistant message continued rather than closed (llama-server's prefill of the
 * assistant's turn): true when the last message is the assistant's with text content (not only
 * whitespace), unless the request (or its chat_template_kwargs) sets continue_final_message
 * false or add_generation_prompt true. Then
 * chat_render_continued renders without a generation prompt and cuts the text where that
 * message's content ends, as transformers' apply_chat_template(continue_final_message=True)
 * does (its last occurrence; failing that, of the content stripped); -1 with a message when
 * the content is not found (empty, or rendered otherwise). */
int chat_continues_final(const json_t *request);
int chat_render_continued(const struct chat_template *t, const json_t *request, char **out,
                          struct error *err);

/* True when a rendered prompt ends inside an open thinking block ("<think>\n"), so generation
 * starts with reasoning: pass this as in_thinking to the parsers below. */
int chat_prompt_opens_thinking(const char *prompt);

/* Python-compatible serialisations, exposed for tests and for the server:
 * chat_tojson   json.dumps(v, ensure_ascii=False) (", " and ": " separators, insertion order,
 *               floats as Python's repr: 1.0, 1e-05, 1e+100)
 * chat_pystr    Python str(v) as Jinja's `|string` prints it (True, None, 1.5, ['a', 1])
 * Both return malloc'd strings. */
char *chat_tojson(const json_t *v);
char *chat_pystr(const json_t *v);

/* A growable byte string (used by chat.c and chat_parse.c). */

/* ---- output parsing --------------------------------------------------------------------
 * Generated text is split into
 *   reasoning  the text inside <think> ... </think>. When in_thinking is set (the prompt already
 *              opened <think>), generation starts in reasoning; otherwise a <think> at the very
 *              start of the text (after whitespace) opens it. Newlines right after <think>, right
 *              before </think> and right after </think> are dropped (the template puts them
 *              there). Without </think> (truncated), everything is reasoning.
 *   content    the rest.
 *   tool calls <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function>\n
 *              </tool_call> blocks in content. Each becomes {id, type "function", function:
 *              {name, arguments}}, arguments a JSON object text ({"k": v, ...}, Python-style
 *              separators). One newline on each side of V is dropped. V is typed by the tool's
 *              JSON schema (tools[].function.parameters.properties[K].type, a name or a list):
 *              string (or no schema) -> the raw text as a JSON string; integer, number, boolean,
 *              null, object, array -> parsed as JSON (True/False accepted for boolean) and, if
 *              that fails or gives another type, kept as a string. A missing </parameter> before
 *              the next <parameter= or </function> is tolerated.
 * Malformed input degrades to content and never crashes: <tool_call> not followed by
 * <function=NAME>, or NAME not among tools (when tools are given), puts the raw text back into
 * content. A tool call cut off after its name was seen is closed (its arguments stay valid
 * JSON) and reported as truncated.
 *
 * Streaming: chat_stream_push() takes text pieces as they are detokenised and calls the delta
 * callback as soon as text is certain. It holds back only text that could still be the start of
 * a tag (a partial "<tool_call>", "</think>", "</parameter>", ... and the newlines directly in
 * front of one, which the tag would swallow). Deltas concatenate to exactly what chat_parse
 * returns for the whole text (chat_parse is the same machine fed at once). */

enum chat_delta_kind {
    CHAT_DELTA_CONTENT,    /* text: a piece of content */
    CHAT_DELTA_REASONING,  /* text: a piece of reasoning_content */
    CHAT_DELTA_TOOL_START, /* index, id, name: a tool call begins (OpenAI: first delta) */
    CHAT_DELTA_TOOL_ARGS,  /* index, text: a piece of function.arguments */
};

struct chat_delta {
    enum chat_delta_kind kind;
    const char *text; /* CONTENT / REASONING / TOOL_ARGS: not NUL-terminated, len bytes */
    size_t len;
    int index;        /* TOOL_*: the tool call's position, 0-based */
    const char *id;   /* TOOL_START: NUL-terminated */
    const char *name; /* TOOL_START: NUL-terminated */
};

typedef void (*chat_delta_fn)(void *user, const struct chat_delta *d);

struct chat_stream;

/* tools: the request's tools array or NULL (then any function name is accepted and every value
 * is a string). tools is borrowed and must outlive the stream. id_prefix: tool call ids are
 * id_prefix + index ("call_0", ...); NULL gives "call_" + 16 random hex digits + "_". */
struct chat_stream *chat_stream_new(int in_thinking, const json_t *tools, const char *id_prefix,
                                    chat_delta_fn fn, void *user);
void chat_stream_push(struct chat_stream *s, const char *text, size_t len);
/* End of generation: flushes what was held back, closes an open tool call. */
void chat_stream_finish(struct chat_stream *s);
int chat_stream_n_tool_calls(const struct chat_stream *s);
int chat_stream_truncated(const struct chat_stream *s); /* a tool call was cut off */
void chat_stream_free(struct chat_stream *s);

struct chat_tool_call {
    char *id, *name;
    char *arguments; /* JSON object text */
};

struct chat_parsed {
    char *reasoning_content; /* NULL when the text had no reasoning part */
    char *content;           /* never NULL, may be "" */
    size_t reasoning_len, content_len; /* bytes: the texts may hold NUL bytes */
    struct chat_tool_call *tool_calls;
    int n_tool_calls;
    int truncated; /* a tool call was cut off by the end of the text */
};

/* Parses a complete generated text (not including the stop token). Always succeeds. */
void chat_parse(const char *text, size_t len, int in_thinking, const json_t *tools,
                const char *id_prefix, struct chat_parsed *out);
void chat_parsed_free(struct chat_parsed *p);
/* The OpenAI message.tool_calls array for p (a new reference; an empty array if none). */
json_t *chat_parsed_tool_calls_json(const struct chat_parsed *p);

#endif
