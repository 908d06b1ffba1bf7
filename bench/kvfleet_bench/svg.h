// A small SVG chart writer (no dependencies): line charts (latency CDFs, throughput over time),
// histograms, and grouped bar charts (per-policy comparisons). Axes get 5 "nice" ticks; colours come
// from a fixed palette in series order so the same policy keeps its colour across charts.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kvfleet::bench {

struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
};

struct BarChart {
  std::string title, y_label;
  std::vector<std::string> categories;  // groups along x
  std::vector<Series> series;           // series[i].y[c]: bar of series i in category c
};

std::string render_svg(const LineChart& chart);
// The bins of `values` (count per bin) drawn as bars.
std::string render_histogram_svg(const std::string& title, const std::string& x_label, const std::vector<double>& values,
                                 int bins = 30);
std::string render_svg(const BarChart& chart);

// The empirical CDF of `values` as a series (x sorted, y from 1/n to 1).
Series cdf_series(const std::string& name, std::vector<double> values);

// Writes `svg` to `path`, and `path` with .png beside it when rsvg-convert or ImageMagick's convert
// is on PATH. Returns the files written.
std::vector<std::filesystem::path> write_chart(const std::filesystem::path& path, const std::string& svg);

}  // namespace kvfleet::bench
