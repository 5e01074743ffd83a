// `troupe rl report RUN_DIR`'s engine: reads the metrics an RL run wrote to
// RUN_DIR/metrics.jsonl (one JSON object per line, as the controller writes
// them: a "run" header, then "step", "eval", "fault", "checkpoint" and
// "resume" events, and an "end" line) and writes RUN_DIR/report.html, one
// self-contained page: no JavaScript, nothing fetched, the plots inline SVG.
//
// Three pieces, each usable alone: read_metrics (file to RunMetrics),
// render_html (RunMetrics to the page), write_report (both, and the file
// written atomically).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/status.h"

namespace troupe::rl::report {

/// The phases of a step's time split ("time_s"), in the order the page
/// stacks them.
enum class Phase : uint8_t { generation, reward, train, sync, wait };
/// How many phases there are.
inline constexpr size_t kPhaseCount = 5;
/// The phase's key in "time_s", e.g. "generation".
std::string_view phase_name(Phase phase);

/// The run's header (the "run" line).
struct RunInfo {
  std::string run_id;
  /// As written, e.g. "2026-11-22T10:00:00Z".
  std::string started_at;
  /// "sync" or "async".
  std::string mode;
  /// "colocated" or "disaggregated".
  std::string placement;
  /// "grpo" or "ppo".
  std::string algorithm;
  /// The run's config, flattened: dotted keys ("train.lr") in key order,
  /// strings as they are, any other value as JSON text.
  std::vector<std::pair<std::string, std::string>> config;
};

/// When an event happened. `wall_s` is as the file has it: seconds since the
/// process that wrote it started, restarting at 0 after a resume;
/// `run_wall_s` is the same moment in seconds since the run began, across
/// resumes (each segment offset by the latest wall_s before it).
struct When {
  int64_t step = 0;
  double wall_s = 0;
  double run_wall_s = 0;
};

/// One training step (a "step" line). A field the line lacks is nullopt; a
/// field written as null (how JSON writers store NaN and infinity), NaN or
/// Infinity is NaN, which the plots skip.
struct StepRecord {
  When when;
  std::optional<double> version;
  std::optional<double> reward_mean;
  std::optional<double> reward_std;
  std::optional<double> samples;
  std::optional<double> tokens;
  std::optional<double> tokens_per_s;
  std::optional<double> loss;
  std::optional<double> grad_norm;
  std::optional<double> kl;
  std::optional<double> clip_fraction;
  std::optional<double> entropy;
  std::optional<double> staleness_mean;
  std::optional<double> staleness_max;
  std::optional<double> dropped_stale;
  /// Seconds per phase, indexed by Phase; other keys of "time_s" are ignored.
  std::array<std::optional<double>, kPhaseCount> time_s;
};

/// One held-out evaluation (an "eval" line).
struct EvalRecord {
  When when;
  /// Fraction correct, in [0, 1].
  std::optional<double> accuracy;
  /// How many problems it scored.
  std::optional<double> problems;
};

/// The kinds of RunEvent.
enum class EventKind : uint8_t { fault, checkpoint, resume };

/// A fault and its recovery, a checkpoint, or a resume: the page's table of
/// what happened to the run.
struct RunEvent {
  EventKind kind = EventKind::fault;
  When when;
  /// fault: "what" (what failed); checkpoint: "path"; resume: "from".
  std::string what;
  /// fault: "action" (how it recovered); empty for the others.
  std::string action;
  /// fault: "cost_s" (seconds lost); checkpoint: "seconds" (to write it).
  std::optional<double> cost_s;
};

/// The "end" line.
struct RunEnd {
  /// Absent when the line lacks "step" and "wall_s".
  std::optional<When> when;
  /// "ok" or "failed: ..."; empty when the line has none.
  std::string status;
  std::optional<double> final_accuracy;
};

/// Everything read from a metrics file, in file order.
struct RunMetrics {
  /// The file read (error messages and the page name it).
  std::string source;
  /// Absent when the file has no "run" line; the first one when it has several.
  std::optional<RunInfo> run;
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  std::vector<RunEvent> events;
  /// Absent while the run is going, or when it was killed.
  std::optional<RunEnd> end;
  /// Lines of events this reader does not know, by event name: kept
  /// countable, not plotted.
  std::map<std::string, int64_t> other_events;
  /// What the reader tolerated, for the page to show (a last line cut
  /// short, no "run" line).
  std::vector<std::string> warnings;
};

/// Reads the metrics file at `path`. Blank lines are skipped; a last line
/// that is not complete JSON (the run was killed while writing it) is
/// dropped with a warning; lines of unknown events are counted in
/// other_events. Errors: not_found (no file there; the message says that
/// `troupe rl train` writes it), invalid_argument (the file is empty),
/// storage (it could not be read), malformed (a line before the last that
/// is not a JSON object with a string "event", or a known event with a
/// field of the wrong type or without "step" and "wall_s": the message
/// names the line number and the field).
Result<RunMetrics> read_metrics(const std::string& path);

/// The report page for `metrics`: a title (run id, mode, placement,
/// algorithm, status), warnings, a summary table (steps, wall time, final
/// and best accuracy, mean tokens/s, the time split per phase in seconds
/// and %), line plots of reward (± std) and held-out accuracy over steps
/// and over wall time, tokens/s and staleness over steps, the training
/// signals that are present (loss, grad norm, KL, clip fraction, entropy),
/// a stacked bar chart of each step's time split, a table of faults,
/// checkpoints and resumes, and the config. Each plot is an <svg> with a
/// stable id ("plot-reward-steps", "plot-accuracy-wall", ...). Plots over
/// steps keep the last record of a step that a resume redid; plots over
/// wall time keep every record. Every string from the file is escaped, and
/// the page forbids scripts (a Content-Security-Policy), so a metrics file
/// cannot put code in it.
std::string render_html(const RunMetrics& metrics);

/// Reads RUN_DIR/metrics.jsonl, renders it, and writes RUN_DIR/report.html
/// atomically (a temporary file beside it, then a rename: a reader sees
/// the old page or the new, never half of one); returns the path written.
/// Errors: as read_metrics; storage when the page cannot be written (the
/// message names the path and the OS's reason).
Result<std::string> write_report(const std::string& run_dir);

}  // namespace troupe::rl::report
