#include "bench/kvfleet_bench/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <fstream>
#include <stdexcept>

namespace kvfleet::bench {
namespace {

constexpr double kWidth = 720, kHeight = 420, kLeft = 70, kRight = 170, kTop = 40, kBottom = 55;
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

const char* colour(std::size_t i) { return kPalette[i % (sizeof kPalette / sizeof *kPalette)]; }

// A step of 1, 2 or 5 times a power of ten giving about `ticks` intervals over [lo, hi].
double nice_step(double lo, double hi, int ticks) {
  const double raw = std::max((hi - lo) / ticks, 1e-12);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

struct Frame {
  double x0, x1, y0, y1;
  double px(double x) const { return kLeft + (x - x0) / (x1 - x0) * (kWidth - kLeft - kRight); }
  double py(double y) const { return kHeight - kBottom - (y - y0) / (y1 - y0) * (kHeight - kTop - kBottom); }
};

std::string open_svg(const std::string& title) {
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
                     "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
                     "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
                     kWidth, kHeight, (kLeft + kWidth - kRight) / 2, escape(title));
}

std::string tick_label(double v) {
  if (v != 0 && (std::abs(v) >= 1e5 || std::abs(v) < 1e-3)) return fmt::format("{:.1e}", v);
  return fmt::format("{:g}", std::round(v * 1e6) / 1e6);
}

// Axes, grid, ticks and labels; `x_ticks` false for a category axis.
std::string axes(const Frame& f, const std::string& x_label, const std::string& y_label, bool x_ticks) {
  std::string s;
  const double ystep = nice_step(f.y0, f.y1, 5);
  for (double y = std::ceil(f.y0 / ystep) * ystep; y <= f.y1 + ystep * 1e-9; y += ystep)
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                     kLeft, kWidth - kRight, f.py(y), kLeft - 6, f.py(y) + 4, tick_label(y));
  if (x_ticks) {
    const double xstep = nice_step(f.x0, f.x1, 6);
    for (double x = std::ceil(f.x0 / xstep) * xstep; x <= f.x1 + xstep * 1e-9; x += xstep)
      s += fmt::format("<text x=\"{0:.1f}\" y=\"{1}\" text-anchor=\"middle\">{2}</text>\n", f.px(x),
                       kHeight - kBottom + 18, tick_label(x));
  }
  s += fmt::format("<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft, kTop,
                   kWidth - kLeft - kRight, kHeight - kTop - kBottom);
  s += fmt::format("<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\">{2}</text>\n", (kLeft + kWidth - kRight) / 2,
                   kHeight - 12, escape(x_label));
  s += fmt::format("<text transform=\"translate(16 {0}) rotate(-90)\" text-anchor=\"middle\">{1}</text>\n",
                   (kTop + kHeight - kBottom) / 2, escape(y_label));
  return s;
}

std::string legend(const std::vector<Series>& series) {
  std::string s;
  for (std::size_t i = 0; i < series.size(); ++i) {
    const double y = kTop + 10 + 20.0 * static_cast<double>(i);
    s += fmt::format("<rect x=\"{0}\" y=\"{1}\" width=\"14\" height=\"10\" fill=\"{2}\"/>"
                     "<text x=\"{3}\" y=\"{4}\">{5}</text>\n",
                     kWidth - kRight + 12, y - 9, colour(i), kWidth - kRight + 32, y, escape(series[i].name));
  }
  return s;
}

Frame fit(double x0, double x1, double y0, double y1) {
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  return {x0, x1, y0, y1 + (y1 - y0) * 0.05};
}

}  // namespace

std::string render_svg(const LineChart& c) {
  double x0 = INFINITY, x1 = -INFINITY, y1 = -INFINITY;
  for (const Series& s : c.series)
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y1 = std::max(y1, s.y[i]);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y1 = 1;
  const Frame f = fit(std::min(x0, 0.0), x1, 0, y1);
  std::string s = open_svg(c.title) + axes(f, c.x_label, c.y_label, true);
  for (std::size_t k = 0; k < c.series.size(); ++k) {
    const Series& series = c.series[k];
    std::string points;
    for (std::size_t i = 0; i < series.x.size() && i < series.y.size(); ++i)
      points += fmt::format("{:.1f},{:.1f} ", f.px(series.x[i]), f.py(series.y[i]));
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", colour(k), points);
  }
  return s + legend(c.series) + "</svg>\n";
}

std::string render_histogram_svg(const std::string& title, const std::string& x_label, const std::vector<double>& values,
                                 int bins) {
  double lo = values.empty() ? 0 : *std::min_element(values.begin(), values.end());
  double hi = values.empty() ? 1 : *std::max_element(values.begin(), values.end());
  if (hi <= lo) hi = lo + 1;
  std::vector<double> counts(static_cast<std::size_t>(bins), 0.0);
  const double width = (hi - lo) / bins;
  for (double v : values) counts[std::min<std::size_t>(counts.size() - 1, static_cast<std::size_t>((v - lo) / width))] += 1;
  const Frame f = fit(lo, hi, 0, *std::max_element(counts.begin(), counts.end()));
  std::string s = open_svg(title) + axes(f, x_label, "requests / tokens", true);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double a = lo + width * static_cast<double>(i);
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", f.px(a),
                     f.py(counts[i]), std::max(0.5, f.px(a + width) - f.px(a) - 1), f.py(0) - f.py(counts[i]), colour(0));
  }
  return s + "</svg>\n";
}

std::string render_svg(const BarChart& c) {
  double y1 = 0;
  for (const Series& s : c.series)
    for (double v : s.y) y1 = std::max(y1, v);
  const auto groups = static_cast<double>(std::max<std::size_t>(1, c.categories.size()));
  const Frame f = fit(0, groups, 0, y1);
  std::string s = open_svg(c.title) + axes(f, "", c.y_label, false);
  const double group_px = (kWidth - kLeft - kRight) / groups;
  const double bar_px = group_px * 0.8 / static_cast<double>(std::max<std::size_t>(1, c.series.size()));
  for (std::size_t g = 0; g < c.categories.size(); ++g) {
    const double gx = kLeft + group_px * static_cast<double>(g);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", gx + group_px / 2,
                     kHeight - kBottom + 18, escape(c.categories[g]));
    for (std::size_t k = 0; k < c.series.size(); ++k) {
      const double v = g < c.series[k].y.size() ? c.series[k].y[g] : 0;
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n",
                       gx + group_px * 0.1 + bar_px * static_cast<double>(k), f.py(v), bar_px - 1, f.py(0) - f.py(v), colour(k));
    }
  }
  return s + legend(c.series) + "</svg>\n";
}

Series cdf_series(const std::string& name, std::vector<double> values) {
  std::sort(values.begin(), values.end());
  Series s{name, {}, {}};
  for (std::size_t i = 0; i < values.size(); ++i) {
    s.x.push_back(values[i]);
    s.y.push_back(static_cast<double>(i + 1) / static_cast<double>(values.size()));
  }
  return s;
}

std::vector<std::filesystem::path> write_chart(const std::filesystem::path& path, const std::string& svg) {
  {
    std::ofstream out(path);
    if (!(out << svg)) throw std::runtime_error("cannot write " + path.string());
  }
  std::vector<std::filesystem::path> written{path};
  std::filesystem::path png = path;
  png.replace_extension(".png");
  // (fmt rather than operator+ chains: GCC 12 at -O3 warns falsely about those, -Wrestrict.)
  const std::string command = fmt::format(
      "{{ command -v rsvg-convert && rsvg-convert -o '{1}' '{0}' || {{ command -v convert && convert '{0}' '{1}'; }}; }} "
      ">/dev/null 2>&1",
      path.string(), png.string());
  if (std::system(command.c_str()) == 0 && std::filesystem::exists(png)) written.push_back(png);
  return written;
}

}  // namespace kvfleet::bench
