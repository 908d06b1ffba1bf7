// Reads a manifest folder: every YAML file (each document parsed with js-yaml), and the kustomizations that
// tie them together. A kustomization's resources must exist (files, or folders with a kustomization of their
// own; nothing remote: the check is offline), every manifest file must be listed by some kustomization, and
// each top-level kustomization is one fleet: the objects that are applied together, with its namespace.
"use strict";
const fs = require("fs");
const path = require("path");
const yaml = require("js-yaml");

const KUSTOMIZATION_NAMES = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

function yamlFiles(dir) {
  const out = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) out.push(...yamlFiles(p));
    else if (/\.ya?ml$/.test(entry.name) || entry.name === "Kustomization") out.push(p);
  }
  return out.sort();
}

function parse(file, errors) {
  try {
    return yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d !== null && d !== undefined);
  } catch (e) {
    errors.push(`${file}: not valid YAML: ${e.message.split("\n")[0]}`);
    return [];
  }
}

function kustomizationIn(dir) {
  for (const name of KUSTOMIZATION_NAMES) {
    const p = path.join(dir, name);
    if (fs.existsSync(p)) return p;
  }
  return null;
}

// The manifest files a kustomization applies (recursively), and the kustomizations it includes.
function resolve(kfile, docsByFile, errors, seen = new Set()) {
  const out = { files: [], kustomizations: [] };
  if (seen.has(kfile)) {
    errors.push(`${kfile}: included twice (a cycle or a diamond)`);
    return out;
  }
  seen.add(kfile);
  const k = (docsByFile.get(kfile) || [])[0] || {};
  const dir = path.dirname(kfile);
  for (const key of ["bases", "components", "crds", "patchesStrategicMerge", "patchesJson6902", "configMapGenerator", "helmCharts"])
    if (k[key]) errors.push(`${kfile}: '${key}' is not used by these examples and not checked here; list plain resources`);
  for (const r of k.resources || []) {
    if (/^[a-z]+:\/\/|^github\.com\//.test(r)) {
      errors.push(`${kfile}: resource '${r}' is remote; the manifests must be complete offline`);
      continue;
    }
    const p = path.resolve(dir, r);
    if (!fs.existsSync(p)) {
      errors.push(`${kfile}: resource '${r}' does not exist`);
    } else if (fs.statSync(p).isDirectory()) {
      const sub = kustomizationIn(p);
      if (!sub) {
        errors.push(`${kfile}: resource folder '${r}' has no kustomization.yaml`);
        continue;
      }
      const inner = resolve(sub, docsByFile, errors, seen);
      out.kustomizations.push(sub, ...inner.kustomizations);
      out.files.push(...inner.files);
    } else {
      out.files.push(p);
    }
  }
  return out;
}

// { files: [{file, docs}], fleets: [{kustomization, namespace, objects: [{file, obj}]}] }
function loadFolder(dir, errors) {
  const files = yamlFiles(dir).map((file) => ({ file: path.resolve(file), docs: [] }));
  const docsByFile = new Map();
  for (const f of files) {
    f.docs = parse(f.file, errors);
    docsByFile.set(f.file, f.docs);
  }
  const isKustomization = (f) => KUSTOMIZATION_NAMES.includes(path.basename(f));
  const kfiles = files.map((f) => f.file).filter(isKustomization);
  const resolved = new Map(kfiles.map((k) => [k, resolve(k, docsByFile, errors)]));
  const included = new Set([...resolved.values()].flatMap((r) => r.kustomizations));
  const listed = new Set([...resolved.values()].flatMap((r) => r.files));
  for (const f of files)
    if (!isKustomization(f.file) && !listed.has(f.file)) errors.push(`${f.file}: not listed in any kustomization's resources`);
  const fleets = kfiles
    .filter((k) => !included.has(k))
    .map((k) => {
      const namespace = (docsByFile.get(k)[0] || {}).namespace || "default";
      const objects = [...new Set(resolved.get(k).files)].flatMap((file) => (docsByFile.get(file) || []).map((obj) => ({ file, obj })));
      return { kustomization: k, namespace, objects };
    });
  if (kfiles.length === 0) errors.push(`${dir}: no kustomization.yaml`);
  return { files, fleets };
}

module.exports = { loadFolder, KUSTOMIZATION_NAMES };
