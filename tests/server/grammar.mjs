#!/usr/bin/env node
// grammar.mjs - constrained decoding through strata serve on the demo model, which writes
// nonsense, so only the grammar can make its output valid:
//   - every schema of tests/fixtures/schemas/corpus.json as response_format json_schema (and a
//     few as llama-server's json_schema field, streamed, and with thinking on): the content
//     parses and validates against the schema (a validator for the subset, below), and the
//     request ends with finish_reason "stop" within a max_tokens of the schema's shortest
//     instance + 25 (the grammar closes structures in time for the budget);
//   - json_object, tool_choice "required" / named with parallel_tool_calls false, unsupported
//     schema features (400 naming the keyword), llama-server's GBNF grammar field;
//   - n > 1 (distinct choices, reproducible by seed, streamed by index, each under the grammar);
//   - logprobs + top_logprobs (chat, streamed and not) and the integer logprobs of /v1/completions;
//   - the SDK helpers agents use: openai chat.completions.parse with zodResponseFormat, Vercel
//     ai generateObject and generateText(toolChoice: 'required') over @ai-sdk/openai-compatible,
//     @langchain/openai withStructuredOutput and bindTools(tool_choice: "any").
//
//   npm ci --prefix tests/server && node tests/server/grammar.mjs
// Env: STRATA (default build/strata), STRATA_DEMO_MODEL (default demo), PORT.
// Prints "N passed, N failed" last; exits non-zero on any failure.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { generateObject, generateText, tool } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const exe = resolve(root, process.env.STRATA || `${process.env.BUILD || "build"}/strata`);
const model = resolve(root, process.env.STRATA_DEMO_MODEL || "demo");
const port = Number(process.env.PORT || 20000 + (process.pid % 2000));
const key = "test-key";
const base = `http://127.0.0.1:${port}`;
let passed = 0, failed = 0;
function expect(cond, msg) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL: ${msg}`); }
}

// ---- a validator for the subset (as tests/test_grammar.c's) ----------------------------
function resolveRef(rootSchema, ref) {
  if (!ref.startsWith("#")) return undefined;
  let cur = rootSchema;
  for (const part of ref.slice(1).split("/").filter((p) => p !== "")) cur = cur?.[part.replace(/~1/g, "/").replace(/~0/g, "~")];
  return cur;
}
const isType = (v, t) => ({
  string: typeof v === "string", integer: Number.isInteger(v), number: typeof v === "number",
  boolean: typeof v === "boolean", null: v === null, array: Array.isArray(v),
  object: v !== null && typeof v === "object" && !Array.isArray(v),
})[t];
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b) || (typeof a === "number" && a === b);
function valid(v, s, rootSchema, depth = 0) {
  if (depth > 200) return false;
  if (s === true || (s && Object.keys(s).length === 0)) return true;
  if (typeof s !== "object" || s === null) return false;
  if (s.$ref) return valid(v, resolveRef(rootSchema, s.$ref), rootSchema, depth + 1);
  if (s.enum && !s.enum.some((e) => same(v, e))) return false;
  if ("const" in s && !same(v, s.const)) return false;
  if (s.anyOf && !s.anyOf.some((a) => valid(v, a, rootSchema, depth + 1))) return false;
  if (s.oneOf && s.oneOf.filter((a) => valid(v, a, rootSchema, depth + 1)).length !== 1) return false;
  if (typeof s.type === "string" && !isType(v, s.type)) return false;
  if (Array.isArray(s.type) && !s.type.some((t) => isType(v, t))) return false;
  if (typeof v === "string") { // lengths in code points
    if (s.minLength !== undefined && [...v].length < s.minLength) return false;
    if (s.maxLength !== undefined && [...v].length > s.maxLength) return false;
  }
  if (typeof v === "number") {
    if (s.minimum !== undefined && v < s.minimum) return false;
    if (s.maximum !== undefined && v > s.maximum) return false;
    if (s.exclusiveMinimum !== undefined && v <= s.exclusiveMinimum) return false;
    if (s.exclusiveMaximum !== undefined && v >= s.exclusiveMaximum) return false;
  }
  if (isType(v, "object")) {
    for (const r of s.required || []) if (!(r in v)) return false;
    for (const [k, x] of Object.entries(v)) {
      if (s.properties && k in s.properties) { if (!valid(x, s.properties[k], rootSchema, depth + 1)) return false; }
      else if (s.additionalProperties === false) return false;
      else if (typeof s.additionalProperties === "object" && !valid(x, s.additionalProperties, rootSchema, depth + 1)) return false;
    }
  }
  if (Array.isArray(v)) {
    if (s.minItems !== undefined && v.length < s.minItems) return false;
    if (s.maxItems !== undefined && v.length > s.maxItems) return false;
    if (s.items && !v.every((x) => valid(x, s.items, rootSchema, depth + 1))) return false;
  }
  return true;
}

// The bytes of the shortest instance the grammar writes (no whitespace): sizes max_tokens.
function minBytes(s, rootSchema, depth = 0) {
  if (depth > 40) return Infinity;
  if (s === true || (s && Object.keys(s).filter((k) => !["title", "description", "$schema", "$defs", "definitions", "default", "examples"].includes(k)).length === 0)) return 1;
  if (s.$ref) return minBytes(resolveRef(rootSchema, s.$ref), rootSchema, depth + 1);
  const lits = "const" in s ? [s.const] : s.enum;
  if (lits) return Math.min(...lits.map((e) => Buffer.byteLength(JSON.stringify(e))));
  const alts = s.anyOf || s.oneOf;
  if (alts) return Math.min(...alts.map((a) => minBytes(a, rootSchema, depth + 1)));
  let types = Array.isArray(s.type) ? s.type : s.type ? [s.type] : s.properties ? ["object"] : s.items ? ["array"] : null;
  if (!types) return 1;
  return Math.min(...types.map((t) => {
    switch (t) {
      case "string": return 2 + (s.minLength || 0);
      case "boolean": return 4;
      case "null": return 4;
      case "integer": case "number": {
        const lo = s.minimum ?? (s.exclusiveMinimum !== undefined ? s.exclusiveMinimum + 1 : -Infinity);
        const hi = s.maximum ?? (s.exclusiveMaximum !== undefined ? s.exclusiveMaximum - 1 : Infinity);
        if (lo <= 0 && hi >= 0) return 1;
        return String(lo > 0 ? Math.ceil(lo) : Math.floor(hi)).length;
      }
      case "object": {
        const req = s.required || [];
        if (!s.properties) return 2;
        return 2 + Math.max(0, req.length - 1) + req.reduce((n, k) => n + Buffer.byteLength(JSON.stringify(k)) + 1 + minBytes(s.properties[k], rootSchema, depth + 1), 0);
      }
      case "array": {
        const n = s.minItems || 0;
        return 2 + Math.max(0, n - 1) + n * (n ? minBytes(s.items || true, rootSchema, depth + 1) : 0);
      }
      default: return Infinity;
    }
  }));
}

// ---- the server -------------------------------------------------------------------------
const server = spawn(exe, ["serve", "--model", model, "--port", String(port), "--backend", "cpu",
  "--threads", "1", "--api-key", key, "--quiet"], { stdio: ["ignore", "pipe", "inherit"], cwd: root });
server.stdout.on("data", () => {});
const exited = new Promise((res) => server.on("exit", (code, sig) => res({ code, sig })));
async function waitUp() {
  for (let i = 0; i < 100; i++) {
    try { if ((await fetch(`${base}/health`)).ok) return true; } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}
async function post(path, body) {
  const r = await fetch(`${base}${path}`, {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}
async function postStream(path, body) {
  const r = await fetch(`${base}${path}`, {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify({ ...body, stream: true }),
  });
  const text = await r.text();
  let content = "", finish = null;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const ev = JSON.parse(line.slice(6));
    const c = ev.choices?.[0];
    if (c?.delta?.content) content += c.delta.content;
    if (c?.finish_reason) finish = c.finish_reason;
  }
  return { content, finish };
}
const user = (content) => [{ role: "user", content }];
const noThink = { chat_template_kwargs: { enable_thinking: false } };

try {
  expect(await waitUp(), "server did not come up");
  const corpus = JSON.parse(readFileSync(resolve(root, "tests/fixtures/schemas/corpus.json"), "utf8"));
  expect(corpus.length >= 50, `the corpus has ${corpus.length} schemas`);
  const t0 = Date.now();
  let tokens = 0;

  // ---- the corpus, one request per schema -------------------------------------------------
  for (const [i, c] of corpus.entries()) {
    const max_tokens = minBytes(c.schema, c.schema) + 25;
    const body = { model: "demo", messages: user(`Answer with JSON: ${c.name}`), max_tokens, seed: i, ...noThink };
    let r, content, finish;
    if (i % 10 === 3) { // streamed, as llama-server's json_schema field
      r = await postStream("/v1/chat/completions", { ...body, json_schema: c.schema });
      ({ content, finish } = r);
    } else {
      r = await post("/v1/chat/completions", { ...body, response_format: { type: "json_schema", json_schema: { name: "s", schema: c.schema, strict: true } } });
      if (r.status !== 200) { expect(false, `'${c.name}': status ${r.status} ${JSON.stringify(r.body)}`); continue; }
      content = r.body.choices[0].message.content;
      finish = r.body.choices[0].finish_reason;
      tokens += r.body.usage.completion_tokens;
    }
    let parsed, ok = false;
    try { parsed = JSON.parse(content); ok = valid(parsed, c.schema, c.schema); } catch { /* reported below */ }
    expect(ok, `'${c.name}': output does not ${parsed === undefined ? "parse" : "validate"}: ${content}`);
    expect(finish === "stop", `'${c.name}': finish_reason ${finish} (max_tokens ${max_tokens})`);
  }
  console.log(`corpus: ${corpus.length} schemas, ${tokens} tokens (non-streamed), ${Date.now() - t0} ms`);

  // ---- thinking on: reasoning first, the constrained answer after </think> ---------------
  {
    const s = corpus.find((c) => c.name === "person").schema;
    const r = await post("/v1/chat/completions", { model: "demo", messages: user("Who?"), max_tokens: 160, seed: 7,
      response_format: { type: "json_schema", json_schema: { name: "p", schema: s } } });
    const m = r.body.choices?.[0]?.message;
    let ok = false;
    try { ok = valid(JSON.parse(m.content), s, s); } catch { /* below */ }
    // the demo model may close its reasoning at once (then there is no reasoning_content)
    expect(r.status === 200 && ok && r.body.choices[0].finish_reason === "stop", `thinking + json_schema: ${JSON.stringify(r.body).slice(0, 600)}`);
  }

  // ---- json_object ---------------------------------------------------------------------------
  {
    const r = await post("/v1/chat/completions", { model: "demo", messages: user("JSON please"), max_tokens: 40, response_format: { type: "json_object" }, ...noThink });
    let v;
    try { v = JSON.parse(r.body.choices[0].message.content); } catch { /* below */ }
    expect(v && typeof v === "object" && !Array.isArray(v), `json_object: ${JSON.stringify(r.body).slice(0, 400)}`);
    const rc = await post("/v1/completions", { model: "demo", prompt: "Numbers:", max_tokens: 30, json_schema: { type: "array", items: { type: "integer" }, minItems: 2 } });
    let a;
    try { a = JSON.parse(rc.body.choices[0].text); } catch { /* below */ }
    expect(Array.isArray(a) && a.length >= 2 && a.every(Number.isInteger), `completions json_schema: ${JSON.stringify(rc.body).slice(0, 400)}`);
  }

  // ---- tool_choice ---------------------------------------------------------------------------
  const tools = [
    { type: "function", function: { name: "get_weather", description: "Current weather", parameters: { type: "object", properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] }, days: { type: "integer", minimum: 1, maximum: 14 } }, required: ["city", "days"] } } },
    { type: "function", function: { name: "search", parameters: { type: "object", properties: { query: { type: "string" }, limit: { type: "integer" } }, required: ["query"] } } },
  ];
  for (const [name, extra] of [["required", { tool_choice: "required" }], ["required, one call", { tool_choice: "required", parallel_tool_calls: false }], ["named", { tool_choice: { type: "function", function: { name: "search" } } }]]) {
    for (const think of [false, true]) {
      const r = await post("/v1/chat/completions", { model: "demo", messages: user("What is the weather in Paris?"), tools, max_tokens: 140, seed: 3, ...extra, ...(think ? {} : noThink) });
      const ch = r.body.choices?.[0];
      const calls = ch?.message?.tool_calls || [];
      let ok = r.status === 200 && ch.finish_reason === "tool_calls" && calls.length >= 1;
      if (extra.parallel_tool_calls === false) ok &&= calls.length === 1;
      for (const c of calls) {
        const t = tools.find((x) => x.function.name === c.function.name);
        if (extra.tool_choice?.function && c.function.name !== "search") ok = false;
        try { ok &&= !!t && valid(JSON.parse(c.function.arguments), t.function.parameters, t.function.parameters); } catch { ok = false; }
      }
      expect(ok, `tool_choice ${name}${think ? " (thinking)" : ""}: ${JSON.stringify(r.body).slice(0, 700)}`);
    }
  }

  { // streamed: the SDK's accumulated tool-call deltas
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: "demo", messages: user("Weather?"), tools, tool_choice: "required", max_tokens: 140, seed: 5, stream: true, ...noThink });
    const acc = [];
    let finish = null;
    for await (const ch of stream) {
      const c = ch.choices[0];
      if (c?.finish_reason) finish = c.finish_reason;
      for (const d of c?.delta?.tool_calls || []) {
        acc[d.index] ??= { name: "", args: "" };
        if (d.function?.name) acc[d.index].name += d.function.name;
        if (d.function?.arguments) acc[d.index].args += d.function.arguments;
      }
    }
    let ok = finish === "tool_calls" && acc.length >= 1;
    for (const c of acc) {
      const t = tools.find((x) => x.function.name === c.name);
      try { ok &&= !!t && valid(JSON.parse(c.args), t.function.parameters, t.function.parameters); } catch { ok = false; }
    }
    expect(ok, `streamed tool_choice required: ${finish} ${JSON.stringify(acc).slice(0, 500)}`);
  }

  // ---- refusals ------------------------------------------------------------------------------
  {
    let r = await post("/v1/chat/completions", { model: "demo", messages: user("x"), response_format: { type: "json_schema", json_schema: { name: "d", schema: { type: "object", properties: { when: { type: "string", format: "date-time" } } } } } });
    expect(r.status === 400 && r.body.error.param === "response_format" && /properties\.when: 'format' is not supported/.test(r.body.error.message), `format: ${JSON.stringify(r.body)}`);
    r = await post("/v1/chat/completions", { model: "demo", messages: user("x"), grammar: 'root ::= "a" (' });
    expect(r.status === 400 && r.body.error.param === "grammar" && /grammar: line 1/.test(r.body.error.message), `bad grammar: ${JSON.stringify(r.body)}`);
    // llama-server's GBNF field, chat and completions
    const gb = 'root ::= answer " " num\nanswer ::= "yes" | "no"\nnum ::= [1-9] [0-9]{0,2}';
    r = await post("/v1/chat/completions", { model: "demo", messages: user("Yes or no?"), grammar: gb, max_tokens: 20, ...noThink });
    expect(r.status === 200 && /^(yes|no) [1-9][0-9]{0,2}$/.test(r.body.choices[0].message.content) && r.body.choices[0].finish_reason === "stop",
      `grammar (chat): ${JSON.stringify(r.body).slice(0, 400)}`);
    r = await post("/v1/completions", { model: "demo", prompt: "Answer:", grammar: gb, max_tokens: 20 });
    expect(r.status === 200 && /^(yes|no) [1-9][0-9]{0,2}$/.test(r.body.choices[0].text), `grammar (completions): ${JSON.stringify(r.body).slice(0, 400)}`);
    r = await post("/v1/chat/completions", { model: "demo", messages: user("x"), tools, tool_choice: { type: "function", function: { name: "nope" } } });
    expect(r.status === 400 && r.body.error.param === "tool_choice" && /nope/.test(r.body.error.message), `unknown named tool: ${JSON.stringify(r.body)}`);
  }

  // ---- logprobs -------------------------------------------------------------------------------
  {
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
    const req = { model: "demo", messages: user("Tell me a fortune."), max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3, ...noThink };
    const r = await client.chat.completions.create(req);
    const lp = r.choices[0].logprobs?.content || [];
    let ok = lp.length === r.usage.completion_tokens && r.choices[0].finish_reason === "length";
    for (const t of lp) {
      ok &&= t.logprob <= 0 && t.top_logprobs.length === 3 && t.top_logprobs[0].token === t.token &&
        Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6 &&
        t.top_logprobs.every((x, i) => i === 0 || x.logprob <= t.top_logprobs[i - 1].logprob) &&
        t.top_logprobs.reduce((z, x) => z + Math.exp(x.logprob), 0) <= 1 + 1e-5 &&
        Array.isArray(t.bytes) && t.bytes.length > 0;
    }
    expect(ok && lp.map((t) => t.token).join("") === r.choices[0].message.content, `chat logprobs: ${JSON.stringify(r.choices[0]).slice(0, 600)}`);
    const stream = await client.chat.completions.create({ ...req, stream: true });
    const slp = [];
    for await (const ch of stream) slp.push(...(ch.choices[0]?.logprobs?.content || []));
    expect(slp.length === lp.length && slp.every((t, i) => t.token === lp[i].token && Math.abs(t.logprob - lp[i].logprob) < 1e-6),
      `streamed chat logprobs differ: ${JSON.stringify(slp).slice(0, 300)}`);
    const c = await client.completions.create({ model: "demo", prompt: "Once upon a time", max_tokens: 6, temperature: 0, logprobs: 2 });
    const cl = c.choices[0].logprobs;
    expect(cl && cl.tokens.length === c.usage.completion_tokens && cl.tokens.join("") === c.choices[0].text &&
      cl.token_logprobs.every((x) => x <= 0) && cl.top_logprobs.every((o) => Object.keys(o).length >= 1 && Object.keys(o).length <= 2) &&
      cl.text_offset[0] === 0, `completions logprobs: ${JSON.stringify(c.choices[0]).slice(0, 500)}`);
    let bad = await post("/v1/chat/completions", { model: "demo", messages: user("x"), top_logprobs: 2 });
    expect(bad.status === 400 && bad.body.error.param === "top_logprobs", `top_logprobs without logprobs: ${JSON.stringify(bad.body)}`);
    bad = await post("/v1/chat/completions", { model: "demo", messages: user("x"), logprobs: true, top_logprobs: 21 });
    expect(bad.status === 400 && bad.body.error.param === "top_logprobs", `top_logprobs 21: ${JSON.stringify(bad.body)}`);
  }

  // ---- n > 1 ---------------------------------------------------------------------------------
  {
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
    const req = { model: "demo", messages: user("Tell me a fortune."), max_tokens: 12, temperature: 1, seed: 42, n: 3, ...noThink };
    const a = await client.chat.completions.create(req), b = await client.chat.completions.create(req);
    const texts = a.choices.map((c) => c.message.content);
    expect(a.choices.length === 3 && a.choices.every((c, i) => c.index === i) && new Set(texts).size > 1 &&
      b.choices.every((c, i) => c.message.content === texts[i]) &&
      a.usage.completion_tokens >= 3 && a.usage.completion_tokens <= 3 * 12,
      `n=3: distinct and reproducible choices: ${JSON.stringify(texts)} / ${JSON.stringify(b.choices.map((c) => c.message.content))}`);
    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    const st = [], fin = [];
    let usage = null;
    for await (const ch of stream) {
      for (const c of ch.choices) {
        st[c.index] = (st[c.index] || "") + (c.delta?.content || "");
        if (c.finish_reason) fin[c.index] = c.finish_reason;
      }
      if (ch.usage) usage = ch.usage;
    }
    expect(st.length === 3 && st.every((t, i) => t === texts[i]) && fin.length === 3 && usage?.completion_tokens === a.usage.completion_tokens,
      `n=3 streamed: ${JSON.stringify(st)} ${JSON.stringify(fin)} ${JSON.stringify(usage)}`);
    const s = corpus.find((c) => c.name === "weather").schema;
    const g = await post("/v1/chat/completions", { model: "demo", messages: user("Weather"), n: 2, seed: 9, max_tokens: 60, response_format: { type: "json_schema", json_schema: { name: "w", schema: s } }, ...noThink });
    expect(g.status === 200 && g.body.choices.length === 2 && g.body.choices.every((c) => { try { return valid(JSON.parse(c.message.content), s, s); } catch { return false; } }),
      `n=2 with a schema: ${JSON.stringify(g.body).slice(0, 500)}`);
  }

  // ---- the SDKs --------------------------------------------------------------------------------
  const Person = z.object({ name: z.string(), age: z.number().int(), hobbies: z.array(z.string()) });
  const Weather = z.object({ city: z.string() });
  {
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
    const r = await client.chat.completions.parse({ model: "demo", messages: user("Describe a person."), max_tokens: 120, seed: 1, response_format: zodResponseFormat(Person, "person") });
    const p = r.choices[0].message.parsed;
    expect(p && Person.safeParse(p).success, `openai chat.completions.parse: ${JSON.stringify(r.choices[0].message)}`);
  }
  {
    const provider = createOpenAICompatible({ name: "strata", baseURL: `${base}/v1`, apiKey: key, supportsStructuredOutputs: true });
    const { object } = await generateObject({ model: provider("demo"), schema: Person, prompt: "Describe a person.", maxOutputTokens: 120, seed: 2, maxRetries: 0 });
    expect(Person.safeParse(object).success, `ai generateObject: ${JSON.stringify(object)}`);
    const r = await generateText({ model: provider("demo"), prompt: "Weather in Paris?", maxOutputTokens: 120, seed: 2, maxRetries: 0, toolChoice: "required",
      tools: { get_weather: tool({ description: "Current weather", inputSchema: Weather }) } });
    expect(r.toolCalls.length >= 1 && r.toolCalls[0].toolName === "get_weather" && Weather.safeParse(r.toolCalls[0].input).success,
      `ai generateText toolChoice required: ${JSON.stringify(r.toolCalls)} ${r.finishReason}`);
  }
  {
    const llm = new ChatOpenAI({ model: "demo", apiKey: key, configuration: { baseURL: `${base}/v1` }, maxTokens: 120, maxRetries: 0 });
    const structured = llm.withStructuredOutput(Person, { name: "person", method: "jsonSchema" });
    const p = await structured.invoke("Describe a person.");
    expect(Person.safeParse(p).success, `langchain withStructuredOutput: ${JSON.stringify(p)}`);
    const withTools = llm.bindTools([{ type: "function", function: { name: "get_weather", description: "Current weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }], { tool_choice: "any" });
    const msg = await withTools.invoke("Weather in Paris?");
    expect(msg.tool_calls?.length >= 1 && msg.tool_calls[0].name === "get_weather" && typeof msg.tool_calls[0].args.city === "string",
      `langchain bindTools tool_choice any: ${JSON.stringify(msg.tool_calls)}`);
  }
} catch (e) {
  expect(false, `exception: ${e.stack || e}`);
} finally {
  server.kill("SIGTERM");
  const { code } = await exited;
  expect(code === 0 || code === null, `server exit code ${code}`);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
