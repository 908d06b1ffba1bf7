// kvfleet-router: a prefix-aware OpenAI gateway in front of kvfleet replicas.
// `kvfleet-router --model DIR --replica URL --replica URL --policy cache_aware --port N`, or
// `--config router.yaml` (flags win). SIGTERM/SIGINT drain: new requests get 503 while running ones
// finish (up to drain_timeout_ms), then the process exits. SIGHUP reloads the configuration file.
#include <csignal>
#include <cstdio>
#include <exception>

#include "kvfleet/http/shutdown.h"
#include "router/gateway/gateway.h"

int main(int argc, char** argv) {
  using namespace kvfleet::router;
  const sigset_t signals = kvfleet::http::block_shutdown_signals({SIGHUP});  // before any thread starts
  try {
    std::string help;
    const RouterConfig config = parse_router_args(argc, argv, &help);
    if (!help.empty()) {
      std::fputs(help.c_str(), stdout);
      return 0;
    }
    Gateway gateway(config);
    gateway.start();
    std::printf("kvfleet-router: serving '%s' on http://%s:%u (%zu replicas)\n", gateway.model_name().c_str(),
                config.host.c_str(), gateway.port(), config.replicas.size());
    std::fflush(stdout);
    // SIGHUP re-reads the configuration (the same flags and file) and applies what can change live.
    const auto reload = [&](int) {
      try {
        std::fprintf(stderr, "kvfleet-router: SIGHUP: %s\n", gateway.reload(parse_router_args(argc, argv, nullptr)).c_str());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kvfleet-router: SIGHUP: the new configuration was not applied: %s\n", e.what());
      }
    };
    kvfleet::http::wait_then_drain("kvfleet-router", signals, [&] { return gateway.drain(); }, reload);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvfleet-router: error: %s\n", e.what());
    return 1;
  }
}
