#include "engine/pd/transport.h"

#include <algorithm>
#include <stdexcept>

namespace kvfleet::pd {

boost::asio::awaitable<bool> PullSink::write_pieces(std::span<const std::string_view> pieces) {
  std::string joined;
  std::size_t n = 0;
  for (const std::string_view p : pieces) n += p.size();
  joined.reserve(n);
  for (const std::string_view p : pieces) joined.append(p);
  if (joined.empty()) co_return true;
  const bool ok = co_await write(joined);  // (named: GCC 12)
  co_return ok;
}

boost::asio::awaitable<std::size_t> ByteSource::read_some_scattered(std::span<const std::span<char>> into) {
  for (const auto& o : into)
    if (!o.empty()) {
      const std::size_t n = co_await read_some_into(o);  // (named: GCC 12)
      co_return n;
    }
  co_return 0;
}

std::vector<std::string> built_transports() {
#if KVFLEET_UCX
  return {"ucx", "tcp"};
#else
  return {"tcp"};
#endif
}

std::vector<std::string> parse_transports(std::string_view list, const std::vector<std::string>& built) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const auto comma = list.find(',');
    std::string name(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (name != "tcp" && name != "ucx") throw std::invalid_argument("unknown KV transport '" + name + "' (tcp, ucx)");
    if (std::find(built.begin(), built.end(), name) == built.end())
      throw std::invalid_argument("KV transport '" + name + "' is not in this build (libucx-dev was not found)");
    if (std::find(out.begin(), out.end(), name) != out.end()) throw std::invalid_argument("KV transport '" + name + "' given twice");
    out.push_back(std::move(name));
  }
  if (out.empty()) throw std::invalid_argument("the list of KV transports is empty");
  return out;
}

std::string pick_transport(const std::vector<std::string>& wanted, const std::vector<std::string>& offered) {
  for (const auto& t : wanted)
    if (std::find(offered.begin(), offered.end(), t) != offered.end()) return t;
  return {};
}

}  // namespace kvfleet::pd
