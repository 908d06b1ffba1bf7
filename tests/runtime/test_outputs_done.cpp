// Engine::set_outputs_done: the per-step hand-over the replica's OutputRelay wakes its streams with. It must
// run once per step, after the last callback of that step, and after every other turn that delivered
// something (an abort, a refused admission, the shutdown's final outputs), so that no output waits for it.
#include <doctest/doctest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

Model tiny_model(const test::TempDir& dir) {
  MakeModelOptions o;
  o.vocab = 300;
  o.layers = 1;
  make_model(o, dir.path());
  return Model::load(dir.path());
}

// What the hook saw: the outputs delivered since the previous call, per call. Everything runs on the
// engine thread; the mutex is for the test thread's reads.
struct Log {
  std::mutex mu;
  int pending = 0;
  std::vector<int> per_call;
  int finals = 0;
  OutputCallback callback() {
    return [this](const RequestOutput& o) {
      std::lock_guard lock(mu);
      ++pending;
      finals += o.finished ? 1 : 0;
    };
  }
  void done() {
    std::lock_guard lock(mu);
    per_call.push_back(pending);
    pending = 0;
  }
};

GenerationRequest request(int i, std::int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = {1 + i, 2, 3, 4};
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

}  // namespace

TEST_CASE("outputs_done runs once per step, after all of the step's outputs") {
  test::TempDir dir;
  const Model model = tiny_model(dir);
  EngineConfig c;
  c.backend.kind = "cpu";
  c.backend.threads = 1;
  Log log;
  Engine engine(model, c);
  engine.set_outputs_done([&log] { log.done(); });
  // Held until all four are queued, so that they run in the same steps: one prefill step, then 5 decodes.
  std::mutex gate;
  std::unique_lock hold(gate);
  engine.run_kv_task([&gate](Scheduler&, Backend&) { std::lock_guard wait(gate); });
  for (int i = 0; i < 4; ++i) engine.submit(request(i, 6), log.callback());
  hold.unlock();
  engine.wait_idle();
  std::lock_guard lock(log.mu);
  CHECK(log.pending == 0);  // nothing delivered after the last hook
  CHECK(log.finals == 4);
  CHECK(log.per_call == std::vector<int>(6, 4));  // 6 steps, each one call after its 4 outputs
  CHECK(engine.stats().steps == 6);
}

TEST_CASE("outputs_done follows an abort's output, and the shutdown's final outputs") {
  test::TempDir dir;
  const Model model = tiny_model(dir);
  EngineConfig c;
  c.backend.kind = "cpu";
  c.backend.threads = 1;
  Log log;
  {
    Engine engine(model, c);
    engine.set_outputs_done([&log] { log.done(); });
    // Submitted and aborted in one loop turn that runs no step: only the abort's output is delivered.
    std::mutex gate;
    std::unique_lock hold(gate);
    engine.run_kv_task([&gate](Scheduler&, Backend&) { std::lock_guard wait(gate); });
    engine.abort(engine.submit(request(0, 4), log.callback()));
    hold.unlock();
    engine.wait_idle();
    {
      std::lock_guard lock(log.mu);
      CHECK(log.finals == 1);
      CHECK(log.per_call == std::vector<int>{1});
      CHECK(engine.stats().steps == 0);
    }
    engine.submit(request(1, 1000), log.callback());  // still running when the engine goes
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (bool started = false; !started;) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::lock_guard lock(log.mu);
      started = log.per_call.size() > 1;
    }
  }  // the destructor ends the running request with an aborted final output
  std::lock_guard lock(log.mu);
  CHECK(log.finals == 2);
  CHECK(log.pending == 0);  // the shutdown's output was followed by a call too
}
