// EpGroup::kv_state (kvfleet/ep_group.h): GET /internal/kv_state of an expert-parallel group, every rank's
// figures gathered (a remote rank's over its channel) and summed.
#include <mutex>

#include "kvfleet/ep_group.h"

namespace kvfleet {

namespace {

// The group's kv_state from the ranks' answers (rank order).
boost::json::object merge_kv_states(std::vector<boost::json::object>& answers) {
  namespace json = boost::json;
  json::object top{{"integrity", "ok"}, {"num_blocks", 0}, {"free_blocks", 0}, {"cached_blocks", 0},
                   {"pins", 0}, {"running", 0}, {"waiting", 0}};
  std::string problems;
  json::array ranks;
  for (std::size_t r = 0; r < answers.size(); ++r) {
    json::object& a = answers[r];
    std::string problem;
    if (const auto* e = a.if_contains("error")) problem = std::string(e->as_string());
    else if (a.at("integrity").as_string() != "ok") problem = std::string(a.at("integrity").as_string());
    if (!problem.empty()) problems += (problems.empty() ? "rank " : "; rank ") + std::to_string(r) + ": " + problem;
    for (const char* key : {"num_blocks", "free_blocks", "cached_blocks", "pins", "running", "waiting"})
      if (const auto* v = a.if_contains(key)) top[key] = top[key].to_number<std::int64_t>() + v->to_number<std::int64_t>();
    a["dp_rank"] = static_cast<std::int64_t>(r);
    ranks.emplace_back(std::move(a));
  }
  if (!problems.empty()) top["integrity"] = problems;
  top["ranks"] = std::move(ranks);
  return top;
}

}  // namespace

void EpGroup::kv_state(std::function<void(boost::json::object)> done) const {
  struct Gather {
    std::mutex mu;
    std::vector<boost::json::object> answers;
    std::size_t left;
    std::function<void(boost::json::object)> done;
  };
  auto g = std::make_shared<Gather>();
  g->answers.resize(ranks_.size());
  g->left = ranks_.size();
  g->done = std::move(done);
  for (std::size_t r = 0; r < ranks_.size(); ++r)
    ranks_[r]->kv_state([g, r](boost::json::object answer) {
      {
        std::lock_guard lock(g->mu);
        g->answers[r] = std::move(answer);
        if (--g->left > 0) return;
      }
      g->done(merge_kv_states(g->answers));  // the last answer: nobody else touches answers now
    });
}

}  // namespace kvfleet
