// harness.mjs - what the protocol tests (anthropic.mjs, responses.mjs) share: start strata serve
// on the demo model (an API key, the test-only forced output on), count checks, stop the server
// and print "N passed, N failed" last. Env: STRATA (default build/strata), STRATA_DEMO_MODEL
// (default demo), PORT.
import { spawn } from "node:child_process";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const key = "test-key";

let passed = 0, failed = 0;
export function expect(cond, msg) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL: ${msg}`); }
}

// Starts the server, runs main(url), stops the server (SIGTERM must exit 0) and exits.
// atStop(url), if given, runs last with the server up and returns a function that is awaited
// after SIGTERM was sent (a stream cut by the shutdown).
export async function run(portBase, main, atStop) {
  const exe = resolve(root, process.env.STRATA || `${process.env.BUILD || "build"}/strata`);
  const model = resolve(root, process.env.STRATA_DEMO_MODEL || "demo");
  const port = Number(process.env.PORT || portBase + (process.pid % 2000));
  const url = `http://127.0.0.1:${port}`;
  const server = spawn(exe, ["serve", "--model", model, "--port", String(port), "--backend", "cpu",
    "--threads", "1", "--api-key", key, "--test-forced-output", "--quiet"],
    { stdio: ["ignore", "ignore", "inherit"], cwd: root });
  const exited = new Promise((res) => server.on("exit", (code, sig) => res({ code, sig })));
  let up = false;
  for (let i = 0; i < 100 && !up; i++) {
    try { up = (await fetch(`${url}/health`)).ok; } catch { /* not yet */ }
    if (!up) await new Promise((r) => setTimeout(r, 100));
  }
  expect(up, "server came up");
  let after = null;
  if (up) {
    try {
      await main(url);
      if (atStop) after = await atStop(url);
    } catch (e) {
      expect(false, `unexpected: ${e?.stack || e}`);
    }
  }
  server.kill("SIGTERM");
  if (after) {
    try {
      await after();
    } catch (e) {
      expect(false, `unexpected at shutdown: ${e?.stack || e}`);
    }
  }
  const { code } = await Promise.race([exited, new Promise((r) => setTimeout(() => r({ code: "timeout" }), 5000))]);
  expect(code === 0, `strata serve exits 0 on SIGTERM (got ${code})`);
  if (code === "timeout") server.kill("SIGKILL");
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

// A tool call in the Qwen3.5 format, after a reasoning part (the prompt opened <think>).
export const forcedCall = "Let me check.\n</think>\n\n<tool_call>\n<function=get_weather>\n" +
  "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
export const weatherSchema = {
  type: "object",
  properties: { city: { type: "string" }, days: { type: "integer" } },
  required: ["city"],
};
