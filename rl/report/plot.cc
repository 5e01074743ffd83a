#include "report/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace troupe::rl::report {
namespace {

// Every plot has the same frame, so that plots side by side line up.
constexpr double kWidth = 560;
constexpr double kHeight = 260;
constexpr double kLeft = 64;  // y tick labels and the y label
constexpr double kRight = 14;
constexpr double kTop = 30;     // the legend
constexpr double kBottom = 44;  // x tick labels and the x label
constexpr double kPlotWidth = kWidth - kLeft - kRight;
constexpr double kPlotHeight = kHeight - kTop - kBottom;
// Dots on every point while a series is sparse enough for them to read as
// points rather than a thick line.
constexpr size_t kMaxDots = 60;
constexpr int kTargetTicks = 5;
constexpr const char* kAxisColour = "#555";
constexpr const char* kGridColour = "#e6e6e6";
constexpr const char* kFaultColour = "#d62728";
constexpr const char* kResumeColour = "#1f77b4";

// An axis's domain and its ticks at round numbers (1, 2 or 5 times a power
// of ten), with the domain widened to the outer ticks.
struct Axis {
  double low = 0;
  double high = 1;
  double step = 0;  // 0: ticks at the two ends only (a domain too wide to round)
  std::vector<double> ticks;
  // Labels in thousands or millions once the numbers get long.
  double label_scale = 1;
  const char* label_suffix = "";
};

double nice_step(double span) {
  const double raw = span / kTargetTicks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  const double nice = fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10;
  return nice * magnitude;
}

// REQUIRES: low and high finite, low <= high.
Axis make_axis(double low, double high, bool integer) {
  Axis axis;
  if (!(high > low)) {
    // One value: a window around it, so that it draws mid-plot.
    const double pad = integer ? 0.5 : (low == 0 ? 1.0 : std::abs(low) * 0.1);
    low -= pad;
    high += pad;
  }
  double step = nice_step(high - low);
  if (integer) step = std::max(1.0, std::round(step));
  const double magnitude = std::max(std::abs(low), std::abs(high));
  if (magnitude >= 1e6) {
    axis.label_scale = 1e6;
    axis.label_suffix = "M";
  } else if (magnitude >= 1e4) {
    axis.label_scale = 1e3;
    axis.label_suffix = "k";
  }
  // Spans near the limits of double (1e308, denormals) have no round
  // ticks: the ends do.
  if (!std::isfinite(high - low) || !std::isfinite(step) || step <= 0 || step < (high - low) * 1e-6) {
    axis.low = low;
    axis.high = high;
    axis.ticks = {low, high};
    return axis;
  }
  axis.step = step;
  axis.low = std::floor(low / step) * step;
  axis.high = std::ceil(high / step) * step;
  const auto intervals = static_cast<int64_t>(std::llround((axis.high - axis.low) / step));
  for (int64_t i = 0; i <= intervals; ++i) axis.ticks.push_back(axis.low + static_cast<double>(i) * step);
  return axis;
}

std::string tick_text(const Axis& axis, double value) {
  if (axis.step == 0) return number_text(value);
  if (std::abs(value) < axis.step * 1e-9) value = 0;  // no "-0" from rounding
  const double scaled_step = axis.step / axis.label_scale;
  const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(scaled_step) + 1e-9)), 0, 10);
  return fmt::format("{:.{}f}{}", value / axis.label_scale, decimals, axis.label_suffix);
}

// Maps data to the frame's pixels.
struct Frame {
  Axis x;
  Axis y;
  double px(double v) const {
    const double span = x.high - x.low;
    return kLeft + (span > 0 && std::isfinite(span) ? (v - x.low) / span : 0.5) * kPlotWidth;
  }
  double py(double v) const {
    const double span = y.high - y.low;
    return kTop + kPlotHeight - (span > 0 && std::isfinite(span) ? (v - y.low) / span : 0.5) * kPlotHeight;
  }
};

std::string svg_open(const std::string& id, std::string_view extra_class, std::string_view aria) {
  return fmt::format(
      "<svg id=\"{}\" class=\"plot{}\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" "
      "height=\"{}\" role=\"img\" aria-label=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
      escape_html(id), extra_class, kWidth, kHeight, kWidth, kHeight, escape_html(aria));
}

// Axes, grid, ticks and the two labels.
std::string svg_axes(const Frame& f, std::string_view x_label, std::string_view y_label) {
  std::string out;
  const double bottom = kTop + kPlotHeight;
  for (double t : f.y.ticks) {
    const double y = f.py(t);
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\"/>\n", kLeft, y,
                       kLeft + kPlotWidth, y, kGridColour);
    out += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" dy=\"0.32em\" text-anchor=\"end\">{}</text>\n",
                       kLeft - 6, y, tick_text(f.y, t));
  }
  for (double t : f.x.ticks) {
    const double x = f.px(t);
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\"/>\n", x, bottom, x,
                       bottom + 4, kAxisColour);
    out += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x,
                       bottom + 16, tick_text(f.x, t));
  }
  out += fmt::format("<path d=\"M{:.1f},{:.1f} V{:.1f} H{:.1f}\" fill=\"none\" stroke=\"{}\"/>\n", kLeft, kTop, bottom,
                     kLeft + kPlotWidth, kAxisColour);
  out += fmt::format(
      "<text class=\"axis-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"12\">{}</text>\n",
      kLeft + kPlotWidth / 2, kHeight - 6, escape_html(x_label));
  out += fmt::format(
      "<text class=\"axis-label\" transform=\"translate(14,{:.1f}) rotate(-90)\" text-anchor=\"middle\" "
      "font-size=\"12\">{}</text>\n",
      kTop + kPlotHeight / 2, escape_html(y_label));
  return out;
}

// The legend along the top; `swatch` draws an entry's sample at (x, y).
struct LegendEntry {
  std::string label;
  std::string swatch;  // SVG, drawn in a 16 x 10 box at the origin
};

std::string svg_legend(const std::vector<LegendEntry>& entries) {
  std::string out = "<g class=\"legend\">\n";
  double x = kLeft;
  for (const LegendEntry& e : entries) {
    out += fmt::format("<g transform=\"translate({:.1f},8)\">{}<text x=\"20\" y=\"5\" dy=\"0.32em\">{}</text></g>\n", x,
                       e.swatch, escape_html(e.label));
    // Sans-serif at 11 px averages about 6 px a character.
    x += 20 + 6.0 * static_cast<double>(e.label.size()) + 14;
  }
  return out + "</g>\n";
}

std::string line_swatch(std::string_view colour, bool dashed) {
  return fmt::format("<line x1=\"0\" y1=\"5\" x2=\"16\" y2=\"5\" stroke=\"{}\" stroke-width=\"2\"{}/>", colour,
                     dashed ? " stroke-dasharray=\"4 2\"" : "");
}

std::string svg_empty(const std::string& id, std::string_view text) {
  return svg_open(id, " empty", text) +
         fmt::format(
             "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#fafafa\" stroke=\"{}\"/>\n"
             "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#777\" font-size=\"12\">{}</text>\n"
             "</svg>\n",
             kLeft, kTop, kPlotWidth, kPlotHeight, kGridColour, kLeft + kPlotWidth / 2, kTop + kPlotHeight / 2,
             escape_html(text));
}

bool finite(PlotPoint p) { return std::isfinite(p.x) && std::isfinite(p.y); }
bool finite(PlotBandPoint b) { return std::isfinite(b.x) && std::isfinite(b.low) && std::isfinite(b.high); }

// The smallest interval holding every value fed to it.
struct Extent {
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();
  void add(double v) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
  bool empty() const { return low > high; }
};

const char* marker_colour(std::string_view kind) { return kind == "fault" ? kFaultColour : kResumeColour; }
const char* marker_dash(std::string_view kind) { return kind == "fault" ? "5 3" : "2 3"; }

std::string svg_markers(const Frame& f, const std::vector<PlotMarker>& markers) {
  std::string out;
  for (const PlotMarker& m : markers) {
    if (!std::isfinite(m.x) || m.x < f.x.low || m.x > f.x.high) continue;
    const double x = f.px(m.x);
    out += fmt::format(
        "<line class=\"marker marker-{}\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"1.2\" stroke-dasharray=\"{}\"><title>{}</title></line>\n",
        m.kind == "fault" ? "fault" : "resume", x, kTop, x, kTop + kPlotHeight, marker_colour(m.kind),
        marker_dash(m.kind), escape_html(m.label));
  }
  return out;
}

std::vector<LegendEntry> marker_legend(const std::vector<PlotMarker>& markers) {
  std::vector<LegendEntry> out;
  for (std::string_view kind : {"fault", "resume"}) {
    const bool any = std::any_of(markers.begin(), markers.end(), [&](const PlotMarker& m) { return m.kind == kind; });
    if (!any) continue;
    out.push_back({std::string(kind), fmt::format("<line x1=\"8\" y1=\"0\" x2=\"8\" y2=\"10\" stroke=\"{}\" "
                                                  "stroke-width=\"1.5\" stroke-dasharray=\"{}\"/>",
                                                  marker_colour(kind), kind == "fault" ? "3 2" : "2 2")});
  }
  return out;
}

}  // namespace

std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string number_text(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  const double magnitude = std::abs(value);
  if (magnitude == 0) return "0";
  if (magnitude >= 1e6 || magnitude < 1e-3) return fmt::format("{:.3g}", value);
  if (magnitude >= 1000) return fmt::format("{:.0f}", value);
  return fmt::format("{:.4g}", value);
}

std::string svg_line_plot(const LinePlot& plot) {
  Extent xs, ys;
  for (const PlotSeries& s : plot.series) {
    for (PlotPoint p : s.points) {
      if (!finite(p)) continue;
      xs.add(p.x);
      ys.add(p.y);
    }
    for (PlotBandPoint b : s.band) {
      if (!finite(b)) continue;
      xs.add(b.x);
      ys.add(b.low);
      ys.add(b.high);
    }
  }
  if (xs.empty()) return svg_empty(plot.id, plot.empty_text);
  if (plot.y_unit_interval && ys.low >= 0 && ys.high <= 1) {
    ys.low = 0;
    ys.high = 1;
  } else if (const double span = ys.high - ys.low; span > 0 && std::isfinite(span)) {
    // Room above (and below, unless at 0) so that a line at the extreme
    // does not run along the frame.
    ys.high += 0.02 * span;
    if (ys.low != 0) ys.low -= 0.02 * span;
  }
  if (plot.y_from_zero && ys.low > 0) ys.low = 0;
  const Frame f{make_axis(xs.low, xs.high, plot.x_integer), make_axis(ys.low, ys.high, false)};

  std::string out = svg_open(plot.id, "", plot.y_label + " over " + plot.x_label);
  out += svg_axes(f, plot.x_label, plot.y_label);
  std::vector<LegendEntry> legend;
  for (const PlotSeries& s : plot.series) {
    legend.push_back({s.label, line_swatch(s.colour, s.dashed)});
    std::vector<PlotBandPoint> band;
    for (PlotBandPoint b : s.band) {
      if (finite(b)) band.push_back(b);
    }
    if (band.size() == 1) {
      // A band of one point has no area: an error bar shows it.
      out += fmt::format(
          "<line class=\"band series-{}\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
          "stroke-opacity=\"0.4\" stroke-width=\"4\"/>\n",
          s.key, f.px(band[0].x), f.py(band[0].low), f.px(band[0].x), f.py(band[0].high), s.colour);
    } else if (band.size() > 1) {
      std::string points;
      for (const PlotBandPoint& b : band) points += fmt::format("{:.1f},{:.1f} ", f.px(b.x), f.py(b.high));
      for (auto it = band.rbegin(); it != band.rend(); ++it) {
        points += fmt::format("{:.1f},{:.1f} ", f.px(it->x), f.py(it->low));
      }
      points.pop_back();
      out += fmt::format(
          "<polygon class=\"band series-{}\" fill=\"{}\" fill-opacity=\"0.18\" stroke=\"none\" points=\"{}\"/>\n",
          s.key, s.colour, points);
    }
  }
  out += svg_markers(f, plot.markers);
  for (const PlotSeries& s : plot.series) {
    std::vector<PlotPoint> points;
    for (PlotPoint p : s.points) {
      if (finite(p)) points.push_back(p);
    }
    if (points.empty()) continue;
    std::string coords;
    for (PlotPoint p : points) coords += fmt::format("{:.1f},{:.1f} ", f.px(p.x), f.py(p.y));
    coords.pop_back();
    out += fmt::format(
        "<polyline class=\"line series-{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" "
        "stroke-linejoin=\"round\"{} points=\"{}\"/>\n",
        s.key, s.colour, s.dashed ? " stroke-dasharray=\"5 3\"" : "", coords);
    if (points.size() > kMaxDots) continue;
    for (PlotPoint p : points) {
      out += fmt::format(
          "<circle class=\"dot series-{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.8\" fill=\"{}\"><title>{}: {} at {} "
          "{}</title></circle>\n",
          s.key, f.px(p.x), f.py(p.y), s.colour, escape_html(s.label), number_text(p.y), escape_html(plot.x_label),
          number_text(p.x));
    }
  }
  for (LegendEntry& e : marker_legend(plot.markers)) legend.push_back(std::move(e));
  out += svg_legend(legend);
  return out + "</svg>\n";
}

std::string svg_stacked_bars(const StackedBars& plot) {
  Extent xs, ys;
  for (const StackedBar& bar : plot.bars) {
    if (!std::isfinite(bar.x_begin) || !std::isfinite(bar.x_end)) continue;
    double total = 0;
    for (double part : bar.parts) {
      if (std::isfinite(part) && part > 0) total += part;
    }
    xs.add(bar.x_begin);
    xs.add(bar.x_end);
    ys.add(total);
  }
  if (xs.empty()) return svg_empty(plot.id, plot.empty_text);
  ys.add(0);
  const Frame f{make_axis(xs.low, xs.high, plot.x_integer), make_axis(ys.low, ys.high, false)};

  std::string out = svg_open(plot.id, "", plot.y_label + " over " + plot.x_label);
  out += svg_axes(f, plot.x_label, plot.y_label);
  for (const StackedBar& bar : plot.bars) {
    if (!std::isfinite(bar.x_begin) || !std::isfinite(bar.x_end)) continue;
    const double x = f.px(bar.x_begin);
    // At least half a pixel, so that a thousand bars still show.
    const double width = std::max(f.px(bar.x_end) - x, 0.5);
    out += fmt::format("<g class=\"bar\"><title>{}</title>", escape_html(bar.label));
    double base = 0;
    for (size_t i = 0; i < bar.parts.size() && i < plot.part_keys.size(); ++i) {
      const double part = bar.parts[i];
      if (!std::isfinite(part) || part <= 0) continue;
      const double top = f.py(base + part);
      out += fmt::format(
          "<rect class=\"part-{}\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"/>",
          plot.part_keys[i], x, top, width, f.py(base) - top, plot.part_colours[i]);
      base += part;
    }
    out += "</g>\n";
  }
  std::vector<LegendEntry> legend;
  for (size_t i = 0; i < plot.part_labels.size() && i < plot.part_colours.size(); ++i) {
    legend.push_back({plot.part_labels[i], fmt::format("<rect x=\"0\" y=\"0\" width=\"14\" height=\"10\" fill=\"{}\"/>",
                                                       plot.part_colours[i])});
  }
  out += svg_legend(legend);
  return out + "</svg>\n";
}

}  // namespace troupe::rl::report
