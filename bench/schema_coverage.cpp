// JSON Schema coverage of the grammar engine on the official JSON Schema Test Suite (npm
// json-schema-test-suite; its newest draft there is draft 4): per suite file (one keyword each), how many
// schemas compile, how many are refused (and the keywords the errors name), and for compiled ones how the
// grammar's language compares with the suite's instances: a valid instance refused is a grammar narrower
// than the schema; an invalid instance accepted is a violation (the grammar lets through output the schema
// forbids). Prints a Markdown table; exits 1 when there is any violation.
// Usage: bench_schema_coverage [--verbose] [--json-schema-objects] [suite dir (default: draft4)]
//   --json-schema-objects: an absent additionalProperties allows other properties (JSON Schema's meaning);
//   by default the server's options are used (an absent additionalProperties is false).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/support/schema_suite.h"

using namespace kvfleet::grammar;

int main(int argc, char** argv) {
  bool verbose = false;
  GrammarOptions options;
  std::string dir = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/json-schema-test-suite/tests/draft4";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verbose") verbose = true;
    else if (a == "--json-schema-objects") options.strict_objects = false;
    else dir = a;
  }
  std::vector<std::string> files;
  for (const auto& sub : {std::string(), std::string("/optional")}) {
    if (!std::filesystem::is_directory(dir + sub)) continue;
    std::vector<std::string> here;
    for (const auto& e : std::filesystem::directory_iterator(dir + sub)) {
      if (e.path().extension() == ".json") here.push_back(e.path().string());
    }
    std::sort(here.begin(), here.end());
    files.insert(files.end(), here.begin(), here.end());
  }
  std::printf("| suite file | schemas | compiled | refused (keyword named) | wrong (violations) | valid refused | invalid rejected |\n");
  std::printf("|---|---:|---:|---|---:|---:|---:|\n");
  int t_schemas = 0, t_compiled = 0, t_refused = 0, t_wrong = 0, t_viol = 0, t_narrow = 0, t_valid = 0, t_rejected = 0, t_invalid = 0;
  std::vector<std::string> details;
  for (const std::string& path : files) {
    const auto results = suite::run_file(path, options);
    int compiled = 0, refused = 0, wrong = 0, viol = 0, narrow = 0, valid = 0, rejected = 0, invalid = 0;
    std::map<std::string, int> keywords;
    for (const auto& r : results) {
      if (!r.compiled) {
        ++refused;
        ++keywords[r.refused_keyword.empty() ? "(none: " + r.error + ")" : r.refused_keyword];
        if (verbose) details.push_back("refused  " + r.file + ": " + r.description + ": " + r.error);
        continue;
      }
      ++compiled;
      wrong += r.violations() > 0;
      viol += r.violations();
      narrow += r.narrower();
      for (const auto& i : r.instances) {
        valid += i.valid;
        invalid += !i.valid;
        rejected += !i.valid && !i.accepted;
        if (!i.valid && i.accepted) details.push_back("VIOLATION " + r.file + ": " + r.description + ": " + i.description + ": " + r.schema + " accepts " + i.data);
        if (verbose && i.valid && !i.accepted) details.push_back("narrower " + r.file + ": " + r.description + ": " + i.description + ": " + r.schema + " refuses " + i.data);
      }
    }
    std::string kw;
    for (const auto& [k, n] : keywords) kw += (kw.empty() ? "" : ", ") + k + (n > 1 ? " x" + std::to_string(n) : "");
    std::string name = std::filesystem::path(path).parent_path().filename() == "optional" ? "optional/" : "";
    name += results.empty() ? std::filesystem::path(path).stem().string() : results.front().file;
    std::printf("| %s | %zu | %d | %d%s | %d (%d) | %d/%d | %d/%d |\n", name.c_str(), results.size(), compiled, refused,
                kw.empty() ? "" : (" (" + kw + ")").c_str(), wrong, viol, narrow, valid, rejected, invalid);
    t_schemas += static_cast<int>(results.size());
    t_compiled += compiled;
    t_refused += refused;
    t_wrong += wrong;
    t_viol += viol;
    t_narrow += narrow;
    t_valid += valid;
    t_rejected += rejected;
    t_invalid += invalid;
  }
  std::printf("| **all** | %d | %d | %d | %d (%d) | %d/%d | %d/%d |\n", t_schemas, t_compiled, t_refused, t_wrong, t_viol,
              t_narrow, t_valid, t_rejected, t_invalid);
  std::printf("\nvalid refused / invalid rejected count instances of compiled schemas only.\n");
  for (const auto& d : details) std::printf("%s\n", d.c_str());
  return t_viol > 0 ? 1 : 0;
}
