#!/usr/bin/env node
// anthropic.mjs - strata's Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens)
// driven by the official @anthropic-ai/sdk, as its users drive it: plain and streamed messages
// (the SDK's MessageStream accumulator and the raw events), a system prompt, thinking blocks,
// a tool round trip (tool_use -> tool_result -> text), stop_sequences, count_tokens against the
// real usage, x-api-key auth, errors in Anthropic's shape as the SDK's typed errors, an aborted
// stream followed by a normal request. The demo model writes nonsense, so thinking and tool
// calls are teacher-forced (strata_forced_output, accepted with --test-forced-output): the
// detokenizer, output parser and event framing after it run as in production.
//
//   npm ci --prefix tests/server && node tests/server/anthropic.mjs
// Prints "N passed, N failed" last; exits non-zero on any failure.
import Anthropic from "@anthropic-ai/sdk";
import { expect, forcedCall, key, run, weatherSchema } from "./harness.mjs";

const tools = [{ name: "get_weather", description: "Current weather", input_schema: weatherSchema }];

await run(20000, async (url) => {
  const client = new Anthropic({ baseURL: url, apiKey: key, maxRetries: 0 });
  const base = {
    model: "demo", max_tokens: 40, temperature: 0, thinking: { type: "disabled" },
    messages: [{ role: "user", content: "Tell me a joke about computers." }],
  };

  // plain
  const plain = await client.messages.create(base);
  const text = plain.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  expect(plain.type === "message" && plain.role === "assistant" && /^msg_/.test(plain.id), `message object ${plain.id}`);
  expect(text.length > 0 && plain.content.every((b) => b.type === "text"), `text blocks ${JSON.stringify(plain.content)}`);
  expect(["end_turn", "max_tokens"].includes(plain.stop_reason), `stop_reason ${plain.stop_reason}`);
  expect(plain.usage.output_tokens > 0 && plain.usage.input_tokens + plain.usage.cache_read_input_tokens > 5,
    `usage ${JSON.stringify(plain.usage)}`);

  // streaming through the SDK's accumulator: the same message; the raw events in order
  const events = [];
  const stream = client.messages.stream(base);
  stream.on("streamEvent", (ev) => events.push(ev.type));
  const final = await stream.finalMessage();
  const stext = final.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  expect(stext === text, `streamed text == plain text:\n  ${JSON.stringify(stext)}\n  ${JSON.stringify(text)}`);
  expect(final.stop_reason === plain.stop_reason && final.usage.output_tokens === plain.usage.output_tokens,
    `stream stop_reason and usage ${final.stop_reason} ${JSON.stringify(final.usage)}`);
  expect(events[0] === "message_start" && events.at(-1) === "message_stop" && events.at(-2) === "message_delta",
    `event order ${events.join(",")}`);
  expect(events.filter((t) => t === "content_block_start").length === events.filter((t) => t === "content_block_stop").length &&
    events.filter((t) => t === "content_block_delta").length > 3, `blocks and deltas ${events.join(",")}`);
  // the identical prompt again: resumed from the prefix cache (Anthropic's cache_read_input_tokens)
  expect(final.usage.cache_read_input_tokens > 0 &&
    final.usage.cache_read_input_tokens + final.usage.input_tokens === plain.usage.cache_read_input_tokens + plain.usage.input_tokens,
    `cache_read_input_tokens on a re-send ${JSON.stringify(final.usage)}`);

  // tool_choice any / tool: a call is forced, its input decoded under the tool's schema (the
  // demo model writes nonsense: only the constraint makes it a valid call)
  for (const tc of [{ type: "any" }, { type: "tool", name: "get_weather" }]) {
    const forced = await client.messages.create({ ...base, max_tokens: 300, tools, tool_choice: tc });
    const use = forced.content.find((b) => b.type === "tool_use");
    expect(forced.stop_reason === "tool_use" && use && use.name === "get_weather" &&
      typeof use.input === "object" && typeof use.input.city === "string",
      `tool_choice ${JSON.stringify(tc)} forces a valid call: ${forced.stop_reason} ${JSON.stringify(forced.content).slice(0, 300)}`);
  }

  // an assistant prefill: the reply continues the last assistant message (the prompt ends with
  // it, so it holds the prefill's tokens and no new turn)
  {
    const pre = { ...base, messages: [...base.messages, { role: "assistant", content: "Sure, here is one:" }] };
    const r = await client.messages.create(pre);
    const c1 = await client.messages.countTokens({ model: "demo", messages: pre.messages, thinking: base.thinking });
    const c0 = await client.messages.countTokens({ model: "demo", messages: base.messages, thinking: base.thinking });
    expect(r.content.length > 0 && r.content[0].type === "text" && !r.content[0].text.startsWith("Sure, here is one:"),
      `prefill: a continuation ${JSON.stringify(r.content).slice(0, 200)}`);
    expect(c1.input_tokens > c0.input_tokens, `prefill: the prompt holds the prefill (${c1.input_tokens} > ${c0.input_tokens})`);
  }

  // count_tokens: the prompt the same request is given
  const counted = await client.messages.countTokens({ model: "demo", messages: base.messages, thinking: base.thinking });
  expect(counted.input_tokens === plain.usage.input_tokens + plain.usage.cache_read_input_tokens,
    `count_tokens ${counted.input_tokens} == usage ${JSON.stringify(plain.usage)}`);

  // a system prompt (a string, and the same as text blocks) reaches the prompt
  const sys = "You answer in one short sentence, politely.";
  const ws = await client.messages.countTokens({ model: "demo", system: sys, messages: base.messages, thinking: base.thinking });
  const wb = await client.messages.countTokens({ model: "demo", system: [{ type: "text", text: sys }], messages: base.messages, thinking: base.thinking });
  expect(ws.input_tokens > counted.input_tokens + 5 && wb.input_tokens === ws.input_tokens,
    `system prompt counted: ${ws.input_tokens} / blocks ${wb.input_tokens} / none ${counted.input_tokens}`);
  // a system message inside messages (Claude Code sends them): first, the system prompt; later,
  // a user turn where it was said
  const count = async (b) => (await client.messages.countTokens({ model: "demo", thinking: base.thinking, ...b })).input_tokens;
  expect(await count({ messages: [{ role: "system", content: sys }, ...base.messages] }) === ws.input_tokens &&
    await count({ system: "A.", messages: [{ role: "system", content: sys }, ...base.messages] }) ===
      await count({ system: `A.\n\n${sys}`, messages: base.messages }), "a leading system message joins the system prompt");
  expect(await count({ messages: [...base.messages, { role: "system", content: [{ type: "text", text: sys }] }] }) ===
    await count({ messages: [...base.messages, { role: "user", content: sys }] }), "a later system message: a user turn");
  const withSys = await client.messages.create({ ...base, system: sys });
  expect(withSys.usage.input_tokens + withSys.usage.cache_read_input_tokens === ws.input_tokens,
    `system prompt in the generation: ${JSON.stringify(withSys.usage)}`);

  // thinking blocks: plain and streamed
  const tq = { ...base, thinking: { type: "enabled", budget_tokens: 1024 }, strata_forced_output: "Two plus two.\n</think>\n\nIt is four." };
  const th = await client.messages.create(tq);
  expect(th.content.length === 2 && th.content[0].type === "thinking" && th.content[0].thinking === "Two plus two." &&
    typeof th.content[0].signature === "string" && th.content[1].type === "text" && th.content[1].text === "It is four.",
    `thinking block ${JSON.stringify(th.content)}`);
  expect(th.stop_reason === "end_turn", `thinking stop_reason ${th.stop_reason}`);
  const ths = client.messages.stream(tq);
  let thinkingDelta = "", sawSignature = false;
  ths.on("thinking", (d) => { thinkingDelta += d; });
  ths.on("streamEvent", (ev) => { if (ev.type === "content_block_delta" && ev.delta.type === "signature_delta") sawSignature = true; });
  const thf = await ths.finalMessage();
  expect(JSON.stringify(thf.content) === JSON.stringify(th.content) && thinkingDelta === "Two plus two." && sawSignature,
    `streamed thinking ${JSON.stringify(thf.content)} (deltas ${JSON.stringify(thinkingDelta)})`);

  // a tool round trip: tool_use (plain and streamed, input_json_delta), then tool_result
  const q1 = { ...base, tools, thinking: { type: "enabled", budget_tokens: 1024 }, strata_forced_output: forcedCall,
    messages: [{ role: "user", content: "What is the weather in Paris?" }] };
  const r1 = await client.messages.create(q1);
  const use = r1.content.find((b) => b.type === "tool_use");
  expect(r1.stop_reason === "tool_use", `tool_use stop_reason ${r1.stop_reason}`);
  expect(use?.name === "get_weather" && use.input.city === "Paris" && use.input.days === 3 && typeof use.id === "string",
    `tool_use block ${JSON.stringify(use)}`);
  expect(r1.content[0].type === "thinking" && r1.content[0].thinking === "Let me check.", `thinking before the call ${JSON.stringify(r1.content[0])}`);
  let partial = "";
  const s1 = client.messages.stream(q1);
  s1.on("inputJson", (d) => { partial += d; });
  const f1 = await s1.finalMessage();
  const suse = f1.content.find((b) => b.type === "tool_use");
  expect(suse && JSON.stringify(suse.input) === JSON.stringify(use.input) && f1.stop_reason === "tool_use" &&
    JSON.stringify(JSON.parse(partial)) === JSON.stringify(use.input), `streamed tool_use ${JSON.stringify(suse)} (json ${partial})`);
  const q2 = {
    ...q1, strata_forced_output: "Sunny, 21 degrees.\n</think>\n\nIt is sunny in Paris.",
    messages: [...q1.messages, { role: "assistant", content: r1.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: [{ type: "text", text: "sunny, 21 C" }] }] }],
  };
  const r2 = await client.messages.create(q2);
  const t2 = r2.content.find((b) => b.type === "text");
  expect(t2?.text === "It is sunny in Paris." && r2.stop_reason === "end_turn", `after the tool result ${JSON.stringify(r2.content)}`);
  const c2 = await client.messages.countTokens({ model: "demo", messages: q2.messages, tools, thinking: q2.thinking });
  const c2s = await client.messages.countTokens({ model: "demo", tools, thinking: q2.thinking, messages: [...q2.messages.slice(0, 2),
    { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny, 21 C" }] }] });
  expect(r2.usage.input_tokens + r2.usage.cache_read_input_tokens === c2.input_tokens && c2s.input_tokens === c2.input_tokens,
    `the tool result in the prompt: usage ${JSON.stringify(r2.usage)}, counted ${c2.input_tokens} / string content ${c2s.input_tokens}`);
  expect(r2.usage.cache_read_input_tokens > 0, `the second turn resumes the first from the cache ${JSON.stringify(r2.usage)}`);
  // the same conversation through the chat route: the same prompt
  const chat = await (await fetch(`${url}/v1/chat/completions`, { method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify({ max_tokens: 1, chat_template_kwargs: { enable_thinking: true },
      tools: tools.map((t) => ({ type: "function", function: { name: t.name, description: t.description, parameters: t.input_schema } })),
      messages: [q1.messages[0],
        { role: "assistant", content: "", reasoning_content: "Let me check.", tool_calls: [{ id: use.id, type: "function", function: { name: use.name, arguments: use.input } }] },
        { role: "tool", tool_call_id: use.id, content: "sunny, 21 C" }] }) })).json();
  expect(chat.usage?.prompt_tokens === c2.input_tokens, `round trip prompt == chat's: ${c2.input_tokens} vs ${JSON.stringify(chat.usage)}`);

  // stop_sequences: the text before it, stop_reason stop_sequence naming it
  const long = await client.messages.create({ ...base, max_tokens: 30 });
  const full = long.content.map((b) => b.text).join("");
  if (full.length > 8) {
    const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 3);
    const cut = await client.messages.create({ ...base, max_tokens: 30, stop_sequences: [stop] });
    expect(cut.stop_reason === "stop_sequence" && cut.stop_sequence === stop &&
      cut.content.map((b) => b.text).join("") === full.slice(0, full.indexOf(stop)),
      `stop_sequences ${JSON.stringify(stop)}: ${JSON.stringify(cut)}`);
  } else expect(false, `reply too short for stop_sequences: ${JSON.stringify(full)}`);

  // errors: Anthropic's shape, the SDK's typed errors
  const bads = [
    [{ model: "demo", messages: base.messages }, /max_tokens/, "missing max_tokens"],
    [{ ...base, messages: [{ role: "tool", content: "x" }] }, /role/, "bad role"],
    [{ ...base, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }] }] }, /image/, "image block"],
    [{ ...base, tools: [{ type: "web_search_20250305", name: "web_search" }] }, /server tool/, "server tool"],
    [{ ...base, temperature: "hot" }, /temperature/, "bad temperature"],
    [{ ...base, tools, tool_choice: { type: "auto" }, stop_sequences: [""] }, /stop/, "empty stop sequence"],
  ];
  for (const [body, re, what] of bads) {
    try {
      await client.messages.create(body);
      expect(false, `${what} accepted`);
    } catch (e) {
      expect(e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.type === "error" &&
        e.error?.error?.type === "invalid_request_error" && re.test(e.error?.error?.message),
        `${what}: 400 in Anthropic's shape: ${e} ${JSON.stringify(e.error)}`);
    }
  }
  try {
    await new Anthropic({ baseURL: url, apiKey: "wrong", maxRetries: 0 }).messages.create(base);
    expect(false, "wrong x-api-key accepted");
  } catch (e) {
    expect(e instanceof Anthropic.AuthenticationError && e.error?.error?.type === "authentication_error", `401: ${e}`);
  }
  // Authorization: Bearer works too (authToken), and the anthropic-version header is accepted
  const bearer = new Anthropic({ baseURL: url, apiKey: null, authToken: key, maxRetries: 0 });
  expect((await bearer.messages.create(base)).content.map((b) => b.text).join("") === text, "Authorization: Bearer");
  // a CORS preflight for the route
  const pre = await fetch(`${url}/v1/messages`, { method: "OPTIONS", headers: { Origin: "http://localhost:3000" } });
  expect(pre.status === 204 && pre.headers.get("access-control-allow-origin") === "http://localhost:3000", `preflight ${pre.status}`);

  // abort a long stream; the engine is free for the next request
  const longs = client.messages.stream({ ...base, max_tokens: 100000, ignore_eos: true });
  let n = 0;
  for await (const ev of longs) { if (ev.type === "content_block_delta" && ++n >= 3) { longs.abort(); break; } }
  const t0 = Date.now();
  const after = await client.messages.create(base);
  expect(after.content.map((b) => b.text).join("") === text && Date.now() - t0 < 5000,
    `request after an aborted stream (${Date.now() - t0} ms)`);
}, async (url) => {
  // a stream the server's shutdown cuts: it ends with Anthropic's error event (the SDK throws)
  const client = new Anthropic({ baseURL: url, apiKey: key, maxRetries: 0 });
  const stream = await client.messages.create({ model: "demo", max_tokens: 100000, ignore_eos: true, stream: true,
    messages: [{ role: "user", content: "Go on." }] });
  const it = stream[Symbol.asyncIterator]();
  for (let n = 0; n < 3;) if ((await it.next()).value?.type === "content_block_delta") n++;
  return async () => {
    try {
      while (!(await it.next()).done);
      expect(false, "a stream cut by the shutdown ended without an error event");
    } catch (e) {
      expect(e instanceof Anthropic.APIError && e.error?.error?.type === "overloaded_error" && /shutting down/.test(e.message),
        `shutdown mid-stream: ${e}`);
    }
  };
});
