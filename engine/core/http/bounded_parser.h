// Internal: a Beast HTTP parser fed through our own limits, for the server's requests and the
// client's responses alike.
//
// Why not Beast's limits alone (Boost 1.81): its header_limit is checked against the bytes of one
// put(), after the request line was consumed by an earlier step, so the limit covers the fields
// but not the line (a 1.5 KB target plus 1.2 KB of fields passed a 2 KiB limit; 22 KB passed a
// 16 KiB one in the field). It accepts chunk
// extensions of any length and trailers of any size, and a trailer field over 64 KiB makes
// basic_fields throw std::length_error out of the read. Here every byte Beast sees of a head, a
// chunk-size line or a trailer section is first bounded by our limit: put() is handed at most the
// allowance left, so a part that does not end inside it is an error before Beast stores anything.
//
// The parser is driven one step at a time (Beast's put() without eager parsing stops after the head,
// after each chunk line and after each piece of data), which tells us what the next bytes are.
#pragma once

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/system/error_code.hpp>
#include <cctype>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string_view>

namespace kvfleet::http {

// Our own parse failures (besides Beast's http::error codes).
enum class ParseError {
  head_too_large = 1,       // request/status line + header fields over header_limit
  trailer_too_large,        // the trailer section of a chunked body over trailer_limit
  chunk_line_too_long,      // one chunk-size line (with its extensions) over chunk_extension_limit
  chunk_extensions_too_long,  // all chunk extensions of one body over chunk_extension_limit
  field_too_large,          // Beast refused to store a field (std::length_error)
};
}  // namespace kvfleet::http

namespace boost::system {
template <>
struct is_error_code_enum<kvfleet::http::ParseError> : std::true_type {};
}  // namespace boost::system

namespace kvfleet::http {

const boost::system::error_category& parse_error_category();
inline boost::system::error_code make_error_code(ParseError e) {
  return {static_cast<int>(e), parse_error_category()};
}

struct ParseLimits {
  size_t header_limit = 16 * 1024;          // the whole head, across reads
  size_t trailer_limit = 8 * 1024;          // the trailer section of a chunked body
  size_t chunk_extension_limit = 4 * 1024;  // chunk extensions of one body, all chunks together
};

template <class Parser>
class BoundedParser {
 public:
  explicit BoundedParser(ParseLimits limits) : limits_(limits) {}
  BoundedParser(const BoundedParser&) = delete;  // Beast keeps a reference to on_chunk_
  BoundedParser& operator=(const BoundedParser&) = delete;

  // A fresh parser for the next message (body_limit: Beast's, nullopt for none).
  Parser& start(std::optional<uint64_t> body_limit) {
    parser_.emplace();
    parser_->header_limit(UINT32_MAX);  // ours applies; Beast's is per put() anyway
    if (body_limit) {
      parser_->body_limit(*body_limit);
    } else {
      parser_->body_limit(boost::none);
    }
    parser_->on_chunk_header(on_chunk_);
    head_bytes_ = 0;
    on_chunk_.remaining = 0;
    on_chunk_.extension_bytes = 0;
    on_chunk_.limit = limits_.chunk_extension_limit;
    return *parser_;
  }
  Parser& parser() { return *parser_; }
  const Parser& parser() const { return *parser_; }
  bool active() const { return parser_.has_value(); }
  void reset() { parser_.reset(); }

  // One step over `data`: returns the bytes consumed. ec: http::error::need_more when a part is
  // still incomplete (read more, then call again with the unconsumed rest followed by the new
  // bytes), need_buffer (a buffer_body's piece is full), a Beast error or a ParseError.
  size_t step(std::string_view data, boost::system::error_code& ec) {
    ec = {};
    if (!parser_->is_header_done()) return head_step(data, ec);
    if (parser_->chunked() && on_chunk_.remaining == 0) return chunk_line_step(data, ec);
    size_t used = put(data, ec);
    on_chunk_.remaining -= std::min<uint64_t>(on_chunk_.remaining, used);
    return used;
  }

 private:
  // Remembers each chunk's size (so data steps are told from line steps) and sums the extensions.
  struct ChunkHeader {
    void operator()(uint64_t size, boost::beast::string_view extensions, boost::system::error_code& ec) {
      remaining = size;
      extension_bytes += extensions.size();
      if (extension_bytes > limit) ec = ParseError::chunk_extensions_too_long;
    }
    uint64_t remaining = 0;
    size_t extension_bytes = 0;
    size_t limit = 0;
  };

  size_t head_step(std::string_view data, boost::system::error_code& ec) {
    const size_t allowance = limits_.header_limit - std::min(head_bytes_, limits_.header_limit);
    const bool truncated = data.size() >= allowance;
    size_t used = put(data.substr(0, allowance), ec);
    head_bytes_ += used;
    if (ec == boost::beast::http::error::need_more && truncated) ec = ParseError::head_too_large;
    if (ec == ParseError::field_too_large || ec == boost::beast::http::error::header_limit) {
      ec = ParseError::head_too_large;
    }
    return used;
  }

  // The next bytes are a chunk-size line (after the CRLF that ends the previous chunk's data) or,
  // after the last chunk "0", the trailer section and its blank line: each within its allowance.
  size_t chunk_line_step(std::string_view data, boost::system::error_code& ec) {
    const size_t line_allowance = limits_.chunk_extension_limit + 64;  // hex digits, CRLFs
    const bool last = is_last_chunk(data);
    size_t allowance = line_allowance;
    if (last) {  // the "0" line itself, then trailer_limit for the trailer section and its blank line
      size_t line_end = data.find("\r\n", data.starts_with("\r\n") ? 2 : 0);
      if (line_end != std::string_view::npos && line_end + 2 <= line_allowance) {
        allowance = line_end + 2 + limits_.trailer_limit;
      }
    }
    const bool truncated = data.size() >= allowance;
    size_t used = put(data.substr(0, allowance), ec);
    if (ec == boost::beast::http::error::need_more && truncated) {
      ec = last ? ParseError::trailer_too_large : ParseError::chunk_line_too_long;
    }
    if (ec == ParseError::field_too_large || ec == boost::beast::http::error::header_limit) {
      ec = ParseError::trailer_too_large;
    }
    return used;
  }

  // "[CRLF] 1*'0' ..." is the last chunk; a line still arriving counts as last while it is all zeros.
  static bool is_last_chunk(std::string_view data) {
    if (data.starts_with("\r\n")) data.remove_prefix(2);
    size_t zeros = 0;
    while (zeros < data.size() && data[zeros] == '0') ++zeros;
    if (zeros == 0) return false;
    if (zeros == data.size()) return true;
    return !std::isxdigit(static_cast<unsigned char>(data[zeros]));
  }

  size_t put(std::string_view data, boost::system::error_code& ec) {
    try {
      return parser_->put(boost::asio::const_buffer(data.data(), data.size()), ec);
    } catch (const std::length_error&) {  // basic_fields: a field name or value over 64 KiB
      ec = ParseError::field_too_large;
      return 0;
    }
  }

  ParseLimits limits_;
  std::optional<Parser> parser_;
  ChunkHeader on_chunk_;
  size_t head_bytes_ = 0;
};

}  // namespace kvfleet::http
