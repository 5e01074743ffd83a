// Reading metrics.jsonl and writing report.html; the page itself is
// page.cc's.
#include "report/report.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>

#include "io/atomic_write.h"

namespace troupe::rl::report {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Deeper config objects show as one value: a TOML config is a few levels
// deep, and the limit keeps a hostile file from exhausting the stack.
constexpr int kMaxConfigDepth = 32;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// A line being read, for messages that name it.
struct Line {
  const std::string& source;
  size_t number = 0;
  std::string event;
};

Status bad_line(const Line& at, std::string_view what) {
  return Status(ErrorCode::malformed,
                fmt::format("report: {} line {}: {}; fix or delete that line and run the report again", at.source,
                            at.number, what));
}

std::string field_problem(const Line& at, std::string_view key, const json& value, std::string_view wanted) {
  return fmt::format("the {} event's \"{}\" is {} {}, not {}", at.event, key,
                     value.is_object() || value.is_array() ? "an" : "a", value.type_name(), wanted);
}

// A number that may be absent; null (how JSON writers store NaN and
// infinity) reads as NaN.
Status read_number(const json& object, std::string_view key, const Line& at, std::optional<double>& out) {
  auto it = object.find(key);
  if (it == object.end()) return {};
  if (it->is_null()) {
    out = std::numeric_limits<double>::quiet_NaN();
    return {};
  }
  if (!it->is_number()) return bad_line(at, field_problem(at, key, *it, "a number"));
  out = it->get<double>();
  return {};
}

// A string that may be absent (then `out` stays empty).
Status read_string(const json& object, std::string_view key, const Line& at, std::string& out) {
  auto it = object.find(key);
  if (it == object.end()) return {};
  if (!it->is_string()) return bad_line(at, field_problem(at, key, *it, "a string"));
  out = it->get<std::string>();
  return {};
}

// "step" (a whole number) and "wall_s" (a finite number), both required.
Result<When> read_when(const json& object, const Line& at) {
  When when;
  auto step = object.find("step");
  if (step == object.end()) return error(bad_line(at, "the " + at.event + " event has no \"step\""));
  if (step->is_number_integer() && !(step->is_number_unsigned() && step->get<uint64_t>() > INT64_MAX)) {
    when.step = step->get<int64_t>();
  } else if (step->is_number_float() && std::abs(step->get<double>()) < 9e15 &&
             step->get<double>() == std::floor(step->get<double>())) {
    when.step = static_cast<int64_t>(step->get<double>());
  } else {
    return error(bad_line(at, field_problem(at, "step", *step, "a whole number")));
  }
  auto wall = object.find("wall_s");
  if (wall == object.end()) return error(bad_line(at, "the " + at.event + " event has no \"wall_s\""));
  if (!wall->is_number() || !std::isfinite(wall->get<double>())) {
    return error(bad_line(at, field_problem(at, "wall_s", *wall, "a finite number")));
  }
  when.wall_s = wall->get<double>();
  return when;
}

void flatten(const json& value, const std::string& key, int depth,
             std::vector<std::pair<std::string, std::string>>& out) {
  if (value.is_object() && !value.empty() && depth < kMaxConfigDepth) {
    for (const auto& [k, v] : value.items()) flatten(v, key.empty() ? k : key + "." + k, depth + 1, out);
    return;
  }
  if (depth >= kMaxConfigDepth) {
    out.emplace_back(key, "(nested too deep to show)");
  } else {
    out.emplace_back(key.empty() ? "config" : key, value.is_string() ? value.get<std::string>() : value.dump());
  }
}

// Python's json module writes NaN, Infinity and -Infinity bare, which JSON
// does not allow: they become null (read as NaN) outside strings. Returns
// nullopt when the line has none.
std::optional<std::string> null_non_finite_literals(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  bool escaped = false;
  bool replaced = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      out += c;
      continue;
    }
    if (c == '"') in_string = true;
    bool matched = false;
    for (std::string_view literal : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i).starts_with(literal)) {
        out += "null";
        i += literal.size() - 1;
        matched = replaced = true;
        break;
      }
    }
    if (!matched) out += c;
  }
  return replaced ? std::optional<std::string>(std::move(out)) : std::nullopt;
}

// The line as JSON, or the parser's complaint.
Result<json> parse_line(std::string_view text) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    if (auto cleaned = null_non_finite_literals(text)) {
      json value = json::parse(*cleaned, nullptr, /*allow_exceptions=*/false);
      if (!value.is_discarded()) return value;
    }
    // what() starts with "[json.exception.parse_error.101] ": the rest says it.
    std::string_view what = e.what();
    if (auto end = what.find("] "); what.starts_with("[json.") && end != std::string_view::npos) {
      what.remove_prefix(end + 2);
    }
    return error(ErrorCode::malformed, std::string(what));
  }
}

bool blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Reads the fields of each event kind into `metrics`; `place` sets a
// When's run_wall_s.
class Reader {
 public:
  explicit Reader(RunMetrics& metrics) : metrics_(metrics) {}

  Status read(const json& object, Line& at) {
    auto event = object.find("event");
    if (event == object.end()) return bad_line(at, "the object has no \"event\"");
    if (!event->is_string()) return bad_line(at, fmt::format("\"event\" is a {}, not a string", event->type_name()));
    at.event = event->get<std::string>();
    if (at.event == "run") return read_run(object, at);
    if (at.event == "step") return read_step(object, at);
    if (at.event == "eval") return read_eval(object, at);
    if (at.event == "fault" || at.event == "checkpoint" || at.event == "resume") return read_event(object, at);
    if (at.event == "end") return read_end(object, at);
    ++metrics_.other_events[at.event];
    return {};
  }

 private:
  // The process that writes the lines restarts its clock when the run
  // resumes: later times are offset by the latest time before.
  void new_segment() {
    offset_s_ += segment_latest_s_;
    segment_latest_s_ = 0;
  }
  void place(When& when) {
    when.run_wall_s = offset_s_ + when.wall_s;
    segment_latest_s_ = std::max(segment_latest_s_, when.wall_s);
  }

  Status read_run(const json& object, const Line& at) {
    if (metrics_.run) {
      // A resumed run's new process may write its header again: only
      // its clock matters.
      new_segment();
      return {};
    }
    RunInfo info;
    for (auto [key, field] : {std::pair{"run_id", &RunInfo::run_id}, std::pair{"started_at", &RunInfo::started_at},
                              std::pair{"mode", &RunInfo::mode}, std::pair{"placement", &RunInfo::placement},
                              std::pair{"algorithm", &RunInfo::algorithm}}) {
      if (Status s = read_string(object, key, at, info.*field); !s.ok()) return s;
    }
    if (auto config = object.find("config"); config != object.end() && !config->is_null()) {
      flatten(*config, "", 0, info.config);
    }
    metrics_.run = std::move(info);
    return {};
  }

  Status read_step(const json& object, const Line& at) {
    auto when = read_when(object, at);
    if (!when) return when.error();
    StepRecord record;
    record.when = *when;
    using Field = std::optional<double> StepRecord::*;
    static constexpr std::pair<const char*, Field> kFields[] = {{"version", &StepRecord::version},
                                                                {"reward_mean", &StepRecord::reward_mean},
                                                                {"reward_std", &StepRecord::reward_std},
                                                                {"samples", &StepRecord::samples},
                                                                {"tokens", &StepRecord::tokens},
                                                                {"tokens_per_s", &StepRecord::tokens_per_s},
                                                                {"loss", &StepRecord::loss},
                                                                {"grad_norm", &StepRecord::grad_norm},
                                                                {"kl", &StepRecord::kl},
                                                                {"clip_fraction", &StepRecord::clip_fraction},
                                                                {"entropy", &StepRecord::entropy},
                                                                {"staleness_mean", &StepRecord::staleness_mean},
                                                                {"staleness_max", &StepRecord::staleness_max},
                                                                {"dropped_stale", &StepRecord::dropped_stale}};
    for (auto [key, field] : kFields) {
      if (Status s = read_number(object, key, at, record.*field); !s.ok()) return s;
    }
    if (auto split = object.find("time_s"); split != object.end() && !split->is_null()) {
      if (!split->is_object()) return bad_line(at, field_problem(at, "time_s", *split, "an object of seconds"));
      for (size_t i = 0; i < kPhaseCount; ++i) {
        const std::string key = "time_s." + std::string(phase_name(static_cast<Phase>(i)));
        auto seconds = split->find(phase_name(static_cast<Phase>(i)));
        if (seconds != split->end() && !seconds->is_null() && !seconds->is_number()) {
          return bad_line(at, field_problem(at, key, *seconds, "a number"));
        }
        if (Status s = read_number(*split, phase_name(static_cast<Phase>(i)), at, record.time_s[i]); !s.ok()) return s;
      }
    }
    place(record.when);
    metrics_.steps.push_back(std::move(record));
    return {};
  }

  Status read_eval(const json& object, const Line& at) {
    auto when = read_when(object, at);
    if (!when) return when.error();
    EvalRecord record;
    record.when = *when;
    if (Status s = read_number(object, "accuracy", at, record.accuracy); !s.ok()) return s;
    if (Status s = read_number(object, "problems", at, record.problems); !s.ok()) return s;
    place(record.when);
    metrics_.evals.push_back(std::move(record));
    return {};
  }

  Status read_event(const json& object, const Line& at) {
    auto when = read_when(object, at);
    if (!when) return when.error();
    RunEvent record;
    record.when = *when;
    Status s;
    if (at.event == "fault") {
      record.kind = EventKind::fault;
      s = read_string(object, "what", at, record.what);
      if (s.ok()) s = read_string(object, "action", at, record.action);
      if (s.ok()) s = read_number(object, "cost_s", at, record.cost_s);
    } else if (at.event == "checkpoint") {
      record.kind = EventKind::checkpoint;
      s = read_string(object, "path", at, record.what);
      if (s.ok()) s = read_number(object, "seconds", at, record.cost_s);
    } else {
      record.kind = EventKind::resume;
      s = read_string(object, "from", at, record.what);
      new_segment();
    }
    if (!s.ok()) return s;
    place(record.when);
    metrics_.events.push_back(std::move(record));
    return {};
  }

  Status read_end(const json& object, const Line& at) {
    RunEnd end;
    if (object.contains("step") && object.contains("wall_s")) {
      auto when = read_when(object, at);
      if (!when) return when.error();
      end.when = *when;
      place(*end.when);
    }
    if (Status s = read_string(object, "status", at, end.status); !s.ok()) return s;
    if (Status s = read_number(object, "final_accuracy", at, end.final_accuracy); !s.ok()) return s;
    metrics_.end = std::move(end);
    return {};
  }

  RunMetrics& metrics_;
  double offset_s_ = 0;          // this segment's start, in run seconds
  double segment_latest_s_ = 0;  // the latest wall_s of this segment
};

// The page is replaced atomically (io/atomic_write.h), so that a reader (a
// browser refreshing mid-run) sees the old page or the new one, and a crash
// cannot leave an empty page under the name.
Status write_page(const fs::path& path, std::string_view text) {
  if (Status s = io::write_atomically(path, text); !s.ok()) {
    return Status(ErrorCode::storage,
                  fmt::format("report: cannot write {}: {}; make the run directory writable, or free space on its "
                              "disk, and run the report again",
                              path.string(), s.message()));
  }
  return {};
}

}  // namespace

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::generation:
      return "generation";
    case Phase::reward:
      return "reward";
    case Phase::train:
      return "train";
    case Phase::sync:
      return "sync";
    case Phase::wait:
      return "wait";
  }
  return "unknown";
}

Result<RunMetrics> read_metrics(const std::string& path) {
  std::error_code ec;
  const auto type = fs::status(path, ec).type();
  if (type == fs::file_type::not_found) {
    return error(ErrorCode::not_found,
                 fmt::format("report: no metrics file at {}: the directory is not an RL run's, or its run has not "
                             "started; `troupe rl train` writes metrics.jsonl into the run directory it is given",
                             path));
  }
  if (type == fs::file_type::directory) {
    return error(
        ErrorCode::invalid_argument,
        fmt::format("report: {} is a directory, not a metrics file; pass the run directory that holds it", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return error(ErrorCode::storage,
                 fmt::format("report: cannot read {}: {}; check its permissions", path, errno_text(errno)));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return error(ErrorCode::storage, fmt::format("report: reading {} failed: {}", path, errno_text(errno)));
  }

  std::vector<std::string_view> lines;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    lines.push_back(std::string_view(text).substr(begin, end - begin));
    begin = end + 1;
  }
  size_t last = lines.size();  // the last line with something on it
  while (last > 0 && blank(lines[last - 1])) --last;
  if (last == 0) {
    return error(ErrorCode::invalid_argument,
                 fmt::format("report: {} is empty: the run has not logged its first step yet; wait for `troupe rl "
                             "train` to write one, or check that this is the run directory it was given",
                             path));
  }

  RunMetrics metrics;
  metrics.source = path;
  Reader reader(metrics);
  for (size_t i = 0; i < last; ++i) {
    if (blank(lines[i])) continue;
    Line at{metrics.source, i + 1, ""};
    auto object = parse_line(lines[i]);
    if (!object && i + 1 == last) {
      // A killed run leaves its last line half-written: the rest stands.
      metrics.warnings.push_back(fmt::format(
          "line {} is not complete JSON ({}): the run was probably killed while writing it; the line is left out",
          at.number, object.error().message()));
      break;
    }
    if (!object) return error(bad_line(at, "not JSON: " + object.error().message()));
    if (!object->is_object()) return error(bad_line(at, fmt::format("a JSON {}, not an object", object->type_name())));
    if (Status s = reader.read(*object, at); !s.ok()) return error(s);
  }
  if (!metrics.run) {
    metrics.warnings.push_back(
        "the file has no \"run\" line: the run's id, mode, placement, algorithm and config "
        "are unknown");
  }
  return metrics;
}

Result<std::string> write_report(const std::string& run_dir) {
  const fs::path dir(run_dir);
  auto metrics = read_metrics((dir / "metrics.jsonl").string());
  if (!metrics) return error(metrics.error());
  const fs::path target = dir / "report.html";
  if (Status s = write_page(target, render_html(*metrics)); !s.ok()) return error(s);
  return target.string();
}

}  // namespace troupe::rl::report
