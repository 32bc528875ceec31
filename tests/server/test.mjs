#!/usr/bin/env node
// test.mjs - strata serve driven by the official `openai` npm client, as users drive it:
// models, chat (plain, streaming with usage, tools with and without streaming via the SDK's
// own accumulator), completions with stop, typed errors (400 with param, 401), and an aborted
// stream followed by a normal request. Greedy decoding makes streamed == non-streamed exact.
// Tool calls: the demo model would not write one, so the engine is teacher-forced with the
// text (strata_forced_output, accepted only with --test-forced-output); the detokenizer,
// parser and SSE framing after it run as in production.
//
//   npm ci --prefix tests/server && node tests/server/test.mjs
// Env: STRATA (default build/strata), STRATA_DEMO_MODEL (default demo), PORT.
// Prints "N passed, N failed" last; exits non-zero on any failure.
import { spawn } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";

// paths are relative to the repository root, wherever this is started from
const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const exe = resolve(root, process.env.STRATA || `${process.env.BUILD || "build"}/strata`);
const model = resolve(root, process.env.STRATA_DEMO_MODEL || "demo");
const port = Number(process.env.PORT || 18000 + (process.pid % 2000));
const key = "test-key";
let passed = 0, failed = 0;
function expect(cond, msg) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL: ${msg}`); }
}

const server = spawn(exe, ["serve", "--model", model, "--port", String(port), "--backend", "cpu",
  "--threads", "1", "--api-key", key, "--test-forced-output", "--quiet"],
  { stdio: ["ignore", "pipe", "inherit"], cwd: root });
let ready = "";
server.stdout.on("data", (d) => { ready += d; });
const exited = new Promise((res) => server.on("exit", (code, sig) => res({ code, sig })));

async function waitUp() {
  for (let i = 0; i < 100; i++) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/health`);
      if (r.ok) return true;
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0 });
const base = {
  model: "demo",
  messages: [{ role: "user", content: "Tell me a joke about computers." }],
  temperature: 0,
  max_tokens: 40,
  chat_template_kwargs: { enable_thinking: false },
};
const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "Current weather",
    parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } } },
  },
}];
const forced = "Let me check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n" +
  "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

async function main() {
  expect(await waitUp(), "server came up");
  expect(/listening on http:\/\/127\.0\.0\.1:\d+/.test(ready), `ready line prints the URL: ${ready}`);

  const models = await client.models.list();
  expect(models.data.length === 1 && typeof models.data[0].id === "string", "models.list");
  const one = await client.models.retrieve(models.data[0].id);
  expect(one.id === models.data[0].id, "models.retrieve");
  try {
    await client.models.retrieve("no-such-model");
    expect(false, "unknown model retrieved");
  } catch (e) {
    expect(e instanceof OpenAI.NotFoundError, `404 for an unknown model: ${e}`);
  }

  // plain chat
  const plain = await client.chat.completions.create(base);
  const content = plain.choices[0].message.content;
  expect(typeof content === "string" && content.length > 0, "chat content");
  expect(["stop", "length"].includes(plain.choices[0].finish_reason), "finish_reason");
  expect(plain.usage.total_tokens === plain.usage.prompt_tokens + plain.usage.completion_tokens,
    "usage adds up");
  expect(typeof plain.timings?.predicted_per_second === "number", "llama-server timings");

  // streaming with usage: same text as the plain call
  const stream = await client.chat.completions.create({
    ...base, stream: true, stream_options: { include_usage: true } });
  let text = "", usage = null, finish = null, chunks = 0, role = null;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.role) role = role ?? c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  expect(text === content, `streamed text == plain text:\n  ${JSON.stringify(text)}\n  ${JSON.stringify(content)}`);
  expect(role === "assistant", "role in the first delta");
  expect(usage && usage.completion_tokens === plain.usage.completion_tokens, "stream usage");
  expect(finish === plain.choices[0].finish_reason, "stream finish_reason");
  expect(chunks > 3, `one chunk per token (${chunks} chunks)`);
  // the same prompt a second time: all of it from the prefix cache (OpenAI's field)
  expect(usage?.prompt_tokens_details?.cached_tokens === usage?.prompt_tokens,
    `identical re-send cached: ${JSON.stringify(usage)}`);

  // no sampling fields: the checkpoint's generation_config.json (the demo's: temperature 0.7,
  // top_p 0.8, top_k 20), not temperature 1 over the whole vocabulary
  const q = { model: "demo", messages: [{ role: "user", content: "Write about the sea." }],
    max_tokens: 32, ignore_eos: true, seed: 4242, chat_template_kwargs: { enable_thinking: false } };
  const dflt = (await client.chat.completions.create(q)).choices[0].message.content;
  const expl = (await client.chat.completions.create({ ...q, temperature: 0.7, top_p: 0.8, top_k: 20 })).choices[0].message.content;
  const wide = (await client.chat.completions.create({ ...q, temperature: 1.0, top_p: 1, top_k: 0 })).choices[0].message.content;
  expect(dflt === expl && dflt !== wide,
    `generation_config defaults: ${JSON.stringify(dflt)} / explicit ${JSON.stringify(expl)} / wide ${JSON.stringify(wide)}`);

  // a conversation as an SDK user writes it: the next turn resumes the first turn's prompt up to
  // its assistant turn (where the template's rendering of the reply parts from the generation
  // prompt, "<think>\n\n</think>\n\n": ~7 tokens), and a second client with the same system
  // prompt in between resumes that prompt and leaves the first cached
  const sys = { role: "system", content: "You answer in one short sentence, politely." };
  const t1 = { ...base, messages: [sys, { role: "user", content: "Name a colour." }] };
  const r1 = await client.chat.completions.create(t1);
  const other = await client.chat.completions.create({ ...base, messages: [sys, { role: "user", content: "Name a fruit." }] });
  expect(other.usage.prompt_tokens_details?.cached_tokens > 0 &&
    other.usage.prompt_tokens_details.cached_tokens < other.usage.prompt_tokens,
    `shared system prompt: ${JSON.stringify(other.usage)}`);
  const t2 = { ...base, messages: [...t1.messages, r1.choices[0].message, { role: "user", content: "Another." }] };
  const r2 = await client.chat.completions.create(t2);
  expect(r2.usage.prompt_tokens_details?.cached_tokens >= r1.usage.prompt_tokens - 8 &&
    r2.usage.prompt_tokens_details.cached_tokens > other.usage.prompt_tokens_details.cached_tokens,
    `next turn: ${r2.usage.prompt_tokens_details?.cached_tokens} cached of ${r2.usage.prompt_tokens} ` +
    `(the first turn's prompt had ${r1.usage.prompt_tokens})`);
  expect(r2.timings?.cache_n === r2.usage.prompt_tokens_details?.cached_tokens, "timings.cache_n");

  // tools, non-streaming
  const tq = { ...base, tools, chat_template_kwargs: { enable_thinking: true }, strata_forced_output: forced };
  const tr = await client.chat.completions.create(tq);
  const call = tr.choices[0].message.tool_calls?.[0];
  expect(tr.choices[0].finish_reason === "tool_calls", "tool_calls finish_reason");
  expect(call?.function.name === "get_weather", "tool name");
  const args = JSON.parse(call?.function.arguments ?? "{}");
  expect(args.city === "Paris" && args.days === 3, `tool arguments ${call?.function.arguments}`);
  expect(tr.choices[0].message.reasoning_content === "Let me check.", "reasoning_content");

  // tools, streaming through the SDK's accumulator
  const runner = client.chat.completions.stream(tq);
  const final = await runner.finalChatCompletion();
  const scall = final.choices[0].message.tool_calls?.[0];
  expect(scall?.function.name === "get_weather" && scall?.function.arguments === call?.function.arguments,
    `streamed tool call ${JSON.stringify(scall)}`);
  expect(final.choices[0].finish_reason === "tool_calls", "streamed tool finish_reason");

  // completions with a stop string never emitted
  const comp = await client.completions.create({ model: "demo", prompt: "The river", max_tokens: 30, temperature: 0 });
  const full = comp.choices[0].text;
  if (full.length > 6) {
    const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 2);
    const cut = await client.completions.create({ model: "demo", prompt: "The river", max_tokens: 30, temperature: 0, stop: [stop] });
    expect(cut.choices[0].text === full.slice(0, full.indexOf(stop)) && cut.choices[0].finish_reason === "stop",
      `stop ${JSON.stringify(stop)}: ${JSON.stringify(cut.choices[0].text)}`);
  } else expect(false, `completion too short: ${JSON.stringify(full)}`);

  // typed errors
  try {
    await client.chat.completions.create({ ...base, temperature: "hot" });
    expect(false, "bad temperature accepted");
  } catch (e) {
    expect(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "temperature",
      `400 with param: ${e}`);
  }
  try {
    await new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "wrong", maxRetries: 0 })
      .chat.completions.create(base);
    expect(false, "wrong key accepted");
  } catch (e) {
    expect(e instanceof OpenAI.AuthenticationError && e.status === 401, `401: ${e}`);
  }

  // abort a long stream after 3 chunks; the engine must be free for the next request
  const longs = await client.chat.completions.create({ ...base, max_tokens: 100000, ignore_eos: true, stream: true });
  let n = 0;
  for await (const _ of longs) { if (++n >= 3) { longs.controller.abort(); break; } }
  const t0 = Date.now();
  const after = await client.chat.completions.create(base);
  expect(after.choices[0].message.content === content && Date.now() - t0 < 5000,
    `request after an aborted stream (${Date.now() - t0} ms)`);
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
