// Cross-references inside one fleet (the objects a top-level kustomization applies), which no schema sees:
// selectors that select nothing, ports named nowhere, a StatefulSet's governing Service, ConfigMaps that do
// not exist, Prometheus scrape annotations that point at no port.
"use strict";
const lws = require("./lws");

// Every pod template in the fleet: { owner: "Kind/name", template }.
function podTemplates(objects) {
  const out = [];
  for (const { obj } of objects) {
    const owner = `${obj.kind}/${obj.metadata.name}`;
    if (["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"].includes(obj.kind) && obj.spec && obj.spec.template)
      out.push({ owner, template: obj.spec.template, workload: obj });
    else if (obj.kind === "LeaderWorkerSet" && obj.spec && obj.spec.leaderWorkerTemplate)
      for (const { role, template } of lws.podTemplates(obj)) out.push({ owner: `${owner} (${role})`, template, workload: obj });
  }
  return out;
}

const labelsOf = (t) => (t.metadata && t.metadata.labels) || {};
const matches = (selector, labels) => Object.entries(selector || {}).every(([k, v]) => labels[k] === v);
const containersOf = (t) => [...((t.spec && t.spec.initContainers) || []), ...((t.spec && t.spec.containers) || [])];

function portKnown(port, containers) {
  const ports = containers.flatMap((c) => c.ports || []);
  return typeof port === "number" ? ports.some((p) => p.containerPort === port) : ports.some((p) => p.name === port);
}

function checkSelectors(objects, pods, errors) {
  for (const { file, obj } of objects) {
    const where = `${file}: ${obj.kind}/${obj.metadata.name}`;
    const spec = obj.spec || {};
    if (["Deployment", "StatefulSet", "DaemonSet"].includes(obj.kind)) {
      const sel = spec.selector && spec.selector.matchLabels;
      if (!matches(sel, labelsOf(spec.template || {}))) errors.push(`${where}: spec.selector does not match its own pod template's labels`);
    }
    if (obj.kind === "Service" && spec.selector) {
      const selected = pods.filter((p) => matches(spec.selector, labelsOf(p.template)));
      if (selected.length === 0) errors.push(`${where}: selector ${JSON.stringify(spec.selector)} matches no pod template in this fleet`);
      for (const port of spec.ports || []) {
        const target = port.targetPort === undefined ? port.port : port.targetPort;
        for (const p of selected)
          if (!portKnown(target, containersOf(p.template))) errors.push(`${where}: targetPort ${JSON.stringify(target)} is not a container port of ${p.owner}`);
      }
    }
    if (obj.kind === "PodDisruptionBudget") {
      const sel = spec.selector && spec.selector.matchLabels;
      if (!pods.some((p) => matches(sel, labelsOf(p.template)))) errors.push(`${where}: selector matches no pod template in this fleet`);
    }
    if (obj.kind === "StatefulSet") {
      const svc = objects.find((o) => o.obj.kind === "Service" && o.obj.metadata.name === spec.serviceName);
      if (!svc) errors.push(`${where}: serviceName '${spec.serviceName}' is no Service in this fleet`);
      else if ((svc.obj.spec || {}).clusterIP !== "None") errors.push(`${where}: its Service '${spec.serviceName}' must be headless (clusterIP: None)`);
    }
  }
}

function checkPods(objects, pods, errors) {
  const configMaps = new Map(objects.filter((o) => o.obj.kind === "ConfigMap").map((o) => [o.obj.metadata.name, o.obj]));
  for (const { owner, template } of pods) {
    const containers = containersOf(template);
    const volumes = (template.spec && template.spec.volumes) || [];
    for (const c of containers) {
      for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const action = c[probe] && (c[probe].httpGet || c[probe].tcpSocket);
        if (action && !portKnown(action.port, [c])) errors.push(`${owner}: ${c.name}.${probe} uses port ${JSON.stringify(action.port)}, not one of its ports`);
      }
      for (const m of c.volumeMounts || [])
        if (!volumes.some((v) => v.name === m.name)) errors.push(`${owner}: ${c.name} mounts volume '${m.name}', which the pod does not define`);
    }
    for (const v of volumes) {
      if (!v.configMap) continue;
      const cm = configMaps.get(v.configMap.name);
      if (!cm) errors.push(`${owner}: volume '${v.name}' needs ConfigMap '${v.configMap.name}', which this fleet does not define`);
      for (const item of v.configMap.items || [])
        if (cm && !(cm.data && item.key in cm.data)) errors.push(`${owner}: ConfigMap '${cm.metadata.name}' has no key '${item.key}'`);
    }
    const notes = (template.metadata && template.metadata.annotations) || {};
    if (notes["prometheus.io/scrape"] === "true") {
      const port = Number(notes["prometheus.io/port"]);
      if (!portKnown(port, containers)) errors.push(`${owner}: prometheus.io/port '${notes["prometheus.io/port"]}' is not a container port`);
    }
  }
}

function checkFleet(fleet, errors) {
  const objects = fleet.objects.filter(({ obj }) => obj && obj.metadata && obj.metadata.name);
  const names = new Map();
  for (const { file, obj } of objects) {
    const key = `${obj.kind}/${obj.metadata.name}`;
    if (names.has(key)) errors.push(`${file}: ${key} is also defined in ${names.get(key)}`);
    names.set(key, file);
  }
  const pods = podTemplates(objects);
  checkSelectors(objects, pods, errors);
  checkPods(objects, pods, errors);
  return pods;
}

module.exports = { checkFleet, containersOf, labelsOf, matches };
