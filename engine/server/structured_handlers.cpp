// Structured outputs on the replica: a request's constraint (api/structured_output.h) compiled by the grammar
// engine into the TokenGrammar its engine requests carry, off the HTTP threads and the engine thread.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "engine/server/api/request.h"
#include "engine/server/replica.h"

namespace kvfleet::server {

boost::asio::awaitable<std::shared_ptr<const TokenGrammar>> Replica::compile_constraint(const GenerateParams& p) {
  if (!p.structured) co_return nullptr;
  const StructuredOutput& so = *p.structured;
  if (!grammar_compiler_)
    throw bad_request("structured outputs ('" + so.param + "', " + to_string(so.kind) +
                          ") are not available: this replica has no grammar engine", so.param);
  // A compiled grammar does not cross processes: only the ranks in this process run constrained requests.
  if (ep_ && p.dp_rank && *p.dp_rank < ep_->size() && !ep_->rank_in_process(*p.dp_rank))
    throw bad_request("data_parallel_rank " + std::to_string(*p.dp_rank) +
                          " runs in another process, where structured outputs are not available", "data_parallel_rank");
  std::call_once(compile_pool_once_, [this] { compile_pool_ = std::make_unique<boost::asio::thread_pool>(1); });
  auto compile = [this, &so]() -> boost::asio::awaitable<std::shared_ptr<const TokenGrammar>> {
    co_return grammar_compiler_(so);
  };
  std::shared_ptr<const TokenGrammar> grammar;
  try {
    // Runs on the compile pool; this coroutine resumes on its own HTTP executor with the result or the error.
    grammar = co_await boost::asio::co_spawn(compile_pool_->get_executor(), compile, boost::asio::use_awaitable);
  } catch (const StructuredOutputError& e) {
    throw bad_request(e.what(), e.param.empty() ? so.param : tool_schema_param(e.param));
  } catch (const std::invalid_argument& e) {
    throw bad_request(e.what(), so.param);
  }
  if (!grammar) throw ApiError(500, "the grammar engine returned no grammar for '" + so.param + "'", "server_error");
  if (grammar->vocab_size() > static_cast<std::size_t>(model_.config().vocab_size))
    throw ApiError(500, "the grammar engine's vocabulary is larger than the model's", "server_error");
  co_return grammar;
}

}  // namespace kvfleet::server
