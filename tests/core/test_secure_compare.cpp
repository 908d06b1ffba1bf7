#include <doctest/doctest.h>

#include <string>

#include "kvfleet/secure_compare.h"

using kvfleet::secure_equal;

TEST_CASE("secure_equal: equal strings only") {
  CHECK(secure_equal("sk-abc123", "sk-abc123"));
  CHECK(!secure_equal("sk-abc123", "sk-abc124"));  // last byte
  CHECK(!secure_equal("sk-abc123", "Sk-abc123"));  // first byte, case matters
  CHECK(!secure_equal("sk-abc", "sk-abc123"));     // a prefix is not the key
  CHECK(!secure_equal("sk-abc123", "sk-abc"));
  CHECK(!secure_equal("abc", "abcabc"));           // nor the key repeated
}

TEST_CASE("secure_equal: empty strings and embedded zeros") {
  CHECK(secure_equal("", ""));
  CHECK(!secure_equal("", "k"));
  CHECK(!secure_equal("k", ""));
  // A shorter string is not padded with zero bytes into a match.
  CHECK(!secure_equal(std::string("k\0", 2), "k"));
  CHECK(secure_equal(std::string("k\0x", 3), std::string("k\0x", 3)));
}
