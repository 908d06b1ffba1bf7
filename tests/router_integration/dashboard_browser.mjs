// The router's /dashboard in a real headless Chromium (Debian's chromium, driven by playwright-core):
// the page asks for the admin key, then shows every replica up; a replica stopped with SIGSTOP turns
// "down" in the open page (it updates itself, no reload) with an entry in the recent errors, and "up"
// again after SIGCONT. Every request the page makes goes to the router (no external assets).
// Usage: node dashboard_browser.mjs ROUTER_URL ADMIN_KEY REPLICA_URL REPLICA_PID REPLICA_COUNT
// (exit 0 and "ok" when every check passes)
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.KVFLEET_NPM + "/node_modules/playwright-core");
const [router, adminKey, replica, pidText, countText] = process.argv.slice(2);
const pid = Number(pidText);

const browser = await chromium.launch({ executablePath: process.env.KVFLEET_CHROMIUM || "/usr/bin/chromium",
  headless: true, args: ["--no-sandbox"] });
let stopped = false;
try {
  const page = await browser.newPage();
  const foreign = [];
  page.on("request", (r) => { if (!r.url().startsWith(router)) foreign.push(r.url()); });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  await page.goto(router + "/dashboard");
  assert.equal(await page.title(), "kvfleet router");

  // The admin API has a key: the page asks for it.
  await page.waitForSelector("#keyform", { state: "visible", timeout: 10000 });
  await page.fill("#key", adminKey);
  await page.click("#keyform button");

  const row = (health) => `tr[data-replica="${replica}"][data-health="${health}"]`;
  await page.waitForSelector(row("up"), { timeout: 15000 });
  assert.equal(await page.locator("#replicas tbody tr").count(), Number(countText));
  assert.equal(await page.locator('#replicas tbody tr[data-health="up"]').count(), Number(countText));
  // Metrics drawn: the decisions table has the requests the test sent before opening the page.
  await page.waitForSelector("#decisions tbody tr", { timeout: 10000 });

  process.kill(pid, "SIGSTOP");
  stopped = true;
  await page.waitForSelector(row("down"), { timeout: 20000 });
  await page.waitForFunction((url) => [...document.querySelectorAll("#errors tbody tr")]
    .some((tr) => tr.textContent.includes(url) && tr.textContent.includes("down")), replica, { timeout: 10000 });
  process.kill(pid, "SIGCONT");
  stopped = false;
  await page.waitForSelector(row("up"), { timeout: 20000 });
  await page.waitForFunction((url) => [...document.querySelectorAll("#errors tbody tr")]
    .some((tr) => tr.textContent.includes(url) && tr.textContent.includes("up")), replica, { timeout: 10000 });
  assert.match(await page.textContent("#status"), /^updated /);

  assert.deepEqual(foreign, []);
  assert.deepEqual(pageErrors, []);
  console.log("ok");
} finally {
  if (stopped) process.kill(pid, "SIGCONT");
  await browser.close();
}
