// render_html: the report page, built from RunMetrics with report/plot.h's
// SVG plots.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <map>

#include "report/plot.h"
#include "report/report.h"

namespace troupe::rl::report {
namespace {

// One colour per phase, the same in the bars, their legend and the summary
// (Tableau 10: distinct to most colour-blind readers too).
constexpr std::array<const char*, kPhaseCount> kPhaseColours = {"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#9d9d9d"};
constexpr const char* kRewardColour = "#4e79a7";
constexpr const char* kAccuracyColour = "#e15759";
constexpr const char* kThroughputColour = "#59a14f";
constexpr const char* kStalenessColour = "#b07aa1";
constexpr const char* kStalenessMaxColour = "#e377c2";
constexpr const char* kSignalColour = "#76b7b2";
// Past this many steps, the time split is drawn as the mean of bins of
// consecutive steps: bars narrower than a couple of pixels read as noise.
constexpr size_t kMaxBars = 200;

constexpr const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;max-width:1180px;margin:24px auto;padding:0 16px;line-height:1.4}
h1{font-size:22px;margin:0 0 6px}
h2{font-size:17px;margin:28px 0 10px;border-bottom:1px solid #ddd;padding-bottom:4px}
code{font-size:95%}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;background:#eee;margin:0 6px 0 0;font-size:13px}
.badge.ok{background:#d8f0d8;color:#1a5e1a}
.badge.failed{background:#f8d7d7;color:#8a1414}
.badge.unknown{background:#fdf0c8;color:#6b4f00}
.meta{color:#666;font-size:13px;margin:6px 0 0}
.warnings{background:#fff8e1;border:1px solid #f0d890;border-radius:4px;padding:6px 14px;margin-top:14px}
.warnings li{margin:4px 0}
.summary{display:flex;flex-wrap:wrap;gap:36px;align-items:flex-start}
table{border-collapse:collapse;font-size:14px}
th,td{padding:4px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f6f6f6;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.grid{display:flex;flex-wrap:wrap;gap:14px}
figure{margin:0;border:1px solid #e4e4e4;border-radius:4px;padding:6px 8px 2px;background:#fff}
figcaption{font-weight:600;font-size:14px}
svg.plot{max-width:100%;height:auto;display:block}
tr.fault td.kind{color:#b00;font-weight:600}
tr.resume td.kind{color:#1f5f9f;font-weight:600}
.note{color:#666;font-size:13px}
details summary{cursor:pointer;font-weight:600}
)";

std::string h(std::string_view text) { return escape_html(text); }

std::string duration_text(double seconds) {
  if (!std::isfinite(seconds)) return number_text(seconds);
  if (std::abs(seconds) < 120) return fmt::format("{:.1f} s", seconds);
  if (std::abs(seconds) < 7200) return fmt::format("{:.1f} min", seconds / 60);
  return fmt::format("{:.2f} h", seconds / 3600);
}

bool finite(const std::optional<double>& v) { return v && std::isfinite(*v); }

// The records a plot over steps shows: a resume redoes the steps after its
// checkpoint, and the redone record is the one that counts.
template <class Record>
std::vector<const Record*> latest_per_step(const std::vector<Record>& records) {
  std::map<int64_t, const Record*> by_step;
  for (const Record& r : records) by_step[r.when.step] = &r;
  std::vector<const Record*> out;
  out.reserve(by_step.size());
  for (const auto& [step, r] : by_step) out.push_back(r);
  return out;
}

template <class Record>
std::vector<const Record*> every_record(const std::vector<Record>& records) {
  std::vector<const Record*> out;
  for (const Record& r : records) out.push_back(&r);
  return out;
}

enum class XAxis { steps, minutes };

double x_of(const When& when, XAxis axis) {
  return axis == XAxis::steps ? static_cast<double>(when.step) : when.run_wall_s / 60;
}
const char* x_label(XAxis axis) { return axis == XAxis::steps ? "step" : "wall time (min)"; }

template <class Record>
PlotSeries series_of(std::string label, std::string key, const char* colour, const std::vector<const Record*>& records,
                     std::optional<double> Record::*field, XAxis axis) {
  PlotSeries s{std::move(label), std::move(key), colour, {}, {}, false};
  for (const Record* r : records) {
    if (r->*field) s.points.push_back({x_of(r->when, axis), *(r->*field)});
  }
  return s;
}

template <class Record>
bool any_of_field(const std::vector<Record>& records, std::optional<double> Record::*field) {
  return std::any_of(records.begin(), records.end(), [&](const Record& r) { return (r.*field).has_value(); });
}

std::vector<PlotMarker> markers_of(const RunMetrics& m, XAxis axis) {
  std::vector<PlotMarker> out;
  for (const RunEvent& e : m.events) {
    if (e.kind == EventKind::checkpoint) continue;
    const bool fault = e.kind == EventKind::fault;
    out.push_back({x_of(e.when, axis),
                   fmt::format("step {}: {}: {}", e.when.step, fault ? "fault" : "resumed from", e.what),
                   fault ? "fault" : "resume"});
  }
  return out;
}

std::string figure(std::string_view caption, const std::string& svg) {
  return fmt::format("<figure><figcaption>{}</figcaption>\n{}</figure>\n", h(caption), svg);
}

std::string reward_plot(const RunMetrics& m, XAxis axis) {
  const auto records = axis == XAxis::steps ? latest_per_step(m.steps) : every_record(m.steps);
  PlotSeries mean = series_of("reward mean", "reward_mean", kRewardColour, records, &StepRecord::reward_mean, axis);
  for (const StepRecord* r : records) {
    if (finite(r->reward_mean) && finite(r->reward_std)) {
      mean.band.push_back({x_of(r->when, axis), *r->reward_mean - *r->reward_std, *r->reward_mean + *r->reward_std});
    }
  }
  if (!mean.band.empty()) mean.label = "reward mean ± std";
  LinePlot plot;
  plot.id = axis == XAxis::steps ? "plot-reward-steps" : "plot-reward-wall";
  plot.x_label = x_label(axis);
  plot.y_label = "reward";
  plot.series.push_back(std::move(mean));
  plot.markers = markers_of(m, axis);
  plot.x_integer = axis == XAxis::steps;
  plot.empty_text = "no step line has a reward_mean";
  return figure(axis == XAxis::steps ? "Reward over steps" : "Reward over wall time", svg_line_plot(plot));
}

std::string accuracy_plot(const RunMetrics& m, XAxis axis) {
  const auto records = axis == XAxis::steps ? latest_per_step(m.evals) : every_record(m.evals);
  LinePlot plot;
  plot.id = axis == XAxis::steps ? "plot-accuracy-steps" : "plot-accuracy-wall";
  plot.x_label = x_label(axis);
  plot.y_label = "held-out accuracy";
  plot.series.push_back(series_of("accuracy", "accuracy", kAccuracyColour, records, &EvalRecord::accuracy, axis));
  plot.markers = markers_of(m, axis);
  plot.x_integer = axis == XAxis::steps;
  plot.y_unit_interval = true;
  plot.empty_text = "no eval line with an accuracy yet";
  return figure(axis == XAxis::steps ? "Held-out accuracy over steps" : "Held-out accuracy over wall time",
                svg_line_plot(plot));
}

std::string throughput_plot(const RunMetrics& m) {
  LinePlot plot;
  plot.id = "plot-tokens-steps";
  plot.x_label = "step";
  plot.y_label = "tokens/s";
  plot.series.push_back(series_of("tokens/s", "tokens_per_s", kThroughputColour, latest_per_step(m.steps),
                                  &StepRecord::tokens_per_s, XAxis::steps));
  plot.markers = markers_of(m, XAxis::steps);
  plot.x_integer = true;
  plot.y_from_zero = true;
  plot.empty_text = "no step line has tokens_per_s";
  return figure("Throughput over steps", svg_line_plot(plot));
}

std::string staleness_plot(const RunMetrics& m) {
  const auto records = latest_per_step(m.steps);
  LinePlot plot;
  plot.id = "plot-staleness-steps";
  plot.x_label = "step";
  plot.y_label = "staleness (versions)";
  if (any_of_field(m.steps, &StepRecord::staleness_mean)) {
    plot.series.push_back(
        series_of("mean", "staleness_mean", kStalenessColour, records, &StepRecord::staleness_mean, XAxis::steps));
  }
  if (any_of_field(m.steps, &StepRecord::staleness_max)) {
    PlotSeries max =
        series_of("max", "staleness_max", kStalenessMaxColour, records, &StepRecord::staleness_max, XAxis::steps);
    max.dashed = true;
    plot.series.push_back(std::move(max));
  }
  plot.markers = markers_of(m, XAxis::steps);
  plot.x_integer = true;
  plot.y_from_zero = true;
  plot.empty_text = "no finite staleness values";
  return figure("Staleness of the samples trained on", svg_line_plot(plot));
}

std::string phase_tooltip(std::string_view head, const std::array<double, kPhaseCount>& seconds) {
  std::string out(head);
  double total = 0;
  for (size_t i = 0; i < kPhaseCount; ++i) {
    if (!std::isfinite(seconds[i])) continue;
    out += fmt::format("{} {}: {} s", i == 0 ? "" : ",", phase_name(static_cast<Phase>(i)), number_text(seconds[i]));
    total += seconds[i];
  }
  return out + fmt::format("; total {} s", number_text(total));
}

std::string time_split_plot(const RunMetrics& m) {
  std::vector<const StepRecord*> records;
  for (const StepRecord* r : latest_per_step(m.steps)) {
    if (std::any_of(r->time_s.begin(), r->time_s.end(), [](const auto& t) { return t.has_value(); })) {
      records.push_back(r);
    }
  }
  StackedBars plot;
  plot.id = "plot-time-split";
  plot.x_label = "step";
  plot.y_label = "seconds";
  plot.x_integer = true;
  plot.empty_text = "no step line has a time_s split";
  for (size_t i = 0; i < kPhaseCount; ++i) {
    plot.part_labels.emplace_back(phase_name(static_cast<Phase>(i)));
    plot.part_keys.emplace_back(phase_name(static_cast<Phase>(i)));
    plot.part_colours.emplace_back(kPhaseColours[i]);
  }
  // Bars half as wide as the closest two steps are apart, so that bars of
  // steps logged every n steps still touch nearly.
  double gap = 1;
  for (size_t i = 1; i < records.size(); ++i) {
    const auto d = static_cast<double>(records[i]->when.step - records[i - 1]->when.step);
    gap = i == 1 ? d : std::min(gap, d);
  }
  const double half = 0.4 * std::max(gap, 1.0);
  const size_t per_bar = (records.size() + kMaxBars - 1) / kMaxBars;
  for (size_t begin = 0; begin < records.size(); begin += per_bar) {
    const size_t end = std::min(records.size(), begin + per_bar);
    std::array<double, kPhaseCount> sum{};
    std::array<size_t, kPhaseCount> count{};
    for (size_t j = begin; j < end; ++j) {
      for (size_t i = 0; i < kPhaseCount; ++i) {
        if (finite(records[j]->time_s[i])) {
          sum[i] += *records[j]->time_s[i];
          ++count[i];
        }
      }
    }
    std::array<double, kPhaseCount> mean{};
    for (size_t i = 0; i < kPhaseCount; ++i) {
      mean[i] = count[i] ? sum[i] / static_cast<double>(count[i]) : std::nan("");
    }
    const int64_t first = records[begin]->when.step;
    const int64_t last = records[end - 1]->when.step;
    const std::string head =
        first == last ? fmt::format("step {}:", first) : fmt::format("steps {} to {} (mean):", first, last);
    plot.bars.push_back({static_cast<double>(first) - half, static_cast<double>(last) + half,
                         std::vector<double>(mean.begin(), mean.end()), phase_tooltip(head, mean)});
  }
  std::string caption = "Time split per step";
  if (per_bar > 1) caption += fmt::format(" (each bar: the mean of {} steps)", per_bar);
  return figure(caption, svg_stacked_bars(plot));
}

std::string signal_plots(const RunMetrics& m) {
  struct Signal {
    const char* key;
    const char* label;
    std::optional<double> StepRecord::*field;
  };
  constexpr std::array<Signal, 5> kSignals = {{{"loss", "loss", &StepRecord::loss},
                                               {"grad_norm", "gradient norm", &StepRecord::grad_norm},
                                               {"kl", "KL to the reference", &StepRecord::kl},
                                               {"clip_fraction", "clip fraction", &StepRecord::clip_fraction},
                                               {"entropy", "entropy", &StepRecord::entropy}}};
  const auto records = latest_per_step(m.steps);
  std::string out;
  for (const Signal& s : kSignals) {
    if (!any_of_field(m.steps, s.field)) continue;
    LinePlot plot;
    plot.id = fmt::format("plot-{}-steps", s.key);
    plot.x_label = "step";
    plot.y_label = s.label;
    plot.series.push_back(series_of(s.label, s.key, kSignalColour, records, s.field, XAxis::steps));
    plot.markers = markers_of(m, XAxis::steps);
    plot.x_integer = true;
    plot.empty_text = fmt::format("no finite {} values", s.key);
    std::string caption = s.label;
    caption[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(caption[0])));
    out += figure(caption, svg_line_plot(plot));
  }
  return out;
}

// ---- the summary -------------------------------------------------------------

struct StatusBadge {
  std::string text;
  const char* css;
};

StatusBadge status_of(const RunMetrics& m) {
  if (!m.end) return {"no end line: still running, or killed", "unknown"};
  if (m.end->status == "ok") return {"ok", "ok"};
  if (m.end->status.starts_with("failed")) return {m.end->status, "failed"};
  return {m.end->status.empty() ? "ended without a status" : m.end->status, "unknown"};
}

double run_seconds(const RunMetrics& m) {
  double latest = 0;
  for (const StepRecord& r : m.steps) latest = std::max(latest, r.when.run_wall_s);
  for (const EvalRecord& r : m.evals) latest = std::max(latest, r.when.run_wall_s);
  for (const RunEvent& r : m.events) latest = std::max(latest, r.when.run_wall_s);
  if (m.end && m.end->when) latest = std::max(latest, m.end->when->run_wall_s);
  return latest;
}

std::string row(std::string_view name, const std::string& value_html) {
  return fmt::format("<tr><th>{}</th><td class=\"num\">{}</td></tr>\n", h(name), value_html);
}

std::string summary_table(const RunMetrics& m) {
  std::string rows;
  const auto steps = latest_per_step(m.steps);
  int64_t last_step = steps.empty() ? 0 : steps.back()->when.step;
  if (m.end && m.end->when) last_step = std::max(last_step, m.end->when->step);
  std::string steps_text = steps.empty() && !(m.end && m.end->when) ? "none yet" : std::to_string(last_step);
  if (m.steps.size() > steps.size()) {
    steps_text += fmt::format(" ({} redone after a resume)", m.steps.size() - steps.size());
  }
  rows += row("Steps", h(steps_text));
  const double seconds = run_seconds(m);
  rows += row("Wall time", h(seconds < 120 ? duration_text(seconds)
                                           : fmt::format("{} ({:.0f} s)", duration_text(seconds), seconds)));

  std::string final_text = "no eval yet";
  if (m.end && finite(m.end->final_accuracy)) {
    final_text = number_text(*m.end->final_accuracy);
  } else {
    for (auto it = m.evals.rbegin(); it != m.evals.rend(); ++it) {
      if (finite(it->accuracy)) {
        final_text = fmt::format("{} (last eval, step {})", number_text(*it->accuracy), it->when.step);
        break;
      }
    }
  }
  rows += row("Final accuracy", h(final_text));
  const EvalRecord* best = nullptr;
  for (const EvalRecord& e : m.evals) {
    if (finite(e.accuracy) && (!best || *e.accuracy > *best->accuracy)) best = &e;
  }
  rows += row("Best accuracy",
              h(best ? fmt::format("{} (step {})", number_text(*best->accuracy), best->when.step) : "no eval yet"));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (finite((*it)->reward_mean)) {
      rows +=
          row("Final reward mean", h(fmt::format("{} (step {})", number_text(*(*it)->reward_mean), (*it)->when.step)));
      break;
    }
  }
  double tokens_per_s = 0;
  size_t throughput_steps = 0;
  double samples = 0;
  double tokens = 0;
  double dropped = 0;
  for (const StepRecord& r : m.steps) {
    if (finite(r.tokens_per_s)) {
      tokens_per_s += *r.tokens_per_s;
      ++throughput_steps;
    }
    if (finite(r.samples)) samples += *r.samples;
    if (finite(r.tokens)) tokens += *r.tokens;
    if (finite(r.dropped_stale)) dropped += *r.dropped_stale;
  }
  rows += row("Mean tokens/s",
              h(throughput_steps ? number_text(tokens_per_s / static_cast<double>(throughput_steps)) : "not logged"));
  if (samples > 0 || tokens > 0) {
    rows += row("Samples, tokens", h(fmt::format("{}, {}", number_text(samples), number_text(tokens))));
  }
  if (any_of_field(m.steps, &StepRecord::dropped_stale)) rows += row("Dropped as stale", h(number_text(dropped)));
  rows += row("Evaluations", std::to_string(m.evals.size()));
  size_t faults = 0, checkpoints = 0, resumes = 0;
  double fault_cost_s = 0;
  for (const RunEvent& e : m.events) {
    if (e.kind == EventKind::fault) {
      ++faults;
      if (finite(e.cost_s)) fault_cost_s += *e.cost_s;
    }
    checkpoints += e.kind == EventKind::checkpoint;
    resumes += e.kind == EventKind::resume;
  }
  rows += row("Faults", h(faults ? fmt::format("{} ({} lost)", faults, duration_text(fault_cost_s)) : "none"));
  rows += row("Checkpoints, resumes", fmt::format("{}, {}", checkpoints, resumes));
  return "<table class=\"summary-table\">\n" + rows + "</table>\n";
}

std::string time_split_table(const RunMetrics& m) {
  std::array<double, kPhaseCount> total{};
  for (const StepRecord& r : m.steps) {
    for (size_t i = 0; i < kPhaseCount; ++i) {
      if (finite(r.time_s[i])) total[i] += *r.time_s[i];
    }
  }
  double all = 0;
  for (double t : total) all += t;
  if (all <= 0) return "<p class=\"note\">No step line has a time_s split.</p>\n";
  std::string out = "<table class=\"time-split\">\n<tr><th>Phase</th><th>Seconds</th><th>Share</th></tr>\n";
  for (size_t i = 0; i < kPhaseCount; ++i) {
    out += fmt::format(
        "<tr class=\"phase-{0}\"><td><span class=\"swatch\" style=\"background:{1}\"></span>{0}</td>"
        "<td class=\"num\">{2:.1f}</td><td class=\"num\">{3:.1f}%</td></tr>\n",
        phase_name(static_cast<Phase>(i)), kPhaseColours[i], total[i], 100 * total[i] / all);
  }
  out += fmt::format("<tr><th>all phases</th><td class=\"num\">{:.1f}</td><td class=\"num\">100%</td></tr>\n", all);
  return out + "</table>\n";
}

// ---- faults, checkpoints, resumes --------------------------------------------

// What a resume cost in steps: those logged after its checkpoint's step
// before the run stopped, which the resumed run does again.
std::string redone_text(const RunMetrics& m, const RunEvent& resume) {
  int64_t latest = resume.when.step;
  for (const StepRecord& r : m.steps) {
    // The segment before ends at the resume's time (its latest time is
    // the resume's offset), the one after starts at it.
    if (r.when.run_wall_s <= resume.when.run_wall_s) latest = std::max(latest, r.when.step);
  }
  if (latest <= resume.when.step) return fmt::format("continues at step {}; no step lost", resume.when.step + 1);
  if (latest == resume.when.step + 1) return fmt::format("redoes step {}, logged before the stop", latest);
  return fmt::format("redoes steps {} to {}, logged before the stop", resume.when.step + 1, latest);
}

std::string events_table(const RunMetrics& m) {
  if (m.events.empty()) return "<p class=\"note\">No faults, checkpoints or resumes.</p>\n";
  std::string out =
      "<table class=\"events\">\n<tr><th>Event</th><th>Step</th><th>Time</th><th>What</th><th>Action</th>"
      "<th>Cost</th></tr>\n";
  for (const RunEvent& e : m.events) {
    const char* kind = e.kind == EventKind::fault ? "fault" : e.kind == EventKind::checkpoint ? "checkpoint" : "resume";
    std::string what = e.what;
    std::string action = e.action;
    if (e.kind == EventKind::checkpoint) {
      what = "saved " + e.what;
    } else if (e.kind == EventKind::resume) {
      what = "resumed from " + e.what;
      action = redone_text(m, e);
    }
    out += fmt::format(
        "<tr class=\"{}\"><td class=\"kind\">{}</td><td class=\"num\">{}</td><td class=\"num\" title=\"wall_s {} "
        "in its segment\">{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>\n",
        kind, kind, e.when.step, h(number_text(e.when.wall_s)), h(duration_text(e.when.run_wall_s)), h(what), h(action),
        e.cost_s ? h(duration_text(*e.cost_s)) : "");
  }
  return out + "</table>\n";
}

std::string config_section(const RunInfo& run) {
  if (run.config.empty()) return "";
  std::string out =
      fmt::format("<details><summary>Config ({} settings)</summary>\n<table class=\"config\">\n", run.config.size());
  for (const auto& [key, value] : run.config) {
    out += fmt::format("<tr><td><code>{}</code></td><td><code>{}</code></td></tr>\n", h(key), h(value));
  }
  return out + "</table>\n</details>\n";
}

}  // namespace

std::string render_html(const RunMetrics& m) {
  const RunInfo run = m.run.value_or(RunInfo{});
  const std::string run_id = run.run_id.empty() ? "(no run id)" : run.run_id;
  const StatusBadge status = status_of(m);

  std::string out;
  out.reserve(64 * 1024 + m.steps.size() * 600);
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // The page needs nothing but its own styles: forbidding the rest keeps a
  // metrics file from running code in it even if escaping ever missed.
  out += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out +=
      fmt::format("<title>RL run {}: troupe report</title>\n<style>{}</style>\n</head>\n<body>\n", h(run_id), kStyle);

  out += fmt::format("<h1>RL run <code>{}</code></h1>\n<div class=\"badges\">", h(run_id));
  const std::pair<const char*, const std::string*> badges[] = {
      {"mode", &run.mode}, {"placement", &run.placement}, {"algorithm", &run.algorithm}};
  for (const auto& [label, value] : badges) {
    out += fmt::format("<span class=\"badge {}\">{}: {}</span>", label, label, h(value->empty() ? "?" : *value));
  }
  out += fmt::format("<span class=\"badge status {}\">status: {}</span></div>\n", status.css, h(status.text));
  out += fmt::format("<p class=\"meta\">started {} · read from <code>{}</code> · {} step lines, {} evals</p>\n",
                     h(run.started_at.empty() ? "at an unknown time" : run.started_at), h(m.source), m.steps.size(),
                     m.evals.size());

  std::vector<std::string> notes = m.warnings;
  for (const auto& [event, count] : m.other_events) {
    notes.push_back(
        fmt::format("{} line(s) of event \"{}\", which this report does not know, are not shown", count, event));
  }
  if (!notes.empty()) {
    out += "<div class=\"warnings\"><ul>\n";
    for (const std::string& note : notes) out += "<li>" + h(note) + "</li>\n";
    out += "</ul></div>\n";
  }

  out += "<h2>Summary</h2>\n<div class=\"summary\">\n" + summary_table(m) + time_split_table(m) + "</div>\n";
  out += "<h2>Learning over steps</h2>\n<div class=\"grid\">\n" + reward_plot(m, XAxis::steps) +
         accuracy_plot(m, XAxis::steps) + "</div>\n";
  out += "<h2>Learning over wall time</h2>\n<div class=\"grid\">\n" + reward_plot(m, XAxis::minutes) +
         accuracy_plot(m, XAxis::minutes) + "</div>\n";
  out += "<h2>Throughput</h2>\n<div class=\"grid\">\n" + throughput_plot(m);
  if (any_of_field(m.steps, &StepRecord::staleness_mean) || any_of_field(m.steps, &StepRecord::staleness_max)) {
    out += staleness_plot(m);
  }
  out += "</div>\n<h2>Where each step's time went</h2>\n<div class=\"grid\">\n" + time_split_plot(m) + "</div>\n";
  if (const std::string signals = signal_plots(m); !signals.empty()) {
    out += "<h2>Training signals</h2>\n<div class=\"grid\">\n" + signals + "</div>\n";
  }
  if (std::any_of(m.events.begin(), m.events.end(),
                  [](const RunEvent& e) { return e.kind != EventKind::checkpoint; })) {
    out +=
        "<p class=\"note\">Dashed red lines on the plots mark faults, dotted blue lines resumes; hover for "
        "details.</p>\n";
  }
  out += "<h2>Faults, recoveries, checkpoints and resumes</h2>\n" + events_table(m);
  if (m.end && !m.end->status.empty() && status.css != std::string_view("ok")) {
    out += fmt::format("<p>The run ended: <strong>{}</strong></p>\n", h(m.end->status));
  }
  if (!run.config.empty()) out += "<h2>Config</h2>\n" + config_section(run);
  out +=
      "<p class=\"note\">Written by <code>troupe rl report</code>. Plots over steps show the last record of a "
      "step that a resume redid; wall time runs on across resumes.</p>\n</body>\n</html>\n";
  return out;
}

}  // namespace troupe::rl::report
