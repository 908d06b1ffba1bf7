// A ResponseWriter in front of the client's that remembers the status it was answered with, for the
// router.request span's http.response.status_code. Everything else passes straight through.
// Thread-safety: as the writer it wraps (one connection's strand).
#pragma once

#include "kvfleet/http/server.h"

namespace kvfleet::router {

class StatusWriter final : public http::ResponseWriter {
 public:
  explicit StatusWriter(http::ResponseWriter& client) : client_(client) {}

  // The status sent (0: nothing was sent).
  int status() const { return status_; }

  boost::asio::awaitable<bool> send(http::Response r) override {
    status_ = r.status;
    return client_.send(std::move(r));
  }
  boost::asio::awaitable<bool> begin_stream(int status, http::Headers headers) override {
    status_ = status;
    return client_.begin_stream(status, std::move(headers));
  }
  boost::asio::awaitable<bool> write(std::string_view piece) override { return client_.write(piece); }
  boost::asio::awaitable<bool> write_pieces(std::span<const std::string_view> pieces) override {
    return client_.write_pieces(pieces);
  }
  boost::asio::awaitable<bool> finish() override { return client_.finish(); }
  bool client_gone() const override { return client_.client_gone(); }
  void on_disconnect(std::function<void()> callback) override { client_.on_disconnect(std::move(callback)); }
  bool started() const override { return client_.started(); }

 private:
  http::ResponseWriter& client_;
  int status_ = 0;
};

}  // namespace kvfleet::router
