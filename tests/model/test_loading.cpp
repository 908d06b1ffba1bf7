// Loading Hugging Face directories: configs of each family, and clear errors for broken checkpoints.
#include <doctest/doctest.h>

#include <fstream>

#include "kvfleet/files.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model.h"
#include "support/temp_dir.h"

using namespace kvfleet;
namespace fs = std::filesystem;

namespace {

// The message of the exception `fn` throws ("" if none).
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

}  // namespace

TEST_CASE("config.json of the llama family") {
  const auto c = ModelConfig::parse(R"({"model_type":"llama","vocab_size":128256,"hidden_size":2048,
    "intermediate_size":8192,"num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,
    "rms_norm_eps":1e-5,"rope_theta":500000.0,"tie_word_embeddings":true,"torch_dtype":"bfloat16",
    "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
    "original_max_position_embeddings":8192,"rope_type":"llama3"},"eos_token_id":[128001,128008,128009]})",
                                    "llama3.2");
  CHECK(c.head_dim == 64);
  CHECK(c.num_kv_heads == 8);
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::llama3);
  CHECK(c.rope_scaling.factor == 32.0);
  CHECK(c.tie_word_embeddings);
  CHECK(c.dtype == DType::bf16);
  CHECK(c.eos_token_ids == std::vector<TokenId>{128001, 128008, 128009});
  CHECK_FALSE(c.qkv_bias);

  const auto q = ModelConfig::parse(R"({"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":8,
    "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"eos_token_id":7,"head_dim":16})", "q");
  CHECK(q.qkv_bias);
  CHECK_FALSE(q.o_bias);
  CHECK(q.head_dim == 16);
  CHECK(q.eos_token_ids == std::vector<TokenId>{7});
}

TEST_CASE("bad config values name the key") {
  const std::string base = R"("vocab_size":10,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1,)";
  CHECK(error_of([&] { ModelConfig::parse(R"({"model_type":"gpt2",)" + base + R"("num_attention_heads":2})", "c"); })
            .find("model_type") != std::string::npos);
  CHECK(error_of([&] { ModelConfig::parse(R"({"model_type":"llama",)" + base + R"("num_attention_heads":"x"})", "c"); })
            .find("num_attention_heads") != std::string::npos);
  CHECK(error_of([&] { ModelConfig::parse(R"({"model_type":"llama","hidden_size":8})", "cfg.json"); }) ==
        "cfg.json: key 'vocab_size' is missing");
  CHECK(error_of([&] { ModelConfig::parse("{not json", "c"); }).find("not valid JSON") != std::string::npos);
}

TEST_CASE("broken checkpoints give errors that name the file and the tensor") {
  test::TempDir dir;
  MakeModelOptions o;
  make_model(o, dir.path());
  const fs::path st = dir / "model.safetensors";
  const std::string good = read_text_file(st);
  CHECK_NOTHROW(Model::load(dir.path()));

  SUBCASE("missing tensor") {
    std::string cfg = read_text_file(dir / "config.json");
    cfg.replace(cfg.find("\"num_hidden_layers\":2"), 21, "\"num_hidden_layers\":3");
    write(dir / "config.json", cfg);
    const auto e = error_of([&] { Model::load(dir.path()); });
    CHECK(e.find("model.layers.2.input_layernorm.weight") != std::string::npos);
    CHECK(e.find("not found") != std::string::npos);
  }
  SUBCASE("wrong shape") {
    std::string cfg = read_text_file(dir / "config.json");
    cfg.replace(cfg.find("\"intermediate_size\":128"), 23, "\"intermediate_size\":64");
    write(dir / "config.json", cfg);
    const auto e = error_of([&] { Model::load(dir.path()); });
    CHECK(e.find("model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64], "
                 "expected [64, 64]") != std::string::npos);
  }
  SUBCASE("truncated file") {
    write(st, good.substr(0, good.size() - 100));
    const auto e = error_of([&] { Model::load(dir.path()); });
    CHECK(e.find("model.safetensors") != std::string::npos);
    CHECK(e.find("truncated") != std::string::npos);
  }
  SUBCASE("bad header") {
    std::string bad = good;
    bad[10] = '#';
    write(st, bad);
    CHECK(error_of([&] { Model::load(dir.path()); }).find("bad header") != std::string::npos);
    write(st, std::string("\xff\xff\xff\xff\xff\xff\xff\x0f", 8) + "{}");
    CHECK(error_of([&] { Model::load(dir.path()); }).find("exceeds the file") != std::string::npos);
    write(st, "abc");
    CHECK(error_of([&] { Model::load(dir.path()); }).find("too short") != std::string::npos);
  }
  SUBCASE("unsupported dtype") {
    std::string bad = good;
    const auto at = bad.find("\"F32\"");
    bad.replace(at, 5, "\"I32\"");
    write(st, bad);
    const auto e = error_of([&] { Model::load(dir.path()); });
    CHECK(e.find("dtype I32") != std::string::npos);
  }
  SUBCASE("not a model directory") {
    CHECK(error_of([&] { Model::load(dir / "nope"); }).find("config.json: not found") != std::string::npos);
  }
}

TEST_CASE("transformers 5 writes rope settings under rope_parameters") {
  const auto c = ModelConfig::parse(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":8,
    "num_hidden_layers":1,"num_attention_heads":2,"rope_parameters":{"rope_theta":500000.0,"rope_type":"llama3",
    "factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}})", "v5");
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::llama3);
  CHECK(c.rope_scaling.original_max_position_embeddings == 64);
  const auto d = ModelConfig::parse(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":8,
    "num_hidden_layers":1,"num_attention_heads":2,"rope_parameters":{"rope_theta":1000.0,"rope_type":"default"}})", "v5");
  CHECK(d.rope_theta == 1000.0);
  CHECK(d.rope_scaling.kind == RopeScaling::Kind::none);
}
