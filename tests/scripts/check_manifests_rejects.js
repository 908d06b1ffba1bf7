// The manifest check must fail on broken manifests: each case copies examples/kubernetes, breaks one thing
// and expects the check to fail naming it (and the untouched copy to pass). Mistakes of the kinds a schema
// alone misses (a typo'd field name, a selector that selects nothing, a flag the binary lacks) included.
//   NODE_PATH=.deps/npm-manifests/node_modules node tests/scripts/check_manifests_rejects.js BUILD/bin
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { spawnSync } = require("child_process");

const root = path.resolve(__dirname, "../..");
const { checkFolder } = require(path.join(root, "scripts/manifests/check.js"));
const binDir = path.resolve(process.argv[2] || path.join(root, "build/bin"));
const source = path.join(root, "examples/kubernetes");

const edit = (file, from, to) => ({ file, from, to });
// [name, edits ([] = none), what the error must say]
const cases = [
  ["a typo'd field name", [edit("router/deployment.yaml", "readinessProbe:", "readinesProbe:")], "readinesProbe: unknown field"],
  ["a typo deep inside a probe", [edit("replicas/statefulset.yaml", "httpGet: {path: /health", "httpGet: {paht: /health")], "httpGet.paht: unknown field"],
  ["a port as a string", [edit("replicas/statefulset.yaml", "containerPort: 8000", 'containerPort: "8000"')], "containerPort: must be integer"],
  ["a value outside an enum", [edit("replicas/statefulset.yaml", "podManagementPolicy: Parallel", "podManagementPolicy: Paralel")], "podManagementPolicy"],
  ["a missing required field", [edit("router/deployment.yaml", "  selector:\n    matchLabels:\n      app.kubernetes.io/name: kvfleet-router\n  strategy:", "  strategy:")], "/spec: must have required property selector"],
  ["a Service selecting nothing", [edit("replicas/service.yaml", "  selector:\n    app.kubernetes.io/name: kvfleet-replica", "  selector:\n    app.kubernetes.io/name: kvfleet-replicas")], "matches no pod template"],
  ["a probe on an unnamed port", [edit("router/deployment.yaml", "httpGet: {path: /readiness, port: http}", "httpGet: {path: /readiness, port: admin}")], 'uses port "admin"'],
  ["a probe path the router does not serve", [edit("router/deployment.yaml", "httpGet: {path: /readiness, port: http}", "httpGet: {path: /healthz, port: http}")], "path /healthz is not served by kvfleet-router"],
  ["readiness and liveness on one endpoint", [edit("router/deployment.yaml", "httpGet: {path: /liveness, port: http}", "httpGet: {path: /readiness, port: http}")], "readiness and liveness probe the same endpoint"],
  ["a replica flag that does not exist", [edit("replicas/statefulset.yaml", "- --num-kv-blocks", "- --num-kv-block")], "kvfleet-replica has no flag --num-kv-block"],
  ["an unknown router.yaml key", [edit("router/configmap.yaml", "kv_events: true", "kv_event: true")], "kvfleet-router rejects router.yaml"],
  ["discovery naming no Service", [edit("router/configmap.yaml", "dns: kvfleet-replica:8000", "dns: kvfleet-replicas:8000")], "names no Service of this fleet"],
  ["discovery on the wrong port", [edit("router/configmap.yaml", "dns: kvfleet-replica:8000", "dns: kvfleet-replica:9000")], "discovery.dns port 9000"],
  ["a served model name the router does not hash with", [edit("replicas/statefulset.yaml", "- kvfleet  ", "- other  ")], "differs from the router's served_model_name"],
  ["a StatefulSet governed by no Service", [edit("replicas/statefulset.yaml", "serviceName: kvfleet-replica", "serviceName: kvfleet")], "serviceName 'kvfleet' is no Service"],
  ["a scrape annotation on no port", [edit("replicas/statefulset.yaml", 'prometheus.io/port: "8000"', 'prometheus.io/port: "9000"')], "prometheus.io/port '9000'"],
  ["a missing ConfigMap", [edit("router/deployment.yaml", "            name: kvfleet-router", "            name: kvfleet-routr")], "needs ConfigMap 'kvfleet-routr'"],
  ["an LWS restart policy that does not exist", [edit("expert-parallel/leaderworkerset.yaml", "restartPolicy: RecreateGroupOnPodRestart", "restartPolicy: Always")], "restartPolicy: must be one of"],
  ["an LWS field typo", [edit("expert-parallel/leaderworkerset.yaml", "startupPolicy: LeaderCreated", "startPolicy: LeaderCreated")], "spec.startPolicy: unknown field"],
  ["an LWS group size that is not an integer", [edit("expert-parallel/leaderworkerset.yaml", "size: 2 ", 'size: "2" ')], "size: must be an integer"],
  ["a typo in an LWS pod template", [edit("expert-parallel/leaderworkerset.yaml", "readinessProbe:", "readynessProbe:")], "readynessProbe: unknown field"],
  ["an undefined $(VAR) in args", [edit("expert-parallel/leaderworkerset.yaml", "- $(EP_RANK)", "- $(EP_RNK)")], "$(EP_RNK) is not in the container's env"],
  ["a manifest no kustomization lists", [{ file: "replicas/extra.yaml", copyOf: "replicas/pdb.yaml" }], "replicas/extra.yaml: not listed"],
  ["a kustomization resource that is missing", [{ file: "replicas/pdb.yaml", remove: true }], "resource 'pdb.yaml' does not exist"],
  ["YAML that does not parse", [edit("router/service.yaml", "  type: ClusterIP", "  type: [ClusterIP")], "not valid YAML"],
];

function copyTree(from, to) {
  fs.mkdirSync(to, { recursive: true });
  for (const e of fs.readdirSync(from, { withFileTypes: true })) {
    if (e.isDirectory()) copyTree(path.join(from, e.name), path.join(to, e.name));
    else fs.copyFileSync(path.join(from, e.name), path.join(to, e.name));
  }
}

function applyEdit(dir, e) {
  const file = path.join(dir, e.file);
  if (e.remove) return fs.rmSync(file);
  if (e.copyOf) return fs.copyFileSync(path.join(dir, e.copyOf), file);
  const text = fs.readFileSync(file, "utf8");
  if (!text.includes(e.from)) throw new Error(`${e.file} no longer contains ${JSON.stringify(e.from)}: update this case`);
  fs.writeFileSync(file, text.replace(e.from, e.to));
}

let passed = 0;
let failed = 0;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "kvfleet-manifest-cases-"));
try {
  const clean = checkFolder(source, binDir);
  if (clean.errors.length === 0) ++passed;
  else (++failed, console.error(`FAIL the examples themselves: ${clean.errors.join("; ")}`));
  cases.forEach(([name, edits, expected], i) => {
    const dir = path.join(tmp, String(i));
    copyTree(source, dir);
    edits.forEach((e) => applyEdit(dir, e));
    const { errors } = checkFolder(dir, binDir);
    if (errors.some((e) => e.includes(expected))) ++passed;
    else (++failed, console.error(`FAIL ${name}: expected an error containing ${JSON.stringify(expected)}, got ${JSON.stringify(errors)}`));
  });
  // yamllint runs in the shell wrapper: one case through scripts/check-manifests as CI runs it.
  const dir = path.join(tmp, "yamllint");
  copyTree(source, dir);
  applyEdit(dir, edit("router/service.yaml", "  type: ClusterIP\n", "  type: ClusterIP\n  type: ClusterIP\n"));
  const r = spawnSync("bash", [path.join(root, "scripts/check-manifests"), "--bin", binDir, dir], { encoding: "utf8" });
  if (r.status !== 0 && /duplication of key/.test(r.stdout + r.stderr)) ++passed;
  else (++failed, console.error(`FAIL a duplicated key: scripts/check-manifests exited ${r.status}: ${r.stdout}${r.stderr}`));
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
