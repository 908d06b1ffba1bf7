// A chat prompt's token ids: the messages rendered by the chat template, then tokenized. Shared by the
// replica and the router, which must tokenize a chat request identically (its block hashes, Contract 1).
//
// With special_tokens_in_content false, text that came from a message's content is never matched as a
// special token (a user who writes "<|im_end|>" gets those characters, not the token), while the
// template's own special tokens are. The content is located by rendering once more with each content
// replaced by a unique marker; a template that transforms content (so that the marked render, with the
// markers put back, differs from the real one) falls back to finding each content verbatim, in order.
// Content that holds special-token text and cannot be located is refused (TemplateError): the safe
// setting never guesses.
#pragma once

#include <boost/json/array.hpp>
#include <vector>

#include "kvfleet/chat_template.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet {

std::vector<TokenId> tokenize_chat(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                                   const boost::json::array& messages, const ChatTemplateOptions& options,
                                   bool special_tokens_in_content);

}  // namespace kvfleet
