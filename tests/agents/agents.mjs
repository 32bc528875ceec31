#!/usr/bin/env node
// agents.mjs - the agent CLIs against strata, with nothing changed but their base URL: Claude
// Code (`claude -p`, ANTHROPIC_BASE_URL -> /v1/messages) and Codex (`codex exec`, a custom
// provider with wire_api = "responses" -> /v1/responses), each a plain prompt and a tool step
// (the CLI runs a real tool - Claude's Write, Codex's exec_command - and sends its result back).
// Run by agents.sh inside a network namespace with loopback only, telemetry off.
//
// The demo model writes nonsense, so a recording proxy between the CLI and strata adds the
// test-only strata_forced_output field to the requests of a scripted turn (marked in the
// prompt): the text the model is teacher-forced to write. Everything else - the CLI, its
// requests, strata's protocol, template, parser and events - is the real thing; the proxy
// forwards every byte of the answers unchanged and keeps the requests for the checks.
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, key, run } from "../server/harness.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const bin = (name) => resolve(here, "node_modules/.bin", name);
const work = fs.mkdtempSync(join(os.tmpdir(), "strata-agents-"));

// The demo's template opens a thinking block unless a request turns it off: then a forced
// text starts with the reasoning and its </think>.
const think = (on, text) => (on ? `Scripted.\n</think>\n\n${text}` : text);
const call = (name, params) => `<tool_call>\n<function=${name}>\n` +
  Object.entries(params).map(([k, v]) => `<parameter=${k}>\n${v}\n</parameter>\n`).join("") + "</function>\n</tool_call>";

// scripted turns: [marker in the conversation, has a tool result yet] -> forced text
function forcedFor(path, body) {
  const all = JSON.stringify(body.messages ?? body.input ?? "");
  if (path.startsWith("/v1/messages") && !path.startsWith("/v1/messages/count_tokens")) {
    if (!body.tools?.some((t) => t.name === "Write")) return null; // side requests: the model's own text
    const on = body.thinking?.type !== "disabled";
    const last = body.messages.at(-1);
    const toolResult = Array.isArray(last?.content) && last.content.some((b) => b.type === "tool_result");
    if (all.includes("[plain-claude]")) return think(on, "Hello from strata, Claude.");
    if (all.includes("[tool-claude]"))
      return think(on, toolResult ? "STRATA-DONE: the file is written."
        : call("Write", { file_path: join(work, "claude.txt"), content: "written by Claude Code via strata" }));
  }
  if (path.startsWith("/v1/responses")) {
    const effort = body.reasoning?.effort;
    const on = effort !== "none" && effort !== "minimal";
    const toolResult = body.input?.some?.((i) => i.type === "function_call_output");
    if (all.includes("[plain-codex]")) return think(on, "Hello from strata, Codex.");
    if (all.includes("[tool-codex]"))
      return think(on, toolResult ? "STRATA-DONE: the command ran."
        : call("exec_command", { cmd: `echo written by Codex via strata > ${join(work, "codex.txt")}` }));
  }
  return null;
}

function proxy(target, log) {
  const srv = http.createServer((req, res) => {
    const parts = [];
    req.on("data", (d) => parts.push(d));
    req.on("end", () => {
      let body = Buffer.concat(parts);
      const entry = { method: req.method, path: req.url, body: null, forced: null, status: 0, response: "" };
      log.push(entry);
      try {
        const j = JSON.parse(body.toString());
        entry.body = j;
        const f = forcedFor(req.url, j);
        if (f) {
          entry.forced = f;
          body = Buffer.from(JSON.stringify({ ...j, strata_forced_output: f }));
        }
      } catch { /* not JSON: forwarded as it is */ }
      const headers = { ...req.headers, "content-length": String(body.length) };
      const up = http.request(target + req.url, { method: req.method, headers }, (ur) => {
        entry.status = ur.statusCode;
        res.writeHead(ur.statusCode, ur.headers);
        ur.on("data", (d) => { entry.response += d; res.write(d); });
        ur.on("end", () => res.end());
      });
      up.on("error", (e) => { res.writeHead(502); res.end(String(e)); });
      up.end(body);
    });
  });
  return new Promise((r) => srv.listen(0, "127.0.0.1", () => r(srv)));
}

function runCli(exe, args, env, cwd) {
  return new Promise((res) => {
    const p = spawn(exe, args, { cwd, env: { PATH: process.env.PATH, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let out = "", err = "";
    p.stdout.on("data", (d) => { out += d; });
    p.stderr.on("data", (d) => { err += d; });
    const timer = setTimeout(() => p.kill("SIGKILL"), 240000);
    p.on("exit", (code) => { clearTimeout(timer); res({ code, out, err }); });
  });
}

await run(24000, async (url) => {
  const log = [];
  const px = await proxy(url, log);
  const purl = `http://127.0.0.1:${px.address().port}`;
  const home = join(work, "home");
  fs.mkdirSync(home);

  // ---- Claude Code
  const claudeEnv = {
    HOME: home, ANTHROPIC_BASE_URL: purl, ANTHROPIC_API_KEY: key,
    ANTHROPIC_MODEL: "demo", ANTHROPIC_SMALL_FAST_MODEL: "demo", ANTHROPIC_DEFAULT_HAIKU_MODEL: "demo",
    DISABLE_TELEMETRY: "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1", DISABLE_AUTOUPDATER: "1",
    DISABLE_ERROR_REPORTING: "1", DISABLE_BUG_COMMAND: "1", CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY: "1",
  };
  const cp = await runCli(bin("claude"), ["-p", "[plain-claude] Say hi.", "--model", "demo"], claudeEnv, work);
  const cpReq = log.filter((e) => e.forced?.includes("Hello from strata, Claude."));
  expect(cp.code === 0 && cp.out.includes("Hello from strata, Claude."),
    `claude -p plain prompt: exit ${cp.code}\n${cp.out}\n${cp.err.slice(-2000)}`);
  expect(cpReq.length >= 1 && cpReq.every((e) => e.status === 200 && e.body.stream === true &&
    e.response.includes("event: message_stop")), `claude's streamed /v1/messages (${cpReq.length} requests)`);

  const n0 = log.length;
  const ct = await runCli(bin("claude"), ["-p", "[tool-claude] Write the file.", "--model", "demo",
    "--allowedTools", "Write"], claudeEnv, work);
  const cfile = join(work, "claude.txt");
  const cwritten = fs.existsSync(cfile) ? fs.readFileSync(cfile, "utf8") : null;
  expect(ct.code === 0 && ct.out.includes("STRATA-DONE: the file is written."),
    `claude -p tool step: exit ${ct.code}\n${ct.out}\n${ct.err.slice(-2000)}`);
  expect(cwritten?.trim() === "written by Claude Code via strata", `Claude's Write tool ran: ${JSON.stringify(cwritten)}`);
  const ctReqs = log.slice(n0).filter((e) => e.forced);
  const first = ctReqs.find((e) => e.forced.includes("<tool_call>"));
  const use = first?.response.match(/"type":"tool_use","id":"([^"]+)","name":"Write"/);
  const back = ctReqs.find((e) => e.forced.includes("STRATA-DONE"));
  const result = back?.body.messages.at(-1).content.find((b) => b.type === "tool_result");
  expect(use && result?.tool_use_id === use[1] && back.status === 200,
    `the tool_use id came back in a tool_result: ${use?.[1]} / ${JSON.stringify(result)?.slice(0, 300)}`);

  // ---- Codex
  const chome = join(work, "codex");
  fs.mkdirSync(chome);
  fs.writeFileSync(join(chome, "config.toml"), [
    'model = "demo"', 'model_provider = "strata"', 'approval_policy = "never"',
    'sandbox_mode = "danger-full-access"', "", "[analytics]", "enabled = false", "", "[otel]", 'exporter = "none"', "",
    "[model_providers.strata]", 'name = "strata"', `base_url = "${purl}/v1"`, 'wire_api = "responses"',
    'env_key = "STRATA_TEST_KEY"', ""].join("\n"));
  const codexEnv = { HOME: home, CODEX_HOME: chome, STRATA_TEST_KEY: key };
  const xp = await runCli(bin("codex"), ["exec", "--skip-git-repo-check", "[plain-codex] Say hi."], codexEnv, work);
  expect(xp.code === 0 && xp.out.includes("Hello from strata, Codex."),
    `codex exec plain prompt: exit ${xp.code}\n${xp.out}\n${xp.err.slice(-2000)}`);
  const xpReq = log.filter((e) => e.forced?.includes("Hello from strata, Codex."));
  expect(xpReq.length >= 1 && xpReq.every((e) => e.status === 200 && e.response.includes("event: response.completed")),
    `codex's streamed /v1/responses (${xpReq.length} requests)`);

  const n1 = log.length;
  const xt = await runCli(bin("codex"), ["exec", "--skip-git-repo-check", "[tool-codex] Run the command."], codexEnv, work);
  const xfile = join(work, "codex.txt");
  const xwritten = fs.existsSync(xfile) ? fs.readFileSync(xfile, "utf8") : null;
  expect(xt.code === 0 && xt.out.includes("STRATA-DONE: the command ran."),
    `codex exec tool step: exit ${xt.code}\n${xt.out}\n${xt.err.slice(-2000)}`);
  expect(xwritten?.trim() === "written by Codex via strata", `Codex's exec_command ran: ${JSON.stringify(xwritten)}`);
  const xReqs = log.slice(n1).filter((e) => e.forced);
  const xfirst = xReqs.find((e) => e.forced.includes("<tool_call>"));
  const fc = xfirst?.response.match(/"type":"function_call","status":"completed","call_id":"([^"]+)","name":"exec_command"/);
  const xback = xReqs.find((e) => e.forced.includes("STRATA-DONE"));
  const out = xback?.body.input.find((i) => i.type === "function_call_output");
  expect(fc && out?.call_id === fc[1] && xback.status === 200,
    `the call_id came back in a function_call_output: ${fc?.[1]} / ${JSON.stringify(out)?.slice(0, 300)}`);

  // nothing the CLIs sent was refused
  const refused = log.filter((e) => e.status >= 400);
  expect(refused.length === 0, `requests refused: ${refused.map((e) => `${e.path} ${e.status} ${e.response.slice(0, 200)}`).join("\n")}`);
  px.close();
  if (!process.env.KEEP) fs.rmSync(work, { recursive: true, force: true });
  else console.error(`kept ${work}`);
});
