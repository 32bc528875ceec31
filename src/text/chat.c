/* chat.c - renders an OpenAI chat request with the Qwen3.5 chat template, byte for byte as
 * transformers' apply_chat_template does with data/qwen35-chat-template.jinja.
 *
 * This is a hand translation of that one template, not a Jinja engine. Each step below quotes
 * the template line it mirrors. Values keep Jinja/Python semantics where the template can see
 * them: a missing key is Jinja's Undefined (NULL here), `in` is Python's (substring on str, key
 * on dict, element on list, TypeError otherwise), truthiness is Python's, `|trim` is str.strip()
 * with Python's Unicode whitespace, `|string` is str() and `tojson` is json.dumps(
 * ensure_ascii=False) - floats print as Python's repr. Python errors the template can hit on
 * odd input (an item that is a number, a tool call without a name) are refused with Python's
 * message too.
 *
 * Not supported: templates other than the two Qwen3.5 variants (see chat.h), continue_final_
 * message, integers beyond 64 bits, NUL characters in strings (jansson limits). */
#include "chat.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 and Python string semantics ------------------------------------------------ */

/* Decodes one code point at s[0..n); returns its byte length (1 for a stray byte). */
static int utf8_decode(const unsigned char *s, size_t n, unsigned *cp) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    if ((size_t)len > n) len = 1;
    if (len == 1) {
        *cp = c;
        return 1;
    }
    unsigned v = c & (0x7f >> len);
    for (int i = 1; i < len; i++) v = (v << 6) | (s[i] & 0x3f);
    *cp = v;
    return len;
}

/* Python's str.isspace(): Unicode White_Space minus nothing, plus the \x1c-\x1f separators. */
static int py_isspace(unsigned c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* str.strip(): the [*start, *start + *len) window of s without surrounding whitespace. */
static void py_strip(const char *s, size_t n, size_t *start, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n;
    while (a < b) {
        unsigned cp;
        int l = utf8_decode(u + a, b - a, &cp);
        if (!py_isspace(cp)) break;
        a += (size_t)l;
    }
    while (b > a) {
        size_t p = b - 1;
        while (p > a && (u[p] & 0xc0) == 0x80 && b - p < 4) p--;
        unsigned cp;
        int l = utf8_decode(u + p, b - p, &cp);
        if ((size_t)l != b - p) { /* stray continuation byte: not whitespace */
            break;
        }
        if (!py_isspace(cp)) break;
        b = p;
    }
    *start = a;
    *len = b - a;
}

/* `s|trim` as a new string. */
static char *py_trim_dup(const char *s) {
    size_t a, n;
    py_strip(s, strlen(s), &a, &n);
    char *r = xmalloc(n + 1);
    memcpy(r, s + a, n);
    r[n] = 0;
    return r;
}

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static int ends_with(const char *s, const char *p) {
    size_t n = strlen(s), m = strlen(p);
    return n >= m && memcmp(s + n - m, p, m) == 0;
}

/* Python's str.isprintable() is false for these (approximation: control, format, separator,
 * surrogate and private-use blocks; unassigned code points are not tracked). */
static int py_nonprintable(unsigned c) {
    return c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad || c == 0x61c || c == 0x1680 ||
           c == 0x180e || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
           (c >= 0x205f && c <= 0x206f) || c == 0x3000 || (c >= 0xd800 && c <= 0xf8ff) ||
           c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb) || (c >= 0xf0000) ||
           (c >= 0xe0000 && c <= 0xe0fff);
}

/* repr(str) */
static void py_repr_str(struct strbuf *b, const char *s) {
    char q = (strchr(s, '\'') && !strchr(s, '"')) ? '"' : '\'';
    strbuf_add(b, &q, 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned cp;
        int l = utf8_decode(u + i, n - i, &cp);
        if (cp == '\\') strbuf_adds(b, "\\\\");
        else if (cp == (unsigned)q) {
            strbuf_add(b, "\\", 1);
            strbuf_add(b, &q, 1);
        } else if (cp == '\t') strbuf_adds(b, "\\t");
        else if (cp == '\n') strbuf_adds(b, "\\n");
        else if (cp == '\r') strbuf_adds(b, "\\r");
        else if (cp != ' ' && py_nonprintable(cp)) {
            if (cp < 0x100) strbuf_printf(b, "\\x%02x", cp);
            else if (cp < 0x10000) strbuf_printf(b, "\\u%04x", cp);
            else strbuf_printf(b, "\\U%08x", cp);
        } else strbuf_add(b, s + i, (size_t)l);
        i += (size_t)l;
    }
    strbuf_add(b, &q, 1);
}

/* repr(float) / json.dumps(float): the shortest digits that read back to d (what %.*e gives
 * at the smallest precision that round-trips), fixed notation when -4 < exponent < 16. */
static void py_float(struct strbuf *b, double d, int json) {
    if (isnan(d)) {
        strbuf_adds(b, json ? "NaN" : "nan");
        return;
    }
    if (isinf(d)) {
        strbuf_adds(b, d < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf"));
        return;
    }
    if (d == 0) {
        strbuf_adds(b, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    char e[40];
    for (int p = 0; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p, d);
        if (strtod(e, NULL) == d) break;
    }
    /* e = [-]D[.DDD]e(+|-)XX */
    const char *q = e;
    if (*q == '-') {
        strbuf_add(b, "-", 1);
        q++;
    }
    char digits[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = atoi(q + 1) + 1; /* d = 0.DIGITS * 10^decpt */
    if (decpt > 16 || decpt < -3) {
        strbuf_add(b, digits, 1);
        if (nd > 1) {
            strbuf_add(b, ".", 1);
            strbuf_add(b, digits + 1, (size_t)nd - 1);
        }
        strbuf_printf(b, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    } else if (decpt <= 0) {
        strbuf_adds(b, "0.");
        for (int i = 0; i < -decpt; i++) strbuf_add(b, "0", 1);
        strbuf_add(b, digits, (size_t)nd);
    } else if (decpt >= nd) {
        strbuf_add(b, digits, (size_t)nd);
        for (int i = nd; i < decpt; i++) strbuf_add(b, "0", 1);
        strbuf_adds(b, ".0");
    } else {
        strbuf_add(b, digits, (size_t)decpt);
        strbuf_add(b, ".", 1);
        strbuf_add(b, digits + decpt, (size_t)(nd - decpt));
    }
}

static void json_str(struct strbuf *b, const char *s, size_t n) {
    strbuf_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c);
            esc = u;
        }
        if (esc) {
            strbuf_add(b, s + run, i - run);
            strbuf_adds(b, esc);
            run = i + 1;
        }
    }
    strbuf_add(b, s + run, n - run);
    strbuf_add(b, "\"", 1);
}

static void tojson(struct strbuf *b, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        strbuf_add(b, "{", 1);
        json_object_foreach((json_t *)v, k, x) {
            if (!first) strbuf_adds(b, ", ");
            first = 0;
            json_str(b, k, strlen(k));
            strbuf_adds(b, ": ");
            tojson(b, x);
        }
        strbuf_add(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        strbuf_add(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) strbuf_adds(b, ", ");
            tojson(b, json_array_get(v, i));
        }
        strbuf_add(b, "]", 1);
        break;
    case JSON_STRING: json_str(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: strbuf_printf(b, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: py_float(b, json_real_value(v), 1); break;
    case JSON_TRUE: strbuf_adds(b, "true"); break;
    case JSON_FALSE: strbuf_adds(b, "false"); break;
    case JSON_NULL: strbuf_adds(b, "null"); break;
    }
}

/* str(v) (repr for the items inside a container, as Python prints them). */
static void pystr(struct strbuf *b, const json_t *v, int as_repr) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        strbuf_add(b, "{", 1);
        json_object_foreach((json_t *)v, k, x) {
            if (!first) strbuf_adds(b, ", ");
            first = 0;
            py_repr_str(b, k);
            strbuf_adds(b, ": ");
            pystr(b, x, 1);
        }
        strbuf_add(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        strbuf_add(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) strbuf_adds(b, ", ");
            pystr(b, json_array_get(v, i), 1);
        }
        strbuf_add(b, "]", 1);
        break;
    case JSON_STRING:
        if (as_repr) py_repr_str(b, json_string_value(v));
        else strbuf_add(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER: strbuf_printf(b, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: py_float(b, json_real_value(v), 0); break;
    case JSON_TRUE: strbuf_adds(b, "True"); break;
    case JSON_FALSE: strbuf_adds(b, "False"); break;
    case JSON_NULL: strbuf_adds(b, "None"); break;
    }
}

char *chat_tojson(const json_t *v) {
    struct strbuf b = {0};
    tojson(&b, v);
    return strbuf_take(&b);
}

char *chat_pystr(const json_t *v) {
    struct strbuf b = {0};
    pystr(&b, v, 0);
    return strbuf_take(&b);
}

/* Python type names, for the TypeError texts the template can raise. */
static const char *py_type(const json_t *v) {
    if (!v) return "Undefined";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "dict";
    case JSON_ARRAY: return "list";
    case JSON_STRING: return "str";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_TRUE:
    case JSON_FALSE: return "bool";
    default: return "NoneType";
    }
}

/* ---- Jinja value semantics ------------------------------------------------------------ */

/* `obj.key`: Undefined (NULL) unless obj is a dict holding key. */
static json_t *jget(const json_t *obj, const char *key) {
    return json_is_object(obj) ? json_object_get(obj, key) : NULL;
}

static int is_str(const json_t *v, const char *s) {
    return json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

/* Python truthiness; Undefined is false. */
static int py_truthy(const json_t *v) {
    if (!v) return 0;
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return 1;
    default: return 0;
    }
}

/* `needle in v`: 1/0, or -1 with Python's TypeError. */
static int py_in(const char *needle, const json_t *v, struct error *err) {
    if (json_is_string(v)) return strstr(json_string_value(v), needle) != NULL;
    if (json_is_object(v)) return json_object_get(v, needle) != NULL;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (is_str(json_array_get(v, i), needle)) return 1;
        return 0;
    }
    return error_set(err, "argument of type '%s' is not iterable", py_type(v));
}

/* ---- the template --------------------------------------------------------------------- */

struct render {
    const struct chat_template *t;
    struct strbuf out;
    int image_count, video_count; /* namespace(value=0) counters */
    int add_vision_id;
    struct error *err;
};

/* {%- macro render_content(content, do_vision_count, is_system_content=false) %}, followed by
 * the `|trim` every call site applies. Returns a malloc'd string or NULL with r->err set. */
static char *render_content(struct render *r, const json_t *content, int do_vision_count,
                            int is_system_content) {
    struct strbuf b = {0};
    if (json_is_string(content)) { /* {%- if content is string %} */
        strbuf_add(&b, json_string_value(content), json_string_length(content));
    } else if (json_is_array(content)) { /* content is iterable and content is not mapping */
        for (size_t i = 0; i < json_array_size(content); i++) {
            const json_t *item = json_array_get(content, i);
            /* 'image' in item or 'image_url' in item or item.type == 'image' */
            int is_image = py_in("image", item, r->err);
            if (is_image < 0) goto fail;
            if (!is_image) is_image = py_in("image_url", item, r->err);
            if (!is_image) is_image = is_str(jget(item, "type"), "image");
            if (is_image) {
                if (is_system_content) {
                    error_set(r->err, "System message cannot contain images.");
                    goto fail;
                }
                if (do_vision_count) r->image_count++;
                if (r->add_vision_id) strbuf_printf(&b, "Picture %d: ", r->image_count);
                strbuf_adds(&b, "<|vision_start|><|image_pad|><|vision_end|>");
                continue;
            }
            /* 'video' in item or item.type == 'video' */
            if (py_in("video", item, r->err) || is_str(jget(item, "type"), "video")) {
                if (is_system_content) {
                    error_set(r->err, "System message cannot contain videos.");
                    goto fail;
                }
                if (do_vision_count) r->video_count++;
                if (r->add_vision_id) strbuf_printf(&b, "Video %d: ", r->video_count);
                strbuf_adds(&b, "<|vision_start|><|video_pad|><|vision_end|>");
                continue;
            }
            if (py_in("text", item, r->err)) { /* {{- item.text }}: Undefined prints as '' */
                const json_t *text = jget(item, "text");
                if (text) pystr(&b, text, 0);
                continue;
            }
            error_set(r->err, "Unexpected item type in content.");
            goto fail;
        }
    } else if (content && !json_is_null(content)) { /* content is none or undefined -> '' */
        error_set(r->err, "Unexpected content type.");
        goto fail;
    }
    char *s = strbuf_take(&b);
    char *t = py_trim_dup(s);
    free(s);
    return t;
fail:
    free(b.s);
    return NULL;
}

/* `'...' + tool_call.name`: a str, or Jinja's UndefinedError / Python's TypeError. */
static const char *tool_call_name(struct render *r, const json_t *tc) {
    const json_t *name = jget(tc, "name");
    if (json_is_string(name)) return json_string_value(name);
    if (!name) {
        if (!tc || json_is_null(tc)) error_set(r->err, "'None' has no attribute 'name'");
        else error_set(r->err, "'%s object' has no attribute 'name'", py_type(tc));
    } else {
        error_set(r->err, "can only concatenate str (not \"%s\") to str", py_type(name));
    }
    return NULL;
}

/* One assistant turn's tool calls ({%- for tool_call in message.tool_calls %}). */
static int render_tool_calls(struct render *r, const json_t *tool_calls, const char *content) {
    size_t n = json_is_array(tool_calls) ? json_array_size(tool_calls)
                                         : strlen(json_string_value(tool_calls));
    for (size_t i = 0; i < n; i++) {
        json_t *tc, *owned = NULL;
        if (json_is_array(tool_calls)) {
            tc = json_array_get(tool_calls, i);
        } else { /* a string is iterable too: one character per "tool call" */
            const char *s = json_string_value(tool_calls);
            if (((unsigned char)s[i] & 0xc0) == 0x80) continue;
            tc = owned = json_string("");
        }
        /* {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %} */
        if (jget(tc, "function")) tc = jget(tc, "function");
        const char *name = tool_call_name(r, tc);
        if (!name) {
            json_decref(owned);
            return -1;
        }
        if (i == 0) {
            size_t a, len;
            py_strip(content, strlen(content), &a, &len);
            strbuf_adds(&r->out, len ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
        } else {
            strbuf_adds(&r->out, "\n<tool_call>\n<function=");
        }
        strbuf_adds(&r->out, name);
        strbuf_adds(&r->out, ">\n");
        const json_t *args = jget(tc, "arguments");
        if (args) { /* {%- if tool_call.arguments is defined %} */
            json_t *parsed = NULL;
            if (json_is_string(args)) { /* arguments as a JSON string: parsed, as servers do */
                parsed = json_loads(json_string_value(args), 0, NULL);
                if (json_is_object(parsed)) args = parsed;
            }
            if (!json_is_object(args)) { /* tool_call.arguments|items */
                json_decref(parsed);
                json_decref(owned);
                return error_set(r->err, "Can only get item pairs from a mapping.");
            }
            const char *k;
            json_t *v;
            json_object_foreach((json_t *)args, k, v) {
                strbuf_adds(&r->out, "<parameter=");
                strbuf_adds(&r->out, k);
                strbuf_adds(&r->out, ">\n");
                /* tojson if mapping or (sequence and not string) else |string */
                if (json_is_object(v) || json_is_array(v)) tojson(&r->out, v);
                else pystr(&r->out, v, 0);
                strbuf_adds(&r->out, "\n</parameter>\n");
            }
            json_decref(parsed);
        }
        strbuf_adds(&r->out, "</function>\n</tool_call>");
        json_decref(owned);
    }
    return 0;
}

/* A request field the template sees as a variable: chat_template_kwargs wins over top level. */
static const json_t *template_var(const json_t *req, const char *name) {
    const json_t *v = jget(jget(req, "chat_template_kwargs"), name);
    return v ? v : jget(req, name);
}

static const char *role_of(const json_t *m) {
    const json_t *role = jget(m, "role");
    return json_is_string(role) ? json_string_value(role) : "";
}

int chat_render(const struct chat_template *t, const json_t *req, char **out, struct error *err) {
    struct render r = {.t = t, .err = err};
    char *content = NULL, *reasoning = NULL;
    *out = NULL;
    r.add_vision_id = py_truthy(template_var(req, "add_vision_id"));
    const json_t *messages = jget(req, "messages");
    if (!py_truthy(messages)) { /* {%- if not messages %} */
        error_set(err, "No messages provided.");
        goto fail;
    }
    if (!json_is_array(messages)) {
        error_set(err, "messages must be an array of message objects");
        goto fail;
    }
    size_t n = json_array_size(messages);
    const json_t *first = json_array_get(messages, 0);
    int first_is_system = strcmp(role_of(first), "system") == 0;

    /* {%- if tools and tools is iterable and tools is not mapping %} */
    const json_t *tools = jget(req, "tools");
    if (py_truthy(tools) && (json_is_array(tools) || json_is_string(tools))) {
        strbuf_adds(&r.out, "<|im_start|>system\n# Tools\n\nYou have access to the following "
                              "functions:\n\n<tools>");
        if (json_is_array(tools)) {
            for (size_t i = 0; i < json_array_size(tools); i++) {
                strbuf_add(&r.out, "\n", 1);
                tojson(&r.out, json_array_get(tools, i));
            }
        } else { /* a string iterates by character */
            const char *s = json_string_value(tools);
            size_t len = json_string_length(tools);
            for (size_t i = 0; i < len;) {
                unsigned cp;
                int l = utf8_decode((const unsigned char *)s + i, len - i, &cp);
                strbuf_add(&r.out, "\n", 1);
                json_str(&r.out, s + i, (size_t)l);
                i += (size_t)l;
            }
        }
        strbuf_adds(
            &r.out,
            "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format "
            "with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter="
            "example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis "
            "is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n"
            "</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow "
            "the specified format: an inner <function=...></function> block must be nested "
            "within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- "
            "You may provide optional reasoning for your function call in natural language "
            "BEFORE the function call, but NOT after\n- If there is no function call available, "
            "answer the question like normal with your current knowledge and do not tell the "
            "user about function calls\n</IMPORTANT>");
        if (first_is_system) {
            content = render_content(&r, jget(first, "content"), 0, 1);
            if (!content) goto fail;
            if (*content) {
                strbuf_adds(&r.out, "\n\n");
                strbuf_adds(&r.out, content);
            }
            free(content);
            content = NULL;
        }
        strbuf_adds(&r.out, "<|im_end|>\n");
    } else if (first_is_system) {
        content = render_content(&r, jget(first, "content"), 0, 1);
        if (!content) goto fail;
        strbuf_adds(&r.out, "<|im_start|>system\n");
        strbuf_adds(&r.out, content);
        strbuf_adds(&r.out, "<|im_end|>\n");
        free(content);
        content = NULL;
    }

    /* The last user message that is not just a <tool_response> block: turns after it keep
     * their thinking. {%- for message in messages[::-1] %} */
    int multi_step_tool = 1;
    size_t last_query_index = n - 1;
    for (size_t k = n; k-- > 0;) {
        const json_t *m = json_array_get(messages, k);
        if (!multi_step_tool || strcmp(role_of(m), "user") != 0) continue;
        content = render_content(&r, jget(m, "content"), 0, 0);
        if (!content) goto fail;
        if (!(starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>"))) {
            multi_step_tool = 0;
            last_query_index = k;
        }
        free(content);
        content = NULL;
    }
    if (multi_step_tool) {
        error_set(err, "No user query found in messages.");
        goto fail;
    }

    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(messages, i);
        content = render_content(&r, jget(m, "content"), 1, 0);
        if (!content) goto fail;
        const char *role = role_of(m);
        if (!strcmp(role, "system")) {
            if (i != 0) {
                error_set(err, "System message must be at the beginning.");
                goto fail;
            }
        } else if (!strcmp(role, "user")) {
            strbuf_adds(&r.out, "<|im_start|>user\n");
            strbuf_adds(&r.out, content);
            strbuf_adds(&r.out, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            const json_t *rc = jget(m, "reasoning_content");
            char *body = content; /* the content shown after the reasoning */
            if (json_is_string(rc)) {
                reasoning = py_trim_dup(json_string_value(rc));
            } else if (strstr(content, "</think>")) {
                /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                char *end = strstr(content, "</think>");
                while (end > content && end[-1] == '\n') end--;
                char *start = content, *p;
                while ((p = strstr(start, "<think>")) && p + strlen("<think>") <= end)
                    start = p + strlen("<think>");
                while (start < end && *start == '\n') start++;
                char *tmp = xmalloc((size_t)(end - start) + 1);
                memcpy(tmp, start, (size_t)(end - start));
                tmp[end - start] = 0;
                reasoning = py_trim_dup(tmp);
                free(tmp);
                /* content.split('</think>')[-1].lstrip('\n') */
                char *last = content, *q;
                while ((q = strstr(last, "</think>"))) last = q + strlen("</think>");
                while (*last == '\n') last++;
                body = last;
            } else {
                reasoning = xstrdup("");
            }
            if (i > last_query_index) {
                strbuf_adds(&r.out, "<|im_start|>assistant\n<think>\n");
                strbuf_adds(&r.out, reasoning);
                strbuf_adds(&r.out, "\n</think>\n\n");
            } else {
                strbuf_adds(&r.out, "<|im_start|>assistant\n");
            }
            strbuf_adds(&r.out, body);
            free(reasoning);
            reasoning = NULL;
            const json_t *tcs = jget(m, "tool_calls");
            if (py_truthy(tcs) && (json_is_array(tcs) || json_is_string(tcs)))
                if (render_tool_calls(&r, tcs, body) < 0) goto fail;
            strbuf_adds(&r.out, "<|im_end|>\n");
        } else if (!strcmp(role, "tool")) {
            /* loop.previtem and loop.previtem.role != "tool" */
            if (i > 0 && py_truthy(json_array_get(messages, i - 1)) &&
                strcmp(role_of(json_array_get(messages, i - 1)), "tool") != 0)
                strbuf_adds(&r.out, "<|im_start|>user");
            strbuf_adds(&r.out, "\n<tool_response>\n");
            strbuf_adds(&r.out, content);
            strbuf_adds(&r.out, "\n</tool_response>");
            if (i + 1 == n || strcmp(role_of(json_array_get(messages, i + 1)), "tool") != 0)
                strbuf_adds(&r.out, "<|im_end|>\n");
        } else {
            error_set(err, "Unexpected message role.");
            goto fail;
        }
        free(content);
        content = NULL;
    }

    const json_t *agp = template_var(req, "add_generation_prompt");
    if (!agp || py_truthy(agp)) {
        const json_t *thinking = template_var(req, "enable_thinking");
        int think;
        if (t->thinking_default == CHAT_THINKING_DEFAULT_ON)
            think = !json_is_false(thinking); /* enable_thinking is defined and ... is false */
        else
            think = json_is_true(thinking); /* enable_thinking is defined and ... is true */
        strbuf_adds(&r.out, think ? "<|im_start|>assistant\n<think>\n"
                                    : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    }
    *out = strbuf_take(&r.out);
    return 0;
fail:
    free(content);
    free(reasoning);
    free(r.out.s);
    return -1;
}

int chat_continues_final(const json_t *req) {
    const json_t *messages = jget(req, "messages");
    const size_t n = json_is_array(messages) ? json_array_size(messages) : 0;
    const json_t *cfm = template_var(req, "continue_final_message");
    const json_t *agp = template_var(req, "add_generation_prompt");
    if (n == 0 || strcmp(role_of(json_array_get(messages, n - 1)), "assistant") != 0 ||
        (cfm && !py_truthy(cfm)) || (agp && py_truthy(agp)))
        return 0;
    /* something to continue: text content that is not only whitespace (an empty one, or a
     * tool-call turn, is closed and a new turn opened, as before) */
    const json_t *c = jget(json_array_get(messages, n - 1), "content");
    if (json_is_array(c) && json_array_size(c) > 0) c = jget(json_array_get(c, json_array_size(c) - 1), "text");
    const char *s = json_is_string(c) ? json_string_value(c) : "";
    return s[strspn(s, " \t\n\r")] != 0;
}

int chat_render_continued(const struct chat_template *t, const json_t *req, char **out,
                          struct error *err) {
    json_t *rq = json_deep_copy(req);
    json_object_set_new(rq, "add_generation_prompt", json_false());
    json_t *kw = json_object_get(rq, "chat_template_kwargs");
    if (json_is_object(kw)) json_object_del(kw, "add_generation_prompt");
    int rc = chat_render(t, rq, out, err);
    const json_t *messages = jget(rq, "messages");
    const json_t *c = jget(json_array_get(messages, json_array_size(messages) - 1), "content");
    if (json_is_array(c) && json_array_size(c) > 0) c = jget(json_array_get(c, json_array_size(c) - 1), "text");
    const char *fin = json_is_string(c) ? json_string_value(c) : "";
    size_t flen = json_is_string(c) ? json_string_length(c) : 0;
    for (int pass = 0; rc == 0 && pass < 2; pass++) { /* transformers: rindex, then stripped */
        const size_t len = strlen(*out);
        const char *hit = NULL;
        for (const char *q = *out; flen && (q = memmem(q, len - (size_t)(q - *out), fin, flen)); q++) hit = q;
        if (hit) {
            (*out)[(size_t)(hit - *out) + flen] = 0;
            json_decref(rq);
            return 0;
        }
        while (flen && strchr(" \t\n\r", fin[0])) fin++, flen--;
        while (flen && strchr(" \t\n\r", fin[flen - 1])) flen--;
    }
    if (rc == 0) {
        free(*out);
        *out = NULL;
        rc = error_set(err, "the final assistant message cannot be continued: its content is empty "
                            "or the template does not render it as given (set "
                            "continue_final_message false to close it instead)");
    }
    json_decref(rq);
    return rc;
}

int chat_prompt_opens_thinking(const char *prompt) { return ends_with(prompt, "<think>\n"); }

/* ---- loading the template ------------------------------------------------------------- */

int chat_template_from_text(struct chat_template *t, const char *text, struct error *err) {
    /* Structural landmarks of the Qwen3.5 template (as written in the Jinja source). */
    static const char *const marks[] = {
        "macro render_content(",       "<|vision_start|><|image_pad|><|vision_end|>",
        "ns.last_query_index",         "<tool_call>\\n<function=",
        "'\\n<tool_response>\\n'",     "No user query found in messages.",
        "<|im_start|>assistant\\n",
    };
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++)
        if (!strstr(text, marks[i]))
            return error_set(err, "chat template is not the Qwen3.5 template (missing \"%s\"); "
                                  "strata renders only the Qwen3.5 family's template", marks[i]);
    if (strstr(text, "preserve_thinking"))
        return error_set(err, "chat template uses preserve_thinking (a later Qwen revision); "
                              "strata renders only the Qwen3.5 template");
    int on = strstr(text, "enable_thinking is defined and enable_thinking is false") != NULL;
    int off = strstr(text, "enable_thinking is defined and enable_thinking is true") != NULL;
    if (on == off)
        return error_set(err, "chat template: cannot tell its thinking default (expected one "
                              "'enable_thinking is defined and enable_thinking is false|true')");
    t->thinking_default = on ? CHAT_THINKING_DEFAULT_ON : CHAT_THINKING_DEFAULT_OFF;
    return 0;
}

int chat_template_load(struct chat_template *t, const char *model_dir, struct error *err) {
    char path[4096];
    struct error e2;
    snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
    char *text = read_file(path, NULL, &e2);
    if (text) {
        int rc = chat_template_from_text(t, text, err);
        free(text);
        if (rc < 0) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return error_set(err, "%s: %s", path, msg);
        }
        return 0;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr);
    if (!cfg)
        return error_set(err, "%s/chat_template.jinja: not found, and %s: %s", model_dir, path,
                         jerr.text);
    const json_t *ct = json_object_get(cfg, "chat_template");
    const char *s = NULL;
    if (json_is_string(ct)) s = json_string_value(ct);
    for (size_t i = 0; json_is_array(ct) && i < json_array_size(ct); i++) {
        const json_t *e = json_array_get(ct, i);
        if (is_str(json_object_get(e, "name"), "default"))
            s = json_string_value(json_object_get(e, "template"));
    }
    if (!s) {
        json_decref(cfg);
        return error_set(err, "%s: no \"chat_template\" (and no chat_template.jinja beside it)",
                         path);
    }
    int rc = chat_template_from_text(t, s, err);
    json_decref(cfg);
    if (rc < 0) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return error_set(err, "%s: %s", path, msg);
    }
    return 0;
}
