// The run report's SVG plots: line plots (with a band, vertical markers and
// a legend) and stacked bars, each one self-contained <svg> element with
// axes, tick marks at round numbers and labels, meant to be inlined into an
// HTML page. Every string is escaped here; points that are not finite are
// skipped, so a plot of one point, of all-equal values or of nothing still
// draws (with padded axes, or a line of text saying what is missing).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe::rl::report {

/// One point of a series.
struct PlotPoint {
  double x = 0;
  double y = 0;
};

/// A band around a series (mean ± std) at one x.
struct PlotBandPoint {
  double x = 0;
  double low = 0;
  double high = 0;
};

/// One line of a LinePlot.
struct PlotSeries {
  /// The legend's text.
  std::string label;
  /// Names the line's CSS class ("series-<key>"); letters, digits, '-' and '_'.
  std::string key;
  /// A CSS colour, e.g. "#4e79a7".
  std::string colour;
  /// Joined in this order (callers sort by x).
  std::vector<PlotPoint> points;
  /// A shaded band in the line's colour; empty: none.
  std::vector<PlotBandPoint> band;
  /// A dashed line, for a series that is secondary to another.
  bool dashed = false;
};

/// A vertical line across a plot at one x (a fault, a resume).
struct PlotMarker {
  double x = 0;
  /// The tooltip, e.g. "step 31: fault: rollout engine 1 died".
  std::string label;
  /// "fault" or "resume": picks the marker's colour and dash.
  std::string kind;
};

/// A line plot: what svg_line_plot draws.
struct LinePlot {
  /// The <svg> element's id ("plot-reward-steps").
  std::string id;
  std::string x_label;
  std::string y_label;
  std::vector<PlotSeries> series;
  std::vector<PlotMarker> markers;
  /// Ticks at whole numbers only (an axis of steps).
  bool x_integer = false;
  /// The y axis starts at 0 when every value is positive (throughput).
  bool y_from_zero = false;
  /// The y axis is [0, 1] when every value lies in it (accuracy).
  bool y_unit_interval = false;
  /// Shown in place of the plot when no series has a finite point.
  std::string empty_text;
};

/// `plot` as one <svg> element (a placeholder <svg> with `empty_text` when
/// there is nothing to draw).
std::string svg_line_plot(const LinePlot& plot);

/// One bar of a StackedBars plot, spanning [x_begin, x_end] on the x axis.
struct StackedBar {
  double x_begin = 0;
  double x_end = 0;
  /// One value per part, stacked bottom up; parts that are not finite or
  /// not positive draw nothing.
  std::vector<double> parts;
  /// The bar's tooltip.
  std::string label;
};

/// A stacked bar chart: what svg_stacked_bars draws.
struct StackedBars {
  std::string id;
  std::string x_label;
  std::string y_label;
  /// The parts' legend text, class keys ("part-<key>") and CSS colours;
  /// the same length as every bar's parts.
  std::vector<std::string> part_labels;
  std::vector<std::string> part_keys;
  std::vector<std::string> part_colours;
  std::vector<StackedBar> bars;
  /// Ticks at whole numbers only (an axis of steps).
  bool x_integer = false;
  std::string empty_text;
};

/// `plot` as one <svg> element, y from 0, with a legend of the parts.
std::string svg_stacked_bars(const StackedBars& plot);

/// `text` safe inside HTML or SVG, in an element or a quoted attribute:
/// & < > " ' become entities.
std::string escape_html(std::string_view text);

/// A number for a person: 3 or 4 significant digits, no exponent between
/// 0.001 and 1e6 ("0.731", "5100", "34.5"); "NaN", "inf" or "-inf" when it
/// is not finite.
std::string number_text(double value);

}  // namespace troupe::rl::report
