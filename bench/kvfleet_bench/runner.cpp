#include "bench/kvfleet_bench/runner.h"

#include <sys/resource.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <deque>
#include <memory>
#include <stdexcept>

#include "bench/kvfleet_bench/arrivals.h"

namespace kvfleet::bench {
namespace {

namespace asio = boost::asio;
namespace json = boost::json;
constexpr auto tuple_awaitable = asio::as_tuple(asio::use_awaitable);
using History = std::vector<std::pair<std::string, std::string>>;

// A counting semaphore for coroutines on one thread: a waiter parks on a timer that never expires
// and is woken (cancelled) by release(), which hands it the slot directly so that arrivals keep
// their order.
class Slots {
 public:
  Slots(asio::any_io_executor executor, std::size_t limit) : executor_(std::move(executor)), free_(limit), unlimited_(limit == 0) {}

  asio::awaitable<void> acquire() {
    if (unlimited_) co_return;
    if (free_ > 0) {
      --free_;
      co_return;
    }
    auto timer = std::make_shared<asio::steady_timer>(executor_, asio::steady_timer::time_point::max());
    waiters_.push_back(timer);
    co_await timer->async_wait(tuple_awaitable);
  }
  void release() {
    if (unlimited_) return;
    if (waiters_.empty()) {
      ++free_;
      return;
    }
    waiters_.front()->cancel();
    waiters_.pop_front();
  }

 private:
  asio::any_io_executor executor_;
  std::size_t free_;
  bool unlimited_;
  std::deque<std::shared_ptr<asio::steady_timer>> waiters_;
};

struct RunState {
  const RunConfig& config;
  const Workload& workload;
  Clock::time_point start;
  Slots slots;
  std::vector<RequestResult> results;
  std::vector<std::size_t> first_result;  // chain -> index of its first turn in results
  std::size_t chains_left = 0;
  Progress progress;
  std::size_t max_in_flight = 0;
  Clock::time_point finished;
};

asio::awaitable<void> run_chain(RunState& s, std::size_t chain_index) {
  const Chain& chain = s.workload.chains[chain_index];
  History history;
  if (!chain.system_text.empty()) history.emplace_back("system", chain.system_text);
  for (std::size_t t = 0; t < chain.turns.size(); ++t) {
    const Turn& turn = chain.turns[t];
    co_await s.slots.acquire();
    s.max_in_flight = std::max(s.max_in_flight, ++s.progress.in_flight);
    const std::string body = request_body(s.config, history, turn, s.config.target.chat());
    RequestResult& result = s.results[s.first_result[chain_index] + t];
    result.group = chain.group;
    co_await stream_request(s.config.target, body, s.start, s.config.client, result);
    --s.progress.in_flight;
    ++s.progress.done;
    if (!result.success) ++s.progress.failed;
    s.slots.release();
    history.emplace_back("user", turn.user_text);
    history.emplace_back("assistant", result.text);
  }
  if (--s.chains_left == 0) s.finished = Clock::now();
}

asio::awaitable<void> dispatch(RunState& s, std::vector<double> arrivals) {
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  for (std::size_t i = 0; i < arrivals.size(); ++i) {
    timer.expires_at(s.start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i])));
    co_await timer.async_wait(tuple_awaitable);
    asio::co_spawn(executor, run_chain(s, i), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  }
}

asio::awaitable<void> report_progress(RunState& s, const std::function<void(const Progress&)>& on_progress) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (s.chains_left > 0) {
    s.progress.elapsed = std::chrono::duration<double>(Clock::now() - s.start).count();
    on_progress(s.progress);
    timer.expires_after(std::chrono::milliseconds(200));
    co_await timer.async_wait(tuple_awaitable);
  }
  s.progress.elapsed = std::chrono::duration<double>(s.finished - s.start).count();
  on_progress(s.progress);
}

std::vector<double> draw_arrivals(const RunConfig& config, const Workload& workload) {
  std::vector<double> times = arrival_times(workload.chains.size(), config.request_rate, config.burstiness, config.seed);
  bool replay = !workload.chains.empty();
  for (const Chain& c : workload.chains) replay = replay && c.arrival.has_value();
  if (replay)
    for (std::size_t i = 0; i < times.size(); ++i) times[i] = *workload.chains[i].arrival;
  return times;
}

// The first num_warmups chains, one turn each, all at once (within the concurrency cap).
void warm_up(const RunConfig& config, const Workload& workload) {
  Workload warm{workload.name, {}};
  for (std::size_t i = 0; i < config.num_warmups && i < workload.chains.size(); ++i) {
    Chain c = workload.chains[i];
    c.turns.resize(1);
    c.arrival.reset();
    warm.chains.push_back(std::move(c));
  }
  RunConfig quick = config;
  quick.num_warmups = 0;
  quick.request_rate = std::numeric_limits<double>::infinity();
  run_benchmark(quick, warm);
}

}  // namespace

std::string request_body(const RunConfig& config, const History& history, const Turn& turn, bool chat) {
  json::object body{{"model", config.model},
                    {"max_tokens", turn.output_len},
                    {"ignore_eos", true},
                    {"temperature", 0.0},
                    {"stream", true},
                    {"stream_options", json::object{{"include_usage", true}}}};
  if (!turn.prompt_ids.empty()) {
    if (chat) throw std::invalid_argument("a Mooncake trace sends token ids: use --endpoint /v1/completions");
    body["prompt"] = json::array(turn.prompt_ids.begin(), turn.prompt_ids.end());
  } else if (chat) {
    json::array messages;
    for (const auto& [role, content] : history) messages.push_back(json::object{{"role", role}, {"content", content}});
    messages.push_back(json::object{{"role", "user"}, {"content", turn.user_text}});
    body["messages"] = std::move(messages);
  } else {
    std::string prompt;
    for (const auto& entry : history) prompt += entry.second;
    prompt += turn.user_text;
    body["prompt"] = std::move(prompt);
  }
  return json::serialize(body);
}

RunOutput run_benchmark(const RunConfig& config, const Workload& workload,
                        const std::function<void(const Progress&)>& on_progress) {
  if (config.num_warmups > 0) warm_up(config, workload);
  asio::io_context ioc(1);
  RunState s{config, workload, Clock::now(), Slots(ioc.get_executor(), config.max_concurrency), {}, {}, 0, {}, 0, {}};
  s.results.resize(workload.request_count());
  for (const Chain& c : workload.chains) {
    s.first_result.push_back(s.progress.total);
    s.progress.total += c.turns.size();
  }
  s.chains_left = workload.chains.size();
  std::vector<double> arrivals = draw_arrivals(config, workload);
  s.start = Clock::now();
  s.finished = s.start;
  auto rethrow = [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  };
  asio::co_spawn(ioc, dispatch(s, std::move(arrivals)), rethrow);
  if (on_progress) asio::co_spawn(ioc, report_progress(s, on_progress), rethrow);
  ioc.run();
  RunOutput out;
  out.results = std::move(s.results);
  out.duration = std::chrono::duration<double>(s.finished - s.start).count();
  out.max_in_flight = s.max_in_flight;
  return out;
}

std::uint64_t raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ::getrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

}  // namespace kvfleet::bench
