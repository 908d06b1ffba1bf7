// Kubernetes schema checks for one object, offline, with the npm package kubernetes-models (Kubernetes 1.27's
// OpenAPI schemas compiled to validators):
//   - validate(): types, required fields, enums, formats, as the API server's OpenAPI validation does;
//   - strict field names: the schemas accept any extra key (Kubernetes' OpenAPI has no
//     additionalProperties: false), so a typo such as `readinesProbe` would pass them, yet the API server
//     refuses it (kubectl's default field validation is Strict since 1.27). The field names come from the
//     package's TypeScript declarations, which list every property of every type and the type it refers to.
"use strict";
const fs = require("fs");
const path = require("path");

const modelsRoot = path.dirname(require.resolve("kubernetes-models/package.json"));
const nodeModules = path.dirname(modelsRoot);

// apiVersion -> the package's folder: "v1" -> v1, "apps/v1" -> apps/v1, "policy/v1" -> policy/v1.
function modelClass(apiVersion, kind) {
  let mod;
  try {
    mod = require(`kubernetes-models/${apiVersion}`);
  } catch {
    return null;
  }
  return mod[kind] || null;
}

// One TypeScript declaration file: the first interface's properties, each with the declaration file of the
// type it refers to (null for a string, number, map or inline type: not followed).
const declarations = new Map();
function parseDeclaration(file) {
  if (declarations.has(file)) return declarations.get(file);
  const text = fs.readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/^import \{ (\w+) \} from "([^"]+)";$/gm)) {
    const spec = m[2];
    const base = spec.startsWith(".") ? path.resolve(path.dirname(file), spec) : path.join(nodeModules, spec);
    imports.set(m[1], `${base}.d.ts`);
  }
  const body = text.match(/^export interface \w+(?: extends [\w, ]+)? \{\n([\s\S]*?)^\}/m);
  const props = new Map();
  if (body) {
    for (const m of body[1].matchAll(/^ {4}"([^"]+)"\??: (.*)$/gm)) {
      const ref = m[2].match(/^(?:Array<)?(I\w+)>?;$/);
      props.set(m[1], ref && imports.has(ref[1]) ? imports.get(ref[1]) : null);
    }
  }
  const decl = { props, extendsTypeMeta: body ? /extends TypeMeta/.test(body[0]) : false };
  declarations.set(file, decl);
  return decl;
}

// Unknown keys in `value` against the declaration in `file`, recursively; each as "path: unknown field".
function unknownFields(value, file, where, out) {
  if (!fs.existsSync(file) || value === null || typeof value !== "object") return out;
  if (Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, file, `${where}[${i}]`, out));
    return out;
  }
  const decl = parseDeclaration(file);
  if (decl.props.size === 0) return out;  // a type alias (IntOrString, Quantity, Time): no fields
  for (const [key, v] of Object.entries(value)) {
    if (decl.extendsTypeMeta && (key === "apiVersion" || key === "kind")) continue;
    if (!decl.props.has(key)) {
      const near = [...decl.props.keys()].filter((k) => k.toLowerCase().startsWith(key.toLowerCase().slice(0, 4)));
      out.push(`${where}.${key}: unknown field${near.length ? ` (known: ${near.join(", ")})` : ""}`);
      continue;
    }
    const ref = decl.props.get(key);
    if (ref) unknownFields(v, ref, `${where}.${key}`, out);
  }
  return out;
}

function declarationFile(apiVersion, kind) {
  return path.join(modelsRoot, apiVersion, `${kind}.d.ts`);
}

function schemaErrors(Model, obj) {
  try {
    new Model(obj).validate();
    return [];
  } catch (e) {
    const errors = e.errors || [{ instancePath: "", message: e.message }];
    return errors.map((x) => `${x.instancePath || "/"}: ${x.message}${x.params && x.params.allowedValues ? ` (${x.params.allowedValues.join(", ")})` : ""}`);
  }
}

// Every schema problem of a whole object (apiVersion + kind), or null when the package has no schema for it.
function checkObject(obj) {
  const Model = modelClass(obj.apiVersion, obj.kind);
  if (!Model) return null;
  return [...schemaErrors(Model, obj), ...unknownFields(obj, declarationFile(obj.apiVersion, obj.kind), obj.kind, [])];
}

// The same for a value of a core/v1 type (PodTemplateSpec) or of ObjectMeta inside another object (a custom
// resource's pod templates and metadata).
function checkType(kind, value, where) {
  const meta = kind === "ObjectMeta";
  const Model = meta ? require("@kubernetes-models/apimachinery/apis/meta/v1").ObjectMeta : modelClass("v1", kind);
  const decl = meta ? path.join(nodeModules, "@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta.d.ts") : declarationFile("v1", kind);
  return [...schemaErrors(Model, value).map((e) => `${where}${e}`), ...unknownFields(value, decl, where, [])];
}

module.exports = { checkObject, checkType };
