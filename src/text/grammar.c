/* grammar.c - JSON Schema / tool calls -> a pushdown automaton over bytes -> token masks (see
 * grammar.h for the language and the design).
 *
 * The automaton is a recursive transition network: states with byte-range edges, epsilon edges
 * and call edges (enter a rule at its start state, continue at a return state once the rule
 * reaches one of its accepting states). A configuration is a stack: a node (state, parent) where
 * parent is the node holding the caller's return state; nodes are hash-consed, so a stack is an
 * int. The matcher holds a set of such stacks (the grammar may be ambiguous, as anyOf is), each
 * "byte-ready" (its state has byte edges; epsilon moves, calls and returns are closed over), and
 * sets are interned too, so the step set x byte -> set is memoised: a lazily built DFA.
 *
 * Masks follow xgrammar's split (Dong et al. 2024), written here from its description: for a
 * state s, a walk of the vocabulary trie from the stack (s, BASE) alone classifies each token as
 * accepted (some path consumes it without leaving s's rule), rejected, or context-dependent (a
 * path leaves the rule with bytes still to consume: those bytes are checked against the real
 * parent at run time). The built-in rules (whitespace, strings, numbers, any JSON) are emitted
 * first and identically in every grammar, so their states' walks - the expensive ones, where
 * nearly every token is possible - are done once per vocabulary. */
#include "grammar.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define INF_LEN (INT32_MAX / 4)
#define MAX_STATES 400000
#define MAX_ITEMS 256   /* minItems / maxItems unrolled up to this */
#define WS_MAX 20       /* spaces or tabs after a newline */

/* ---- the automaton -------------------------------------------------------------------- */

struct gedge {
    uint8_t lo, hi;
    int32_t to;
};
struct gx {
    int32_t to;   /* epsilon target, or the return state of a call */
    int32_t call; /* -1: epsilon; else the called rule's start state */
};
struct gstate {
    int32_t e0, ne; /* byte edges [e0, e0 + ne) */
    int32_t x0, nx; /* epsilon / call edges */
    int32_t minlen; /* fewest bytes to reach an accepting state of this rule */
    uint8_t accept; /* the rule may end here */
};

struct sclass; /* a state's token classification (below) */

struct grammar {
    struct gstate *st;
    int n_st;
    struct gedge *ed;
    struct gx *x;
    int32_t start;
    int n_prelude; /* states [0, n_prelude) are the shared built-in rules */
    pthread_mutex_t mu;
    const struct grammar_vocab *cls_vocab; /* the vocabulary cls was computed for */
    struct sclass **cls;                   /* (n_st,) lazily */
    int refs;
};

/* ---- building ------------------------------------------------------------------------- */

struct bedge {
    int32_t from, to;
    uint8_t lo, hi;
};
struct bx {
    int32_t from, to, call;
};
struct memo {
    const json_t *node;
    int tool;
    int32_t start;
};

struct builder {
    uint8_t *acc;
    int n_st, cap_st;
    struct bedge *e;
    int ne, cap_e;
    struct bx *x;
    int nx, cap_x;
    struct error *err;
    int failed;
    /* the prelude's rules (start states) */
    int32_t ws, str, str_t, raw_t, num, integer, value, value_t, object, object_t, array, array_t;
    int32_t str_body, str_t_body, raw_t_body; /* their text states with no partial pattern */
    /* schema compiling */
    const json_t *root; /* what "#" means in a $ref */
    struct memo *memo;
    int n_memo, cap_memo;
    char path[400];
    int depth;
};

static int32_t st_new(struct builder *b) {
    if (b->n_st >= MAX_STATES) {
        if (!b->failed) error_set(b->err, "the grammar is too large (over %d states)", MAX_STATES);
        b->failed = 1;
        return 0;
    }
    if (b->n_st == b->cap_st) {
        b->cap_st = b->cap_st ? 2 * b->cap_st : 1024;
        b->acc = xrealloc(b->acc, (size_t)b->cap_st);
    }
    b->acc[b->n_st] = 0;
    return b->n_st++;
}

static void edge(struct builder *b, int32_t from, int lo, int hi, int32_t to) {
    if (b->ne == b->cap_e) {
        b->cap_e = b->cap_e ? 2 * b->cap_e : 4096;
        b->e = xrealloc(b->e, (size_t)b->cap_e * sizeof *b->e);
    }
    b->e[b->ne++] = (struct bedge){from, to, (uint8_t)lo, (uint8_t)hi};
}

static void xedge(struct builder *b, int32_t from, int32_t to, int32_t call) {
    if (b->nx == b->cap_x) {
        b->cap_x = b->cap_x ? 2 * b->cap_x : 1024;
        b->x = xrealloc(b->x, (size_t)b->cap_x * sizeof *b->x);
    }
    b->x[b->nx++] = (struct bx){from, to, call};
}

static void eps(struct builder *b, int32_t from, int32_t to) { xedge(b, from, to, -1); }

/* from --call rule--> (new state), returned */
static int32_t call(struct builder *b, int32_t from, int32_t rule) {
    int32_t to = st_new(b);
    xedge(b, from, to, rule);
    return to;
}

static int32_t byte1(struct builder *b, int32_t from, int c) {
    int32_t to = st_new(b);
    edge(b, from, c, c, to);
    return to;
}

/* from --bytes--> (new state), returned */
static int32_t lit(struct builder *b, int32_t from, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) from = byte1(b, from, (unsigned char)s[i]);
    return from;
}
static int32_t lits(struct builder *b, int32_t from, const char *s) { return lit(b, from, s, strlen(s)); }

/* ---- the prelude: whitespace, strings, raw text, numbers, any JSON ---------------------- */

static int32_t build_ws(struct builder *b) {
    int32_t s = st_new(b), sp = byte1(b, s, ' '), nl = byte1(b, s, '\n');
    b->acc[s] = b->acc[sp] = b->acc[nl] = 1;
    int32_t cur = nl;
    for (int i = 0; i < WS_MAX; i++) {
        int32_t nx = st_new(b);
        edge(b, cur, ' ', ' ', nx);
        edge(b, cur, '\t', '\t', nx);
        b->acc[nx] = 1;
        cur = nx;
    }
    return s;
}

/* An Aho-Corasick automaton over ASCII for the substrings a text must not contain. */
#define AC_MAX 64
struct ac {
    int n;
    int go[AC_MAX][128];
    uint8_t term[AC_MAX];
};

static void ac_build(struct ac *a, const char *const *pat, int n_pat) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < AC_MAX; i++)
        for (int c = 0; c < 128; c++) a->go[i][c] = -1;
    a->n = 1;
    for (int p = 0; p < n_pat; p++) {
        int cur = 0;
        for (const char *q = pat[p]; *q; q++) {
            int c = (unsigned char)*q & 127;
            if (a->go[cur][c] < 0) {
                CHECK(a->n < AC_MAX);
                a->go[cur][c] = a->n++;
            }
            cur = a->go[cur][c];
        }
        a->term[cur] = 1;
    }
    int fail[AC_MAX] = {0}, queue[AC_MAX], qh = 0, qt = 0;
    for (int c = 0; c < 128; c++) {
        if (a->go[0][c] < 0) a->go[0][c] = 0;
        else fail[a->go[0][c]] = 0, queue[qt++] = a->go[0][c];
    }
    while (qh < qt) {
        int u = queue[qh++];
        a->term[u] |= a->term[fail[u]];
        for (int c = 0; c < 128; c++) {
            int v = a->go[u][c];
            if (v < 0) a->go[u][c] = a->go[fail[u]][c];
            else fail[v] = a->go[fail[u]][c], queue[qt++] = v;
        }
    }
}

/* Edges for byte values [lo, hi] from `from`, the target of each given by target(c) (-1: none),
 * merged into ranges. */
static void edges_by(struct builder *b, int32_t from, int lo, int hi, const int32_t *target) {
    int c = lo;
    while (c <= hi) {
        if (target[c] < 0) {
            c++;
            continue;
        }
        int d = c;
        while (d + 1 <= hi && target[d + 1] == target[c]) d++;
        edge(b, from, c, d, target[c]);
        c = d + 1;
    }
}

/* The UTF-8 multi-byte sequences from `from` back to `back` (continuation states made here). */
struct utf8 {
    int32_t c1, c2, c3, e0, ed, f0, f4;
};
static void utf8_states(struct builder *b, struct utf8 *u, int32_t back) {
    u->c1 = st_new(b), u->c2 = st_new(b), u->c3 = st_new(b);
    u->e0 = st_new(b), u->ed = st_new(b), u->f0 = st_new(b), u->f4 = st_new(b);
    edge(b, u->c1, 0x80, 0xBF, back);
    edge(b, u->c2, 0x80, 0xBF, u->c1);
    edge(b, u->c3, 0x80, 0xBF, u->c2);
    edge(b, u->e0, 0xA0, 0xBF, u->c1);
    edge(b, u->ed, 0x80, 0x9F, u->c1);
    edge(b, u->f0, 0x90, 0xBF, u->c2);
    edge(b, u->f4, 0x80, 0x8F, u->c2);
}
static void utf8_leads(struct builder *b, int32_t from, const struct utf8 *u) {
    edge(b, from, 0xC2, 0xDF, u->c1);
    edge(b, from, 0xE0, 0xE0, u->e0);
    edge(b, from, 0xE1, 0xEC, u->c2);
    edge(b, from, 0xED, 0xED, u->ed);
    edge(b, from, 0xEE, 0xEF, u->c2);
    edge(b, from, 0xF0, 0xF0, u->f0);
    edge(b, from, 0xF1, 0xF3, u->c3);
    edge(b, from, 0xF4, 0xF4, u->f4);
}

/* A JSON string ("..." with escapes) whose raw bytes never contain the patterns (json = 1), or
 * raw text that never contains them (json = 0: any valid UTF-8 but NUL, accepted anywhere). */
static int32_t build_text(struct builder *b, const char *const *pat, int n_pat, int json,
                          int32_t *body0) {
    struct ac a;
    ac_build(&a, pat, n_pat);
    int32_t start = st_new(b), end = json ? st_new(b) : -1;
    int32_t body[AC_MAX] = {0};
    for (int k = 0; k < a.n; k++) body[k] = a.term[k] ? -1 : st_new(b);
    struct utf8 u;
    utf8_states(b, &u, body[0]);
    int32_t esc = -1;
    if (json) {
        b->acc[end] = 1;
        edge(b, start, '"', '"', body[0]);
        /* escapes: \uXXXX outside D800-FFFF (no surrogates) and not \u0000 */
        esc = st_new(b);
        int32_t u1 = st_new(b), h3 = st_new(b), h2 = st_new(b), h1 = st_new(b);
        int32_t z2 = st_new(b), z3 = st_new(b), z4 = st_new(b);
        static const char simple[] = "\"\\/bfnrt";
        for (const char *q = simple; *q; q++) edge(b, esc, *q, *q, body[0]);
        edge(b, esc, 'u', 'u', u1);
        edge(b, u1, '1', '9', h3), edge(b, u1, 'A', 'C', h3), edge(b, u1, 'a', 'c', h3);
        edge(b, u1, '0', '0', z2);
        int32_t hs[3] = {h3, h2, h1}, nxt[3] = {h2, h1, body[0]};
        for (int i = 0; i < 3; i++) {
            edge(b, hs[i], '0', '9', nxt[i]);
            edge(b, hs[i], 'A', 'F', nxt[i]);
            edge(b, hs[i], 'a', 'f', nxt[i]);
        }
        int32_t zs[3] = {z2, z3, z4}, zn[3] = {z3, z4, -1}, zh[3] = {h2, h1, body[0]};
        for (int i = 0; i < 3; i++) {
            edge(b, zs[i], '1', '9', zh[i]);
            edge(b, zs[i], 'A', 'F', zh[i]);
            edge(b, zs[i], 'a', 'f', zh[i]);
            if (zn[i] >= 0) edge(b, zs[i], '0', '0', zn[i]);
        }
    } else {
        eps(b, start, body[0]);
    }
    for (int k = 0; k < a.n; k++) {
        if (body[k] < 0) continue;
        if (!json) b->acc[body[k]] = 1;
        int32_t target[128];
        for (int c = 0; c < 128; c++) {
            int nk = a.go[k][c];
            target[c] = a.term[nk] ? -1 : body[nk];
            if (json && c < 0x20) target[c] = -1;
            if (!json && c == 0) target[c] = -1;
        }
        if (json) target['"'] = end, target['\\'] = esc;
        edges_by(b, body[k], 0, 127, target);
        utf8_leads(b, body[k], &u);
    }
    *body0 = body[0];
    return start;
}

static int32_t build_number(struct builder *b, int integer) {
    int32_t s = st_new(b), m = byte1(b, s, '-'), z = st_new(b), d1 = st_new(b);
    b->acc[z] = b->acc[d1] = 1;
    edge(b, s, '0', '0', z), edge(b, m, '0', '0', z);
    edge(b, s, '1', '9', d1), edge(b, m, '1', '9', d1);
    int32_t ints[16];
    ints[0] = d1;
    for (int i = 1; i < 15; i++) {
        ints[i] = st_new(b);
        b->acc[ints[i]] = 1;
        edge(b, ints[i - 1], '0', '9', ints[i]);
    }
    if (integer) return s;
    int32_t f0 = st_new(b), e0 = st_new(b), e1 = st_new(b);
    edge(b, z, '.', '.', f0);
    edge(b, z, 'e', 'e', e0), edge(b, z, 'E', 'E', e0);
    for (int i = 0; i < 15; i++) {
        edge(b, ints[i], '.', '.', f0);
        edge(b, ints[i], 'e', 'e', e0), edge(b, ints[i], 'E', 'E', e0);
    }
    int32_t cur = f0;
    for (int i = 0; i < 16; i++) {
        int32_t nx = st_new(b);
        b->acc[nx] = 1;
        edge(b, cur, '0', '9', nx);
        edge(b, nx, 'e', 'e', e0), edge(b, nx, 'E', 'E', e0);
        cur = nx;
    }
    edge(b, e0, '+', '+', e1), edge(b, e0, '-', '-', e1);
    /* at most 2 exponent digits: jansson refuses a real that overflows a double */
    int32_t x1 = st_new(b), x2 = st_new(b);
    b->acc[x1] = b->acc[x2] = 1;
    edge(b, e0, '0', '9', x1), edge(b, e1, '0', '9', x1);
    edge(b, x1, '0', '9', x2);
    return s;
}

/* '{' ws ( '}' | KEY ws ':' ws VAL (ws ',' ws KEY ws ':' ws VAL)* ws '}' ) */
static int32_t object_body(struct builder *b, int32_t s, int32_t key, int32_t val) {
    int32_t end = st_new(b);
    b->acc[end] = 1;
    int32_t a = call(b, byte1(b, s, '{'), b->ws);
    edge(b, a, '}', '}', end);
    int32_t k = st_new(b);
    eps(b, a, k);
    int32_t v = call(b, byte1(b, call(b, call(b, k, key), b->ws), ':'), b->ws);
    int32_t after = call(b, call(b, v, val), b->ws);
    edge(b, after, '}', '}', end);
    int32_t comma = call(b, byte1(b, after, ','), b->ws);
    eps(b, comma, k);
    return end;
}

/* '[' ws ( ']' | VAL (ws ',' ws VAL)* ws ']' ) */
static int32_t array_body(struct builder *b, int32_t s, int32_t val) {
    int32_t end = st_new(b);
    b->acc[end] = 1;
    int32_t a = call(b, byte1(b, s, '['), b->ws);
    edge(b, a, ']', ']', end);
    int32_t i = st_new(b);
    eps(b, a, i);
    int32_t after = call(b, call(b, i, val), b->ws);
    edge(b, after, ']', ']', end);
    eps(b, call(b, byte1(b, after, ','), b->ws), i);
    return end;
}

static void build_prelude(struct builder *b) {
    b->ws = build_ws(b);
    static const char *const content_pat[] = {"<tool_call>"};
    static const char *const tool_pat[] = {"</parameter>", "<parameter=", "</function>"};
    b->str = build_text(b, content_pat, 1, 1, &b->str_body);
    b->str_t = build_text(b, tool_pat, 3, 1, &b->str_t_body);
    b->raw_t = build_text(b, tool_pat, 3, 0, &b->raw_t_body);
    b->num = build_number(b, 0);
    b->integer = build_number(b, 1);
    for (int t = 0; t < 2; t++) {
        int32_t value = st_new(b), object = st_new(b), array = st_new(b);
        int32_t str = t ? b->str_t : b->str;
        object_body(b, object, str, value);
        array_body(b, array, value);
        int32_t end = st_new(b);
        b->acc[end] = 1;
        eps(b, call(b, value, object), end);
        eps(b, call(b, value, array), end);
        eps(b, call(b, value, str), end);
        eps(b, call(b, value, b->num), end);
        eps(b, lits(b, value, "true"), end);
        eps(b, lits(b, value, "false"), end);
        eps(b, lits(b, value, "null"), end);
        if (t) b->value_t = value, b->object_t = object, b->array_t = array;
        else b->value = value, b->object = object, b->array = array;
    }
}

/* ---- JSON Schema ---------------------------------------------------------------------- */

static int fail(struct builder *b, const char *fmt, const char *what) {
    if (!b->failed) {
        char msg[600];
        snprintf(msg, sizeof msg, fmt, what);
        error_set(b->err, "%s: %s", b->path, msg);
    }
    b->failed = 1;
    return -1;
}

static size_t path_push(struct builder *b, const char *part) {
    size_t n = strlen(b->path);
    snprintf(b->path + n, sizeof b->path - n, "%s", part);
    return n;
}
static void path_pop(struct builder *b, size_t n) { b->path[n] = 0; }

static const char *const refused_kw[] = {
    "pattern", "format", "multipleOf", "allOf", "not", "if", "then", "else", "patternProperties",
    "propertyNames", "minProperties", "maxProperties", "uniqueItems", "contains", "minContains",
    "maxContains", "prefixItems", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
    "dependentRequired", "dependentSchemas", "dependencies", "$dynamicRef", "$recursiveRef",
    "contentEncoding", "contentMediaType", NULL};

static int32_t schema_rule(struct builder *b, const json_t *node, int tool);

/* The canonical compact JSON of v (reals written with the fewest digits that read back). */
static char *dump_value(const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (!s) return NULL;
    json_t *back = json_loads(s, JSON_DECODE_ANY, NULL);
    int same = back && json_equal(back, v);
    json_decref(back);
    if (same) return s;
    free(s);
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
}

static int type_matches(const json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return 0;
}

/* Enum / const values (of the schema's types, when it names any) as literal alternatives from s
 * to end. raw: strings without their quotes (a tool call's string parameter). */
static int enum_alts(struct builder *b, const json_t *node, int32_t s, int32_t end, int raw) {
    const json_t *en = json_object_get(node, "enum"), *cn = json_object_get(node, "const");
    json_t *vals = json_array();
    if (cn) json_array_append(vals, (json_t *)cn);
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) {
            json_decref(vals);
            return fail(b, "%s", "'enum' must be a non-empty array");
        }
        for (size_t i = 0; i < json_array_size(en); i++) {
            const json_t *v = json_array_get(en, i);
            if (!cn || json_equal(v, cn)) json_array_append(vals, (json_t *)v);
        }
    }
    const json_t *ty = json_object_get(node, "type");
    int n = 0;
    for (size_t i = 0; i < json_array_size(vals); i++) {
        const json_t *v = json_array_get(vals, i);
        int ok = !ty;
        if (json_is_string(ty)) ok = type_matches(v, json_string_value(ty));
        for (size_t k = 0; json_is_array(ty) && k < json_array_size(ty); k++)
            if (json_is_string(json_array_get(ty, k)) &&
                type_matches(v, json_string_value(json_array_get(ty, k))))
                ok = 1;
        if (raw && !json_is_string(v)) ok = 0;
        if (!ok) continue;
        if (raw) {
            eps(b, lit(b, s, json_string_value(v), json_string_length(v)), end);
        } else {
            char *d = dump_value(v);
            if (!d) continue;
            eps(b, lits(b, s, d), end);
            free(d);
        }
        n++;
    }
    json_decref(vals);
    if (n == 0)
        return fail(b, "%s", raw ? "no 'enum' / 'const' value is a string (a string parameter "
                                   "of a tool call)" : "no 'enum' / 'const' value has the schema's type");
    return 0;
}

/* An object with declared properties (in order; the required ones always present). */
static int object_props(struct builder *b, const json_t *node, int32_t s, int32_t end, int tool) {
    const json_t *props = json_object_get(node, "properties");
    const json_t *req = json_object_get(node, "required");
    const json_t *addl = json_object_get(node, "additionalProperties");
    if (props && !json_is_object(props)) return fail(b, "%s", "'properties' must be an object");
    if (req && !json_is_array(req)) return fail(b, "%s", "'required' must be an array");
    for (size_t i = 0; i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) return fail(b, "%s", "'required' must hold strings");
        if (!json_object_get(props, json_string_value(r))) {
            char m[400];
            snprintf(m, sizeof m, "required property '%.200s' is not in 'properties'", json_string_value(r));
            return fail(b, "%s", m);
        }
    }
    int32_t str = tool ? b->str_t : b->str, anyv = tool ? b->value_t : b->value;
    size_t np = json_object_size(props);
    if (np == 0) {
        if (json_is_false(addl)) { /* {} only */
            edge(b, call(b, byte1(b, s, '{'), b->ws), '}', '}', end);
            return 0;
        }
        int32_t val = anyv;
        if (json_is_object(addl)) {
            size_t n = path_push(b, ".additionalProperties");
            val = schema_rule(b, addl, tool);
            path_pop(b, n);
            if (b->failed) return -1;
        } else if (addl && !json_is_true(addl)) {
            return fail(b, "%s", "'additionalProperties' must be a boolean or a schema");
        }
        int32_t e = object_body(b, s, str, val);
        eps(b, e, end);
        return 0;
    }
    if (addl && !json_is_false(addl))
        return fail(b, "%s", "'additionalProperties' other than false beside 'properties' is not "
                             "supported (set it to false)");
    /* none: nothing written yet; some: after the last written property's value */
    int32_t none = call(b, byte1(b, s, '{'), b->ws), some = -1;
    const char *key;
    const json_t *ps;
    json_object_foreach((json_t *)props, key, ps) {
        int required = 0;
        for (size_t r = 0; r < json_array_size(req); r++)
            if (!strcmp(json_string_value(json_array_get(req, r)), key)) required = 1;
        char part[300];
        snprintf(part, sizeof part, ".properties.%.250s", key);
        size_t n = path_push(b, part);
        int32_t val = schema_rule(b, ps, tool);
        path_pop(b, n);
        if (b->failed) return -1;
        int32_t k = st_new(b); /* this property's "key": value starts */
        if (none >= 0) eps(b, none, k);
        if (some >= 0) eps(b, call(b, byte1(b, call(b, some, b->ws), ','), b->ws), k);
        json_t *ks = json_string(key);
        char *kd = json_dumps(ks, JSON_ENCODE_ANY);
        json_decref(ks);
        int32_t after = call(b, call(b, byte1(b, call(b, lits(b, k, kd), b->ws), ':'), b->ws), val);
        free(kd);
        int32_t nsome = st_new(b);
        eps(b, after, nsome);
        if (!required) {
            if (some >= 0) eps(b, some, nsome);
        } else {
            none = -1; /* cannot be skipped */
        }
        some = nsome;
    }
    if (none >= 0) edge(b, none, '}', '}', end);
    edge(b, call(b, some, b->ws), '}', '}', end);
    return 0;
}

static int array_items(struct builder *b, const json_t *node, int32_t s, int32_t end, int tool) {
    const json_t *items = json_object_get(node, "items");
    int32_t item = tool ? b->value_t : b->value;
    if (items && json_is_object(items)) {
        size_t n = path_push(b, ".items");
        item = schema_rule(b, items, tool);
        path_pop(b, n);
        if (b->failed) return -1;
    } else if (items && json_is_false(items)) {
        edge(b, call(b, byte1(b, s, '['), b->ws), ']', ']', end);
        return 0;
    } else if (items && !json_is_true(items)) {
        return fail(b, "%s", "'items' must be a schema (tuple 'items' arrays are not supported)");
    }
    long long mn = 0, mx = -1;
    const json_t *v = json_object_get(node, "minItems");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) return fail(b, "%s", "'minItems' must be a non-negative integer");
        mn = json_integer_value(v);
    }
    v = json_object_get(node, "maxItems");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) return fail(b, "%s", "'maxItems' must be a non-negative integer");
        mx = json_integer_value(v);
    }
    if (mn > MAX_ITEMS || mx > MAX_ITEMS) {
        char m[64];
        snprintf(m, sizeof m, "%d", MAX_ITEMS);
        return fail(b, "'minItems' / 'maxItems' above %s are not supported", m);
    }
    if (mx >= 0 && mx < mn) return fail(b, "%s", "'maxItems' is below 'minItems'");
    int32_t a = call(b, byte1(b, s, '['), b->ws);
    if (mn == 0) edge(b, a, ']', ']', end);
    if (mx == 0) return 0;
    long long k_max = mx >= 0 ? mx : (mn > 1 ? mn : 1);
    int32_t cur = a; /* before item k */
    for (long long k = 1; k <= k_max; k++) {
        int32_t item_k = st_new(b); /* only the item: no ']' after a ',' */
        eps(b, cur, item_k);
        int32_t w = call(b, call(b, item_k, item), b->ws);
        if (k >= mn) edge(b, w, ']', ']', end);
        if (k < k_max) cur = call(b, byte1(b, w, ','), b->ws);
        else if (mx < 0) eps(b, call(b, byte1(b, w, ','), b->ws), item_k); /* unbounded: loop */
    }
    return 0;
}

/* ---- string lengths (minLength / maxLength) --------------------------------------------- */

#define MAX_STR_LEN 32 /* minLength / maxLength up to this: a copy of the text states per count */

/* A string of mn..mx characters (mx < 0: no maximum), counted in code points as JSON Schema
 * does (an escape is one). json: a quoted JSON string (tool: a tool parameter's); else a tool
 * call's raw text. The counted characters exclude '<' (no tag can start there; JSON writes it
 * \u003c); past the count, the plain text states take over. */
static int32_t counted_text(struct builder *b, long long mn, long long mx, int json, int tool) {
    const int K = (int)(mx >= 0 ? mx : mn);
    int32_t s = st_new(b), end = json ? st_new(b) : -1;
    if (json) b->acc[end] = 1;
    int32_t c[MAX_STR_LEN + 1] = {0};
    for (int k = 0; k <= K; k++) c[k] = st_new(b);
    if (json) edge(b, s, '"', '"', c[0]);
    else eps(b, s, c[0]);
    for (int k = 0; k <= K; k++) {
        if (k >= mn) {
            if (json) edge(b, c[k], '"', '"', end);
            else b->acc[c[k]] = 1;
        }
        if (k == K) {
            if (mx < 0) eps(b, c[k], json ? (tool ? b->str_t_body : b->str_body) : b->raw_t_body);
            break;
        }
        int32_t target[128];
        for (int ch = 0; ch < 128; ch++) {
            target[ch] = c[k + 1];
            if ((json && ch < 0x20) || ch == 0 || ch == '<') target[ch] = -1;
            if (json && (ch == '"' || ch == '\\')) target[ch] = -1;
        }
        edges_by(b, c[k], 0, 127, target);
        struct utf8 u;
        utf8_states(b, &u, c[k + 1]);
        utf8_leads(b, c[k], &u);
        if (json) { /* escapes, as build_text's, back to c[k + 1] */
            int32_t esc = byte1(b, c[k], '\\'), u1 = st_new(b), h3 = st_new(b), h2 = st_new(b),
                    h1 = st_new(b), z2 = st_new(b), z3 = st_new(b), z4 = st_new(b);
            static const char simple[] = "\"\\/bfnrt";
            for (const char *q = simple; *q; q++) edge(b, esc, *q, *q, c[k + 1]);
            edge(b, esc, 'u', 'u', u1);
            edge(b, u1, '1', '9', h3), edge(b, u1, 'A', 'C', h3), edge(b, u1, 'a', 'c', h3);
            edge(b, u1, '0', '0', z2);
            int32_t hs[3] = {h3, h2, h1}, nx[3] = {h2, h1, c[k + 1]};
            for (int i = 0; i < 3; i++)
                edge(b, hs[i], '0', '9', nx[i]), edge(b, hs[i], 'A', 'F', nx[i]), edge(b, hs[i], 'a', 'f', nx[i]);
            int32_t zs[3] = {z2, z3, z4}, zn[3] = {z3, z4, -1}, zh[3] = {h2, h1, c[k + 1]};
            for (int i = 0; i < 3; i++) {
                edge(b, zs[i], '1', '9', zh[i]), edge(b, zs[i], 'A', 'F', zh[i]), edge(b, zs[i], 'a', 'f', zh[i]);
                if (zn[i] >= 0) edge(b, zs[i], '0', '0', zn[i]);
            }
        }
    }
    return s;
}

/* minLength / maxLength of a string schema: 1 when given (mn, mx set), 0 when not, -1 bad. */
static int str_bounds(struct builder *b, const json_t *node, long long *mn, long long *mx) {
    const json_t *lo = json_object_get(node, "minLength"), *hi = json_object_get(node, "maxLength");
    *mn = 0, *mx = -1;
    if (!lo && !hi) return 0;
    if ((lo && (!json_is_integer(lo) || json_integer_value(lo) < 0)) ||
        (hi && (!json_is_integer(hi) || json_integer_value(hi) < 0)))
        return fail(b, "%s", "'minLength' / 'maxLength' must be non-negative integers");
    if (lo) *mn = json_integer_value(lo);
    if (hi) *mx = json_integer_value(hi);
    if (*mn > MAX_STR_LEN || *mx > MAX_STR_LEN) {
        char m[16];
        snprintf(m, sizeof m, "%d", MAX_STR_LEN);
        return fail(b, "'minLength' / 'maxLength' above %s are not supported", m);
    }
    if (*mx >= 0 && *mx < *mn) return fail(b, "%s", "'maxLength' is below 'minLength'");
    return 1;
}

/* ---- numeric bounds (minimum / maximum) ------------------------------------------------ */

#define INT_DIGITS_MAX 999999999999999LL /* 15 digits: every integer the grammar writes */

/* Digit strings of length L from a to z (same length, a <= z), from `from` to end. */
static void digits_range(struct builder *b, int32_t from, const char *a, const char *z, int L,
                         int32_t end) {
    if (L == 0) {
        eps(b, from, end);
        return;
    }
    int all_lo = 1, all_hi = 1;
    for (int i = 0; i < L; i++) all_lo &= a[i] == '0', all_hi &= z[i] == '9';
    if (all_lo && all_hi) { /* any L digits */
        int32_t cur = from;
        for (int i = 0; i < L; i++) {
            int32_t nx = i + 1 == L ? end : st_new(b);
            edge(b, cur, '0', '9', nx);
            cur = nx;
        }
        return;
    }
    static const char nines[] = "9999999999999999", zeros[] = "0000000000000000";
    if (a[0] == z[0]) {
        int32_t n = st_new(b);
        edge(b, from, a[0], a[0], n);
        digits_range(b, n, a + 1, z + 1, L - 1, end);
        return;
    }
    int32_t n = st_new(b);
    edge(b, from, a[0], a[0], n);
    digits_range(b, n, a + 1, nines, L - 1, end);
    if (a[0] + 1 <= z[0] - 1) {
        n = st_new(b);
        edge(b, from, a[0] + 1, z[0] - 1, n);
        digits_range(b, n, zeros, nines, L - 1, end);
    }
    n = st_new(b);
    edge(b, from, z[0], z[0], n);
    digits_range(b, n, zeros, z + 1, L - 1, end);
}

/* Decimal integers a..z (0 <= a <= z), no leading zeros. */
static void nonneg_range(struct builder *b, int32_t from, long long a, long long z, int32_t end) {
    long long p = 1;
    for (int L = 1; L <= 15; L++, p *= 10) {
        long long lo = L == 1 ? 0 : p, hi = p * 10 - 1;
        if (lo < a) lo = a;
        if (hi > z) hi = z;
        if (lo > hi) continue;
        char sa[24], sz[24];
        snprintf(sa, sizeof sa, "%lld", lo);
        snprintf(sz, sizeof sz, "%lld", hi);
        digits_range(b, from, sa, sz, L, end);
    }
}

static void int_range(struct builder *b, int32_t s, long long lo, long long hi, int32_t end) {
    if (hi >= 0) nonneg_range(b, s, lo > 0 ? lo : 0, hi, end);
    if (lo < 0) {
        long long top = hi < -1 ? hi : -1; /* the negative part: lo..top */
        nonneg_range(b, byte1(b, s, '-'), -top, -lo, end);
    }
}

/* The bounds of an integer (exclusive ones made inclusive), clipped to what the grammar writes.
 * Returns 1 when the schema has any, 0 when none, -1 on a bad one. */
static int int_bounds(struct builder *b, const json_t *node, long long *lo, long long *hi) {
    static const char *const kw[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    *lo = -INT_DIGITS_MAX, *hi = INT_DIGITS_MAX;
    int any = 0;
    for (int k = 0; k < 4; k++) {
        const json_t *v = json_object_get(node, kw[k]);
        if (!v) continue;
        if (!json_is_number(v)) return fail(b, "'%s' must be a number", kw[k]);
        double x = json_number_value(v);
        any = 1;
        if (k < 2) {
            double c = k == 0 ? ceil(x) : floor(x) + 1;
            if (c > (double)*lo) *lo = c > (double)INT_DIGITS_MAX ? INT_DIGITS_MAX + 1 : (long long)c;
        } else {
            double c = k == 2 ? floor(x) : ceil(x) - 1;
            if (c < (double)*hi) *hi = c < -(double)INT_DIGITS_MAX ? -INT_DIGITS_MAX - 1 : (long long)c;
        }
    }
    if (any && *lo > *hi)
        return fail(b, "%s", "no integer of at most 15 digits lies between 'minimum' and 'maximum'");
    return any;
}

/* A number with bounds: supported for a "minimum" >= 0 and a "maximum" that are integers (no
 * exponent then): I (.F)? with I in [minimum, maximum - 1], or I = maximum alone. */
static int number_range(struct builder *b, const json_t *node, int32_t s, int32_t end) {
    const json_t *mn = json_object_get(node, "minimum"), *mx = json_object_get(node, "maximum");
    if (json_object_get(node, "exclusiveMinimum") || json_object_get(node, "exclusiveMaximum"))
        return fail(b, "%s", "'exclusiveMinimum' / 'exclusiveMaximum' on a number are not supported "
                             "(on an integer they are)");
    double lo = mn ? json_number_value(mn) : -1, hi = mx ? json_number_value(mx) : (double)INT_DIGITS_MAX;
    if (!mn || !json_is_number(mn) || lo < 0 || lo != floor(lo) || (mx && (!json_is_number(mx) || hi != floor(hi))))
        return fail(b, "%s", "'minimum' / 'maximum' on a number are supported as integers with a "
                             "'minimum' >= 0");
    if (hi > (double)INT_DIGITS_MAX) hi = (double)INT_DIGITS_MAX;
    if (lo > hi) return fail(b, "%s", "'minimum' is above 'maximum'");
    int32_t ip = st_new(b); /* the integer part, then an optional fraction */
    b->acc[ip] = 0;
    if (lo <= hi - 1) nonneg_range(b, s, (long long)lo, (long long)hi - 1, ip);
    nonneg_range(b, s, (long long)hi, (long long)hi, end);
    eps(b, ip, end);
    int32_t cur = byte1(b, ip, '.');
    for (int i = 0; i < 16; i++) {
        int32_t nx = st_new(b);
        edge(b, cur, '0', '9', nx);
        eps(b, nx, end);
        cur = nx;
    }
    return 0;
}

static int compile_type(struct builder *b, const json_t *node, const char *t, int32_t s,
                        int32_t end, int tool) {
    if (!strcmp(t, "string")) {
        long long mn, mx;
        int r = str_bounds(b, node, &mn, &mx);
        if (r < 0) return -1;
        eps(b, call(b, s, r ? counted_text(b, mn, mx, 1, tool) : tool ? b->str_t : b->str), end);
    }
    else if (!strcmp(t, "number")) {
        if (json_object_get(node, "minimum") || json_object_get(node, "maximum") ||
            json_object_get(node, "exclusiveMinimum") || json_object_get(node, "exclusiveMaximum"))
            return number_range(b, node, s, end);
        eps(b, call(b, s, b->num), end);
    } else if (!strcmp(t, "integer")) {
        long long lo, hi;
        int r = int_bounds(b, node, &lo, &hi);
        if (r < 0) return -1;
        if (r) int_range(b, s, lo, hi, end);
        else eps(b, call(b, s, b->integer), end);
    }
    else if (!strcmp(t, "boolean")) eps(b, lits(b, s, "true"), end), eps(b, lits(b, s, "false"), end);
    else if (!strcmp(t, "null")) eps(b, lits(b, s, "null"), end);
    else if (!strcmp(t, "object")) return object_props(b, node, s, end, tool);
    else if (!strcmp(t, "array")) return array_items(b, node, s, end, tool);
    else return fail(b, "type '%s' is not a JSON Schema type", t);
    return 0;
}

/* "#", "#/$defs/x", "#/definitions/x", any JSON pointer into the root. */
static const json_t *resolve_ref(struct builder *b, const char *ref) {
    if (ref[0] != '#') {
        fail(b, "$ref '%s': only local references (#/...) are supported", ref);
        return NULL;
    }
    const json_t *cur = b->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)strtoul(tok, NULL, 10));
        else cur = NULL;
        if (!cur) break;
    }
    if (!cur || *p) {
        fail(b, "$ref '%s' does not resolve", ref);
        return NULL;
    }
    return cur;
}

/* The body of a schema node's rule, from s to end. */
static int schema_body(struct builder *b, const json_t *node, int32_t s, int32_t end, int tool) {
    if (json_is_true(node)) {
        eps(b, call(b, s, tool ? b->value_t : b->value), end);
        return 0;
    }
    if (!json_is_object(node)) return fail(b, "%s", "a schema must be an object (or true)");
    for (int i = 0; refused_kw[i]; i++)
        if (json_object_get(node, refused_kw[i]))
            return fail(b, "'%s' is not supported by constrained decoding", refused_kw[i]);
    const json_t *ref = json_object_get(node, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return fail(b, "%s", "'$ref' must be a string");
        const json_t *t = resolve_ref(b, json_string_value(ref));
        if (!t) return -1;
        char part[300];
        snprintf(part, sizeof part, "(%.250s)", json_string_value(ref));
        size_t n = path_push(b, part);
        int32_t r = schema_rule(b, t, tool);
        path_pop(b, n);
        if (b->failed) return -1;
        eps(b, call(b, s, r), end);
        return 0;
    }
    if (json_object_get(node, "enum") || json_object_get(node, "const"))
        return enum_alts(b, node, s, end, 0);
    const char *alt_kw = json_object_get(node, "anyOf") ? "anyOf" : json_object_get(node, "oneOf") ? "oneOf" : NULL;
    if (alt_kw) {
        const json_t *alts = json_object_get(node, alt_kw);
        if (!json_is_array(alts) || json_array_size(alts) == 0)
            return fail(b, "'%s' must be a non-empty array", alt_kw);
        static const char *const siblings[] = {"type", "properties", "items", "enum", "const", NULL};
        for (int i = 0; siblings[i]; i++)
            if (json_object_get(node, siblings[i]))
                return fail(b, "'%s' beside other constraints is not supported", alt_kw);
        for (size_t i = 0; i < json_array_size(alts); i++) {
            char part[48];
            snprintf(part, sizeof part, ".%s[%zu]", alt_kw, i);
            size_t n = path_push(b, part);
            int32_t r = schema_rule(b, json_array_get(alts, i), tool);
            path_pop(b, n);
            if (b->failed) return -1;
            eps(b, call(b, s, r), end);
        }
        return 0;
    }
    const json_t *ty = json_object_get(node, "type");
    if (!ty) {
        if (json_object_get(node, "properties") || json_object_get(node, "additionalProperties") ||
            json_object_get(node, "required"))
            return compile_type(b, node, "object", s, end, tool);
        if (json_object_get(node, "items") || json_object_get(node, "minItems") ||
            json_object_get(node, "maxItems"))
            return compile_type(b, node, "array", s, end, tool);
        eps(b, call(b, s, tool ? b->value_t : b->value), end);
        return 0;
    }
    if (json_is_string(ty)) return compile_type(b, node, json_string_value(ty), s, end, tool);
    if (!json_is_array(ty) || json_array_size(ty) == 0)
        return fail(b, "%s", "'type' must be a string or a non-empty array of strings");
    for (size_t i = 0; i < json_array_size(ty); i++) {
        const char *t = json_string_value(json_array_get(ty, i));
        if (!t) return fail(b, "%s", "'type' must be a string or a non-empty array of strings");
        if (compile_type(b, node, t, s, end, tool)) return -1;
    }
    return 0;
}

static int32_t schema_rule(struct builder *b, const json_t *node, int tool) {
    for (int i = 0; i < b->n_memo; i++)
        if (b->memo[i].node == node && b->memo[i].tool == tool) return b->memo[i].start;
    if (++b->depth > 64) {
        fail(b, "%s", "the schema nests deeper than 64 levels");
        return 0;
    }
    int32_t s = st_new(b), end = st_new(b);
    b->acc[end] = 1;
    if (b->n_memo == b->cap_memo) {
        b->cap_memo = b->cap_memo ? 2 * b->cap_memo : 64;
        b->memo = xrealloc(b->memo, (size_t)b->cap_memo * sizeof *b->memo);
    }
    b->memo[b->n_memo++] = (struct memo){node, tool, s};
    schema_body(b, node, s, end, tool);
    b->depth--;
    return s;
}

/* ---- tool calls ----------------------------------------------------------------------- */

/* The parameter typing of chat_parse.c (collect_types / param_is_string): the types a schema
 * names through type, anyOf and oneOf. Kept identical, so that what the grammar writes as raw
 * text is what the parser reads as a string. */
static void collect_types(const json_t *schema, const char **types, int *n, int depth) {
    if (!json_is_object(schema) || depth > 4) return;
    const json_t *ty = json_object_get(schema, "type");
    if (json_is_string(ty) && *n < 16) types[(*n)++] = json_string_value(ty);
    for (size_t i = 0; json_is_array(ty) && i < json_array_size(ty); i++)
        if (json_is_string(json_array_get(ty, i)) && *n < 16)
            types[(*n)++] = json_string_value(json_array_get(ty, i));
    static const char *const alts[] = {"anyOf", "oneOf"};
    for (int a = 0; a < 2; a++) {
        const json_t *l = json_object_get(schema, alts[a]);
        for (size_t i = 0; json_is_array(l) && i < json_array_size(l); i++)
            collect_types(json_array_get(l, i), types, n, depth + 1);
    }
}

static int param_is_string(const json_t *ps, int *untyped) {
    const char *types[16];
    int n = 0;
    collect_types(ps, types, &n, 0);
    *untyped = n == 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(types[i], "string")) return 1;
    return n == 0;
}

static int valid_tag_name(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n <= 256 && !strpbrk(s, "<>\n");
}

/* "<tool_call>\n<function=NAME>\n" params "</function>\n</tool_call>" for each allowed tool. */
static int32_t tool_call_rule(struct builder *b, const json_t *tools, const char *only) {
    int32_t s = st_new(b), end = st_new(b);
    b->acc[end] = 1;
    int32_t f = lits(b, s, "<tool_call>\n<function=");
    int n_ok = 0;
    for (size_t i = 0; i < json_array_size(tools) && !b->failed; i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *fn = json_object_get(t, "function");
        if (!fn) fn = t;
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || (only && strcmp(name, only) != 0)) continue;
        snprintf(b->path, sizeof b->path, "tools[%zu].function.parameters", i);
        if (!valid_tag_name(name)) {
            fail(b, "the function name '%s' cannot be written in a <function=...> tag", name);
            break;
        }
        const json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_object(params)) {
            fail(b, "%s", "'parameters' must be an object");
            break;
        }
        const json_t *pt = json_object_get(params, "type");
        if (pt && !(json_is_string(pt) && !strcmp(json_string_value(pt), "object"))) {
            fail(b, "%s", "'parameters' must be a schema of type object");
            break;
        }
        b->root = params;
        const json_t *props = json_object_get(params, "properties");
        const json_t *req = json_object_get(params, "required");
        if (props && !json_is_object(props)) {
            fail(b, "%s", "'properties' must be an object");
            break;
        }
        for (int k = 0; refused_kw[k]; k++)
            if (json_object_get(params, refused_kw[k])) {
                fail(b, "'%s' is not supported by constrained decoding", refused_kw[k]);
                break;
            }
        for (size_t r = 0; r < json_array_size(req); r++) {
            const char *rn = json_string_value(json_array_get(req, r));
            if (!rn || !json_object_get(props, rn)) {
                fail(b, "required parameter '%s' is not in 'properties'", rn ? rn : "?");
                break;
            }
        }
        if (b->failed) break;
        int32_t cur = lits(b, lits(b, f, name), ">\n");
        const char *key;
        const json_t *ps;
        json_object_foreach((json_t *)props, key, ps) {
            char part[300];
            snprintf(part, sizeof part, ".properties.%.250s", key);
            size_t pn = path_push(b, part);
            if (!valid_tag_name(key)) {
                fail(b, "the parameter name '%s' cannot be written in a <parameter=...> tag", key);
                break;
            }
            int required = 0;
            for (size_t r = 0; r < json_array_size(req); r++)
                if (!strcmp(json_string_value(json_array_get(req, r)), key)) required = 1;
            int32_t next = st_new(b);
            if (!required) eps(b, cur, next);
            int32_t x = lits(b, lits(b, lits(b, cur, "<parameter="), key), ">\n");
            int32_t y = st_new(b);
            int untyped;
            if (param_is_string(ps, &untyped)) {
                if (untyped && json_is_object(ps) &&
                    (json_object_get(ps, "$ref") || json_object_get(ps, "properties") ||
                     json_object_get(ps, "items"))) {
                    fail(b, "%s", "a parameter without a 'type' is read back as a string; give it a 'type'");
                    break;
                }
                for (int k = 0; json_is_object(ps) && refused_kw[k]; k++)
                    if (json_object_get(ps, refused_kw[k])) {
                        fail(b, "'%s' is not supported by constrained decoding", refused_kw[k]);
                        break;
                    }
                if (b->failed) break;
                long long mn, mx;
                int r = json_is_object(ps) ? str_bounds(b, ps, &mn, &mx) : 0;
                if (r < 0) break;
                if (json_object_get(ps, "enum") || json_object_get(ps, "const")) {
                    if (enum_alts(b, ps, x, y, 1)) break;
                } else {
                    eps(b, call(b, x, r ? counted_text(b, mn, mx, 0, 1) : b->raw_t), y);
                }
            } else {
                int32_t r = schema_rule(b, ps, 1);
                if (b->failed) break;
                eps(b, call(b, x, r), y);
            }
            eps(b, lits(b, y, "\n</parameter>\n"), next);
            path_pop(b, pn);
            cur = next;
        }
        if (b->failed) break;
        eps(b, lits(b, cur, "</function>\n</tool_call>"), end);
        n_ok++;
    }
    if (!b->failed && n_ok == 0) {
        snprintf(b->path, sizeof b->path, "tools");
        if (only) fail(b, "no function named '%s'", only);
        else fail(b, "%s", "no function to call");
    }
    return s;
}

/* ---- GBNF (llama.cpp's grammar format) ------------------------------------------------ */

/* Code points lo..hi (same UTF-8 length n, bytes L and H) from `from` to `to`. */
static void utf8_bytes_range(struct builder *b, int32_t from, const uint8_t *L, const uint8_t *H,
                             int n, int32_t to) {
    if (n == 1) {
        edge(b, from, L[0], H[0], to);
        return;
    }
    int lo_min = 1, hi_max = 1;
    for (int i = 1; i < n; i++) lo_min &= L[i] == 0x80, hi_max &= H[i] == 0xBF;
    if (L[0] == H[0] || (lo_min && hi_max)) {
        int32_t mid = st_new(b);
        edge(b, from, L[0], H[0], mid);
        utf8_bytes_range(b, mid, L + 1, H + 1, n - 1, to);
        return;
    }
    uint8_t top[4] = {0xBF, 0xBF, 0xBF, 0xBF}, bot[4] = {0x80, 0x80, 0x80, 0x80};
    int32_t mid = st_new(b); /* L[0] then L[1..] .. BF.. */
    edge(b, from, L[0], L[0], mid);
    utf8_bytes_range(b, mid, L + 1, top, n - 1, to);
    if (L[0] + 1 <= H[0] - 1) {
        mid = st_new(b);
        edge(b, from, L[0] + 1, H[0] - 1, mid);
        utf8_bytes_range(b, mid, bot, top, n - 1, to);
    }
    mid = st_new(b);
    edge(b, from, H[0], H[0], mid);
    utf8_bytes_range(b, mid, bot, H + 1, n - 1, to);
}

static int utf8_encode(uint32_t c, uint8_t *o) {
    if (c < 0x80) return o[0] = (uint8_t)c, 1;
    if (c < 0x800) return o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)), 2;
    if (c < 0x10000)
        return o[0] = (uint8_t)(0xE0 | c >> 12), o[1] = (uint8_t)(0x80 | (c >> 6 & 63)),
               o[2] = (uint8_t)(0x80 | (c & 63)), 3;
    return o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | (c >> 12 & 63)),
           o[2] = (uint8_t)(0x80 | (c >> 6 & 63)), o[3] = (uint8_t)(0x80 | (c & 63)), 4;
}

/* Code points lo..hi (no surrogates) as UTF-8, from `from` to `to`. */
static void cp_range(struct builder *b, int32_t from, uint32_t lo, uint32_t hi, int32_t to) {
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xD7FF, 0xDFFF, 0xFFFF, 0x10FFFF};
    uint32_t start = 0;
    for (int k = 0; k < 6; k++) {
        uint32_t a = lo > start ? lo : start, z = hi < bounds[k] ? hi : bounds[k];
        if (a <= z && k != 3) { /* k == 3: the surrogates */
            uint8_t L[4], H[4];
            int n = utf8_encode(a, L);
            utf8_encode(z, H);
            utf8_bytes_range(b, from, L, H, n, to);
        }
        start = bounds[k] + 1;
    }
}

struct gbnf {
    struct builder *b;
    const char *src, *p, *end;
    struct {
        const char *name;
        size_t len;
        const char *body; /* after ::= */
        int32_t start;
        int defined;
    } rules[512];
    int n_rules;
};

static int gbnf_fail(struct gbnf *G, const char *what) {
    int line = 1;
    for (const char *q = G->src; q < G->p && q < G->end; q++) line += *q == '\n';
    if (!G->b->failed) error_set(G->b->err, "grammar: line %d: %s", line, what);
    G->b->failed = 1;
    return -1;
}

static void gbnf_ws(struct gbnf *G, int newlines) {
    for (;;) {
        while (G->p < G->end && (*G->p == ' ' || *G->p == '\t' || *G->p == '\r' ||
                                 (newlines && *G->p == '\n')))
            G->p++;
        if (G->p < G->end && *G->p == '#') {
            while (G->p < G->end && *G->p != '\n') G->p++;
            continue;
        }
        /* a line that continues the rule: newline then indentation or an operator */
        if (!newlines && G->p + 1 < G->end && *G->p == '\n') {
            const char *q = G->p + 1;
            while (q < G->end && (*q == ' ' || *q == '\t')) q++;
            if (q < G->end && (q > G->p + 1 || *q == '|')) {
                G->p = q;
                continue;
            }
        }
        return;
    }
}

static int is_name(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int gbnf_rule_index(struct gbnf *G, const char *name, size_t len) {
    for (int i = 0; i < G->n_rules; i++)
        if (G->rules[i].len == len && !memcmp(G->rules[i].name, name, len)) return i;
    return -1;
}

/* One character of a literal or class (an escape or a UTF-8 character): its code point. */
static int gbnf_char(struct gbnf *G, uint32_t *cp) {
    if (G->p >= G->end) return gbnf_fail(G, "unexpected end");
    unsigned char c = (unsigned char)*G->p;
    if (c == '\\') {
        G->p++;
        if (G->p >= G->end) return gbnf_fail(G, "unexpected end after '\\'");
        char e = *G->p++;
        int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (hex) {
            uint32_t v = 0;
            for (int i = 0; i < hex; i++, G->p++) {
                char h = G->p < G->end ? *G->p : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) return gbnf_fail(G, "a bad hex escape");
                v = v * 16 + (uint32_t)d;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return gbnf_fail(G, "an escape outside Unicode");
            *cp = v;
            return 0;
        }
        switch (e) {
        case 'n': *cp = '\n'; break;
        case 'r': *cp = '\r'; break;
        case 't': *cp = '\t'; break;
        case '\\': case '"': case '[': case ']': case '-': case '^': *cp = (unsigned char)e; break;
        default: return gbnf_fail(G, "an unknown escape");
        }
        return 0;
    }
    int k = 1;
    if (c >= 0x80) {
        k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (G->p + k > G->end) return gbnf_fail(G, "invalid UTF-8");
        uint32_t v = c & (0x3F >> (k - 1));
        for (int i = 1; i < k; i++) {
            unsigned char x = (unsigned char)G->p[i];
            if ((x & 0xC0) != 0x80) return gbnf_fail(G, "invalid UTF-8");
            v = v << 6 | (x & 63);
        }
        *cp = v;
    } else {
        *cp = c;
    }
    G->p += k;
    return 0;
}

static int32_t gbnf_alts(struct gbnf *G, int32_t from, int depth);

static int32_t gbnf_rule_start(struct gbnf *G, int i);

/* One primary (literal, class, rule, group, '.') from `from`; returns its end state. */
static int32_t gbnf_primary(struct gbnf *G, int32_t from, int depth) {
    struct builder *b = G->b;
    if (G->p >= G->end) return gbnf_fail(G, "an element is missing"), from;
    char c = *G->p;
    if (c == '"') {
        G->p++;
        while (G->p < G->end && *G->p != '"' && !b->failed) {
            uint32_t cp;
            if (gbnf_char(G, &cp)) break;
            uint8_t o[4];
            int n = utf8_encode(cp, o);
            from = lit(b, from, (const char *)o, (size_t)n);
        }
        if (G->p >= G->end) return gbnf_fail(G, "an unterminated literal"), from;
        G->p++;
        return from;
    }
    if (c == '[') {
        G->p++;
        int neg = G->p < G->end && *G->p == '^';
        if (neg) G->p++;
        uint32_t lo[256], hi[256];
        int n = 0;
        while (G->p < G->end && *G->p != ']' && !b->failed) {
            uint32_t a, z;
            if (gbnf_char(G, &a)) break;
            z = a;
            if (G->p + 1 < G->end && *G->p == '-' && G->p[1] != ']') {
                G->p++;
                if (gbnf_char(G, &z)) break;
                if (z < a) return gbnf_fail(G, "a reversed range in a class"), from;
            }
            if (n == 256) return gbnf_fail(G, "a class of more than 256 ranges"), from;
            lo[n] = a, hi[n++] = z;
        }
        if (b->failed) return from;
        if (G->p >= G->end) return gbnf_fail(G, "an unterminated class"), from;
        G->p++;
        int32_t to = st_new(b);
        if (!neg) {
            for (int i = 0; i < n; i++) cp_range(b, from, lo[i], hi[i], to);
            return to;
        }
        /* the complement over all code points: sort the ranges, emit the gaps */
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && lo[j - 1] > lo[j]; j--) {
                uint32_t t = lo[j]; lo[j] = lo[j - 1], lo[j - 1] = t;
                t = hi[j]; hi[j] = hi[j - 1], hi[j - 1] = t;
            }
        uint32_t next = 0;
        for (int i = 0; i < n; i++) {
            if (lo[i] > next) cp_range(b, from, next, lo[i] - 1, to);
            if (hi[i] + 1 > next) next = hi[i] + 1;
        }
        if (next <= 0x10FFFF) cp_range(b, from, next, 0x10FFFF, to);
        return to;
    }
    if (c == '.') {
        G->p++;
        int32_t to = st_new(b);
        cp_range(b, from, 0, 0x10FFFF, to);
        return to;
    }
    if (c == '(') {
        G->p++;
        int32_t to = gbnf_alts(G, from, depth + 1);
        gbnf_ws(G, 1);
        if (G->p >= G->end || *G->p != ')') return gbnf_fail(G, "a '(' without its ')'"), to;
        G->p++;
        return to;
    }
    if (is_name(c)) {
        const char *name = G->p;
        while (G->p < G->end && is_name(*G->p)) G->p++;
        int i = gbnf_rule_index(G, name, (size_t)(G->p - name));
        if (i < 0) {
            char m[200];
            snprintf(m, sizeof m, "the rule '%.*s' is not defined", (int)(G->p - name > 100 ? 100 : G->p - name), name);
            return gbnf_fail(G, m), from;
        }
        return call(b, from, gbnf_rule_start(G, i));
    }
    return gbnf_fail(G, "an unexpected character"), from;
}

/* A primary with its repetition (* + ? {m} {m,} {m,n}): the primary is parsed once to find
 * its extent (into states nothing reaches), then emitted as many times as the count needs. */
static int32_t gbnf_item(struct gbnf *G, int32_t from, int depth) {
    struct builder *b = G->b;
    const char *start = G->p;
    (void)gbnf_primary(G, st_new(b), depth);
    if (b->failed) return from;
    long mn = 1, mx = 1;
    const char *after = G->p;
    if (G->p < G->end) {
        char op = *G->p;
        if (op == '*') mn = 0, mx = -1, after = G->p + 1;
        else if (op == '+') mn = 1, mx = -1, after = G->p + 1;
        else if (op == '?') mn = 0, mx = 1, after = G->p + 1;
        else if (op == '{') {
            char *q;
            mn = strtol(G->p + 1, &q, 10);
            if (q == G->p + 1 || mn < 0) return gbnf_fail(G, "a bad {m,n}"), from;
            mx = mn;
            if (*q == ',') {
                q++;
                mx = *q == '}' ? -1 : strtol(q, &q, 10);
            }
            if (*q != '}' || (mx >= 0 && mx < mn) || mn > 256 || mx > 256)
                return gbnf_fail(G, "a bad {m,n} (counts up to 256)"), from;
            after = q + 1;
        }
    }
    int32_t cur = from;
    for (long k = 0; k < mn && !b->failed; k++) {
        G->p = start;
        cur = gbnf_primary(G, cur, depth);
    }
    if (mx < 0) {
        int32_t loop = st_new(b);
        eps(b, cur, loop);
        G->p = start;
        eps(b, gbnf_primary(G, loop, depth), loop);
        cur = loop;
    } else if (mx > mn) {
        int32_t out = st_new(b);
        eps(b, cur, out);
        for (long k = mn; k < mx && !b->failed; k++) {
            G->p = start;
            cur = gbnf_primary(G, cur, depth);
            eps(b, cur, out);
        }
        cur = out;
    }
    G->p = after;
    return cur;
}

static int32_t gbnf_seq(struct gbnf *G, int32_t from, int depth) {
    for (;;) {
        gbnf_ws(G, depth > 0);
        if (G->p >= G->end || *G->p == '|' || *G->p == ')' || *G->p == '\n' || G->b->failed) return from;
        /* the next rule's "name ::=" ends this one */
        const char *q = G->p;
        while (q < G->end && is_name(*q)) q++;
        const char *r = q;
        while (r < G->end && (*r == ' ' || *r == '\t')) r++;
        if (q > G->p && G->end - r >= 3 && !memcmp(r, "::=", 3)) return from;
        from = gbnf_item(G, from, depth);
    }
}

static int32_t gbnf_alts(struct gbnf *G, int32_t from, int depth) {
    if (depth > 64) return gbnf_fail(G, "groups nest deeper than 64"), from;
    int32_t join = st_new(G->b);
    for (;;) {
        eps(G->b, gbnf_seq(G, from, depth), join);
        gbnf_ws(G, depth > 0);
        if (G->p < G->end && *G->p == '|' && !G->b->failed) {
            G->p++;
            continue;
        }
        return join;
    }
}

static int32_t gbnf_rule_start(struct gbnf *G, int i) {
    if (G->rules[i].start >= 0) return G->rules[i].start;
    struct builder *b = G->b;
    int32_t s = st_new(b);
    G->rules[i].start = s;
    const char *saved = G->p;
    G->p = G->rules[i].body;
    int32_t e = gbnf_alts(G, s, 0);
    b->acc[e] = 1;
    G->p = saved;
    return s;
}

/* Compiles a GBNF text; returns the start state of its rule "root". */
static int32_t gbnf_compile(struct builder *b, const char *text, size_t n) {
    struct gbnf *G = xcalloc(1, sizeof *G);
    G->b = b, G->src = G->p = text, G->end = text + n;
    /* the rules: "name ::=" at the start of a line */
    const char *line = text;
    while (line < G->end) {
        const char *q = line;
        while (q < G->end && (*q == ' ' || *q == '\t')) q++;
        const char *name = q;
        while (q < G->end && is_name(*q)) q++;
        const char *r = q;
        while (r < G->end && (*r == ' ' || *r == '\t')) r++;
        if (q > name && G->end - r >= 3 && !memcmp(r, "::=", 3)) {
            if (gbnf_rule_index(G, name, (size_t)(q - name)) >= 0) {
                G->p = name;
                gbnf_fail(G, "a rule defined twice");
                break;
            }
            if (G->n_rules == 512) {
                G->p = name;
                gbnf_fail(G, "more than 512 rules");
                break;
            }
            G->rules[G->n_rules].name = name, G->rules[G->n_rules].len = (size_t)(q - name);
            G->rules[G->n_rules].body = r + 3, G->rules[G->n_rules].start = -1;
            G->n_rules++;
        }
        const char *nl = memchr(line, '\n', (size_t)(G->end - line));
        line = nl ? nl + 1 : G->end;
    }
    int32_t root = 0;
    if (!b->failed) {
        int i = gbnf_rule_index(G, "root", 4);
        if (i < 0) {
            G->p = text;
            gbnf_fail(G, "no rule 'root'");
        } else {
            root = gbnf_rule_start(G, i);
        }
    }
    free(G);
    return root;
}

/* ---- finishing: flatten, check, shortest lengths -------------------------------------- */

static int rule_left_cycle(const struct grammar *g, const uint8_t *nullable, int32_t *bad) {
    /* the rules (call targets) each may enter without consuming a byte */
    int n = g->n_st;
    int32_t *rule_of = xmalloc((size_t)n * sizeof *rule_of); /* state -> rule index, -1 */
    for (int i = 0; i < n; i++) rule_of[i] = -1;
    int n_rules = 0;
    int32_t *rules = xmalloc((size_t)(n + 1) * sizeof *rules);
    rules[n_rules] = g->start, rule_of[g->start] = n_rules++;
    for (int s = 0; s < n; s++)
        for (int k = 0; k < g->st[s].nx; k++) {
            int32_t c = g->x[g->st[s].x0 + k].call;
            if (c >= 0 && rule_of[c] < 0) rules[n_rules] = c, rule_of[c] = n_rules++;
        }
    /* left-call edges, by a walk from each rule start over epsilon moves and nullable calls */
    int32_t *adj_off = xcalloc((size_t)n_rules + 1, sizeof *adj_off);
    int32_t *adj = NULL;
    int n_adj = 0, cap_adj = 0;
    uint32_t *seen = xcalloc((size_t)n, sizeof *seen);
    int32_t *stk = xmalloc((size_t)n * sizeof *stk);
    for (int r = 0; r < n_rules; r++) {
        adj_off[r] = n_adj;
        int sp = 0;
        stk[sp++] = rules[r];
        seen[rules[r]] = (uint32_t)r + 1;
        while (sp) {
            int32_t s = stk[--sp];
            for (int k = 0; k < g->st[s].nx; k++) {
                const struct gx *x = &g->x[g->st[s].x0 + k];
                if (x->call >= 0) {
                    if (n_adj == cap_adj) {
                        cap_adj = cap_adj ? 2 * cap_adj : 256;
                        adj = xrealloc(adj, (size_t)cap_adj * sizeof *adj);
                    }
                    adj[n_adj++] = rule_of[x->call];
                    if (!nullable[x->call]) continue;
                }
                if (seen[x->to] != (uint32_t)r + 1) {
                    seen[x->to] = (uint32_t)r + 1;
                    stk[sp++] = x->to;
                }
            }
        }
    }
    adj_off[n_rules] = n_adj;
    /* a cycle in the left-call graph: iterative DFS with colours */
    uint8_t *color = xcalloc((size_t)n_rules, 1);
    int32_t *it = xmalloc((size_t)n_rules * sizeof *it);
    int cyc = 0;
    for (int r0 = 0; r0 < n_rules && !cyc; r0++) {
        if (color[r0]) continue;
        int sp = 0;
        stk[sp++] = r0;
        it[r0] = adj_off[r0];
        color[r0] = 1;
        while (sp && !cyc) {
            int r = stk[sp - 1];
            if (it[r] < adj_off[r + 1]) {
                int q = adj[it[r]++];
                if (color[q] == 1) cyc = 1, *bad = rules[q];
                else if (!color[q]) color[q] = 1, it[q] = adj_off[q], stk[sp++] = q;
            } else {
                color[r] = 2;
                sp--;
            }
        }
    }
    free(rule_of), free(rules), free(adj_off), free(adj), free(seen), free(stk), free(color), free(it);
    return cyc;
}

static struct grammar *finish(struct builder *b, int32_t start, int n_prelude) {
    struct grammar *g = xcalloc(1, sizeof *g);
    int n = b->n_st;
    g->n_st = n;
    g->start = start;
    g->n_prelude = n_prelude;
    g->refs = 1;
    pthread_mutex_init(&g->mu, NULL);
    g->st = xcalloc((size_t)n, sizeof *g->st);
    /* byte edges and x edges grouped by source state (counting sort) */
    for (int i = 0; i < b->ne; i++) g->st[b->e[i].from].ne++;
    for (int i = 0; i < b->nx; i++) g->st[b->x[i].from].nx++;
    int32_t eo = 0, xo = 0;
    for (int s = 0; s < n; s++) {
        g->st[s].e0 = eo, eo += g->st[s].ne, g->st[s].ne = 0;
        g->st[s].x0 = xo, xo += g->st[s].nx, g->st[s].nx = 0;
        g->st[s].accept = b->acc[s];
    }
    g->ed = xmalloc((size_t)(eo ? eo : 1) * sizeof *g->ed);
    g->x = xmalloc((size_t)(xo ? xo : 1) * sizeof *g->x);
    for (int i = 0; i < b->ne; i++) {
        struct gstate *st = &g->st[b->e[i].from];
        g->ed[st->e0 + st->ne++] = (struct gedge){b->e[i].lo, b->e[i].hi, b->e[i].to};
    }
    for (int i = 0; i < b->nx; i++) {
        struct gstate *st = &g->st[b->x[i].from];
        g->x[st->x0 + st->nx++] = (struct gx){b->x[i].to, b->x[i].call};
    }
    /* shortest completion within each rule (Bellman-Ford, high ids first: chains run upward) */
    for (int s = 0; s < n; s++) g->st[s].minlen = g->st[s].accept ? 0 : INF_LEN;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = n - 1; s >= 0; s--) {
            struct gstate *st = &g->st[s];
            int32_t m = st->minlen;
            for (int k = 0; k < st->ne; k++) {
                int32_t t = g->st[g->ed[st->e0 + k].to].minlen;
                if (t < INF_LEN && t + 1 < m) m = t + 1;
            }
            for (int k = 0; k < st->nx; k++) {
                const struct gx *x = &g->x[st->x0 + k];
                int32_t t = g->st[x->to].minlen, c = x->call >= 0 ? g->st[x->call].minlen : 0;
                if (t < INF_LEN && c < INF_LEN && t + c < m) m = t + c;
            }
            if (m < st->minlen) st->minlen = m, changed = 1;
        }
    }
    if (g->st[start].minlen >= INF_LEN) {
        error_set(b->err, "the schema has no finite instance (a required property or item recurses "
                          "forever)");
        grammar_unref(g);
        return NULL;
    }
    /* drop moves into states that can never complete */
    for (int s = 0; s < n; s++) {
        struct gstate *st = &g->st[s];
        int w = 0;
        for (int k = 0; k < st->ne; k++)
            if (g->st[g->ed[st->e0 + k].to].minlen < INF_LEN) g->ed[st->e0 + w++] = g->ed[st->e0 + k];
        st->ne = w;
        w = 0;
        for (int k = 0; k < st->nx; k++) {
            const struct gx x = g->x[st->x0 + k];
            if (g->st[x.to].minlen < INF_LEN && (x.call < 0 || g->st[x.call].minlen < INF_LEN))
                g->x[st->x0 + w++] = x;
        }
        st->nx = w;
    }
    /* no rule may reach itself without consuming a byte (the closure would not end) */
    uint8_t *nullable = xcalloc((size_t)n, 1);
    for (int s = 0; s < n; s++) nullable[s] = g->st[s].minlen == 0;
    int32_t bad = -1;
    int cyc = rule_left_cycle(g, nullable, &bad);
    free(nullable);
    if (cyc) {
        error_set(b->err, "the schema refers to itself without consuming input (a $ref cycle "
                          "through $ref or anyOf alone, or a grammar rule that starts with itself)");
        grammar_unref(g);
        return NULL;
    }
    return g;
}

struct grammar *grammar_compile(const struct grammar_spec *spec, struct error *err) {
    struct builder b = {.err = err};
    build_prelude(&b);
    const int n_prelude = b.n_st;
    int32_t root = st_new(&b), x = root, end = st_new(&b);
    b.acc[end] = 1;
    if (spec->after_think) {
        int32_t n1 = byte1(&b, root, '\n'), n2 = byte1(&b, n1, '\n');
        x = st_new(&b);
        eps(&b, root, x), eps(&b, n1, x), eps(&b, n2, x);
    }
    int content = spec->schema || spec->json_object || spec->gbnf;
    if (spec->tools && (spec->tools_required || spec->tool_name || json_array_size(spec->tools) > 0)) {
        if (!json_is_array(spec->tools)) {
            error_set(err, "tools: must be an array");
            goto fail;
        }
        int32_t calls = tool_call_rule(&b, spec->tools, spec->tool_name);
        if (b.failed) goto fail;
        int32_t a = call(&b, x, calls);
        eps(&b, a, end);
        if (spec->parallel) eps(&b, call(&b, byte1(&b, a, '\n'), calls), a);
    } else if (spec->tools_required) {
        error_set(err, "tools: a tool call is required but no tools are given");
        goto fail;
    }
    if (content && !spec->tools_required && !spec->tool_name) {
        snprintf(b.path, sizeof b.path, "schema");
        b.root = spec->schema;
        int32_t r = spec->gbnf ? gbnf_compile(&b, spec->gbnf, strlen(spec->gbnf))
                    : spec->schema ? schema_rule(&b, spec->schema, 0) : b.object;
        if (b.failed) goto fail;
        eps(&b, call(&b, x, r), end);
    } else if (!content && !(spec->tools && json_array_size(spec->tools) > 0)) {
        error_set(err, "nothing to constrain: no schema, json_object or tools");
        goto fail;
    }
    if (b.failed) goto fail;
    struct grammar *g = finish(&b, root, n_prelude);
    free(b.acc), free(b.e), free(b.x), free(b.memo);
    return g;
fail:
    free(b.acc), free(b.e), free(b.x), free(b.memo);
    return NULL;
}

void grammar_ref(struct grammar *g) {
    pthread_mutex_lock(&g->mu);
    g->refs++;
    pthread_mutex_unlock(&g->mu);
}

static void sclass_free(struct sclass *c);

void grammar_unref(struct grammar *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left > 0) return;
    if (g->cls)
        for (int i = 0; i < g->n_st; i++) sclass_free(g->cls[i]);
    free(g->cls);
    free(g->st), free(g->ed), free(g->x);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

int grammar_n_states(const struct grammar *g) { return g->n_st; }

/* ---- the vocabulary and its byte trie -------------------------------------------------- */

struct sclass {
    int32_t *acc; /* (n_acc,) accepted token ids, or NULL when acc_bits holds them */
    int n_acc;
    uint64_t *acc_bits;
    uint16_t *acc_d;   /* bytes still needed after each accepted token (clipped at 65535):
                          indexed like acc, or by token id with acc_bits */
    int max_d;         /* the largest of acc_d */
    int32_t *unc_tok; /* (n_unc,) context-dependent: token, and the bytes it consumed when */
    uint16_t *unc_off; /* its path left the rule; grouped by offset, in trie order within one */
    uint16_t *unc_lcp; /* (so remainders come in sorted runs), each remainder's common prefix
                          length with the one before */
    int n_unc;
};

static void sclass_free(struct sclass *c) {
    if (!c) return;
    free(c->acc), free(c->acc_bits), free(c->acc_d), free(c->unc_tok), free(c->unc_off), free(c->unc_lcp);
    free(c);
}

struct grammar_vocab {
    int n_tokens;
    size_t words;
    char *blob;       /* every token's bytes */
    uint32_t *off;    /* (n_tokens + 1,) token i is blob[off[i], off[i + 1]) */
    uint8_t *is_stop; /* (n_tokens,) */
    int32_t *stop;
    int n_stop;
    uint64_t *all_bits; /* every token with bytes, no stop token */
    /* the trie in depth-first order: node i has byte tb[i] at depth td[i] (1-based), its subtree
     * is [i, tend[i]), ttok[i] the first token ending there (tnext[] chains the others) */
    int n_nodes;
    uint8_t *tb;
    uint16_t *td;
    int32_t *tend, *ttok, *tnext;
    int max_depth;
    pthread_mutex_t mu;
    struct sclass **pre; /* (n_pre,) the prelude states' classes */
    int n_pre;
    /* free_until: for each partial-match length k, the tokens that complete it and where */
    char trig[32];
    int trig_len;
    int32_t *trig_tok[32];
    uint16_t *trig_off[32];
    int trig_n[32];
};

static const struct grammar_vocab *sort_vocab; /* qsort has no context argument */
static int tok_cmp(const void *a, const void *b) {
    const struct grammar_vocab *v = sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->blob + v->off[x], v->blob + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

struct grammar_vocab *grammar_vocab_new(int n_tokens, const char *const *bytes, const size_t *len,
                                        const int32_t *stop, int n_stop) {
    static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;
    CHECK(n_tokens > 0);
    struct grammar_vocab *v = xcalloc(1, sizeof *v);
    v->n_tokens = n_tokens;
    v->words = ((size_t)n_tokens + 63) / 64;
    v->is_stop = xcalloc((size_t)n_tokens, 1);
    v->stop = xmalloc((size_t)(n_stop ? n_stop : 1) * sizeof *v->stop);
    for (int i = 0; i < n_stop; i++)
        if (stop[i] >= 0 && stop[i] < n_tokens && !v->is_stop[stop[i]]) {
            v->is_stop[stop[i]] = 1;
            v->stop[v->n_stop++] = stop[i];
        }
    size_t total = 0;
    for (int i = 0; i < n_tokens; i++)
        if (bytes[i] && !v->is_stop[i] && len[i] <= 65535) total += len[i];
    v->blob = xmalloc(total ? total : 1);
    v->off = xmalloc(((size_t)n_tokens + 1) * sizeof *v->off);
    v->all_bits = xcalloc(v->words, sizeof *v->all_bits);
    int32_t *ids = xmalloc((size_t)n_tokens * sizeof *ids);
    int n_ids = 0;
    size_t o = 0;
    for (int i = 0; i < n_tokens; i++) {
        v->off[i] = (uint32_t)o;
        if (!bytes[i] || len[i] == 0 || len[i] > 65535 || v->is_stop[i]) continue;
        memcpy(v->blob + o, bytes[i], len[i]);
        o += len[i];
        ids[n_ids++] = i;
        v->all_bits[i / 64] |= 1ull << (i % 64);
    }
    v->off[n_tokens] = (uint32_t)o;
    pthread_mutex_lock(&sort_mu);
    sort_vocab = v;
    qsort(ids, (size_t)n_ids, sizeof *ids, tok_cmp);
    pthread_mutex_unlock(&sort_mu);
    /* the trie: sorted order is depth-first order; lcp with the previous token shares nodes */
    size_t cap = total + 1;
    v->tb = xmalloc(cap);
    v->td = xmalloc(cap * sizeof *v->td);
    v->tend = xmalloc(cap * sizeof *v->tend);
    v->ttok = xmalloc(cap * sizeof *v->ttok);
    v->tnext = xmalloc((size_t)n_tokens * sizeof *v->tnext);
    int32_t *path = xmalloc((65536 + 1) * sizeof *path); /* the trie nodes of the current token */
    int depth = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int k = 0; k < n_ids; k++) {
        int32_t t = ids[k];
        const char *p = v->blob + v->off[t];
        uint32_t l = v->off[t + 1] - v->off[t], lcp = 0;
        while (prev && lcp < l && lcp < prev_len && p[lcp] == prev[lcp]) lcp++;
        while (depth > (int)lcp) v->tend[path[depth--]] = v->n_nodes;
        for (uint32_t d = lcp; d < l; d++) {
            int i = v->n_nodes++;
            v->tb[i] = (uint8_t)p[d];
            v->td[i] = (uint16_t)(d + 1);
            v->ttok[i] = -1;
            path[++depth] = i;
        }
        if ((int)l > v->max_depth) v->max_depth = (int)l;
        int32_t node = path[l];
        v->tnext[t] = v->ttok[node];
        v->ttok[node] = t;
        prev = p, prev_len = l;
    }
    while (depth > 0) v->tend[path[depth--]] = v->n_nodes;
    free(path);
    free(ids);
    pthread_mutex_init(&v->mu, NULL);
    return v;
}

void grammar_vocab_free(struct grammar_vocab *v) {
    if (!v) return;
    for (int i = 0; i < v->n_pre; i++) sclass_free(v->pre[i]);
    free(v->pre);
    for (int k = 0; k < 32; k++) free(v->trig_tok[k]), free(v->trig_off[k]);
    free(v->blob), free(v->off), free(v->is_stop), free(v->stop), free(v->all_bits);
    free(v->tb), free(v->td), free(v->tend), free(v->ttok), free(v->tnext);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

int grammar_vocab_n_tokens(const struct grammar_vocab *v) { return v->n_tokens; }
size_t grammar_mask_words(const struct grammar_vocab *v) { return v->words; }

/* ---- stacks and stack sets (a lazily built DFA) -------------------------------------- */

#define NODE_ROOT 0 /* below the root rule: returning here completes the output */
#define NODE_BASE 1 /* below the state being classified: returning here leaves its rule */
#define F_ACC 1
#define F_BASE 2

struct hmap { /* uint64 key -> int32 value, open addressing; keys stored + 1 (0: empty) */
    uint64_t *k;
    int32_t *v;
    size_t cap, n;
};

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t hmap_get(const struct hmap *h, uint64_t key) {
    if (!h->cap) return -1;
    size_t m = h->cap - 1, i = mix64(key) & m;
    for (;; i = (i + 1) & m) {
        if (h->k[i] == 0) return -1;
        if (h->k[i] == key + 1) return h->v[i];
    }
}

static void hmap_put(struct hmap *h, uint64_t key, int32_t val) {
    if ((h->n + 1) * 2 > h->cap) {
        struct hmap old = *h;
        h->cap = old.cap ? 2 * old.cap : 1024;
        h->k = xcalloc(h->cap, sizeof *h->k);
        h->v = xmalloc(h->cap * sizeof *h->v);
        h->n = 0;
        for (size_t i = 0; i < old.cap; i++)
            if (old.k[i]) hmap_put(h, old.k[i] - 1, old.v[i]);
        free(old.k), free(old.v);
    }
    size_t m = h->cap - 1, i = mix64(key) & m;
    while (h->k[i] && h->k[i] != key + 1) i = (i + 1) & m;
    if (!h->k[i]) h->n++;
    h->k[i] = key + 1;
    h->v[i] = val;
}

static void hmap_free(struct hmap *h) { free(h->k), free(h->v); }

struct pset {
    uint32_t off; /* pool[off, off + n): byte-ready stack nodes, ascending */
    int32_t n;
    uint64_t hash;
    uint8_t flags; /* F_ACC: the output may end; F_BASE: the classified rule may end */
};

struct pda {
    const struct grammar *g;
    int32_t *nst, *npar; /* (n_nodes,) node = (state, parent node) */
    int n_nodes, cap_nodes;
    struct hmap nodes;
    uint32_t *mark, gen;
    int32_t *pool;
    size_t n_pool, cap_pool;
    struct pset *sets;
    int n_sets, cap_sets;
    int32_t *stab; /* set intern table: set ids, -1 empty */
    size_t stab_cap;
    struct hmap trans;    /* set * 256 + byte -> set */
    struct hmap node_set; /* node -> the closure of that node alone */
    int32_t *stk, *out;
    int n_stk, cap_stk, n_out, cap_out;
    uint8_t oflags;
};

static int32_t node_new(struct pda *p, int32_t st, int32_t par) {
    if (p->n_nodes == p->cap_nodes) {
        size_t old = (size_t)p->cap_nodes;
        p->cap_nodes = p->cap_nodes ? 2 * p->cap_nodes : 1024;
        p->nst = xrealloc(p->nst, (size_t)p->cap_nodes * sizeof *p->nst);
        p->npar = xrealloc(p->npar, (size_t)p->cap_nodes * sizeof *p->npar);
        p->mark = xrealloc(p->mark, (size_t)p->cap_nodes * sizeof *p->mark);
        memset(p->mark + old, 0, ((size_t)p->cap_nodes - old) * sizeof *p->mark);
    }
    p->nst[p->n_nodes] = st;
    p->npar[p->n_nodes] = par;
    return p->n_nodes++;
}

static int32_t node_get(struct pda *p, int32_t st, int32_t par) {
    uint64_t key = (uint64_t)(uint32_t)st << 32 | (uint32_t)par;
    int32_t n = hmap_get(&p->nodes, key);
    if (n >= 0) return n;
    n = node_new(p, st, par);
    hmap_put(&p->nodes, key, n);
    return n;
}

static void pda_init(struct pda *p, const struct grammar *g) {
    memset(p, 0, sizeof *p);
    p->g = g;
    node_new(p, -1, -1); /* NODE_ROOT */
    node_new(p, -1, -1); /* NODE_BASE */
    p->gen = 1;
}

static void pda_free(struct pda *p) {
    free(p->nst), free(p->npar), free(p->mark), free(p->pool), free(p->sets), free(p->stab);
    hmap_free(&p->nodes), hmap_free(&p->trans), hmap_free(&p->node_set);
    free(p->stk), free(p->out);
}

static void push(struct pda *p, int32_t n) {
    if (p->n_stk == p->cap_stk) {
        p->cap_stk = p->cap_stk ? 2 * p->cap_stk : 256;
        p->stk = xrealloc(p->stk, (size_t)p->cap_stk * sizeof *p->stk);
    }
    p->stk[p->n_stk++] = n;
}

/* Closes the pushed nodes over epsilon moves, calls and returns: byte-ready nodes go to out,
 * returns below the stack to oflags. */
static void closure(struct pda *p) {
    const struct grammar *g = p->g;
    while (p->n_stk) {
        int32_t n = p->stk[--p->n_stk];
        if (p->mark[n] == p->gen) continue;
        p->mark[n] = p->gen;
        int32_t s = p->nst[n], par = p->npar[n];
        const struct gstate *st = &g->st[s];
        if (st->ne) {
            if (p->n_out == p->cap_out) {
                p->cap_out = p->cap_out ? 2 * p->cap_out : 256;
                p->out = xrealloc(p->out, (size_t)p->cap_out * sizeof *p->out);
            }
            p->out[p->n_out++] = n;
        }
        if (st->accept) {
            if (par == NODE_ROOT) p->oflags |= F_ACC;
            else if (par == NODE_BASE) p->oflags |= F_BASE;
            else push(p, par); /* return: the parent holds the return state */
        }
        for (int k = 0; k < st->nx; k++) {
            const struct gx *x = &g->x[st->x0 + k];
            if (x->call < 0) push(p, node_get(p, x->to, par));
            else push(p, node_get(p, x->call, node_get(p, x->to, par)));
        }
    }
}

static void begin(struct pda *p) {
    p->gen++;
    p->n_out = 0;
    p->n_stk = 0;
    p->oflags = 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Interns out[0..n_out) + oflags as a set. */
static int32_t intern(struct pda *p) {
    int n = p->n_out;
    if (n > 1) {
        if (n < 16) {
            for (int i = 1; i < n; i++)
                for (int j = i; j > 0 && p->out[j - 1] > p->out[j]; j--) {
                    int32_t t = p->out[j];
                    p->out[j] = p->out[j - 1], p->out[j - 1] = t;
                }
        } else {
            qsort(p->out, (size_t)n, sizeof *p->out, cmp_i32);
        }
    }
    uint64_t h = mix64(0x1234567ull + p->oflags);
    for (int i = 0; i < n; i++) h = mix64(h ^ (uint64_t)(uint32_t)p->out[i]);
    if (p->stab_cap && (size_t)(p->n_sets + 1) * 2 <= p->stab_cap) {
        size_t m = p->stab_cap - 1;
        for (size_t i = h & m;; i = (i + 1) & m) {
            int32_t id = p->stab[i];
            if (id < 0) break;
            const struct pset *s = &p->sets[id];
            if (s->hash == h && s->n == n && s->flags == p->oflags &&
                (n == 0 || !memcmp(p->pool + s->off, p->out, (size_t)n * sizeof *p->out)))
                return id;
        }
    } else { /* grow the intern table */
        free(p->stab);
        p->stab_cap = p->stab_cap ? 2 * p->stab_cap : 1024;
        p->stab = xmalloc(p->stab_cap * sizeof *p->stab);
        for (size_t i = 0; i < p->stab_cap; i++) p->stab[i] = -1;
        for (int id = 0; id < p->n_sets; id++) {
            size_t m = p->stab_cap - 1, i = p->sets[id].hash & m;
            while (p->stab[i] >= 0) i = (i + 1) & m;
            p->stab[i] = id;
        }
        return intern(p); /* look up again in the bigger table */
    }
    if (p->n_pool + (size_t)n > p->cap_pool) {
        p->cap_pool = (p->n_pool + (size_t)n) * 2 + 1024;
        p->pool = xrealloc(p->pool, p->cap_pool * sizeof *p->pool);
    }
    if (n) memcpy(p->pool + p->n_pool, p->out, (size_t)n * sizeof *p->out);
    if (p->n_sets == p->cap_sets) {
        p->cap_sets = p->cap_sets ? 2 * p->cap_sets : 256;
        p->sets = xrealloc(p->sets, (size_t)p->cap_sets * sizeof *p->sets);
    }
    int32_t id = p->n_sets++;
    p->sets[id] = (struct pset){(uint32_t)p->n_pool, n, h, p->oflags};
    p->n_pool += (size_t)n;
    size_t m = p->stab_cap - 1, i = h & m;
    while (p->stab[i] >= 0) i = (i + 1) & m;
    p->stab[i] = id;
    return id;
}

/* The set of one node's closure (memoised). */
static int32_t set_of_node(struct pda *p, int32_t n) {
    int32_t r = hmap_get(&p->node_set, (uint64_t)n);
    if (r >= 0) return r;
    begin(p);
    push(p, n);
    closure(p);
    r = intern(p);
    hmap_put(&p->node_set, (uint64_t)n, r);
    return r;
}

/* A set of nodes that are already byte-ready (no closure). */
static int32_t set_of_ready(struct pda *p, int32_t n) {
    begin(p);
    p->out = p->cap_out ? p->out : xmalloc(256 * sizeof *p->out);
    if (!p->cap_out) p->cap_out = 256;
    p->out[p->n_out++] = n;
    return intern(p);
}

static int32_t step(struct pda *p, int32_t set, uint8_t c) {
    uint64_t key = (uint64_t)(uint32_t)set << 8 | c;
    int32_t r = hmap_get(&p->trans, key);
    if (r >= 0) return r;
    begin(p);
    const struct grammar *g = p->g;
    const int32_t n = p->sets[set].n;
    const uint32_t off = p->sets[set].off;
    for (int32_t i = 0; i < n; i++) {
        int32_t node = p->pool[off + i];
        const struct gstate *st = &g->st[p->nst[node]];
        for (int k = 0; k < st->ne; k++) {
            const struct gedge *e = &g->ed[st->e0 + k];
            if (c >= e->lo && c <= e->hi) {
                push(p, node_get(p, e->to, p->npar[node]));
                closure(p);
            }
        }
    }
    r = intern(p);
    hmap_put(&p->trans, key, r);
    return r;
}

static inline int set_dead(const struct pda *p, int32_t s) {
    return p->sets[s].n == 0 && !(p->sets[s].flags & F_ACC);
}

/* ---- classifying a state's tokens ------------------------------------------------------ */

static void add_i32(int32_t **a, int *n, int *cap, int32_t x) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *a = xrealloc(*a, (size_t)*cap * sizeof **a);
    }
    (*a)[(*n)++] = x;
}

struct unc_acc {
    int32_t *tok;
    uint16_t *off;
    int n, cap;
};
static void add_unc(struct unc_acc *u, int32_t t, int off) {
    if (u->n == u->cap) {
        u->cap = u->cap ? 2 * u->cap : 64;
        u->tok = xrealloc(u->tok, (size_t)u->cap * sizeof *u->tok);
        u->off = xrealloc(u->off, (size_t)u->cap * sizeof *u->off);
    }
    u->tok[u->n] = t;
    u->off[u->n++] = (uint16_t)off;
}

/* Every token that passes trie node i's subtree [i, end) gets an uncertain entry for each pop
 * depth recorded on its path (depths 1..d, flagged in pop[]). */
static void unc_subtree(const struct grammar_vocab *v, int i, int end, const uint8_t *pop, int d,
                        struct unc_acc *u) {
    for (int j = i; j < end; j++)
        for (int32_t t = v->ttok[j]; t >= 0; t = v->tnext[t])
            for (int k = 1; k <= d; k++)
                if (pop[k]) add_unc(u, t, k);
}

/* Bytes still needed within the classified rule from a set: the fewest over its stacks of the
 * minlen of every frame above BASE (0 when the rule may end). */
static int local_dist(const struct pda *p, int32_t set) {
    if (p->sets[set].flags & F_BASE) return 0;
    int64_t best = INF_LEN;
    for (int i = 0; i < p->sets[set].n; i++) {
        int64_t d = 0;
        for (int32_t q = p->pool[p->sets[set].off + i]; q != NODE_BASE; q = p->npar[q])
            d += p->g->st[p->nst[q]].minlen;
        if (d < best) best = d;
    }
    return best > 65535 ? 65535 : (int)best;
}

static struct sclass *classify(const struct grammar *g, const struct grammar_vocab *v, int32_t s) {
    struct pda p;
    pda_init(&p, g);
    struct sclass *c = xcalloc(1, sizeof *c);
    int cap_acc = 0, n_d = 0, cap_d = 0;
    int32_t *dl = NULL; /* parallel to c->acc */
    int32_t *set_d = NULL; /* local_dist by set id, -1 unknown */
    int cap_set_d = 0;
    struct unc_acc u = {0};
    const int D = v->max_depth + 1;
    int32_t *setd = xmalloc((size_t)(D + 1) * sizeof *setd);
    uint8_t *pop = xcalloc((size_t)D + 1, 1);
    int32_t *npop = xcalloc((size_t)D + 1, sizeof *npop); /* pops at depths 1..d */
    setd[0] = set_of_ready(&p, node_get(&p, s, NODE_BASE));
    for (int i = 0; i < v->n_nodes; i++) {
        const int d = v->td[i];
        const int32_t ns = step(&p, setd[d - 1], v->tb[i]);
        setd[d] = ns;
        const int live = p.sets[ns].n > 0, based = (p.sets[ns].flags & F_BASE) != 0;
        pop[d] = (uint8_t)based;
        npop[d] = npop[d - 1] + based;
        for (int32_t t = v->ttok[i]; t >= 0; t = v->tnext[t]) {
            if (live || based) {
                while (ns >= cap_set_d) {
                    int old = cap_set_d;
                    cap_set_d = cap_set_d ? 2 * cap_set_d : 1024;
                    set_d = xrealloc(set_d, (size_t)cap_set_d * sizeof *set_d);
                    for (int q = old; q < cap_set_d; q++) set_d[q] = -1;
                }
                if (set_d[ns] < 0) set_d[ns] = local_dist(&p, ns);
                add_i32(&c->acc, &c->n_acc, &cap_acc, t);
                add_i32(&dl, &n_d, &cap_d, set_d[ns]);
                if (set_d[ns] > c->max_d) c->max_d = set_d[ns];
            } else if (npop[d - 1]) {
                for (int k = 1; k < d; k++)
                    if (pop[k]) add_unc(&u, t, k);
            }
        }
        if (!live) {
            if (npop[d]) unc_subtree(v, i + 1, v->tend[i], pop, d, &u);
            i = v->tend[i] - 1;
        }
    }
    free(setd), free(pop), free(npop), free(set_d);
    pda_free(&p);
    if ((size_t)c->n_acc > v->words * 2) { /* a bitset is smaller */
        c->acc_bits = xcalloc(v->words, sizeof *c->acc_bits);
        c->acc_d = xmalloc((size_t)v->n_tokens * sizeof *c->acc_d);
        for (int k = 0; k < c->n_acc; k++) {
            c->acc_bits[c->acc[k] / 64] |= 1ull << (c->acc[k] % 64);
            c->acc_d[c->acc[k]] = (uint16_t)dl[k];
        }
        free(c->acc);
        c->acc = NULL;
    } else {
        c->acc_d = xmalloc((size_t)(c->n_acc ? c->n_acc : 1) * sizeof *c->acc_d);
        for (int k = 0; k < c->n_acc; k++) c->acc_d[k] = (uint16_t)dl[k];
    }
    free(dl);
    /* the uncertain entries grouped by offset (a stable counting sort: within one offset, trie
     * order sorts the remainders of each popped prefix), so that run time walks a shared prefix
     * of consecutive remainders once */
    int *count = xcalloc((size_t)D + 2, sizeof *count);
    for (int k = 0; k < u.n; k++) count[u.off[k] + 1]++;
    for (int d = 1; d <= D + 1; d++) count[d] += count[d - 1];
    c->unc_tok = xmalloc((size_t)(u.n ? u.n : 1) * sizeof *c->unc_tok);
    c->unc_off = xmalloc((size_t)(u.n ? u.n : 1) * sizeof *c->unc_off);
    c->unc_lcp = xmalloc((size_t)(u.n ? u.n : 1) * sizeof *c->unc_lcp);
    for (int k = 0; k < u.n; k++) {
        int at = count[u.off[k]]++;
        c->unc_tok[at] = u.tok[k];
        c->unc_off[at] = u.off[k];
    }
    free(count);
    for (int k = 0; k < u.n; k++) {
        uint16_t l = 0;
        if (k > 0) {
            const char *a = v->blob + v->off[c->unc_tok[k - 1]] + c->unc_off[k - 1];
            const char *b = v->blob + v->off[c->unc_tok[k]] + c->unc_off[k];
            int la = (int)(v->off[c->unc_tok[k - 1] + 1] - v->off[c->unc_tok[k - 1]]) - c->unc_off[k - 1];
            int lb = (int)(v->off[c->unc_tok[k] + 1] - v->off[c->unc_tok[k]]) - c->unc_off[k];
            while (l < la && l < lb && a[l] == b[l]) l++;
        }
        c->unc_lcp[k] = l;
    }
    free(u.tok);
    free(u.off);
    c->n_unc = u.n;
    return c;
}

static const struct sclass *get_class(struct grammar *g, const struct grammar_vocab *v, int32_t s) {
    struct grammar_vocab *mv = (struct grammar_vocab *)v;
    if (s < g->n_prelude) {
        pthread_mutex_lock(&mv->mu);
        if (!mv->pre) {
            mv->n_pre = g->n_prelude;
            mv->pre = xcalloc((size_t)mv->n_pre, sizeof *mv->pre);
        }
        CHECK(mv->n_pre == g->n_prelude);
        if (!mv->pre[s]) mv->pre[s] = classify(g, v, s);
        struct sclass *c = mv->pre[s];
        pthread_mutex_unlock(&mv->mu);
        return c;
    }
    pthread_mutex_lock(&g->mu);
    if (g->cls_vocab != v) {
        if (g->cls)
            for (int i = 0; i < g->n_st; i++) sclass_free(g->cls[i]);
        free(g->cls);
        g->cls = xcalloc((size_t)g->n_st, sizeof *g->cls);
        g->cls_vocab = v;
    }
    if (!g->cls[s]) g->cls[s] = classify(g, v, s);
    struct sclass *c = g->cls[s];
    pthread_mutex_unlock(&g->mu);
    return c;
}

/* ---- the matcher ---------------------------------------------------------------------- */

#define N_CACHE 8

struct grammar_matcher {
    struct grammar *g;
    const struct grammar_vocab *v;
    struct pda p;
    int32_t cur; /* the current set */
    int stopped;
    /* before free_until */
    int free_mode, kmp;
    char trig[32];
    int trig_len, trig_fail[33];
    /* masks by set (never in closing mode) */
    int32_t cache_set[N_CACHE];
    uint64_t *cache_bits[N_CACHE];
    int cache_count[N_CACHE], cache_next;
    int64_t cache_max[N_CACHE]; /* the mask's largest completion after a token (mask_normal) */
    int64_t *sdist;             /* (n_sdist,) set_dist by set id, -1 unknown */
    int n_sdist;
    int32_t *unc_path;          /* (longest token + 1,) mask_normal's walk of remainders */
};

static void kmp_fail(const char *t, int n, int *f) {
    f[0] = -1;
    for (int i = 1, k = -1; i <= n; i++) {
        while (k >= 0 && t[k] != t[i - 1]) k = f[k];
        f[i] = ++k;
    }
}

/* The KMP state after byte c from state k (k < n). */
static int kmp_step(const char *t, int n, const int *f, int k, char c) {
    (void)n;
    while (k >= 0 && t[k] != c) k = f[k];
    return k + 1;
}

/* For each partial match k, the tokens that complete the trigger and the offset just after it
 * (once per vocabulary and trigger). */
static void trig_lists(struct grammar_vocab *v, const char *trig, int n, const int *f) {
    pthread_mutex_lock(&v->mu);
    if (v->trig_len == n && !memcmp(v->trig, trig, (size_t)n)) {
        pthread_mutex_unlock(&v->mu);
        return;
    }
    for (int k = 0; k < 32; k++) {
        free(v->trig_tok[k]), free(v->trig_off[k]);
        v->trig_tok[k] = NULL, v->trig_off[k] = NULL, v->trig_n[k] = 0;
    }
    int cap[32] = {0};
    for (int t = 0; t < v->n_tokens; t++) {
        const char *b = v->blob + v->off[t];
        uint32_t len = v->off[t + 1] - v->off[t];
        if (!len) continue;
        for (int k0 = 0; k0 < n; k0++) {
            int k = k0;
            for (uint32_t i = 0; i < len; i++) {
                k = kmp_step(trig, n, f, k, b[i]);
                if (k == n) {
                    add_i32(&v->trig_tok[k0], &v->trig_n[k0], &cap[k0], t);
                    v->trig_n[k0]--;
                    int c2 = cap[k0];
                    v->trig_off[k0] = xrealloc(v->trig_off[k0], (size_t)c2 * sizeof *v->trig_off[k0]);
                    v->trig_off[k0][v->trig_n[k0]++] = (uint16_t)(i + 1);
                    break;
                }
            }
        }
    }
    memcpy(v->trig, trig, (size_t)n);
    v->trig_len = n;
    pthread_mutex_unlock(&v->mu);
}

struct grammar_matcher *grammar_matcher_new(struct grammar *g, const struct grammar_vocab *v,
                                            const char *free_until) {
    struct grammar_matcher *m = xcalloc(1, sizeof *m);
    grammar_ref(g);
    m->g = g;
    m->v = v;
    pda_init(&m->p, g);
    m->cur = set_of_node(&m->p, node_get(&m->p, g->start, NODE_ROOT));
    for (int i = 0; i < N_CACHE; i++) m->cache_set[i] = -1;
    m->unc_path = xmalloc(((size_t)v->max_depth + 2) * sizeof *m->unc_path);
    if (free_until && *free_until) {
        m->trig_len = (int)strlen(free_until);
        CHECK(m->trig_len < 32);
        memcpy(m->trig, free_until, (size_t)m->trig_len);
        kmp_fail(m->trig, m->trig_len, m->trig_fail);
        trig_lists((struct grammar_vocab *)v, m->trig, m->trig_len, m->trig_fail);
        m->free_mode = 1;
    }
    return m;
}

void grammar_matcher_free(struct grammar_matcher *m) {
    if (!m) return;
    pda_free(&m->p);
    for (int i = 0; i < N_CACHE; i++) free(m->cache_bits[i]);
    free(m->sdist);
    free(m->unc_path);
    grammar_unref(m->g);
    free(m);
}

static int32_t advance(struct grammar_matcher *m, int32_t set, const char *s, size_t n) {
    for (size_t i = 0; i < n && !set_dead(&m->p, set); i++) set = step(&m->p, set, (uint8_t)s[i]);
    return set;
}

static inline int32_t tok_len(const struct grammar_vocab *v, int32_t t) {
    return (int32_t)(v->off[t + 1] - v->off[t]);
}

static int popcount_bits(const uint64_t *b, size_t words) {
    int n = 0;
    for (size_t i = 0; i < words; i++) n += __builtin_popcountll(b[i]);
    return n;
}

/* Fewest bytes to complete from node n (its rule, then each caller's). */
static int64_t node_dist(const struct pda *p, int32_t n) {
    int64_t d = p->g->st[p->nst[n]].minlen;
    for (int32_t q = p->npar[n]; q != NODE_ROOT; q = p->npar[q]) d += p->g->st[p->nst[q]].minlen;
    return d;
}

int grammar_matcher_shortest(struct grammar_matcher *m, char *out, size_t cap) {
    if (m->free_mode) return -1;
    const struct pda *p = &m->p;
    const struct pset *set = &p->sets[m->cur];
    if (out && cap) out[0] = 0;
    if (set->flags & F_ACC) return 0;
    if (set->n == 0) return -1;
    int32_t best = -1;
    int64_t bd = INT64_MAX;
    for (int i = 0; i < set->n; i++) {
        int32_t n = p->pool[set->off + i];
        int64_t d = node_dist(p, n);
        if (d < bd) bd = d, best = n;
    }
    const struct grammar *g = m->g;
    int32_t s = p->nst[best], par = p->npar[best];
    int32_t local[512];
    int n_local = 0;
    size_t len = 0;
    for (int guard = 0; guard < 1 << 20; guard++) {
        const struct gstate *st = &g->st[s];
        if (st->accept) {
            if (n_local) s = local[--n_local];
            else if (par == NODE_ROOT) break;
            else s = p->nst[par], par = p->npar[par];
            continue;
        }
        int moved = 0;
        for (int k = 0; k < st->ne && !moved; k++) {
            const struct gedge *e = &g->ed[st->e0 + k];
            if (g->st[e->to].minlen + 1 == st->minlen) {
                if (out && len + 1 < cap) out[len] = (char)e->lo;
                len++;
                s = e->to;
                moved = 1;
            }
        }
        for (int k = 0; k < st->nx && !moved; k++) {
            const struct gx *x = &g->x[st->x0 + k];
            if (x->call >= 0 && n_local < 512 &&
                g->st[x->call].minlen + g->st[x->to].minlen == st->minlen) {
                local[n_local++] = x->to;
                s = x->call;
                moved = 1;
            } else if (x->call < 0 && g->st[x->to].minlen == st->minlen) {
                s = x->to;
                moved = 1;
            }
        }
        if (!moved) break; /* cannot happen: minlen says a move exists */
    }
    if (out && cap) out[len < cap ? len : cap - 1] = 0;
    return (int)len;
}

static void set_stops(const struct grammar_vocab *v, uint64_t *bits) {
    for (int i = 0; i < v->n_stop; i++) bits[v->stop[i] / 64] |= 1ull << (v->stop[i] % 64);
}

/* Fewest bytes to complete from a set (memoised by set id). */
static int64_t set_dist(struct grammar_matcher *m, int32_t set) {
    while (set >= m->n_sdist) {
        int old = m->n_sdist;
        m->n_sdist = m->n_sdist ? 2 * m->n_sdist : 1024;
        m->sdist = xrealloc(m->sdist, (size_t)m->n_sdist * sizeof *m->sdist);
        for (int i = old; i < m->n_sdist; i++) m->sdist[i] = -1;
    }
    if (m->sdist[set] >= 0) return m->sdist[set];
    const struct pda *p = &m->p;
    int64_t best = (p->sets[set].flags & F_ACC) ? 0 : INT64_MAX / 4;
    for (int i = 0; i < p->sets[set].n; i++) {
        int64_t d = node_dist(p, p->pool[p->sets[set].off + i]);
        if (d < best) best = d;
    }
    return m->sdist[set] = best;
}

/* Before free_until: any token but a stop, except one completing the trigger with bytes the
 * grammar refuses. Once the budget only just holds the rest of the trigger and the grammar's
 * shortest completion (lim as in grammar_matcher_mask), only the trigger's next bytes. */
static int mask_free(struct grammar_matcher *m, uint64_t *bits, int64_t lim) {
    const struct grammar_vocab *v = m->v;
    const int k = m->kmp;
    const int64_t d0 = set_dist(m, m->cur);
    const int closing = lim < INT64_MAX && m->trig_len + d0 > lim && (m->trig_len - k) + d0 <= lim + 1;
    if (closing) {
        memset(bits, 0, v->words * sizeof *bits);
        int lo = 0, hi = v->n_nodes; /* the trie node's children lie in [lo, hi) */
        for (int d = k; d < m->trig_len; d++) {
            int j = lo, found = -1;
            for (; j < hi; j = v->tend[j])
                if (v->tb[j] == (uint8_t)m->trig[d]) {
                    found = j;
                    break;
                }
            if (found < 0) break;
            for (int32_t t = v->ttok[found]; t >= 0; t = v->tnext[t]) bits[t / 64] |= 1ull << (t % 64);
            lo = found + 1, hi = v->tend[found];
        }
    } else {
        memcpy(bits, v->all_bits, v->words * sizeof *bits);
    }
    for (int i = 0; i < v->trig_n[k]; i++) {
        int32_t t = v->trig_tok[k][i];
        int off = v->trig_off[k][i];
        int32_t r = advance(m, m->cur, v->blob + v->off[t] + off, (size_t)(tok_len(v, t) - off));
        if (set_dead(&m->p, r) || (lim < INT64_MAX && set_dist(m, r) > lim))
            bits[t / 64] &= ~(1ull << (t % 64));
        else if (closing)
            bits[t / 64] |= 1ull << (t % 64);
    }
    return popcount_bits(bits, v->words);
}

/* The tokens allowed from the current set whose shortest completion afterwards is at most lim
 * bytes (INT64_MAX: no limit); *max_after: the largest such completion over the tokens allowed
 * (an upper bound). */
static int mask_normal(struct grammar_matcher *m, uint64_t *bits, int64_t lim, int64_t *max_after) {
    const struct grammar_vocab *v = m->v;
    struct pda *p = &m->p;
    memset(bits, 0, v->words * sizeof *bits);
    const int32_t cur = m->cur;
    const int n = p->sets[cur].n;
    int64_t mx = 0;
    for (int i = 0; i < n; i++) {
        int32_t node = p->pool[p->sets[cur].off + i];
        const struct sclass *c = get_class(m->g, v, p->nst[node]);
        const int64_t dpar = node_dist(p, node) - m->g->st[p->nst[node]].minlen;
        if (c->n_acc && dpar + c->max_d > mx) mx = dpar + c->max_d;
        if (dpar + c->max_d <= lim) {
            if (c->acc_bits)
                for (size_t w = 0; w < v->words; w++) bits[w] |= c->acc_bits[w];
            else
                for (int k = 0; k < c->n_acc; k++) bits[c->acc[k] / 64] |= 1ull << (c->acc[k] % 64);
        } else if (c->acc_bits) {
            for (size_t w = 0; w < v->words; w++)
                for (uint64_t b = c->acc_bits[w]; b; b &= b - 1) {
                    int t = (int)(w * 64) + __builtin_ctzll(b);
                    if (dpar + c->acc_d[t] <= lim) bits[w] |= 1ull << (t % 64);
                }
        } else {
            for (int k = 0; k < c->n_acc; k++)
                if (dpar + c->acc_d[k] <= lim) bits[c->acc[k] / 64] |= 1ull << (c->acc[k] % 64);
        }
    }
    for (int i = 0; i < n; i++) {
        int32_t node = p->pool[p->sets[cur].off + i];
        const struct sclass *c = get_class(m->g, v, p->nst[node]);
        int32_t par = p->npar[node];
        if (!c->n_unc || par == NODE_ROOT) continue;
        /* the remainders in list order: path[d] is the set after the first d bytes of the
         * current one (valid up to depth `valid`), and a prefix found dead (at dead_at) is not
         * walked again by the entries that follow and share it */
        int32_t *path = m->unc_path;
        path[0] = set_of_node(p, par);
        int valid = 0, dead_at = INT_MAX;
        for (int k = 0; k < c->n_unc; k++) {
            const int32_t t = c->unc_tok[k];
            const int l = c->unc_lcp[k];
            if (l >= dead_at) continue; /* shares a dead prefix */
            dead_at = INT_MAX;
            if (bits[t / 64] >> (t % 64) & 1) { /* allowed already: skipped, its path unknown */
                if (valid > l) valid = l;
                continue;
            }
            const char *rem = v->blob + v->off[t] + c->unc_off[k];
            const int rl = tok_len(v, t) - c->unc_off[k];
            int d = l < valid ? l : valid;
            for (; d < rl; d++) {
                path[d + 1] = step(p, path[d], (uint8_t)rem[d]);
                if (set_dead(p, path[d + 1])) {
                    dead_at = d + 1;
                    break;
                }
            }
            valid = d < rl ? d + 1 : rl;
            if (d < rl) continue;
            int64_t dist = set_dist(m, path[rl]);
            if (dist > mx) mx = dist;
            if (dist <= lim) bits[t / 64] |= 1ull << (t % 64);
        }
    }
    if (p->sets[cur].flags & F_ACC) set_stops(v, bits);
    *max_after = mx;
    return popcount_bits(bits, v->words);
}

int grammar_matcher_mask(struct grammar_matcher *m, uint64_t *bits, int budget) {
    const struct grammar_vocab *v = m->v;
    if (m->stopped) {
        memset(bits, 0, v->words * sizeof *bits);
        return 0;
    }
    /* after this token budget - 1 remain: the completion (a token per byte at worst) and a stop */
    int64_t lim = budget > 0 ? (int64_t)budget - 2 : INT64_MAX;
    if (m->free_mode) return mask_free(m, bits, lim);
    if (budget > 0 && set_dist(m, m->cur) > lim + 1) lim = INT64_MAX; /* cannot fit: no limit */
    for (int i = 0; i < N_CACHE; i++)
        if (m->cache_set[i] == m->cur) {
            if (m->cache_max[i] <= lim) {
                memcpy(bits, m->cache_bits[i], v->words * sizeof *bits);
                return m->cache_count[i];
            }
            int64_t mx;
            return mask_normal(m, bits, lim, &mx);
        }
    int64_t mx;
    int count = mask_normal(m, bits, INT64_MAX, &mx);
    int slot = m->cache_next++ % N_CACHE;
    if (!m->cache_bits[slot]) m->cache_bits[slot] = xmalloc(v->words * sizeof *bits);
    memcpy(m->cache_bits[slot], bits, v->words * sizeof *bits);
    m->cache_set[slot] = m->cur;
    m->cache_count[slot] = count;
    m->cache_max[slot] = mx;
    if (mx <= lim) return count;
    return mask_normal(m, bits, lim, &mx);
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n) {
    if (m->stopped) return -1;
    size_t i = 0;
    int kmp = m->kmp;
    if (m->free_mode) {
        for (; i < n; i++) {
            kmp = kmp_step(m->trig, m->trig_len, m->trig_fail, kmp, s[i]);
            if (kmp == m->trig_len) break;
        }
        if (i == n) {
            m->kmp = kmp;
            return 0;
        }
        i++; /* past the trigger */
    }
    int32_t r = advance(m, m->cur, s + i, n - i);
    if (set_dead(&m->p, r)) return -1;
    m->cur = r;
    m->free_mode = 0;
    return 0;
}

int grammar_matcher_accept(struct grammar_matcher *m, int32_t token) {
    const struct grammar_vocab *v = m->v;
    if (m->stopped || token < 0 || token >= v->n_tokens) return -1;
    if (v->is_stop[token]) {
        if (m->free_mode || !(m->p.sets[m->cur].flags & F_ACC)) return -1;
        m->stopped = 1;
        return 0;
    }
    int32_t len = tok_len(v, token);
    if (len == 0) return -1;
    return grammar_matcher_accept_bytes(m, v->blob + v->off[token], (size_t)len);
}

int grammar_matcher_is_complete(const struct grammar_matcher *m) {
    return !m->free_mode && (m->p.sets[m->cur].flags & F_ACC) != 0;
}

int grammar_matcher_is_stopped(const struct grammar_matcher *m) { return m->stopped; }

int grammar_matcher_allows_bytes(struct grammar_matcher *m, const char *s, size_t n) {
    if (m->stopped || m->free_mode) return !m->stopped;
    return !set_dead(&m->p, advance(m, m->cur, s, n));
}

int grammar_matcher_n_tokens(const struct grammar_matcher *m) { return m->v->n_tokens; }
