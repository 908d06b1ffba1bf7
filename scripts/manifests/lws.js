// LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) is a custom resource: kubernetes-models has no schema for it
// and its CRD is not available offline. Its shape is checked here by hand, field for field from the LWS API
// types (api/leaderworkerset/v1/leaderworkerset_types.go in kubernetes-sigs/lws): known fields only, enums,
// integer sizes; the leader and worker pod templates are core/v1 PodTemplateSpecs and get the full schema
// check. What LWS adds to each pod at run time (labels, LWS_* variables) is described in `injectedLabels`.
"use strict";
const { checkType } = require("./schema");

const API_VERSION = "leaderworkerset.x-k8s.io/v1";

// field -> check(value, where, errors); unknown fields are errors.
const isInt = (min) => (v, where, errors) => {
  if (!Number.isInteger(v) || v < min) errors.push(`${where}: must be an integer >= ${min}`);
};
const oneOf = (...allowed) => (v, where, errors) => {
  if (!allowed.includes(v)) errors.push(`${where}: must be one of ${allowed.join(", ")} (got ${JSON.stringify(v)})`);
};
const intOrPercent = (v, where, errors) => {
  if (!Number.isInteger(v) && !(typeof v === "string" && /^\d+%$/.test(v))) errors.push(`${where}: must be an integer or a percentage`);
};
const template = (v, where, errors) => errors.push(...checkType("PodTemplateSpec", v, where));
const fields = (shape) => (v, where, errors) => {
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    errors.push(`${where}: must be an object`);
    return;
  }
  for (const [key, value] of Object.entries(v)) {
    if (!(key in shape)) errors.push(`${where}.${key}: unknown field (known: ${Object.keys(shape).join(", ")})`);
    else shape[key](value, `${where}.${key}`, errors);
  }
};
const required = (v, where, errors, keys) => {
  for (const k of keys) if (v && v[k] === undefined) errors.push(`${where}: missing required field ${k}`);
};
const anything = () => {};

const leaderWorkerTemplate = fields({
  leaderTemplate: template,
  workerTemplate: template,
  size: isInt(1),
  restartPolicy: oneOf("RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None", "Default"),
  subGroupPolicy: fields({ subGroupPolicyType: oneOf("LeaderWorker", "LeaderExcluded"), subGroupSize: isInt(1) }),
  volumeClaimTemplates: anything,
  persistentVolumeClaimRetentionPolicy: anything,
});
const spec = fields({
  replicas: isInt(0),
  leaderWorkerTemplate,
  rolloutStrategy: fields({
    type: oneOf("RollingUpdate"),
    rollingUpdateConfiguration: fields({ partition: isInt(0), maxUnavailable: intOrPercent, maxSurge: intOrPercent }),
  }),
  startupPolicy: oneOf("LeaderCreated", "LeaderReady"),
  networkConfig: fields({ subdomainPolicy: oneOf("Shared", "UniquePerReplica") }),
});

function checkLeaderWorkerSet(obj) {
  const errors = [];
  if (obj.apiVersion !== API_VERSION) errors.push(`apiVersion: must be ${API_VERSION}`);
  fields({ apiVersion: anything, kind: anything, metadata: anything, spec })(obj, "LeaderWorkerSet", errors);
  errors.push(...checkType("ObjectMeta", obj.metadata || {}, "LeaderWorkerSet.metadata"));
  if (!obj.metadata || !obj.metadata.name) errors.push("LeaderWorkerSet.metadata: missing required field name");
  required(obj, "LeaderWorkerSet", errors, ["spec"]);
  required(obj.spec, "LeaderWorkerSet.spec", errors, ["leaderWorkerTemplate"]);
  if (obj.spec) required(obj.spec.leaderWorkerTemplate, "LeaderWorkerSet.spec.leaderWorkerTemplate", errors, ["workerTemplate"]);
  return errors;
}

// The pod templates of a LeaderWorkerSet with the labels LWS puts on their pods: the set's name on every pod,
// worker-index "0" on the leader (workers get 1..size-1). The leader template defaults to the worker's.
function podTemplates(obj) {
  const name = obj.metadata.name;
  const lwt = obj.spec.leaderWorkerTemplate;
  const withLabels = (t, extra) => ({
    ...t,
    metadata: { ...(t.metadata || {}), labels: { ...((t.metadata || {}).labels || {}), "leaderworkerset.sigs.k8s.io/name": name, ...extra } },
  });
  const out = [{ role: "leader", template: withLabels(lwt.leaderTemplate || lwt.workerTemplate, { "leaderworkerset.sigs.k8s.io/worker-index": "0" }) }];
  if ((lwt.size || 1) > 1) out.push({ role: "worker", template: withLabels(lwt.workerTemplate, {}) });
  return out;
}

module.exports = { API_VERSION, checkLeaderWorkerSet, podTemplates };
