// The MoE tools from outside: make-model --arch mixtral|qwen2_moe|qwen3_moe, inspect, and
// logits --ep-size N printing exactly what one rank prints.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "support/temp_dir.h"

using namespace kvfleet;

TEST_CASE("kvfleet make-model/inspect/logits on MoE models, logits --ep-size 1, 2, 4 identical") {
  test::TempDir dir;
  const std::string bin = test::bin_dir() + "/kvfleet ";
  const std::string model = (dir / "moe").string();
  auto made = test::run_command(bin + "make-model --arch qwen2_moe --experts 8 --experts-per-tok 2 --packed-experts "
                                "--mlp-only-layers 0 --vocab 128 --out " + model);
  REQUIRE(made.status == 0);
  const auto inspect = test::run_command(bin + "inspect --model " + model);
  REQUIRE(inspect.status == 0);
  CHECK(inspect.out.find("experts:      8, top-2") != std::string::npos);
  CHECK(inspect.out.find("packed (experts.gate_up_proj) layout") != std::string::npos);
  CHECK(inspect.out.find("sparse:       1 of 2 layers") != std::string::npos);
  CHECK(inspect.out.find("shared:") != std::string::npos);

  const std::string logits = bin + "logits --backend cpu --model " + model + " --ids 5,9,2,77,31,8,64,1,3";
  const auto one = test::run_command(logits);
  REQUIRE(one.status == 0);
  CHECK(one.out.find("\"logits\"") != std::string::npos);
  for (const char* n : {"2", "4"}) {
    CAPTURE(n);
    const auto ep = test::run_command(logits + " --ep-size " + n);
    REQUIRE(ep.status == 0);
    CHECK(ep.out == one.out);
  }
  const auto bad = test::run_command(logits + " --ep-size 3 2>&1");
  CHECK(bad.status != 0);
  CHECK(bad.out.find("do not split over ep_size 3") != std::string::npos);

  for (const char* arch : {"mixtral", "qwen3_moe"}) {
    CAPTURE(arch);
    const std::string m = (dir / arch).string();
    REQUIRE(test::run_command(bin + "make-model --arch " + arch + " --vocab 64 --out " + m).status == 0);
    const auto i = test::run_command(bin + "inspect --model " + m);
    CHECK(i.status == 0);
    CHECK(i.out.find("per-expert (experts.N.*) layout") != std::string::npos);
  }
}

TEST_CASE("kvfleet generate --ep-size 2 and 4 print what one engine prints") {
  test::TempDir dir;
  const std::string bin = test::bin_dir() + "/kvfleet ";
  const std::string model = (dir / "moe").string();
  REQUIRE(test::run_command(bin + "make-model --arch mixtral --experts 4 --vocab 128 --out " + model).status == 0);
  {
    std::ofstream f(dir / "p.jsonl");
    for (int i = 0; i < 6; ++i) {
      f << "{\"id\": " << i << ", \"prompt_ids\": [";
      for (int t = 0; t < 5 + 9 * i; ++t) f << (t ? "," : "") << (t * 7 + i) % 128;
      f << "], \"max_tokens\": " << 3 + i << (i % 2 ? ", \"temperature\": 0.8, \"seed\": 5" : "") << "}\n";
    }
  }
  const std::string gen = bin + "generate --backend cpu --threads 1 --ignore-eos --model " + model + " --prompts " +
                          (dir / "p.jsonl").string();
  auto sorted_lines = [](const std::string& out) {
    std::vector<std::string> lines;
    std::size_t start = 0;
    while (start < out.size()) {
      const auto end = out.find('\n', start);
      lines.push_back(out.substr(start, end - start));
      start = end + 1;
    }
    std::sort(lines.begin(), lines.end());
    return lines;
  };
  const auto one = test::run_command(gen);
  REQUIRE(one.status == 0);
  const auto want = sorted_lines(one.out);
  CHECK(want.size() == 6);
  for (const char* n : {"2", "4"}) {
    CAPTURE(n);
    const auto ep = test::run_command(gen + " --ep-size " + n);
    REQUIRE(ep.status == 0);
    CHECK(sorted_lines(ep.out) == want);
  }
}
