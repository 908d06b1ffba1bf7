// Checks a Grafana dashboard JSON two ways, and exits 1 listing every problem:
//   1. against Grafana's own dashboard schema: the TypeScript types that Grafana generates from its CUE
//      schema (npm @grafana/schema, `Dashboard`), compiled strictly with the JSON as an object literal, so a
//      misspelt or unknown field, a wrong type or a bad enum value is an error naming its place;
//   2. against live metrics: every metric an expression names must be one that kvfleet's processes export
//      (METRICS files: /metrics bodies scraped from a running router and replicas), or, for a series that
//      appears only once its event happened (a failover, a PD fallback), one that the code registers (a
//      quoted name in a .cpp or .h under a --source DIR); a histogram's _bucket, _sum and _count count as
//      its name.
// Also: panel ids unique, every panel has a datasource and at least one query, refIds unique per panel.
// Usage: NODE_PATH=.deps/npm-manifests/node_modules node scripts/grafana/check.mjs DASHBOARD.json
//          [--source DIR]... METRICS...
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const require = createRequire(import.meta.url);
const ts = require("typescript");
const args = process.argv.slice(2);
const sourceDirs = [];
for (let i = args.indexOf("--source"); i >= 0; i = args.indexOf("--source")) sourceDirs.push(...args.splice(i, 2).slice(1));
const [dashboardFile, ...metricsFiles] = args;
if (!dashboardFile || metricsFiles.length === 0) {
  console.error("usage: check.mjs DASHBOARD.json METRICS_FILE...");
  process.exit(2);
}
const errors = [];
const text = fs.readFileSync(dashboardFile, "utf8");
const dashboard = JSON.parse(text);

// 1. Grafana's schema types.
const schemaDir = path.dirname(require.resolve("@grafana/schema/package.json"));
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kvfleet-grafana-"));
const file = path.join(dir, "dashboard.ts");
fs.writeFileSync(file, `import type { Dashboard } from ${JSON.stringify(schemaDir)};\n` +
  `export const dashboard: Dashboard = ${JSON.stringify(dashboard, null, 2)};\n`);
const program = ts.createProgram([file], {
  strict: true, noEmit: true, target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.ESNext,
  moduleResolution: ts.ModuleResolutionKind.Bundler, skipLibCheck: true,
});
for (const d of ts.getPreEmitDiagnostics(program)) {
  const where = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start) : null;
  errors.push(`schema: ${where ? `line ${where.line + 1}: ` : ""}${ts.flattenDiagnosticMessageText(d.messageText, " ")}`);
}
fs.rmSync(dir, { recursive: true, force: true });

// 2. Metric names against what the processes export.
const exported = new Set();
for (const f of metricsFiles) {
  for (const line of fs.readFileSync(f, "utf8").split("\n")) {
    const m = line.match(/^# TYPE (\S+) (\S+)/) || line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/);
    if (m) exported.add(m[1]);
  }
}
const registered = new Set();
const walk = (d) => {
  for (const e of fs.readdirSync(d, { withFileTypes: true })) {
    const p = path.join(d, e.name);
    if (e.isDirectory()) walk(p);
    else if (/\.(cpp|h)$/.test(e.name))
      for (const m of fs.readFileSync(p, "utf8").matchAll(/"((?:kvfleet_|vllm:)[a-z_:]+)"/g)) registered.add(m[1]);
  }
};
for (const d of sourceDirs) walk(d);
const has = (name) => exported.has(name) || registered.has(name);
const known = (name) => has(name) ||
  ["_bucket", "_sum", "_count"].some((s) => name.endsWith(s) && has(name.slice(0, -s.length)));
const promqlWords = new Set(["sum", "rate", "by", "le", "max", "min", "count", "histogram_quantile", "avg",
  "without", "on", "irate", "increase"]);
const panelsOf = (list) => list.flatMap((p) => (p.type === "row" ? [p, ...(p.panels || [])] : [p]));
const ids = new Set();
let queries = 0;
for (const p of panelsOf(dashboard.panels || [])) {
  if (ids.has(p.id)) errors.push(`panel id ${p.id} repeats`);
  ids.add(p.id);
  if (p.type === "row") continue;
  if (!p.datasource) errors.push(`panel "${p.title}": no datasource`);
  if (!p.targets || p.targets.length === 0) errors.push(`panel "${p.title}": no queries`);
  const refs = new Set();
  for (const t of p.targets || []) {
    if (refs.has(t.refId)) errors.push(`panel "${p.title}": refId ${t.refId} repeats`);
    refs.add(t.refId);
    queries += 1;
    const names = (t.expr || "").replace(/"[^"]*"/g, "").replace(/\[[^\]]*\]/g, "")
      .match(/[a-zA-Z_:][a-zA-Z0-9_:]*/g) || [];
    const metrics = names.filter((n) => (n.startsWith("kvfleet_") || n.startsWith("vllm:")));
    if (metrics.length === 0) errors.push(`panel "${p.title}" ${t.refId}: names no kvfleet metric: ${t.expr}`);
    for (const n of metrics) if (!known(n)) errors.push(`panel "${p.title}" ${t.refId}: ${n} is not exported`);
    for (const n of names) {
      if (metrics.includes(n) || promqlWords.has(n) || /^(instance|status|reason|replica|tenant|medium|method)$/.test(n)) continue;
      errors.push(`panel "${p.title}" ${t.refId}: unknown word ${n} in ${t.expr}`);
    }
  }
}
if (errors.length) {
  for (const e of errors) console.error(`[check-grafana] ERROR ${e}`);
  process.exit(1);
}
console.log(`[check-grafana] ok: ${ids.size} panels, ${queries} queries, Grafana schema types and live metric names`);
