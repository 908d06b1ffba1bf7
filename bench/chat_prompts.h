// Realistic chat requests for the router benchmarks: every request shares one long system prompt
// (as an application's requests do) and has its own user message, so no two prompts are equal and
// no whole-prompt cache can trivialise the work. Deterministic for a given seed.
#pragma once

#include <boost/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace kvfleet::bench {

inline std::string english_words(std::minstd_rand& rng, int n) {
  static const char* vocab[] = {
      "the", "model", "answer", "question", "because", "customer", "order", "shipping", "refund", "policy",
      "please", "explain", "why", "when", "where", "account", "password", "invoice", "delivery", "address",
      "support", "ticket", "priority", "urgent", "weekend", "Monday", "product", "warranty", "battery",
      "screen", "cable", "adapter", "replacement", "broken", "working", "again", "yesterday", "morning",
      "evening", "received", "package", "damaged", "missing", "item", "color", "size", "price", "discount",
      "coupon", "checkout", "payment", "card", "declined", "bank", "transfer", "confirm", "email", "phone",
      "number", "contact", "manager", "store", "online", "website", "login", "error", "message", "update",
      "version", "install", "restart", "settings", "language", "English", "French", "German", "summary",
      "detail", "short", "long", "careful", "friendly", "polite", "tone", "never", "always", "only", "also",
      "with", "without", "before", "after", "during", "about", "into", "from", "their", "your", "our"};
  constexpr int kVocab = sizeof(vocab) / sizeof(vocab[0]);
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += vocab[rng() % kVocab];
    if (i % 11 == 10) s += (rng() % 3 == 0) ? "? " : ". ";
    else if (i % 7 == 6) s += ", ";
    else s += ' ';
  }
  return s;
}

// `count` chat completion bodies: a ~600-token system prompt shared by all, then a distinct
// ~400-token user message (with its request number) each.
inline std::vector<std::string> chat_bodies(int count, const std::string& model, unsigned seed = 7) {
  std::minstd_rand rng(seed);
  const std::string system = "You are the support assistant of an online shop. " + english_words(rng, 520);
  std::vector<std::string> bodies;
  bodies.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    const std::string user = "Request " + std::to_string(i) + ": " + english_words(rng, 340);
    boost::json::array messages{boost::json::object{{"role", "system"}, {"content", system}},
                                boost::json::object{{"role", "user"}, {"content", user}}};
    bodies.push_back(boost::json::serialize(
        boost::json::object{{"model", model}, {"messages", std::move(messages)}, {"max_tokens", 2}}));
  }
  return bodies;
}

}  // namespace kvfleet::bench
