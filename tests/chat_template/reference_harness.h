// Runs tests/chat_template/render_ref.py (jinja2 as transformers configures it) once over a batch of
// cases and compares each rendering with ChatTemplate's, byte for byte.
#pragma once

#include <boost/json.hpp>
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kvfleet/chat_template.h"

namespace kvfleet::test {

inline const std::filesystem::path kSourceDir = KVFLEET_SOURCE_DIR;
inline const char* kSystemPython = "/usr/bin/python3";  // Debian's, with python3-jinja2

struct RefCase {
  std::string name;
  std::string source;  // template text
  std::string bos_token, eos_token;
  boost::json::array messages;
  bool add_generation_prompt = true;
  boost::json::value tools;
  boost::json::object extra;
};

struct RefResult {
  bool ok = false;
  std::string text;  // the rendering, or the error message
  bool raised = false;  // error came from raise_exception
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fails the test (with the fix) when the reference renderer cannot run.
inline bool reference_available() {
  const auto script = kSourceDir / "tests/chat_template/render_ref.py";
  bool ok = std::filesystem::exists(kSystemPython) && std::filesystem::exists(script) &&
            std::system((std::string(kSystemPython) + " -c 'import jinja2' 2>/dev/null").c_str()) == 0;
  if (!ok) FAIL_CHECK("/usr/bin/python3 with python3-jinja2 is missing: run scripts/setup");
  return ok;
}

// The reference script's input. Set KVFLEET_DUMP_CASES=file to keep a copy for debugging by hand:
//   /usr/bin/python3 tests/chat_template/render_ref.py < file
inline std::string cases_json(const std::vector<RefCase>& cases) {
  boost::json::array jcases;
  for (const auto& c : cases) {
    boost::json::object o;
    o["name"] = c.name;
    o["template"] = c.source;
    o["messages"] = c.messages;
    o["add_generation_prompt"] = c.add_generation_prompt;
    o["tools"] = c.tools;
    o["bos_token"] = c.bos_token;
    o["eos_token"] = c.eos_token;
    o["extra"] = c.extra;
    jcases.push_back(std::move(o));
  }
  std::string text = boost::json::serialize(boost::json::object{{"cases", jcases}});
  if (const char* dump = std::getenv("KVFLEET_DUMP_CASES")) std::ofstream(dump, std::ios::binary) << text;
  return text;
}

inline std::map<std::string, RefResult> run_reference(const std::vector<RefCase>& cases) {
  const auto input = std::filesystem::temp_directory_path() / ("kvfleet_render_ref_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(input, std::ios::binary);
    out << cases_json(cases);
  }
  const std::string cmd = std::string(kSystemPython) + " " +
                          (kSourceDir / "tests/chat_template/render_ref.py").string() + " < " + input.string();
  std::string output;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) output.append(buf, n);
    ::pclose(p);
  }
  std::filesystem::remove(input);
  std::map<std::string, RefResult> results;
  boost::system::error_code ec;
  auto parsed = boost::json::parse(output, ec);
  if (ec || !parsed.is_object()) {
    FAIL_CHECK("render_ref.py produced no JSON (run scripts/setup?): " << output.substr(0, 500));
    return results;
  }
  for (const auto& r : parsed.at("results").as_array()) {
    const auto& o = r.as_object();
    RefResult res;
    res.ok = o.contains("output");
    res.text = std::string(res.ok ? o.at("output").as_string() : o.at("error").as_string());
    res.raised = !res.ok && o.at("raised").as_bool();
    results[std::string(o.at("name").as_string())] = std::move(res);
  }
  return results;
}

inline RefResult render_ours(const ChatTemplate& t, const RefCase& c) {
  ChatTemplateOptions opts;
  opts.add_generation_prompt = c.add_generation_prompt;
  opts.tools = c.tools;
  opts.extra_context = c.extra;
  RefResult r;
  try {
    r.text = t.render(c.messages, opts);
    r.ok = true;
  } catch (const TemplateError& e) {
    r.text = e.what();
  }
  return r;
}

// Compares every case with the reference; returns one description per case that differs (empty: all
// match). A rendering must match byte for byte; an error must be an error on both sides, with the same
// message when the template raised it itself (raise_exception).
inline std::vector<std::string> mismatches(const std::vector<RefCase>& cases,
                                           const std::vector<const ChatTemplate*>& templates) {
  auto ref = run_reference(cases);
  std::vector<std::string> out;
  for (size_t i = 0; i < cases.size(); ++i) {
    const RefCase& c = cases[i];
    auto it = ref.find(c.name);
    if (it == ref.end()) {
      out.push_back("no reference result for " + c.name);
      continue;
    }
    const RefResult& want = it->second;
    RefResult got = render_ours(*templates[i], c);
    bool same = want.ok == got.ok;
    if (same && want.ok) same = want.text == got.text;
    if (same && !want.ok && want.raised) same = want.text == got.text;
    if (same) continue;
    out.push_back("case " + c.name + " differs\n--- jinja2 (" + (want.ok ? "output" : "error") + "):\n" + want.text +
                  "\n--- kvfleet (" + (got.ok ? "output" : "error") + "):\n" + got.text + "\n---");
  }
  return out;
}

}  // namespace kvfleet::test
