#!/usr/bin/env node
// ollama.mjs - strata serve's Ollama API driven by the official `ollama` npm client (ollama-js)
// as Ollama users drive it: list / show / ps / version, chat and generate streaming (NDJSON,
// Ollama's default) and not, options (num_predict, stop, seed, temperature, num_ctx), think,
// a tool round trip (arguments as an object), an aborted stream, and bad input answered in
// Ollama's error shape. Greedy decoding makes streamed == non-streamed exact. Tool calls and
// thinking: the demo model would not write them, so the engine is teacher-forced with the text
// (strata_forced_output, only with --test-forced-output; ollama-js sends the request object
// as given); the detokenizer, parser and NDJSON framing after it run as in production.
//
//   npm ci --prefix tests/server && node tests/server/ollama.mjs
// Env: STRATA (default build/strata), STRATA_DEMO_MODEL (default demo), PORT.
// Prints "N passed, N failed" last; exits non-zero on any failure.
import { spawn } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Ollama } from "ollama";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const exe = resolve(root, process.env.STRATA || `${process.env.BUILD || "build"}/strata`);
const model = resolve(root, process.env.STRATA_DEMO_MODEL || "demo");
const port = Number(process.env.PORT || 20000 + (process.pid % 2000));
const key = "ollama-test-key";
let passed = 0, failed = 0;
function expect(cond, msg) {
  if (process.env.DEBUG) console.error(`${cond ? "ok" : "FAIL"}: ${msg.split("\n")[0].slice(0, 80)}`);
  if (cond) passed++;
  else { failed++; console.error(`FAIL: ${msg}`); }
}

const server = spawn(exe, ["serve", "--model", model, "--port", String(port), "--backend", "cpu",
  "--threads", "1", "--api-key", key, "--test-forced-output", "--quiet"],
  { stdio: ["ignore", "pipe", "inherit"], cwd: root });
const exited = new Promise((res) => server.on("exit", (code, sig) => res({ code, sig })));
process.on("exit", () => server.kill("SIGKILL")); // never leave it behind, even on a crash

async function waitUp() {
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/api/version`)).ok) return true;
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

const host = `http://127.0.0.1:${port}`;
const ollama = new Ollama({ host, headers: { Authorization: `Bearer ${key}` } });
const user = [{ role: "user", content: "Tell me a joke about computers." }];
const greedy = { temperature: 0, num_predict: 40 };
const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "Current weather",
    parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } } },
  },
}];
const forcedCall = "Let me check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n" +
  "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

// a request that must fail: its ResponseError (status and message)
async function refused(p) {
  try { await p; return { status: 0, message: "accepted" }; }
  catch (e) { return { status: e.status_code ?? 0, message: String(e.error ?? e.message) }; }
}

async function collect(stream) {
  const parts = [];
  for await (const p of stream) parts.push(p);
  return parts;
}

function isFinal(r) {
  return r.done === true && typeof r.done_reason === "string" &&
    ["total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
      "eval_duration"].every((k) => Number.isInteger(r[k]) && r[k] >= 0) &&
    r.total_duration >= r.eval_duration && r.eval_count > 0 && r.prompt_eval_count > 0;
}

async function main() {
  expect(await waitUp(), "server came up");

  // the listings
  const ver = await ollama.version();
  expect(/^\d+\.\d+\.\d+$/.test(ver.version), `version ${JSON.stringify(ver)}`);
  const list = await ollama.list();
  const name = list.models?.[0]?.name;
  expect(list.models.length === 1 && name === "demo:latest" && list.models[0].size > 0 &&
    /^[0-9a-f]{64}$/.test(list.models[0].digest), `list ${JSON.stringify(list)}`);
  expect(list.models[0].details?.quantization_level === "BF16" &&
    /^[\d.]+[MB]$/.test(list.models[0].details?.parameter_size), `list details ${JSON.stringify(list.models[0].details)}`);
  const show = await ollama.show({ model: name });
  expect(["completion", "tools", "thinking"].every((c) => show.capabilities?.includes(c)),
    `show capabilities ${JSON.stringify(show.capabilities)}`);
  expect(show.model_info?.["qwen35.context_length"] === 32768 &&
    show.model_info?.["general.architecture"] === "qwen35", `show model_info ${JSON.stringify(show.model_info)}`);
  expect(/^temperature\s+0\.7$/m.test(show.parameters) && /^top_k\s+20$/m.test(show.parameters),
    `show parameters from generation_config: ${JSON.stringify(show.parameters)}`);
  expect(show.template.includes("<|im_start|>") && show.details?.family === "qwen35", "show template, details");
  const notThere = await refused(ollama.show({ model: "llama3:8b" }));
  expect(notThere.status === 404 && notThere.message.includes("llama3:8b"), `show unknown model: ${JSON.stringify(notThere)}`);
  const ps = await ollama.ps();
  expect(ps.models.length === 1 && ps.models[0].name === name && ps.models[0].context_length === 32768 &&
    !isNaN(Date.parse(ps.models[0].expires_at)), `ps ${JSON.stringify(ps)}`);

  // chat, not streamed and streamed: the same text; NDJSON parts, the last one with the counts
  const plain = await ollama.chat({ model: name, messages: user, options: greedy, think: false });
  const content = plain.message?.content;
  expect(typeof content === "string" && content.length > 0 && plain.message.role === "assistant", "chat content");
  expect(isFinal(plain) && !isNaN(Date.parse(plain.created_at)), `chat final fields ${JSON.stringify(plain)}`);
  const parts = await collect(await ollama.chat({ model: name, messages: user, options: greedy, think: false, stream: true }));
  const streamed = parts.map((p) => p.message?.content ?? "").join("");
  expect(streamed === content, `streamed chat == plain:\n  ${JSON.stringify(streamed)}\n  ${JSON.stringify(content)}`);
  expect(parts.length > 3 && parts.slice(0, -1).every((p) => p.done === false), `one part per token (${parts.length})`);
  const last = parts[parts.length - 1];
  expect(isFinal(last) && last.eval_count === plain.eval_count && last.done_reason === plain.done_reason,
    `stream's last part ${JSON.stringify(last)}`);
  expect(last.prompt_eval_count === plain.prompt_eval_count, "prompt_eval_count");
  // no "stream" field at all: Ollama streams by default (ollama-js always sends it; fetch does not)
  const raw = await fetch(`${host}/api/chat`, { method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: name, messages: user, options: greedy, think: false }) });
  const lines = (await raw.text()).trim().split("\n").map((l) => JSON.parse(l));
  expect(raw.headers.get("content-type") === "application/x-ndjson" && lines.length === parts.length &&
    lines[lines.length - 1].done === true, `stream by default: ${raw.headers.get("content-type")}, ${lines.length} lines`);

  // generate: templated and raw, streamed and not
  const gen = await ollama.generate({ model: name, prompt: "Write about the sea.", options: greedy, think: false });
  expect(typeof gen.response === "string" && gen.response.length > 0 && isFinal(gen), `generate ${JSON.stringify(gen)}`);
  const gparts = await collect(await ollama.generate({ model: name, prompt: "Write about the sea.", options: greedy, think: false, stream: true }));
  expect(gparts.map((p) => p.response).join("") === gen.response && gparts[gparts.length - 1].done === true,
    "streamed generate == plain");
  const rawGen = await ollama.generate({ model: name, prompt: "The river", raw: true, options: { temperature: 0, num_predict: 12 } });
  expect(rawGen.prompt_eval_count === 2 && rawGen.eval_count === 12 && rawGen.done_reason === "length",
    `raw generate: the prompt as given, no template: ${JSON.stringify(rawGen)}`);
  const sysGen = await ollama.generate({ model: name, prompt: "Hi", system: "You are terse.", options: greedy, think: false });
  expect(sysGen.prompt_eval_count > gen.prompt_eval_count - 6 && sysGen.prompt_eval_count > 10, "generate with system");
  const load = await ollama.generate({ model: name, prompt: "" });
  expect(load.done === true && load.done_reason === "load", `empty prompt loads: ${JSON.stringify(load)}`);

  // options
  const short = await ollama.chat({ model: name, messages: user, options: { temperature: 0, num_predict: 3 }, think: false });
  expect(short.eval_count === 3 && short.done_reason === "length", `num_predict 3: ${short.eval_count} ${short.done_reason}`);
  if (content.length > 6) {
    const stop = content.slice(Math.floor(content.length / 2), Math.floor(content.length / 2) + 2);
    const cut = await ollama.chat({ model: name, messages: user, options: { ...greedy, stop: [stop] }, think: false });
    expect(cut.message.content === content.slice(0, content.indexOf(stop)) && cut.done_reason === "stop",
      `stop ${JSON.stringify(stop)}: ${JSON.stringify(cut.message.content)}`);
  } else expect(false, `chat too short: ${JSON.stringify(content)}`);
  const sampled = { temperature: 1.0, top_k: 0, top_p: 1, num_predict: 24, seed: 7 };
  const s1 = await ollama.chat({ model: name, messages: user, options: sampled, think: false });
  const s2 = await ollama.chat({ model: name, messages: user, options: sampled, think: false });
  const s3 = await ollama.chat({ model: name, messages: user, options: { ...sampled, seed: 8, repeat_penalty: 1.3, min_p: 0.01,
    presence_penalty: 0.5, frequency_penalty: 0.5 }, think: false });
  expect(s1.message.content === s2.message.content && s1.message.content !== s3.message.content,
    `seed: ${JSON.stringify([s1.message.content, s2.message.content, s3.message.content])}`);
  const big = await ollama.chat({ model: name, messages: user, options: { ...greedy, num_ctx: 1 << 20 }, think: false });
  expect(big.message.content === content, "num_ctx above the server's context: clamped");
  const tiny = await refused(ollama.chat({ model: name, messages: user, options: { ...greedy, num_ctx: 8 } }));
  expect(tiny.status === 400 && tiny.message.includes("num_ctx is 8"), `num_ctx below the prompt: ${JSON.stringify(tiny)}`);
  const capped = await ollama.chat({ model: name, messages: user, options: { temperature: 0, num_ctx: plain.prompt_eval_count + 2 }, think: false });
  expect(capped.eval_count <= 2 && capped.done_reason === "length", `num_ctx caps the reply: ${capped.eval_count}`);
  const hot = await refused(ollama.chat({ model: name, messages: user, options: { temperature: "hot" } }));
  expect(hot.status === 400 && hot.message.startsWith("options.temperature:"), `bad option named: ${JSON.stringify(hot)}`);

  // think: the reply's message.thinking (streamed as thinking parts)
  const forcedThink = "The user wants a joke.\n</think>\n\nWhy did the computer sneeze? It had a virus.";
  const th = await ollama.chat({ model: name, messages: user, think: true, options: greedy, strata_forced_output: forcedThink });
  expect(th.message.thinking === "The user wants a joke." && th.message.content === "Why did the computer sneeze? It had a virus.",
    `think: ${JSON.stringify(th.message)}`);
  const tparts = await collect(await ollama.chat({ model: name, messages: user, think: true, options: greedy,
    strata_forced_output: forcedThink, stream: true }));
  expect(tparts.map((p) => p.message.thinking ?? "").join("") === th.message.thinking &&
    tparts.map((p) => p.message.content).join("") === th.message.content, "streamed thinking");
  const gth = await ollama.generate({ model: name, prompt: "Joke?", think: true, options: greedy, strata_forced_output: forcedThink });
  expect(gth.thinking === "The user wants a joke." && gth.response.startsWith("Why did"), `generate think: ${JSON.stringify(gth)}`);
  const off = await ollama.chat({ model: name, messages: user, think: false, options: greedy, strata_forced_output: forcedThink });
  expect(!off.message.thinking && off.prompt_eval_count > th.prompt_eval_count,
    `think false closes the block in the prompt (${off.prompt_eval_count} vs ${th.prompt_eval_count} tokens)`);

  // tools: a call (arguments an object), then the round trip with the tool's answer
  const tc = await ollama.chat({ model: name, messages: [{ role: "user", content: "Weather in Paris for 3 days?" }],
    tools, think: true, options: greedy, strata_forced_output: forcedCall });
  const call = tc.message.tool_calls?.[0];
  expect(call?.function?.name === "get_weather" && call.function.arguments?.city === "Paris" &&
    call.function.arguments?.days === 3, `tool call ${JSON.stringify(tc.message)}`);
  expect(tc.message.thinking === "Let me check." && tc.done_reason === "stop", "tool call thinking, done_reason");
  const scalls = (await collect(await ollama.chat({ model: name, messages: [{ role: "user", content: "Weather in Paris for 3 days?" }],
    tools, think: true, options: greedy, strata_forced_output: forcedCall, stream: true })))
    .flatMap((p) => p.message.tool_calls ?? []);
  expect(scalls.length === 1 && JSON.stringify(scalls[0].function) === JSON.stringify(call.function),
    `streamed tool call ${JSON.stringify(scalls)}`);
  const history = [{ role: "user", content: "Weather in Paris for 3 days?" }, tc.message,
    { role: "tool", content: "{\"forecast\": \"sunny\"}", tool_name: "get_weather" }];
  const answer = await ollama.chat({ model: name, messages: history, tools, think: true, options: greedy,
    strata_forced_output: "Sunny.\n</think>\n\nIt will be sunny in Paris." });
  expect(answer.message.content === "It will be sunny in Paris." && !answer.message.tool_calls,
    `round trip answer ${JSON.stringify(answer.message)}`);
  const rendered = await (await fetch(`${host}/apply-template`, { method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify({ messages: [{ role: "user", content: "x" },
      { role: "assistant", content: "", tool_calls: [{ function: call.function }] }, { role: "tool", content: "sunny" }] }) })).json();
  expect(answer.prompt_eval_count > tc.prompt_eval_count + 10 && rendered.prompt?.includes("<parameter=city>\nParis"),
    "the tool call and result are in the next prompt");

  // an aborted stream; the engine is free for the next request
  const longText = "and the sea went on ".repeat(300);
  const long = await ollama.chat({ model: name, messages: user, stream: true, options: greedy, strata_forced_output: longText });
  let n = 0, aborted = false;
  try {
    for await (const _ of long) { if (++n === 3) long.abort(); }
  } catch (e) { aborted = e.name === "AbortError"; }
  expect(aborted && n >= 3, `stream aborted after ${n} parts`);
  const t0 = Date.now();
  const after = await ollama.chat({ model: name, messages: user, options: greedy, think: false });
  expect(after.message.content === content && Date.now() - t0 < 5000, `request after an aborted stream (${Date.now() - t0} ms)`);

  // format: constrained decoding (the demo model writes nonsense: only the grammar makes it JSON)
  {
    const schema = { type: "object", properties: { name: { type: "string" }, age: { type: "integer" }, tags: { type: "array", items: { type: "string" }, maxItems: 3 } },
      required: ["name", "age"], additionalProperties: false };
    const r = await ollama.chat({ model: name, messages: user, format: schema, think: false, options: { ...greedy, num_predict: 300 } });
    let v = null;
    try { v = JSON.parse(r.message.content); } catch { /* checked below */ }
    expect(v && typeof v.name === "string" && Number.isInteger(v.age) && Object.keys(v).every((k) => k in schema.properties),
      `format: a schema gives matching JSON: ${r.message.content.slice(0, 200)}`);
    const g = await ollama.generate({ model: name, prompt: "A JSON object:", format: "json", think: false, options: { ...greedy, num_predict: 200 } });
    let o = null;
    try { o = JSON.parse(g.response); } catch { /* checked below */ }
    expect(o && typeof o === "object" && !Array.isArray(o), `format "json" gives a JSON object: ${g.response.slice(0, 200)}`);
  }

  // bad input: Ollama's error shape, clear words
  const cases = [
    [() => ollama.chat({ model: name, messages: user, format: 7 }), 400, "'format'"],
    [() => ollama.chat({ model: name, messages: user, format: { type: "string", format: "email" } }), 400, "'format' is not supported"],
    [() => ollama.generate({ model: name, prompt: "def f(", suffix: "return 1" }), 400, "fill-in-the-middle"],
    [() => ollama.generate({ model: name, prompt: "x", template: "{{ .Prompt }}" }), 400, "cannot be overridden"],
    [() => ollama.chat({ model: name, messages: [{ role: "user", content: "x", images: ["aGk="] }] }), 400, "images"],
    [() => ollama.chat({ model: name, messages: [{ role: "wizard", content: "x" }] }), 400, "wizard"],
    [() => ollama.chat({ model: name, messages: user, think: "maybe" }), 400, "'think'"],
    [() => ollama.chat({ model: name, messages: "hi" }), 400, "'messages' must be an array"],
    [() => ollama.embed({ model: name, input: "x" }), 501, "embeddings"],
    [() => ollama.pull({ model: "llama3" }), 501, "pulling"],
    [() => ollama.delete({ model: name }), 501, "deleting models"],
    [() => new Ollama({ host }).chat({ model: name, messages: user }), 401, "API key"],
  ];
  for (const [p, status, words] of cases) {
    const r = await refused(p());
    expect(r.status === status && r.message.includes(words), `want ${status} '${words}': ${JSON.stringify(r)}`);
  }
  const bad = await fetch(`${host}/api/chat`, { method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` }, body: "{\"model\":" });
  const badBody = await bad.json();
  expect(bad.status === 400 && typeof badBody.error === "string" && badBody.error.includes("invalid JSON"),
    `malformed JSON: ${JSON.stringify(badBody)}`);
  const nowhere = await fetch(`${host}/api/nowhere`, { headers: { Authorization: `Bearer ${key}` } });
  expect(nowhere.status === 404 && typeof (await nowhere.json()).error === "string", "unknown /api/ route: 404 {error}");
  const get = await fetch(`${host}/api/chat`, { headers: { Authorization: `Bearer ${key}` } });
  expect(get.status === 405 && (await get.json()).error?.includes("method not allowed"), "GET /api/chat: 405 {error}");
  const still = await ollama.chat({ model: name, messages: user, options: greedy, think: false });
  expect(still.message.content === content, "the server still answers after the bad requests");
}

try {
  await main();
} catch (e) {
  expect(false, `unexpected: ${e?.stack || e}`);
}
server.kill("SIGTERM");
const { code } = await Promise.race([exited, new Promise((r) => setTimeout(() => r({ code: "timeout" }), 5000))]);
expect(code === 0, `strata serve exits 0 on SIGTERM (got ${code})`);
if (code === "timeout") server.kill("SIGKILL");
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
