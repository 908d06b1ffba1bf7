// Global functions: jinja2's namespace/range/dict, and the two transformers adds (raise_exception,
// strftime_now).
#include <ctime>

#include "engine/core/chat_template/builtins.h"
#include "kvfleet/chat_template.h"

namespace kvfleet::jinja {
namespace {

Value make_namespace(const CallArgs& a) {
  auto d = std::make_shared<Dict>();
  d->is_namespace = true;
  for (const auto& v : a.args) {  // namespace(some_dict) copies its items
    if (!v.is_dict()) throw TemplateError("namespace() positional argument must be a mapping");
    for (const auto& [k, x] : v.as_dict().items) d->set(k, x);
  }
  for (const auto& [k, v] : a.kwargs) d->set(k, v);
  return Value(std::move(d));
}

Value make_range(const CallArgs& a) {
  if (a.args.empty() || a.args.size() > 3) throw TemplateError("range expects 1 to 3 arguments");
  for (const auto& v : a.args)
    if (!v.is_int() && !v.is_bool()) throw TemplateError("range arguments must be integers");
  std::int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) {
    stop = a.args[0].as_int();
  } else {
    start = a.args[0].as_int();
    stop = a.args[1].as_int();
    if (a.args.size() == 3) step = a.args[2].as_int();
  }
  if (step == 0) throw TemplateError("range() arg 3 must not be zero");
  std::vector<Value> out;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) throw TemplateError("range too big");  // jinja2's sandbox MAX_RANGE
    out.emplace_back(i);
  }
  return Value::list(std::move(out));
}

Value strftime_now(const CallArgs& a) {
  const Value* fmt = a.get(0, "format");
  if (!fmt || !fmt->is_string()) throw TemplateError("strftime_now expects a format string");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  size_t n = std::strftime(buf, sizeof buf, fmt->as_string().c_str(), &local);
  return Value(std::string(buf, n));
}

}  // namespace

void add_globals(Dict& globals) {
  globals.set("namespace", Value::function("namespace", make_namespace));
  globals.set("range", Value::function("range", make_range));
  globals.set("dict", Value::function("dict", [](const CallArgs& a) {
    Value d = Value::dict();
    for (const auto& [k, v] : a.kwargs) d.as_dict().set(k, v);
    return d;
  }));
  globals.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
    const Value* msg = a.get(0, "message");
    throw RaisedError(msg ? msg->str() : "");
  }));
  globals.set("strftime_now", Value::function("strftime_now", strftime_now));
}

}  // namespace kvfleet::jinja
