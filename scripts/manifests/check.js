// node scripts/manifests/check.js DIR BIN_DIR: the offline check of a Kubernetes manifest folder (run by
// scripts/check-manifests after yamllint). Exits 1 and lists every problem, each naming its file or object.
"use strict";
const path = require("path");
const { loadFolder, KUSTOMIZATION_NAMES } = require("./load");
const { checkObject } = require("./schema");
const lws = require("./lws");
const { checkFleet } = require("./fleet");
const { checkKvfleet } = require("./kvfleet");

function checkObjects(dir, files, errors) {
  let count = 0;
  for (const { file, docs } of files) {
    if (KUSTOMIZATION_NAMES.includes(path.basename(file))) continue;
    for (const obj of docs) {
      ++count;
      const where = `${path.relative(dir, file)}: ${obj.kind}/${(obj.metadata || {}).name}`;
      if (!obj.apiVersion || !obj.kind || !obj.metadata || !obj.metadata.name) {
        errors.push(`${where}: needs apiVersion, kind and metadata.name`);
        continue;
      }
      let problems = obj.kind === "LeaderWorkerSet" ? lws.checkLeaderWorkerSet(obj) : checkObject(obj);
      if (problems === null) problems = [`no schema for ${obj.apiVersion} ${obj.kind} (not a built-in kind, and not LeaderWorkerSet)`];
      for (const p of problems) errors.push(`${where}: ${p}`);
    }
  }
  return count;
}

// { errors: [...], notes: [...], summary } for the folder; binDir holds kvfleet-replica and kvfleet-router.
function checkFolder(dir, binDir) {
  const errors = [];
  const notes = new Set();
  const { files, fleets } = loadFolder(dir, errors);
  const objects = checkObjects(dir, files, errors);
  const ctx = { binDir, sourceDir: path.resolve(__dirname, "../.."), errors, notes };
  for (const fleet of fleets) {
    try {
      checkKvfleet(fleet, checkFleet(fleet, errors), ctx);
    } catch (e) {
      errors.push(`${path.relative(dir, fleet.kustomization)}: ${e.message}`);
    }
  }
  const summary = `${objects} objects in ${files.length} files, ${fleets.length} fleet(s): ` +
                  fleets.map((f) => path.relative(dir, path.dirname(f.kustomization)) || ".").join(", ");
  return { errors, notes: [...notes], summary };
}

function main(dir, binDir) {
  const { errors, notes, summary } = checkFolder(dir, binDir);
  for (const n of notes) console.log(`[check-manifests] note: ${n}`);
  if (errors.length === 0) {
    console.log(`[check-manifests] ok: ${summary}`);
    return 0;
  }
  for (const e of errors) console.error(`[check-manifests] ERROR ${e}`);
  console.error(`[check-manifests] ${errors.length} problem(s) in ${dir}`);
  return 1;
}

module.exports = { checkFolder };

if (require.main === module) {
  if (process.argv.length !== 4) {
    console.error("usage: node scripts/manifests/check.js DIR BIN_DIR");
    process.exit(2);
  }
  process.exit(main(path.resolve(process.argv[2]), path.resolve(process.argv[3])));
}
