#!/usr/bin/env node
// page.mjs - the chat page at / end to end in headless Chromium (Debian's chromium, driven by
// playwright-core): it loads from a running strata serve (with an API key, typed into the
// page), streams a real reply of the demo model, shows a reasoning folded (<details>), stops a
// long reply with the Stop button (the server is free at once after), keeps the conversation
// across a reload, starts a new chat, and renders: a screenshot (build/page-test.png) that must
// be a non-trivial PNG. The reasoning and the long reply are teacher-forced (strata_forced_output,
// added to the page's request by a Playwright route; the page itself is unchanged).
//
//   npm ci --prefix tests/server && node tests/server/page.mjs
// Env: STRATA (default build/strata), STRATA_DEMO_MODEL (default demo), CHROMIUM
// (default /usr/bin/chromium), PORT. Prints "N passed, N failed" last.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const build = process.env.BUILD || "build";
const exe = resolve(root, process.env.STRATA || `${build}/strata`);
const model = resolve(root, process.env.STRATA_DEMO_MODEL || "demo");
const browserPath = process.env.CHROMIUM || "/usr/bin/chromium";
const port = Number(process.env.PORT || 22000 + (process.pid % 2000));
const shot = resolve(root, build, "page-test.png");
const key = "page-test-key";
let passed = 0, failed = 0;
function expect(cond, msg) {
  if (cond) passed++;
  else { failed++; console.error(`FAIL: ${msg}`); }
}

if (!existsSync(browserPath)) {
  console.error(`page.mjs: no Chromium at ${browserPath} (Debian: apt-get install chromium; scripts/install-deps.sh)`);
  console.log("0 passed, 1 failed");
  process.exit(1);
}

const server = spawn(exe, ["serve", "--model", model, "--port", String(port), "--backend", "cpu",
  "--threads", "1", "--api-key", key, "--test-forced-output", "--quiet"],
  { stdio: ["ignore", "pipe", "inherit"], cwd: root });
const exited = new Promise((res) => server.on("exit", (code, sig) => res({ code, sig })));
process.on("exit", () => server.kill("SIGKILL"));

async function waitUp() {
  for (let i = 0; i < 100; i++) {
    try { if ((await fetch(`http://127.0.0.1:${port}/health`)).ok) return true; } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

let browser;
async function main() {
  expect(await waitUp(), "server came up");
  browser = await chromium.launch({ executablePath: browserPath, headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"] });
  const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  const offsite = [];
  page.on("request", (r) => { if (!r.url().startsWith(`http://127.0.0.1:${port}/`)) offsite.push(r.url()); });
  let forced = null; // what the next request teacher-forces, set by the steps below
  await page.route("**/v1/chat/completions", async (route) => {
    const body = JSON.parse(route.request().postData());
    if (forced) body.strata_forced_output = forced;
    await route.continue({ postData: JSON.stringify(body) });
  });

  await page.goto(`http://127.0.0.1:${port}/`);
  expect((await page.title()) === "strata", "the page loads from /");
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0);
  expect((await page.textContent("#model")).includes("API key"), "without the key: the page says one is needed");
  await page.fill("#key", key);
  await page.dispatchEvent("#key", "change");
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("context"));
  expect((await page.textContent("#model")).includes("demo"), "with the key: the model's name");

  // a real reply of the demo model, streamed
  const replies = () => page.locator(".msg.assistant .content");
  await page.fill("#input", "Tell me a fortune.");
  await page.press("#input", "Enter");
  await page.waitForFunction(() => !document.getElementById("send").disabled &&
    document.querySelectorAll(".msg.assistant").length === 1, null, { timeout: 60000 });
  const first = await replies().nth(0).textContent();
  expect(first.trim().length > 0, `the demo's reply is shown: ${JSON.stringify(first)}`);
  expect((await page.locator(".msg.user").nth(0).textContent()) === "Tell me a fortune.", "the user's message");
  expect(/\d+ tokens/.test(await page.locator(".msg.assistant .note").nth(0).textContent()), "token count under the reply");

  // reasoning folded
  forced = "The user wants a greeting.\n</think>\n\nHello there, friend.";
  await page.fill("#input", "Say hello.");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant").length === 2 &&
    !document.getElementById("send").disabled, null, { timeout: 60000 });
  expect((await replies().nth(1).textContent()) === "Hello there, friend.", "the answer");
  const det = page.locator(".msg.assistant").nth(1).locator("details");
  expect(await det.isVisible() && !(await det.evaluate((d) => d.open)), "the reasoning is folded in <details>");
  expect((await det.locator(".reasoning").textContent()) === "The user wants a greeting.", "the reasoning text");
  await det.locator("summary").click();
  expect(await det.locator(".reasoning").isVisible(), "unfolds on a click");

  // stop a long reply
  forced = "</think>\n\n" + "and the river ran on to the sea ".repeat(400);
  await page.fill("#input", "Go on.");
  await page.click("#send");
  await page.waitForFunction(() => {
    const c = document.querySelectorAll(".msg.assistant .content");
    return c.length === 3 && c[2].textContent.length > 60;
  }, null, { timeout: 60000 });
  expect(await page.isVisible("#stop"), "Stop shows while streaming");
  await page.click("#stop");
  await page.waitForFunction(() => !document.getElementById("send").disabled, null, { timeout: 10000 });
  const stoppedAt = (await replies().nth(2).textContent()).length;
  await page.waitForTimeout(400);
  const note = await page.locator(".msg.assistant .note").nth(2).textContent();
  expect((await replies().nth(2).textContent()).length === stoppedAt && stoppedAt < forced.length &&
    note === "stopped", `stopped at ${stoppedAt} of ${forced.length} characters (${note})`);
  const t0 = Date.now();
  const health = await (await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, { method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify({ messages: [{ role: "user", content: "Hi" }], max_tokens: 4 }) })).json();
  expect(health.choices?.[0] && Date.now() - t0 < 5000, `the engine is free after Stop (${Date.now() - t0} ms)`);
  forced = null;

  // reload: the conversation is still there, the key too
  await page.reload();
  await page.waitForFunction(() => document.querySelectorAll(".msg").length === 6);
  expect((await replies().nth(1).textContent()) === "Hello there, friend." &&
    (await page.locator(".msg.user").nth(2).textContent()) === "Go on.", "reload keeps the conversation");
  expect((await page.inputValue("#key")) === key, "reload keeps the key");

  await page.screenshot({ path: shot, fullPage: false });
  const png = readFileSync(shot);
  const sig = png.subarray(0, 8).toString("hex");
  const w = png.readUInt32BE(16), h = png.readUInt32BE(20);
  expect(sig === "89504e470d0a1a0a" && w === 1000 && h === 700 && png.length > 20000,
    `screenshot ${shot}: a ${w}x${h} PNG of ${png.length} bytes`);

  // a new chat empties the page and the storage
  await page.click("#new");
  expect((await page.locator(".msg").count()) === 0 && (await page.isVisible("#empty")), "New chat clears the page");
  expect(await page.evaluate(() => localStorage.getItem("strata.chat")) === "[]", "and the stored conversation");

  expect(pageErrors.length === 0, `no script errors: ${pageErrors.join("; ")}`);
  expect(offsite.length === 0, `nothing fetched from elsewhere: ${offsite.join(", ")}`);
}

try {
  mkdirSync(resolve(root, build), { recursive: true });
  await main();
} catch (e) {
  expect(false, `unexpected: ${e?.stack || e}`);
}
if (browser) await browser.close();
server.kill("SIGTERM");
const { code } = await Promise.race([exited, new Promise((r) => setTimeout(() => r({ code: "timeout" }), 5000))]);
expect(code === 0, `strata serve exits 0 on SIGTERM (got ${code})`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
