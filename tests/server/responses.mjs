#!/usr/bin/env node
// responses.mjs - strata's OpenAI Responses API (POST /v1/responses, stateless) driven by the
// official `openai` npm client's client.responses: plain and streamed (the SDK's ResponseStream
// accumulator and the raw events with their sequence numbers), instructions, reasoning items,
// function tools and a function_call -> function_call_output round trip, checked against the
// chat route's prompt for the same conversation, typed errors, an aborted stream. Reasoning and
// tool calls are teacher-forced (strata_forced_output, accepted with --test-forced-output): the
// demo model writes nonsense; the parser and event framing after it run as in production.
//
//   npm ci --prefix tests/server && node tests/server/responses.mjs
// Prints "N passed, N failed" last; exits non-zero on any failure.
import OpenAI from "openai";
import { expect, forcedCall, key, run, weatherSchema } from "./harness.mjs";

const tools = [{ type: "function", name: "get_weather", description: "Current weather", parameters: weatherSchema }];
const chatTools = [{ type: "function", function: { name: "get_weather", description: "Current weather", parameters: weatherSchema } }];

await run(22000, async (url) => {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0 });
  const off = { chat_template_kwargs: { enable_thinking: false } };
  const base = { model: "demo", input: "Tell me a joke about computers.", max_output_tokens: 40, temperature: 0, reasoning: { effort: "none" } };

  // plain: the SDK's output_text, the object's fields
  const plain = await client.responses.create(base);
  expect(plain.object === "response" && /^resp_/.test(plain.id) && ["completed", "incomplete"].includes(plain.status),
    `response object ${plain.id} ${plain.status}`);
  const msg = plain.output.find((o) => o.type === "message");
  expect(plain.output_text.length > 0 && msg?.role === "assistant" && msg.content[0].type === "output_text" &&
    msg.content[0].text === plain.output_text, `output_text ${JSON.stringify(plain.output)}`);
  expect(plain.usage.total_tokens === plain.usage.input_tokens + plain.usage.output_tokens &&
    plain.usage.output_tokens_details.reasoning_tokens === 0 && typeof plain.usage.input_tokens_details.cached_tokens === "number",
    `usage ${JSON.stringify(plain.usage)}`);
  const chat = await client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: base.input }],
    max_tokens: 40, temperature: 0, ...off });
  expect(chat.choices[0].message.content === plain.output_text && chat.usage.prompt_tokens === plain.usage.input_tokens,
    `same prompt and text as chat: ${JSON.stringify(chat.choices[0].message.content)} (${chat.usage.prompt_tokens} tokens)`);
  expect(plain.status === (chat.choices[0].finish_reason === "length" ? "incomplete" : "completed") &&
    (plain.status === "completed" || plain.incomplete_details?.reason === "max_output_tokens"), `status ${plain.status}`);

  // streaming: the raw events (sequence numbers 0, 1, 2, ...), then the SDK's accumulator
  const raw = await client.responses.create({ ...base, stream: true });
  const types = [];
  let seqOk = true, deltas = "", done = null;
  for await (const ev of raw) {
    if (ev.sequence_number !== types.length) seqOk = false;
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") deltas += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") done = ev.response;
  }
  expect(seqOk, `sequence_number counts from 0: ${types.join(",")}`);
  expect(types[0] === "response.created" && types[1] === "response.in_progress" &&
    ["response.completed", "response.incomplete"].includes(types.at(-1)), `first and last events ${types.join(",")}`);
  for (const t of ["response.output_item.added", "response.content_part.added", "response.output_text.done",
    "response.content_part.done", "response.output_item.done"])
    expect(types.filter((x) => x === t).length === 1, `one ${t}`);
  expect(deltas === plain.output_text && done?.output_text === undefined && done?.output[0].content[0].text === plain.output_text,
    `streamed deltas == plain text: ${JSON.stringify(deltas)}`);
  expect(done?.usage.input_tokens_details.cached_tokens === done?.usage.input_tokens, `re-send cached ${JSON.stringify(done?.usage)}`);
  // (the SDK adds output_text to a plain response only; a stream's final one has the items)
  const acc = await client.responses.stream(base).finalResponse();
  const accText = acc.output.filter((o) => o.type === "message").map((o) => o.content[0].text).join("");
  expect(accText === plain.output_text && acc.status === plain.status, `ResponseStream.finalResponse ${JSON.stringify(acc.output)}`);

  // instructions: the system message (the same prompt as chat's)
  const ins = "You answer in one short sentence, politely.";
  const wi = await client.responses.create({ ...base, instructions: ins });
  const wc = await client.chat.completions.create({ model: "demo", messages: [{ role: "system", content: ins },
    { role: "user", content: base.input }], max_tokens: 40, temperature: 0, ...off });
  expect(wi.usage.input_tokens === wc.usage.prompt_tokens && wi.output_text === wc.choices[0].message.content &&
    wi.instructions === ins, `instructions: ${wi.usage.input_tokens} vs chat ${wc.usage.prompt_tokens}`);
  // message items with content parts, and a developer message first: the same as instructions
  const items = await client.responses.create({ ...base, input: [
    { type: "message", role: "developer", content: [{ type: "input_text", text: ins }] },
    { role: "user", content: [{ type: "input_text", text: base.input }] }] });
  expect(items.usage.input_tokens === wi.usage.input_tokens && items.output_text === wi.output_text, "input items");
  // a developer message later in the conversation: a user turn where it was said (chat's prompt)
  const later = await client.responses.create({ ...base, input: [{ role: "user", content: base.input },
    { role: "developer", content: ins }] });
  const laterChat = await client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: base.input },
    { role: "user", content: ins }], max_tokens: 40, temperature: 0, ...off });
  expect(later.usage.input_tokens === laterChat.usage.prompt_tokens, `a later developer message: ${later.usage.input_tokens} vs ${laterChat.usage.prompt_tokens}`);

  // reasoning + a function call, plain and streamed
  const q1 = { ...base, tools, reasoning: { effort: "medium" }, strata_forced_output: forcedCall,
    input: [{ role: "user", content: "What is the weather in Paris?" }] };
  const r1 = await client.responses.create(q1);
  const rs = r1.output.find((o) => o.type === "reasoning");
  const fc = r1.output.find((o) => o.type === "function_call");
  expect(rs?.content?.[0]?.type === "reasoning_text" && rs.content[0].text === "Let me check." && Array.isArray(rs.summary),
    `reasoning item ${JSON.stringify(rs)}`);
  expect(fc?.name === "get_weather" && typeof fc.call_id === "string" && /^fc_/.test(fc.id) && fc.status === "completed",
    `function_call item ${JSON.stringify(fc)}`);
  const args = JSON.parse(fc?.arguments ?? "{}");
  expect(args.city === "Paris" && args.days === 3, `arguments ${fc?.arguments}`);
  expect(r1.usage.output_tokens_details.reasoning_tokens > 0 && r1.usage.output_tokens_details.reasoning_tokens < r1.usage.output_tokens,
    `reasoning_tokens ${JSON.stringify(r1.usage)}`);
  const s1 = client.responses.stream(q1);
  let argDeltas = "", reasoningDeltas = "", argsDone = null;
  s1.on("response.function_call_arguments.delta", (ev) => { argDeltas += ev.delta; });
  s1.on("response.function_call_arguments.done", (ev) => { argsDone = ev.arguments; });
  s1.on("response.reasoning_text.delta", (ev) => { reasoningDeltas += ev.delta; });
  const f1 = await s1.finalResponse();
  const sfc = f1.output.find((o) => o.type === "function_call");
  expect(sfc?.arguments === fc?.arguments && argDeltas === fc?.arguments && argsDone === fc?.arguments &&
    reasoningDeltas === "Let me check." && JSON.stringify(f1.output.map((o) => o.type)) === JSON.stringify(r1.output.map((o) => o.type)),
    `streamed call ${JSON.stringify(f1.output)} (deltas ${argDeltas}, reasoning ${JSON.stringify(reasoningDeltas)})`);

  // the round trip: the output items sent back, then function_call_output
  const q2 = { ...q1, strata_forced_output: "Sunny.\n</think>\n\nIt is sunny in Paris.",
    input: [...q1.input, ...r1.output, { type: "function_call_output", call_id: fc.call_id, output: "sunny, 21 C" }] };
  const r2 = await client.responses.create(q2);
  expect(r2.output_text === "It is sunny in Paris." && r2.status === "completed", `after the tool output ${JSON.stringify(r2.output)}`);
  expect(r2.usage.input_tokens_details.cached_tokens > 0, `the second turn resumes the first ${JSON.stringify(r2.usage)}`);
  // the same conversation through chat: the same prompt
  const c2 = await client.chat.completions.create({ model: "demo", tools: chatTools, max_tokens: 40, temperature: 0,
    chat_template_kwargs: { enable_thinking: true }, strata_forced_output: q2.strata_forced_output, messages: [
      { role: "user", content: "What is the weather in Paris?" },
      { role: "assistant", content: "", reasoning_content: "Let me check.", tool_calls: [{ id: fc.call_id, type: "function", function: { name: fc.name, arguments: fc.arguments } }] },
      { role: "tool", tool_call_id: fc.call_id, content: "sunny, 21 C" }] });
  expect(c2.usage.prompt_tokens === r2.usage.input_tokens && c2.choices[0].message.content === r2.output_text,
    `round trip prompt == chat's: ${r2.usage.input_tokens} vs ${c2.usage.prompt_tokens}`);
  // hosted tools (web_search) are left out of the prompt; a namespace's functions are offered
  const hosted = await client.responses.create({ ...base, tools: [{ type: "web_search" }] });
  expect(hosted.usage.input_tokens === plain.usage.input_tokens, `web_search left out: ${hosted.usage.input_tokens}`);
  const flat = await client.responses.create({ ...base, tools });
  const nsd = await client.responses.create({ ...base, tools: [{ type: "namespace", name: "weather", description: "Weather tools", tools }] });
  expect(nsd.usage.input_tokens === flat.usage.input_tokens && flat.usage.input_tokens > plain.usage.input_tokens + 20,
    `namespace tools: ${nsd.usage.input_tokens} vs flat ${flat.usage.input_tokens}`);
  // tool_choice none: no tools in the prompt
  const none = await client.responses.create({ ...base, tools, tool_choice: "none" });
  expect(none.usage.input_tokens === plain.usage.input_tokens && none.output_text === plain.output_text, "tool_choice none");

  // errors: OpenAI's shape, the SDK's typed errors, the field named
  const bads = [
    [{ ...base, previous_response_id: "resp_123" }, "previous_response_id", /stateless/],
    [{ model: "demo", max_output_tokens: 5 }, "input", /input/],
    [{ ...base, input: [{ role: "user", content: [{ type: "input_image", image_url: "http://x/y.png" }] }] }, "input", /input_image/],
    [{ ...base, input: [{ type: "item_reference", id: "msg_1" }] }, "input", /stateless/],
    [{ ...base, tools: [{ type: "function" }] }, "tools", /name/],
    [{ ...base, temperature: "hot" }, "temperature", /temperature/],
    [{ ...base, max_output_tokens: 0 }, "max_output_tokens", /max_output_tokens/],
  ];
  for (const [body, param, re] of bads) {
    try {
      await client.responses.create(body);
      expect(false, `${param} ${JSON.stringify(body).slice(0, 80)} accepted`);
    } catch (e) {
      expect(e instanceof OpenAI.BadRequestError && e.param === param && re.test(e.message), `400 naming ${param}: ${e}`);
    }
  }

  // abort a long stream; the engine is free for the next request
  const longs = await client.responses.create({ ...base, max_output_tokens: 100000, ignore_eos: true, stream: true });
  let n = 0;
  for await (const ev of longs) { if (ev.type === "response.output_text.delta" && ++n >= 3) { longs.controller.abort(); break; } }
  const t0 = Date.now();
  const after = await client.responses.create(base);
  expect(after.output_text === plain.output_text && Date.now() - t0 < 5000, `request after an aborted stream (${Date.now() - t0} ms)`);
}, async (url) => {
  // a stream the server's shutdown cuts: it ends with response.failed
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0 });
  const stream = await client.responses.create({ model: "demo", input: "Go on.", max_output_tokens: 100000,
    ignore_eos: true, reasoning: { effort: "none" }, stream: true });
  const it = stream[Symbol.asyncIterator]();
  for (let n = 0; n < 3;) if ((await it.next()).value?.type === "response.output_text.delta") n++;
  return async () => {
    let last = null;
    for (;;) { const r = await it.next(); if (r.done) break; last = r.value; }
    expect(last?.type === "response.failed" && last.response.status === "failed" && /shutting down/.test(last.response.error?.message),
      `shutdown mid-stream: ${JSON.stringify(last)?.slice(0, 300)}`);
  };
});
