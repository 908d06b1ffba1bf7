// Settings of KV transfer between replicas (Contract 3), on both sides; kvfleet-replica's pd_* keys.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kvfleet::pd {

struct PdConfig {
  // P: blocks stay pinned this long after the handshake or D's last progress (a written block frame, a
  // pull); then P frees them and the transfer is gone (D falls back). D may ask for less in its hello.
  std::chrono::milliseconds lease{10'000};
  // D: connecting to P, and each read from P (a P that stalls this long is given up on).
  std::chrono::milliseconds connect_timeout{2'000};
  std::chrono::milliseconds io_timeout{5'000};
  // D: the whole transfer, handshake (P's prefill included) to the last block.
  std::chrono::milliseconds transfer_timeout{60'000};
  std::uint32_t pull_blocks = 32;  // D: blocks asked for per pull (bounds D's buffer)
  // Both sides: the KV transports this replica speaks. D lists them in its hello in this order of
  // preference; P starts a UCP listener when "ucx" is here and picks the first of D's that it offers (tcp,
  // the HTTP pull, it always offers). UCX is opt-in: the default is tcp alone.
  std::vector<std::string> transports{"tcp"};
  std::uint16_t ucx_port = 0;  // P: its UCP listener's port (0: any free port; the accept names it)
  // D: the Bearer key sent to P's /internal/* endpoints (the replica sets it from its internal_api_key, else
  // its api_key: a fleet shares its keys). Empty: none sent.
  std::string peer_api_key;
};

}  // namespace kvfleet::pd
