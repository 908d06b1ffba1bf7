// The CPU backend against this machine's limits, in one run: the memory read bandwidth (the pool's threads,
// one per core by default; a buffer far beyond the last-level cache; the better of one stream and 16
// interleaved streams per thread), the fp32 FMA peak (same threads, the widest vectors the CPU has), and
// kvfleet's decode at batch 1, 8 and 32 and prefill at 512 and 4k tokens and of 8 prompts of 128 tokens in one
// step (the table), as tokens/s and as a fraction of the bandwidth (decode: the weights each step
// streams) or of the peak (prefill: the step's FLOPs). Also:
// the read bandwidth on one thread (what a second one can add at batch 1), the bandwidth read again just
// before and after each decode measurement (this VM's moves by up to 2x within minutes), and the engine's
// own time per step outside the forward pass. Around each decode measurement, 8 + 8 read windows of one
// step's bytes (their median and spread: what a median step compares with); at batch 1, a run with a read
// window after every token, each step against the windows on either side (phases of the VM's bandwidth
// skew neither). The read probes use 2 MiB pages where the kernel gives them, as the packed weights do.
//
//   build/bin/bench_cpu_roofline --model DIR [--threads 0] [--tokens 64] [--runs 3] [--read-mib 1024]
//                                [--no-4k] [--batches 1,8,32] [--prefill 512,4096,8x128]  (0: none; BxP: B
//                                                 prompts of P tokens in one step)
//                                [--ab KNOB N]   (only: batch-1 decode with KNOB off and on, alternating, N
//                                                 rounds each; KNOB taper, notify, gemv2 or bf16 (the avx512bf16
//                                                 mode against avx512: each --prefill workload too);
//                                                 --ab-taper N = --ab taper N)
//                                [--json FILE]   (every figure printed, as one JSON object; bench/cpu_goals.py)
// bench/cpu_roofline.sh makes the 125M Llama and runs this (and old-vs-new, interleaved).
#include <immintrin.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <latch>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/cpu/huge_page_arena.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/linear_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kvfleet/engine.h"

using namespace kvfleet;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs part(i, parts) on `parts` threads at once (the caller is one) and returns the wall time from the
// moment all have started. The hardware probes use plain threads, not the kernels' pool: the pool lets a
// thread that is free take another's chunk, so a probe through it could run on fewer cores than it says.
template <class Part>
double on_threads(unsigned parts, Part part) {
  std::latch ready(parts), go(1);
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < parts; ++i) threads.emplace_back([&, i] { ready.count_down(); go.wait(); part(i, parts); });
  ready.count_down();
  ready.wait();
  const auto t0 = Clock::now();
  go.count_down();
  part(0, parts);
  for (auto& t : threads) t.join();
  return seconds_since(t0);
}

// [begin, end) of part i of n items cut in `parts` contiguous pieces.
std::pair<std::int64_t, std::int64_t> piece(std::int64_t n, unsigned i, unsigned parts) {
  return {n * i / parts, n * (i + 1) / parts};
}

// Sums n floats from p (n a multiple of 32) with four independent 32-byte accumulators: a pure read stream.
float read_one_stream(const float* p, std::int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (std::int64_t i = 0; i < n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return out[0];
}

// The same n floats (a multiple of 16 x 16) cut in 16 parts read side by side, as the GEMV reads 16 weight
// rows: on some VMs one stream per core does not reach the memory's speed (the hardware prefetcher keeps
// too few lines in flight for one stream), so the machine's read bandwidth is the better of the two.
constexpr std::int64_t kStreams = 16;
float read_16_streams(const float* base, std::int64_t n) {
  const std::int64_t len = n / kStreams;  // floats per stream
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (std::int64_t i = 0; i < len; i += 16)
    for (std::int64_t s = 0; s < kStreams; ++s) {
      const float* p = base + s * len + i;
      acc[s & 3] = _mm256_add_ps(acc[s & 3], _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)));
    }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  return out[0];
}

// A read probe's buffer of n floats (all 1), on 2 MiB pages where the kernel gives them, as the CPU backend's
// packed weights are (engine/backend/cpu/huge_page_arena.h; KVFLEET_CPU_HUGEPAGES=0: small pages for both):
// the bandwidth a decode step is compared with is read on the same kind of pages as the weights it streams.
class ProbeBuffer {
 public:
  explicit ProbeBuffer(std::size_t n) : n_(n), p_(reinterpret_cast<float*>(arena_.take(n * sizeof(float)))) {
    std::fill(p_, p_ + n, 1.0f);
  }
  float* data() { return p_; }
  std::size_t size() const { return n_; }

 private:
  cpu::HugePageArena arena_;
  std::size_t n_;
  float* p_;
};

// Bytes/s of the best of `runs` passes over a `mib` buffer, on `threads` threads (0: the pool's size), each
// thread reading its contiguous share as one stream or as 16.
double read_bandwidth(ThreadPool& pool, std::size_t mib, int runs, unsigned threads = 0, bool sixteen = false) {
  const unsigned n_threads = threads ? threads : pool.size();
  const std::int64_t unit = sixteen ? 16 * kStreams : 32;  // floats: what each reader takes whole
  const std::int64_t units = static_cast<std::int64_t>((mib << 20) / sizeof(float)) / unit;
  ProbeBuffer buf(static_cast<std::size_t>(units * unit));
  std::vector<float> sink(n_threads * 16, 0.0f);
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const double t = on_threads(n_threads, [&](unsigned part, unsigned parts) {
      const auto [b, e] = piece(units, part, parts);
      const float* p = buf.data() + b * unit;
      sink[part * 16] += sixteen ? read_16_streams(p, (e - b) * unit) : read_one_stream(p, (e - b) * unit);
    });
    best = std::min(best, t);
  }
  if (sink[0] < 0) std::printf(" ");  // keeps the sums alive
  return static_cast<double>(buf.size() * sizeof(float)) / best;
}

double read_bandwidth_streams(ThreadPool& pool, std::size_t mib, int runs, unsigned threads = 0) {
  return read_bandwidth(pool, mib, runs, threads, true);
}

// Reads the size of one decode step: windows of `window` bytes, one after another over a `mib` buffer (each
// starts where the last ended, wrapping), each timed alone on the pool's thread count. The best of a few
// passes (read_bandwidth) is what the memory can do; the windows show how much it moves from step to step,
// and their median is what a median decode step can be compared with.
class ReadWindows {
 public:
  ReadWindows(ThreadPool& pool, std::size_t mib, double window, bool sixteen)
      : threads_(pool.size()), sixteen_(sixteen), unit_((sixteen ? 16 * kStreams : 32) * threads_),
        total_(static_cast<std::int64_t>((mib << 20) / sizeof(float)) / unit_),
        per_(std::clamp<std::int64_t>(static_cast<std::int64_t>(window / sizeof(float)) / unit_, 1, total_)),
        buf_(static_cast<std::size_t>(total_ * unit_)), sink_(threads_ * 16, 0.0f) {}
  ~ReadWindows() {
    if (sink_[0] < 0) std::printf(" ");  // keeps the sums alive
  }

  double next() {  // bytes/s of the next window
    if (at_ + per_ > total_) at_ = 0;
    const float* base = buf_.data() + at_ * unit_;
    const double t = on_threads(threads_, [&](unsigned part, unsigned parts) {
      const std::int64_t n = per_ * unit_ / parts;  // a multiple of the reader's unit
      const float* p = base + part * n;
      sink_[part * 16] += sixteen_ ? read_16_streams(p, n) : read_one_stream(p, n);
    });
    at_ += per_;
    return static_cast<double>(per_ * unit_ * sizeof(float)) / t;
  }

 private:
  unsigned threads_;
  bool sixteen_;
  std::int64_t unit_, total_, per_, at_ = 0;  // unit_: floats every reader's share holds whole
  ProbeBuffer buf_;
  std::vector<float> sink_;
};

// Appends the rates of `count` windows to `rates`.
void read_windows(ThreadPool& pool, std::size_t mib, double window, int count, bool sixteen, std::vector<double>& rates) {
  ReadWindows w(pool, mib, window, sixteen);
  for (int i = 0; i < count; ++i) rates.push_back(w.next());
}

constexpr int kWindows = 8;  // read windows before and after each decode measurement

double quantile(const std::vector<double>& sorted, double q) {
  return sorted[static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5)];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return quantile(v, 0.5);
}

// 12 independent FMA chains per thread; returns FLOP/s (2 per lane per FMA).
constexpr std::int64_t kFmaIters = 20'000'000;

__attribute__((target("avx512f"))) float fma_chains_512(float seed) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(seed + static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (std::int64_t it = 0; it < kFmaIters; ++it)
    for (auto& v : a) v = _mm512_fmadd_ps(v, m, c);
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}

float fma_chains_256(float seed) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(seed + static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (std::int64_t it = 0; it < kFmaIters; ++it)
    for (auto& v : a) v = _mm256_fmadd_ps(v, m, c);
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

double fma_peak(ThreadPool& pool, bool wide) {
  std::vector<float> sink(pool.size());
  const double s = on_threads(pool.size(), [&](unsigned part, unsigned) {
    sink[part] = wide ? fma_chains_512(static_cast<float>(part)) : fma_chains_256(static_cast<float>(part));
  });
  if (sink[0] < 0) std::printf(" ");
  return 2.0 * (wide ? 16 : 8) * 12.0 * static_cast<double>(kFmaIters) * pool.size() / s;
}

// The engine's own time per step (schedule, sample, stop check, outputs: the step less its forward pass),
// over every step of the last engine_seconds call.
double g_own_seconds_per_step = 0.0;
double g_steps_per_run = 0.0;  // engine steps a run, over the runs of the last engine_seconds call

// `batch` sequences of `prompt` tokens each, `gen` tokens generated per sequence (greedy, no EOS).
// Returns the best of `runs` wall times of the whole run (prompt and decode).
EngineConfig engine_config(unsigned threads, int batch, int prompt, int gen) {
  EngineConfig c;
  c.backend.kind = "cpu";
  c.backend.threads = threads;
  c.enable_prefix_caching = false;  // each run computes its prompts
  c.block_size = 16;
  c.num_blocks = static_cast<std::int32_t>(batch * ((prompt + gen) / 16 + 2) + 16);
  c.scheduler.max_num_batched_tokens = std::max(2048, prompt);
  c.scheduler.max_num_seqs = std::max(batch, 1);
  return c;
}

// The median time between two decode steps of the first sequence, over every run of the last engine_runs
// call: the steady token rate, which a preemption now and then (on a shared machine) does not move the way
// it moves a whole run's wall time.
double g_median_step_seconds = 0.0;

// The best of `runs` wall times of `batch` sequences on an existing engine (see engine_seconds).
double engine_runs(Engine& engine, int batch, int prompt, int gen, int runs) {
  double best = 1e30;
  std::vector<Clock::time_point> at;  // outputs of the first sequence, written on the engine thread
  std::vector<double> steps;
  at.reserve(static_cast<std::size_t>(gen) + 8);
  for (int r = 0; r < runs; ++r) {
    at.clear();
    const auto t0 = Clock::now();
    for (int i = 0; i < batch; ++i) {
      GenerationRequest q;
      for (int k = 0; k < prompt; ++k) q.prompt.push_back(1 + (k * 7 + i * 131 + r) % 1000);
      q.max_tokens = gen;
      q.ignore_eos = true;
      q.sampling.temperature = 0;
      OutputCallback stamp;
      if (i == 0) stamp = [&at](const RequestOutput&) { at.push_back(Clock::now()); };
      engine.submit(q, std::move(stamp));
    }
    engine.wait_idle();
    best = std::min(best, seconds_since(t0));
    for (std::size_t k = 2; k < at.size(); ++k)  // from the second token on: the first follows the prefill
      steps.push_back(std::chrono::duration<double>(at[k] - at[k - 1]).count());
  }
  std::sort(steps.begin(), steps.end());
  g_median_step_seconds = steps.empty() ? 0.0 : steps[steps.size() / 2];
  return best;
}

double engine_seconds(const Model& model, unsigned threads, int batch, int prompt, int gen, int runs) {
  Engine engine(model, engine_config(threads, batch, prompt, gen));
  const double best = engine_runs(engine, batch, prompt, gen, runs);
  const EngineStats st = engine.stats();
  g_own_seconds_per_step = (st.step_seconds - st.forward_seconds) / static_cast<double>(std::max<std::uint64_t>(1, st.steps));
  g_steps_per_run = static_cast<double>(st.steps) / runs;
  return best;
}

// Batch-1 decode with one read window of the step's bytes after every token: the window runs on the engine
// thread in the sequence's output callback, so the next step waits for it, and each step is compared with
// the reads just before and after it. A VM whose bandwidth moves in phases of seconds (this one's windows
// of 200 MB ranged 26-46 GB/s between runs a minute apart) then skews neither side. Steps are timed from the
// end of one window to the next callback; the first step after the prefill is left out.
struct Interleaved {
  double share_median = 0.0;  // the median over steps of (step bytes / step time) / (mean of its two windows)
  double step_median_s = 0.0, window_median = 0.0;
  int steps = 0;
};

Interleaved interleaved_decode(const Model& model, ThreadPool& pool, unsigned threads, int tokens, std::size_t read_mib,
                               double step_bytes, bool sixteen) {
  Engine engine(model, engine_config(threads, 1, 8, tokens + 1));
  ReadWindows reads(pool, read_mib, step_bytes, sixteen);
  std::vector<double> windows, steps;  // windows[k] follows token k; steps[k] is the step from window k to token k+2
  Clock::time_point after_window;
  int seen = 0;
  GenerationRequest q;
  for (int k = 0; k < 8; ++k) q.prompt.push_back(1 + k * 7);
  q.max_tokens = tokens + 1;
  q.ignore_eos = true;
  q.sampling.temperature = 0;
  engine.submit(q, [&](const RequestOutput& out) {
    if (out.new_tokens.empty()) return;
    const auto now = Clock::now();
    if (seen++ >= 1) {
      if (!windows.empty()) steps.push_back(std::chrono::duration<double>(now - after_window).count());
      windows.push_back(reads.next());
      after_window = Clock::now();
    }
  });
  engine.wait_idle();
  Interleaved r;
  std::vector<double> shares;
  for (std::size_t k = 0; k < steps.size() && k + 1 < windows.size(); ++k)
    shares.push_back(step_bytes / steps[k] / ((windows[k] + windows[k + 1]) / 2));
  if (shares.empty()) return r;
  r.share_median = median(shares);
  r.step_median_s = median(steps);
  r.window_median = median(windows);
  r.steps = static_cast<int>(shares.size());
  return r;
}

// Batch-1 decode with a knob off and on, alternating on one engine (A B B A ...), `rounds` rates of each:
// the change measured in one process, next to each other in time. Knobs: "taper" (tapered against equal
// chunks, set_tapered_split), "notify" (the pool notifying only a sleeping thread against on every op,
// ThreadPool::set_notify_always), "gemv2" (the AVX2 GEMV's two passes a panel against the 2 x 2 tile,
// set_avx2_gemv: on an AVX2-only CPU).
void ab_knob(const Model& model, const std::string& knob, unsigned threads, int tokens, int rounds, double step_bytes) {
  auto set = [&](bool on) {
    if (knob == "taper") cpu::detail::set_tapered_split(on);
    else if (knob == "notify") ThreadPool::set_notify_always(!on);
    else if (knob == "gemv2") cpu::detail::set_avx2_gemv(on ? 0 : -1);
    else if (knob == "bf16") cpu::set_cpu_isa(on ? cpu::Isa::avx512bf16 : cpu::Isa::avx512);
    else throw std::invalid_argument("--ab: unknown knob " + knob + " (taper, notify, gemv2, bf16)");
  };
  Engine engine(model, engine_config(threads, 1, 8, tokens + 1));
  engine_runs(engine, 1, 8, 2, 1);  // packs the weights
  std::vector<double> rate[2];
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 2; ++k) {
      const int mode = r % 2 == 0 ? k : 1 - k;  // 1: on
      set(mode == 1);
      const double full = engine_runs(engine, 1, 8, tokens + 1, 1), start = engine_runs(engine, 1, 8, 1, 1);
      rate[mode].push_back(tokens / std::max(1e-9, full - start));
    }
  set(true);
  for (auto& v : rate) std::sort(v.begin(), v.end());
  const double med[2] = {rate[0][rate[0].size() / 2], rate[1][rate[1].size() / 2]};
  std::printf("decode batch 1, %u threads, %d rounds alternating %s: on median %.1f tok/s (best %.1f, %.2f GB/s), "
              "off median %.1f (best %.1f, %.2f GB/s): on/off %.3fx (median), %.3fx (best)\n",
              threads, rounds, knob.c_str(), med[1], rate[1].back(), med[1] * step_bytes / 1e9, med[0], rate[0].back(),
              med[0] * step_bytes / 1e9, med[1] / med[0], rate[1].back() / rate[0].back());
}

// Prefill of `seqs` prompts of `tokens` with the avx512bf16 mode off (the exact AVX-512 kernels) and on,
// alternating on one engine (A B B A ...): `rounds` wall times of each, one step's prompts a run.
void ab_prefill(const Model& model, unsigned threads, int seqs, int tokens, int rounds) {
  Engine engine(model, engine_config(threads, seqs, tokens, 1));
  engine_runs(engine, seqs, tokens, 1, 1);  // packs the weights
  std::vector<double> rate[2];
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 2; ++k) {
      const int mode = r % 2 == 0 ? k : 1 - k;  // 1: the bf16 mode
      cpu::set_cpu_isa(mode == 1 ? cpu::Isa::avx512bf16 : cpu::Isa::avx512);
      rate[mode].push_back(seqs * tokens / engine_runs(engine, seqs, tokens, 1, 1));
    }
  cpu::set_cpu_isa(cpu::Isa::avx512);
  for (auto& v : rate) std::sort(v.begin(), v.end());
  const double med[2] = {rate[0][rate[0].size() / 2], rate[1][rate[1].size() / 2]};
  std::printf("prefill %d x %d, %u threads, %d rounds alternating: avx512bf16 median %.1f tok/s (%.1f-%.1f), avx512 "
              "median %.1f (%.1f-%.1f): bf16/exact %.3fx (median)\n",
              seqs, tokens, threads, rounds, med[1], rate[1].front(), rate[1].back(), med[0], rate[0].front(),
              rate[0].back(), med[1] / med[0]);
}

// The comma-separated items of s ("" -> none).
std::vector<std::string> items(const std::string& s) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t j = std::min(s.find(',', i), s.size());
    v.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return v;
}

std::vector<int> int_list(const std::string& s) {  // "1,8,32"; "" or "0": none
  std::vector<int> v;
  for (const std::string& item : items(s))
    if (const int x = std::stoi(item); x > 0) v.push_back(x);
  return v;
}

struct Prefill {
  int seqs, tokens;  // seqs prompts of `tokens` each, prefilled together
};

std::vector<Prefill> prefill_list(const std::string& s) {  // "512,4096,8x128"; "" or "0": none
  std::vector<Prefill> v;
  for (const std::string& item : items(s)) {
    const std::size_t x = item.find('x');
    const Prefill p = x == std::string::npos ? Prefill{1, std::stoi(item)}
                                             : Prefill{std::stoi(item.substr(0, x)), std::stoi(item.substr(x + 1))};
    if (p.seqs > 0 && p.tokens > 0) v.push_back(p);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  unsigned threads = 0;
  int tokens = 64, runs = 3;
  std::size_t read_mib = 1024;
  bool with_4k = true;
  int ab_rounds = 0;  // --ab KNOB N (or --ab-taper N): only ab_knob, N rounds
  std::string ab = "taper";
  std::string json_path;
  std::vector<int> batches = {1, 8, 32};
  std::vector<Prefill> prefills = {{1, 512}, {1, 4096}, {8, 128}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model") model_dir = next();
    else if (a == "--threads") threads = static_cast<unsigned>(std::stoul(next()));
    else if (a == "--tokens") tokens = std::stoi(next());
    else if (a == "--runs") runs = std::stoi(next());
    else if (a == "--read-mib") read_mib = std::stoul(next());
    else if (a == "--no-4k") with_4k = false;
    else if (a == "--batches") batches = int_list(next());
    else if (a == "--prefill") prefills = prefill_list(next());
    else if (a == "--ab-taper") ab_rounds = std::stoi(next());
    else if (a == "--ab") {
      ab = next();
      ab_rounds = std::stoi(next());
    }
    else if (a == "--json") json_path = next();
  }
  if (model_dir.empty()) {
    std::fprintf(stderr, "usage: bench_cpu_roofline --model DIR [--threads N] [--tokens 64] [--runs 3] [--no-4k]\n");
    return 2;
  }
  ThreadPool pool(threads);
  const bool wide = cpu::cpu_supports(cpu::Isa::avx512);
  const double bw1 = read_bandwidth(pool, read_mib, 3), bw16 = read_bandwidth_streams(pool, read_mib, 3);
  const double bw = std::max(bw1, bw16), peak = fma_peak(pool, wide);
  const Model model = Model::load(model_dir);
  const ModelConfig& c = model.config();
  // What a decode step streams: every linear weight once (the embedding table only through its rows).
  const double qd = static_cast<double>(c.num_heads * c.head_dim), kvd = static_cast<double>(c.num_kv_heads * c.head_dim);
  const double h = static_cast<double>(c.hidden_size), ff = static_cast<double>(c.intermediate_size);
  const double linear_params = static_cast<double>(c.num_layers) * (h * (qd + 2 * kvd) + qd * h + 3 * h * ff) +
                               h * static_cast<double>(c.vocab_size);
  const double bytes_per_param = static_cast<double>(model.weight_bytes()) /
                                 (linear_params + (c.tie_word_embeddings ? 0 : h * static_cast<double>(c.vocab_size)));
  const double step_bytes = linear_params * bytes_per_param;
  boost::json::object out{{"threads", pool.size()}, {"kernels", cpu::isa_name(cpu::cpu_isa())}, {"model", model_dir},
                          {"step_bytes", step_bytes}, {"read_bytes_per_s", bw}, {"fma_flops_per_s", peak}};
  std::printf("threads %u, kernels %s; model %s: %lld layers, hidden %lld, %.0f MB streamed per decode step\n",
              pool.size(), std::string(cpu::isa_name(cpu::cpu_isa())).c_str(), model_dir.c_str(),
              static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size), step_bytes / 1e6);
  std::printf("read bandwidth (%zu MiB, %u threads): %.2f GB/s (1 stream a thread %.2f, 16 streams %.2f)\n", read_mib,
              pool.size(), bw / 1e9, bw1 / 1e9, bw16 / 1e9);
  if (pool.size() > 1) {  // what more threads can add at batch 1: the bandwidth's own scaling, same minute
    const double one = std::max(read_bandwidth(pool, read_mib, 3, 1), read_bandwidth_streams(pool, read_mib, 3, 1));
    std::printf("read bandwidth on 1 thread: %.2f GB/s: %u threads read %.2fx of one (the bound on batch-1 decode's "
                "scaling)\n", one / 1e9, pool.size(), bw / one);
    out["read_bytes_per_s_1_thread"] = one;
  }
  std::printf("fp32 FMA peak (%s, %u threads):       %.1f GFLOP/s\n", wide ? "512-bit" : "256-bit", pool.size(),
              peak / 1e9);
  if (ab_rounds > 0) {
    if (ab == "bf16")  // the mode against the exact kernels: each --prefill workload, then batch-1 decode
      for (const Prefill& pf : prefills) ab_prefill(model, threads, pf.seqs, pf.tokens, ab_rounds);
    ab_knob(model, ab, threads, tokens, ab_rounds, step_bytes);
    return 0;
  }
  boost::json::array decode_out, prefill_out;
  for (int batch : batches) {
    // The decode rate: the run with `tokens` generated minus the run with 1, per generated token.
    // The VM's bandwidth moves by up to 2x within minutes: read it again around each decode measurement
    // too, and give the fraction of both (the start's and the mean of the reads next to it).
    const double bw_before = std::max(read_bandwidth(pool, read_mib, 2), read_bandwidth_streams(pool, read_mib, 2));
    std::vector<double> windows;  // kWindows just before and kWindows just after, sorted
    read_windows(pool, read_mib, step_bytes, kWindows, bw16 > bw1, windows);
    const double full = engine_seconds(model, threads, batch, 8, tokens + 1, runs);
    const double own = g_own_seconds_per_step, median_step = g_median_step_seconds;
    const double start = engine_seconds(model, threads, batch, 8, 1, runs);
    read_windows(pool, read_mib, step_bytes, kWindows, bw16 > bw1, windows);
    std::sort(windows.begin(), windows.end());
    const double bw_after = std::max(read_bandwidth(pool, read_mib, 2), read_bandwidth_streams(pool, read_mib, 2));
    const double bw_near = (bw_before + bw_after) / 2;
    const double steps_per_s = tokens / std::max(1e-9, full - start);
    std::printf("decode batch %2d: %8.1f tok/s  (%.1f steps/s x %.0f MB = %.2f GB/s, %.0f%% of read bandwidth; "
                "engine outside the forward %.0f us/step = %.1f%%)\n",
                batch, steps_per_s * batch, steps_per_s, step_bytes / 1e6, steps_per_s * step_bytes / 1e9,
                100.0 * steps_per_s * step_bytes / bw, own * 1e6, 100.0 * own * steps_per_s);
    std::printf("                 read bandwidth just before / after: %.2f / %.2f GB/s: %.0f%% of their mean\n",
                bw_before / 1e9, bw_after / 1e9, 100.0 * steps_per_s * step_bytes / bw_near);
    decode_out.push_back(boost::json::object{{"batch", batch},
                                             {"tok_per_s", steps_per_s * batch},
                                             {"bytes_per_s", steps_per_s * step_bytes},
                                             {"read_bytes_per_s_before", bw_before},
                                             {"read_bytes_per_s_after", bw_after},
                                             {"median_step_s", median_step},
                                             {"read_window_bytes_per_s_median", quantile(windows, 0.5)},
                                             {"read_window_bytes_per_s_p10", quantile(windows, 0.1)},
                                             {"read_window_bytes_per_s_p90", quantile(windows, 0.9)},
                                             {"engine_own_s_per_step", own}});
    if (batch == 1) {
      const Interleaved il = interleaved_decode(model, pool, threads, tokens, read_mib, step_bytes, bw16 > bw1);
      std::printf("                 interleaved, a read window after every token: %d steps, median step %.2f ms, "
                  "median window %.2f GB/s; the median step's share of the windows next to it: %.0f%%\n",
                  il.steps, il.step_median_s * 1e3, il.window_median / 1e9, 100.0 * il.share_median);
      decode_out.back().as_object()["interleaved"] = boost::json::object{{"steps", il.steps},
                                                                         {"share_median", il.share_median},
                                                                         {"step_median_s", il.step_median_s},
                                                                         {"read_window_bytes_per_s_median", il.window_median}};
    }
    if (median_step > 0) {
      std::printf("                 median step %.2f ms: %.1f tok/s, %.2f GB/s = %.0f%% of that mean\n", median_step * 1e3,
                  batch / median_step, step_bytes / median_step / 1e9, 100.0 * step_bytes / median_step / bw_near);
      std::printf("                 reads of one step's bytes, %zu windows just before / after: median %.2f GB/s (p10 "
                  "%.2f, p90 %.2f): the median step is %.0f%% of their median\n",
                  windows.size(), quantile(windows, 0.5) / 1e9, quantile(windows, 0.1) / 1e9, quantile(windows, 0.9) / 1e9,
                  100.0 * step_bytes / median_step / quantile(windows, 0.5));
    }
  }
  for (const Prefill& pf : prefills) {
    if (pf.tokens == 4096 && !with_4k) continue;
    const bool long_one = static_cast<std::int64_t>(pf.seqs) * pf.tokens >= 4096;
    const double s = engine_seconds(model, threads, pf.seqs, pf.tokens, 1, long_one ? 1 : runs);
    const double pp = static_cast<double>(pf.tokens), n = static_cast<double>(pf.seqs);
    // lm_head runs on each prompt's last row only.
    const double lm = h * static_cast<double>(c.vocab_size);
    const double flops = n * (2.0 * (linear_params - lm) * pp + 2.0 * lm +
                              4.0 * static_cast<double>(c.num_layers) * qd * pp * (pp + 1) / 2);
    char what[32];
    if (pf.seqs == 1) std::snprintf(what, sizeof what, "%d", pf.tokens);
    else std::snprintf(what, sizeof what, "%d x %d", pf.seqs, pf.tokens);
    std::printf("prefill %4s:    %8.1f tok/s  (%.1f GFLOP/s, %.0f%% of FMA peak; %s", what, n * pp / s, flops / s / 1e9,
                100.0 * flops / s / peak, long_one ? "1 run" : "best of runs");
    if (pf.seqs > 1) std::printf(", %.1f engine steps a run", g_steps_per_run);
    std::printf(")\n");
    prefill_out.push_back(boost::json::object{
        {"tokens", pf.tokens}, {"sequences", pf.seqs}, {"tok_per_s", n * pp / s}, {"flops_per_s", flops / s}});
  }
  out["decode"] = std::move(decode_out);
  out["prefill"] = std::move(prefill_out);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << boost::json::serialize(out) << "\n";
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
