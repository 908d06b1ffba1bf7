// A chat message's content given as parts ([{"type": "text", "text": ...}, ...]) joined into the one
// string the chat template takes. Shared by the replica and the router: both must render the same
// template text (the router hashes it for routing, Contract 1) and agree on what is refused.
#pragma once

#include <boost/json/fwd.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace kvfleet {

// A part that is not a text part, or a malformed one. `param` names the field for a 400
// ("messages[0].content[1].type").
struct ContentPartError : std::invalid_argument {
  ContentPartError(const std::string& message, std::string param_)
      : std::invalid_argument(message), param(std::move(param_)) {}
  std::string param;
};

// The text parts' texts, in order. `where` names the content array ("messages[0].content"). Any other
// part (an image, audio, a file: this is a text-only server) throws ContentPartError.
std::string join_content_parts(const boost::json::array& parts, std::string_view where);

}  // namespace kvfleet
