// The KV blocks a decode replica receives are byte for byte the blocks it would have computed itself.
// Three replicas in this process (P, D and a mixed reference M) on loopback HTTP; the bytes are read on
// each engine's thread (Engine::run_kv_task). The CPU backend is batch-invariant, so this holds exactly.
#include <doctest/doctest.h>

#include <cstring>
#include <future>
#include <thread>

#include "engine/pd/wire.h"
#include "engine/server/replica.h"
#include "kvfleet/backend.h"
#include "pd/pd_test_util.h"
#include "support/temp_dir.h"
#include "support/tiny_qwen.h"

using namespace kvfleet;
using namespace kvfleet::test;

namespace {

std::unique_ptr<server::Replica> start_replica(const std::string& model, const std::string& role, int num_blocks = 64,
                                              int step_tokens = 2048) {
  server::ReplicaConfig c;
  c.model = model;
  c.port = 0;
  c.role = role;
  c.engine.backend.kind = "cpu";
  c.engine.backend.threads = 1;
  c.engine.num_blocks = num_blocks;
  c.engine.scheduler.max_num_batched_tokens = step_tokens;
  auto r = std::make_unique<server::Replica>(c);
  r->start();
  return r;
}

// Every layer's bytes of the blocks cached under `hashes` (empty string: not cached).
std::vector<std::string> block_bytes(Engine& engine, const std::vector<BlockHash>& hashes, const std::vector<TokenId>& tokens) {
  std::promise<std::vector<std::string>> done;
  engine.run_kv_task([&](Scheduler& s, Backend& b) {
    std::vector<std::string> out;
    const std::size_t bs = static_cast<std::size_t>(s.kv().block_size());
    const auto layers = b.kv_cache_shape().num_layers;
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      const BlockId block = s.kv().cached_block(hashes[i], std::span(tokens).subspan(i * bs, bs));
      std::string bytes;
      if (block != kNoBlock) {
        bytes.resize(b.kv_block_bytes() * static_cast<std::size_t>(layers));
        for (std::int64_t l = 0; l < layers; ++l) b.read_kv_bytes(l, block, bytes.data() + l * b.kv_block_bytes());
      }
      out.push_back(std::move(bytes));
    }
    done.set_value(std::move(out));
  });
  return done.get_future().get();
}

// D's side of one transfer by hand: the hello for `tokens` (whole blocks), then one pull of every block.
// Returns the payloads in order (empty when P refused); `accept` gets P's answer.
std::vector<std::string> pull_all(std::uint16_t port, const std::vector<TokenId>& tokens, pd::Accept& accept) {
  pd::Hello hello;
  hello.layout = {"tiny-qwen", "qwen2", DType::bf16, DType::f32, 2, 2, 16, 16, block_hash_root("tiny-qwen")};
  hello.compat_hash = pd::compat_hash(hello.layout);
  hello.tokens = tokens;
  const http::Headers binary{{"Content-Type", "application/octet-stream"}};
  const auto ok = http::http_request("127.0.0.1", port, "POST", "/internal/prefill", pd::encode(hello), binary);
  if (ok.status != 200) return {};
  accept = std::get<pd::Accept>(pd::decode_one(ok.body));
  const auto pulled = http::http_request("127.0.0.1", port, "GET",
                                         "/internal/prefill/blocks?transfer=" + std::to_string(accept.transfer_id) +
                                             "&from=0&count=" + std::to_string(accept.num_blocks));
  pd::FrameDecoder frames;
  frames.feed(pulled.body);
  std::vector<std::string> received;
  while (auto f = frames.next())
    if (auto* b = std::get_if<pd::BlockFrame>(&*f)) received.push_back(b->payload);
  return received;
}

}  // namespace

TEST_CASE("blocks D receives are byte-identical to the ones D computes itself, and D's KV events report them") {
  TempDir dir;
  make_tiny_qwen(dir / "tiny-qwen");
  const std::string model = (dir / "tiny-qwen").string();
  auto p = start_replica(model, "prefill");
  auto d = start_replica(model, "decode");
  auto m = start_replica(model, "mixed");
  const std::vector<int> ids = prompt_ids(11, 90);  // 5 blocks ship (the 6th holds the last token)
  const std::string body = completion_body(ids, -1, 4);
  const auto events_before = d->engine().kv_events()->last_seq();
  const std::string p_url = "http://127.0.0.1:" + std::to_string(p->port());
  CHECK(answer_of(post(d->port(), "/v1/completions", body, p_url)) == answer_of(post(m->port(), "/v1/completions", body)));

  const std::vector<TokenId> tokens(ids.begin(), ids.begin() + 80);
  const auto hashes = block_hashes(block_hash_root("tiny-qwen"), tokens, 16);
  REQUIRE(hashes.size() == 5);
  const auto received = block_bytes(d->engine(), hashes, tokens);
  const auto computed = block_bytes(m->engine(), hashes, tokens);
  const auto on_p = block_bytes(p->engine(), hashes, tokens);
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    CAPTURE(i);
    REQUIRE(received[i].size() == 2 * 4096);
    CHECK(received[i] == computed[i]);
    CHECK(received[i] == on_p[i]);
  }
  // D computed only the tail: prompt tokens 80..89 (and the prompt's tokens never came twice).
  CHECK(d->engine().stats().prompt_tokens == 10);
  // The imported blocks were announced, one `stored` event each, chained to their parents.
  const auto replay = d->engine().kv_events()->since(events_before);
  std::vector<BlockHash> stored;
  for (const auto& e : replay.events)
    if (e.type == KvEvent::Type::stored) stored.insert(stored.end(), e.block_hashes.begin(), e.block_hashes.end());
  REQUIRE(stored.size() >= 5);
  CHECK(std::vector<BlockHash>(stored.begin(), stored.begin() + 5) == hashes);
}

TEST_CASE("strided block reads and writes (KV straight into and out of wire frames) match the packed ones") {
  BackendOptions o;
  o.kind = "cpu";
  o.threads = 1;
  auto backend = make_backend(o);
  const KvCacheShape shape{3, 8, 16, 2, 8};
  backend->allocate_kv_cache(shape);
  const std::size_t block = backend->kv_block_bytes() * 3, stride = block + 40;  // 40 bytes of frame between blocks
  const std::vector<std::int32_t> blocks{4, 0, 7};
  std::string packed(blocks.size() * block, '\0');
  for (std::size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<char>((i * 13) & 0x3f);
  std::string framed(blocks.size() * stride, '#');
  for (std::size_t i = 0; i < blocks.size(); ++i) std::memcpy(framed.data() + i * stride, packed.data() + i * block, block);
  backend->write_kv_blocks(blocks, framed.data(), stride);
  std::string back(packed.size(), '\0');
  backend->read_kv_blocks(blocks, back.data());
  CHECK(back == packed);
  std::string out(framed.size(), '#');
  backend->read_kv_blocks(blocks, out.data(), stride);
  CHECK(out == framed);  // the gaps between blocks are left alone
}

TEST_CASE("P accepts while its prefill still runs and a pull waits for the blocks not computed yet") {
  TempDir dir;
  make_tiny_qwen(dir / "tiny-qwen");
  const std::string model = (dir / "tiny-qwen").string();
  auto p = start_replica(model, "prefill", 160, 16);  // chunked prefill, one block per engine step
  auto m = start_replica(model, "mixed", 160);
  const std::vector<int> ids = prompt_ids(12, 961);  // 60 blocks ship
  pd::Hello hello;
  hello.layout = {"tiny-qwen", "qwen2", DType::bf16, DType::f32, 2, 2, 16, 16, block_hash_root("tiny-qwen")};
  hello.compat_hash = pd::compat_hash(hello.layout);
  hello.tokens.assign(ids.begin(), ids.begin() + 960);
  const http::Headers binary{{"Content-Type", "application/octet-stream"}};
  const auto ok = http::http_request("127.0.0.1", p->port(), "POST", "/internal/prefill", pd::encode(hello), binary);
  REQUIRE(ok.status == 200);
  CHECK(kv_state(p->port()).at("running").as_int64() == 1);  // the accept came before the prefill's end
  const auto accept = std::get<pd::Accept>(pd::decode_one(ok.body));
  REQUIRE(accept.num_blocks == 60);
  const auto pulled = http::http_request("127.0.0.1", p->port(), "GET",
                                         "/internal/prefill/blocks?transfer=" + std::to_string(accept.transfer_id) +
                                             "&from=0&count=60");
  REQUIRE(pulled.status == 200);
  pd::FrameDecoder frames;
  frames.feed(pulled.body);
  std::vector<std::string> received;
  while (auto f = frames.next()) {
    if (auto* b = std::get_if<pd::BlockFrame>(&*f)) {
      CHECK(b->index == received.size());
      received.push_back(b->payload);
    } else {
      CHECK(std::holds_alternative<pd::End>(*f));
    }
  }
  REQUIRE(received.size() == 60);
  post(m->port(), "/v1/completions", completion_body(ids, -1, 1));  // M computes the same prompt itself
  const auto computed = block_bytes(m->engine(), accept.hashes, hello.tokens);
  for (std::size_t i = 0; i < received.size(); ++i) {
    CAPTURE(i);
    CHECK(received[i] == computed[i]);
  }
  check_no_leak(p->port());  // the last pull released the transfer
}

TEST_CASE("a prompt P holds entirely is sent from P's prefix cache without a prefill (no recompute of its last block)") {
  TempDir dir;
  make_tiny_qwen(dir / "tiny-qwen");
  const std::string model = (dir / "tiny-qwen").string();
  auto p = start_replica(model, "prefill");
  const std::vector<int> ids = prompt_ids(13, 160);
  const std::vector<TokenId> tokens(ids.begin(), ids.begin() + 160);  // 10 whole blocks
  pd::Accept first, again;
  const auto computed = pull_all(p->port(), tokens, first);
  REQUIRE(computed.size() == 10);
  const auto idle = [&] {  // P's prefill ends just after its last block is sent
    for (int i = 0; i < 500 && p->engine().stats().scheduler.num_running + p->engine().stats().scheduler.num_waiting > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  idle();
  CHECK(p->engine().stats().prompt_tokens == 160);
  const auto steps = p->engine().stats().scheduler.num_steps;
  const auto sent = pull_all(p->port(), tokens, again);  // P's prefix cache now holds all 10 blocks
  CHECK(again.hashes == first.hashes);
  CHECK(sent == computed);
  idle();
  // Before, P ran a prefill_only request here that recomputed the last block (16 tokens, an engine step).
  CHECK(p->engine().stats().prompt_tokens == 160);
  CHECK(p->engine().stats().scheduler.num_steps == steps);
  check_no_leak(p->port());
  // A prompt that extends it by a block still runs a prefill, of what P lacks alone.
  std::vector<TokenId> longer = tokens;
  for (int i = 0; i < 16; ++i) longer.push_back(1000 + i);
  pd::Accept more;
  const auto extended = pull_all(p->port(), longer, more);
  REQUIRE(extended.size() == 11);
  idle();
  CHECK(std::vector<std::string>(extended.begin(), extended.begin() + 10) == computed);
  CHECK(p->engine().stats().prompt_tokens == 176);
  check_no_leak(p->port());
}
