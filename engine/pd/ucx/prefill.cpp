// PrefillService's ucx transport: a UCP listener whose pull requests get the same frames as the HTTP pull
// (serve_pull -> serve_blocks), checked against the same internal key.
#include "engine/pd/prefill_service.h"
#include "engine/pd/ucx/transport.h"
#include "engine/pd/wire.h"
#include "kvfleet/secure_compare.h"

namespace kvfleet::pd {
using boost::asio::awaitable;

void PrefillService::enable_ucx(std::shared_ptr<UcxWorker> worker, const std::string& host, std::uint16_t port,
                                std::string key) {
  auto handler = [this, key = std::move(key)](const UcxPullRequest& req, PullSink& sink) -> awaitable<void> {
    if (!key.empty() && !secure_equal(req.key, key)) {
      const std::string bytes = encode(ErrorFrame{ErrorCode::internal, "a valid internal API key is required"});
      const bool written = co_await sink.write(bytes);  // (named: GCC 12 miscompiles a co_await in an if)
      if (written) co_await sink.finish();
      co_return;
    }
    co_await serve_pull(req.transfer, req.from, req.count, sink);
  };
  ucx_ = std::make_unique<UcxPullServer>(std::move(worker), host, port, config_.io_timeout, std::move(handler));
}

std::uint16_t PrefillService::ucx_port() const { return ucx_ ? ucx_->port() : 0; }

std::vector<std::string> PrefillService::offered_transports() const {
  if (ucx_) return {"ucx", "tcp"};
  return {"tcp"};
}

std::string PrefillService::offered_list() const { return ucx_ ? "ucx, tcp" : "tcp"; }

}  // namespace kvfleet::pd
