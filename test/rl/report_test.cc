// The run report: a realistic metrics.jsonl is read field by field, the
// page's summary states the right numbers, every plot is an <svg> with one
// point per record, a last line cut short is tolerated and any other bad
// line is an error naming it, strings from the file never become markup,
// wall time runs on across a resume, plots of one point, all-equal values,
// nothing or NaN still draw, and a page that cannot be written is an error
// that leaves the older page whole.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "report/plot.h"
#include "report/report.h"
#include "support/temp_files.h"

using namespace troupe::rl::report;
using troupe::ErrorCode;
using json = nlohmann::json;
namespace fs = std::filesystem;
using troupe::test::read_file;
using troupe::test::with_file_size_limit;

namespace {

// A fresh run directory, removed at scope exit.
struct RunDir : troupe::test::TempDir {
  RunDir() : TempDir("troupe-report") {}
  fs::path metrics() const { return path / "metrics.jsonl"; }
  void write_metrics(const std::string& text) const { troupe::test::write_file(metrics(), text); }
};

json step_line(int step, double wall_s) {
  return {{"event", "step"},
          {"step", step},
          {"wall_s", wall_s},
          {"version", step},
          {"reward_mean", 0.3 + 0.05 * step},
          {"reward_std", 0.2},
          {"samples", 256},
          {"tokens", 2048},
          {"tokens_per_s", 4000 + 100 * step},
          {"loss", 0.01},
          {"grad_norm", 0.4},
          {"kl", 0.001},
          {"clip_fraction", 0.02},
          {"entropy", 1.2},
          {"staleness_mean", 0.5},
          {"staleness_max", 1},
          {"dropped_stale", 0},
          {"time_s", {{"generation", 0.8}, {"reward", 0.1}, {"train", 0.5}, {"sync", 0.02}, {"wait", 0.08}}}};
}

// A 12-step async GRPO run as the controller logs it: an eval every 4
// steps (accuracy 0.6, 0.7, 0.8), a fault at step 6, a checkpoint at 8, an
// event this reader does not know, and an end line.
std::string realistic_run(int steps = 12) {
  std::vector<json> lines;
  lines.push_back({{"event", "run"},
                   {"run_id", "arith-grpo-7"},
                   {"started_at", "2026-11-22T10:00:00Z"},
                   {"config",
                    {{"train", {{"lr", 1e-4}, {"steps", steps}}},
                     {"rollout", {{"engines", 2}, {"group_size", 8}}},
                     {"task", "arithmetic"}}},
                   {"mode", "async"},
                   {"placement", "disaggregated"},
                   {"algorithm", "grpo"}});
  for (int s = 1; s <= steps; ++s) {
    lines.push_back(step_line(s, 2.5 * s));
    if (s % 4 == 0) {
      lines.push_back({{"event", "eval"},
                       {"step", s},
                       {"wall_s", 2.5 * s + 0.5},
                       {"accuracy", 0.5 + 0.1 * (s / 4)},
                       {"problems", 400}});
    }
    if (s == 6) {
      lines.push_back({{"event", "fault"},
                       {"step", 6},
                       {"wall_s", 15.2},
                       {"what", "rollout engine 1's process died (killed by signal 9)"},
                       {"action", "requeued 4 prompt groups; engine restarted and rejoined at version 6"},
                       {"cost_s", 1.8}});
      lines.push_back({{"event", "heartbeat"}, {"wall_s", 15.3}});
    }
    if (s == 8) {
      lines.push_back({{"event", "checkpoint"},
                       {"step", 8},
                       {"wall_s", 20.1},
                       {"path", "run/checkpoints/step-8"},
                       {"seconds", 0.2}});
    }
  }
  lines.push_back(
      {{"event", "end"}, {"step", steps}, {"wall_s", 2.5 * steps + 1}, {"status", "ok"}, {"final_accuracy", 0.8}});
  std::string text;
  for (const json& line : lines) text += line.dump() + "\n";
  return text;
}

// The <svg> element with this id, or "" when the page has none.
std::string svg_by_id(const std::string& html, const std::string& id) {
  const size_t begin = html.find("<svg id=\"" + id + "\"");
  if (begin == std::string::npos) return "";
  return html.substr(begin, html.find("</svg>", begin) + 6 - begin);
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// The "x,y" pairs of the line of series `key` in `svg` (empty: no line).
std::vector<std::pair<double, double>> line_points(const std::string& svg, const std::string& key) {
  const size_t line = svg.find("<polyline class=\"line series-" + key + "\"");
  if (line == std::string::npos) return {};
  const size_t begin = svg.find("points=\"", line) + 8;
  std::istringstream in(svg.substr(begin, svg.find('"', begin) - begin));
  std::vector<std::pair<double, double>> out;
  std::string pair;
  while (in >> pair) {
    const size_t comma = pair.find(',');
    out.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return out;
}

// The text from `start` to the end of its table row.
std::string row_of(const std::string& html, const std::string& start) {
  const size_t begin = html.find(start);
  if (begin == std::string::npos) return "";
  return html.substr(begin, html.find("</tr>", begin) - begin);
}

}  // namespace

TEST_CASE("report: a realistic metrics file is read field by field, with cumulative wall time", "[rl][report]") {
  RunDir dir;
  dir.write_metrics(realistic_run());
  auto metrics = read_metrics(dir.metrics().string());
  REQUIRE(metrics.has_value());
  REQUIRE(metrics->run.has_value());
  CHECK(metrics->run->run_id == "arith-grpo-7");
  CHECK(metrics->run->mode == "async");
  CHECK(metrics->run->placement == "disaggregated");
  CHECK(metrics->run->algorithm == "grpo");
  CHECK(metrics->run->started_at == "2026-11-22T10:00:00Z");
  const std::vector<std::pair<std::string, std::string>> config = {{"rollout.engines", "2"},
                                                                   {"rollout.group_size", "8"},
                                                                   {"task", "arithmetic"},
                                                                   {"train.lr", "0.0001"},
                                                                   {"train.steps", "12"}};
  CHECK(metrics->run->config == config);

  REQUIRE(metrics->steps.size() == 12);
  const StepRecord& s3 = metrics->steps[2];
  CHECK(s3.when.step == 3);
  CHECK(s3.when.wall_s == 7.5);
  CHECK(s3.when.run_wall_s == 7.5);
  CHECK(*s3.reward_mean == Approx(0.45));
  CHECK(s3.tokens_per_s == 4300.0);
  CHECK(s3.staleness_max == 1.0);
  CHECK(s3.time_s[static_cast<size_t>(Phase::generation)] == 0.8);
  CHECK(s3.time_s[static_cast<size_t>(Phase::wait)] == 0.08);

  REQUIRE(metrics->evals.size() == 3);
  CHECK(*metrics->evals[2].accuracy == Approx(0.8));
  CHECK(metrics->evals[2].problems == 400.0);

  REQUIRE(metrics->events.size() == 2);
  CHECK(metrics->events[0].kind == EventKind::fault);
  CHECK(metrics->events[0].when.step == 6);
  CHECK(metrics->events[0].what == "rollout engine 1's process died (killed by signal 9)");
  CHECK(metrics->events[0].cost_s == 1.8);
  CHECK(metrics->events[1].kind == EventKind::checkpoint);
  CHECK(metrics->events[1].what == "run/checkpoints/step-8");
  CHECK(metrics->events[1].cost_s == 0.2);

  REQUIRE(metrics->end.has_value());
  CHECK(metrics->end->status == "ok");
  CHECK(metrics->end->final_accuracy == 0.8);
  CHECK(metrics->other_events == std::map<std::string, int64_t>{{"heartbeat", 1}});
  CHECK(metrics->warnings.empty());
}

TEST_CASE("report: fields a step line lacks stay absent, and null or bare NaN read as NaN", "[rl][report]") {
  RunDir dir;
  dir.write_metrics(
      "{\"event\":\"run\",\"run_id\":\"r\"}\n"
      "{\"event\":\"step\",\"step\":1,\"wall_s\":1.0}\n"
      "\n"
      "{\"event\":\"step\",\"step\":2,\"wall_s\":2.0,\"loss\":null,\"kl\":NaN,\"grad_norm\":-Infinity,"
      "\"note\":\"NaN stays text\"}\n");
  auto metrics = read_metrics(dir.metrics().string());
  REQUIRE(metrics.has_value());
  REQUIRE(metrics->steps.size() == 2);
  CHECK_FALSE(metrics->steps[0].reward_mean.has_value());
  CHECK_FALSE(metrics->steps[0].time_s[0].has_value());
  CHECK(std::isnan(*metrics->steps[1].loss));
  CHECK(std::isnan(*metrics->steps[1].kl));
  CHECK(std::isnan(*metrics->steps[1].grad_norm));
  CHECK_FALSE(metrics->end.has_value());
}

TEST_CASE("report: the summary states total steps, final and best accuracy, mean tokens/s and the time split in %",
          "[rl][report]") {
  RunDir dir;
  dir.write_metrics(realistic_run());
  const std::string html = render_html(read_metrics(dir.metrics().string()).value());

  CHECK_THAT(html, Catch::Contains("<title>RL run arith-grpo-7"));
  CHECK_THAT(html, Catch::Contains("mode: async"));
  CHECK_THAT(html, Catch::Contains("placement: disaggregated"));
  CHECK_THAT(html, Catch::Contains("algorithm: grpo"));
  CHECK_THAT(html, Catch::Contains("<span class=\"badge status ok\">status: ok</span>"));
  CHECK_THAT(html, Catch::Contains("<tr><th>Steps</th><td class=\"num\">12</td></tr>"));
  CHECK_THAT(html, Catch::Contains("<tr><th>Final accuracy</th><td class=\"num\">0.8</td></tr>"));
  CHECK_THAT(html, Catch::Contains("<tr><th>Best accuracy</th><td class=\"num\">0.8 (step 12)</td></tr>"));
  // 4000 + 100 s over s = 1..12.
  CHECK_THAT(html, Catch::Contains("<tr><th>Mean tokens/s</th><td class=\"num\">4650</td></tr>"));
  CHECK_THAT(html, Catch::Contains("<tr><th>Wall time</th><td class=\"num\">31.0 s</td></tr>"));
  CHECK_THAT(html, Catch::Contains("<tr><th>Faults</th><td class=\"num\">1 (1.8 s lost)</td></tr>"));
  // Each step: 0.8 + 0.1 + 0.5 + 0.02 + 0.08 = 1.5 s.
  CHECK_THAT(row_of(html, "<tr class=\"phase-generation\">"), Catch::Contains("53.3%"));
  CHECK_THAT(row_of(html, "<tr class=\"phase-reward\">"), Catch::Contains("6.7%"));
  CHECK_THAT(row_of(html, "<tr class=\"phase-train\">"), Catch::Contains("33.3%"));
  CHECK_THAT(row_of(html, "<tr class=\"phase-sync\">"), Catch::Contains("1.3%"));
  CHECK_THAT(row_of(html, "<tr class=\"phase-wait\">"), Catch::Contains("5.3%"));
  CHECK_THAT(row_of(html, "<tr class=\"phase-generation\">"), Catch::Contains("<td class=\"num\">9.6</td>"));
  // The events table and the config.
  CHECK_THAT(html, Catch::Contains("rollout engine 1&#39;s process died (killed by signal 9)"));
  CHECK_THAT(html, Catch::Contains("requeued 4 prompt groups; engine restarted and rejoined at version 6"));
  CHECK_THAT(html, Catch::Contains("saved run/checkpoints/step-8"));
  CHECK_THAT(html, Catch::Contains("<code>train.lr</code></td><td><code>0.0001</code>"));
  CHECK_THAT(html, Catch::Contains("event &quot;heartbeat&quot;"));
}

TEST_CASE("report: every plot is an inline svg with one point per record", "[rl][report]") {
  RunDir dir;
  dir.write_metrics(realistic_run());
  const std::string html = render_html(read_metrics(dir.metrics().string()).value());

  const std::string reward_steps = svg_by_id(html, "plot-reward-steps");
  REQUIRE_FALSE(reward_steps.empty());
  CHECK(line_points(reward_steps, "reward_mean").size() == 12);
  CHECK(count_of(reward_steps, "<circle class=\"dot series-reward_mean\"") == 12);
  CHECK(count_of(reward_steps, "<polygon class=\"band series-reward_mean\"") == 1);
  CHECK_THAT(reward_steps, Catch::Contains("reward mean ± std"));
  CHECK(count_of(reward_steps, "class=\"marker marker-fault\"") == 1);
  CHECK(count_of(reward_steps, "class=\"tick\"") >= 4);
  CHECK_THAT(reward_steps, Catch::Contains(">step</text>"));
  CHECK_THAT(reward_steps, Catch::Contains(">reward</text>"));

  CHECK(line_points(svg_by_id(html, "plot-accuracy-steps"), "accuracy").size() == 3);
  CHECK(line_points(svg_by_id(html, "plot-reward-wall"), "reward_mean").size() == 12);
  CHECK_THAT(svg_by_id(html, "plot-reward-wall"), Catch::Contains(">wall time (min)</text>"));
  CHECK(line_points(svg_by_id(html, "plot-accuracy-wall"), "accuracy").size() == 3);
  CHECK(line_points(svg_by_id(html, "plot-tokens-steps"), "tokens_per_s").size() == 12);
  const std::string staleness = svg_by_id(html, "plot-staleness-steps");
  CHECK(line_points(staleness, "staleness_mean").size() == 12);
  CHECK(line_points(staleness, "staleness_max").size() == 12);
  for (const char* signal : {"loss", "grad_norm", "kl", "clip_fraction", "entropy"}) {
    CAPTURE(signal);
    CHECK(line_points(svg_by_id(html, std::string("plot-") + signal + "-steps"), signal).size() == 12);
  }
  const std::string split = svg_by_id(html, "plot-time-split");
  for (const char* phase : {"generation", "reward", "train", "sync", "wait"}) {
    CAPTURE(phase);
    CHECK(count_of(split, std::string("<rect class=\"part-") + phase + "\"") == 12);
    CHECK_THAT(split, Catch::Contains(std::string(">") + phase + "</text>"));  // the legend
  }
  // Higher reward draws higher (smaller y).
  const auto reward = line_points(reward_steps, "reward_mean");
  CHECK(reward.back().second < reward.front().second);

  // Self-contained: nothing to fetch, nothing to run.
  CHECK(count_of(html, "<script") == 0);
  CHECK(count_of(html, "src=") == 0);
  CHECK(count_of(html, "href=") == 0);
}

TEST_CASE("report: a run without staleness or training signals has no such plots", "[rl][report]") {
  RunDir dir;
  dir.write_metrics("{\"event\":\"step\",\"step\":1,\"wall_s\":1.0,\"reward_mean\":0.5}\n");
  auto metrics = read_metrics(dir.metrics().string());
  REQUIRE(metrics.has_value());
  const std::string html = render_html(*metrics);
  CHECK(svg_by_id(html, "plot-staleness-steps").empty());
  CHECK(svg_by_id(html, "plot-loss-steps").empty());
  CHECK_FALSE(svg_by_id(html, "plot-tokens-steps").empty());
  CHECK_THAT(html, Catch::Contains("the file has no &quot;run&quot; line"));
}

TEST_CASE("report: a last line cut short is left out with a warning and the rest is read", "[rl][report]") {
  RunDir dir;
  std::string text = realistic_run();
  text.resize(text.size() - 30);  // into the end line
  dir.write_metrics(text);
  const size_t lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
  auto metrics = read_metrics(dir.metrics().string());
  REQUIRE(metrics.has_value());
  CHECK(metrics->steps.size() == 12);
  CHECK_FALSE(metrics->end.has_value());
  REQUIRE(metrics->warnings.size() == 1);
  CHECK_THAT(metrics->warnings[0], Catch::Contains("line " + std::to_string(lines) + " is not complete JSON"));
  CHECK_THAT(metrics->warnings[0], Catch::Contains("killed"));
  const std::string html = render_html(*metrics);
  CHECK_THAT(html, Catch::Contains("is not complete JSON"));
  CHECK_THAT(html, Catch::Contains("status: no end line"));
}

TEST_CASE("report: a malformed line before the last is an error naming its line number and the problem",
          "[rl][report]") {
  RunDir dir;
  const std::string head = "{\"event\":\"run\",\"run_id\":\"r\"}\n{\"event\":\"step\",\"step\":1,\"wall_s\":1}\n";
  const std::string tail = "{\"event\":\"step\",\"step\":3,\"wall_s\":3}\n";
  struct Case {
    const char* line;
    const char* says;
  };
  const Case cases[] = {
      {"{\"event\":\"step\",\"step\":2,\"wall", "not JSON"},
      {"[1, 2]", "a JSON array, not an object"},
      {"{\"step\":2,\"wall_s\":2}", "no \"event\""},
      {"{\"event\":\"step\",\"step\":2,\"wall_s\":\"soon\"}", "\"wall_s\" is a string"},
      {"{\"event\":\"step\",\"wall_s\":2}", "has no \"step\""},
      {"{\"event\":\"step\",\"step\":2.5,\"wall_s\":2}", "not a whole number"},
      {"{\"event\":\"step\",\"step\":2,\"wall_s\":2,\"loss\":\"low\"}", "\"loss\" is a string"},
      {"{\"event\":\"step\",\"step\":2,\"wall_s\":2,\"time_s\":{\"train\":true}}", "\"time_s.train\" is a boolean"},
      {"{\"event\":\"fault\",\"step\":2,\"wall_s\":2,\"what\":7}", "\"what\" is a number"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.line);
    dir.write_metrics(head + c.line + "\n" + tail);
    auto metrics = read_metrics(dir.metrics().string());
    REQUIRE_FALSE(metrics.has_value());
    CHECK(metrics.error().code() == ErrorCode::malformed);
    CHECK_THAT(metrics.error().message(), Catch::Contains(dir.metrics().string() + " line 3: "));
    CHECK_THAT(metrics.error().message(), Catch::Contains(c.says));
  }
}

TEST_CASE("report: a missing or empty metrics file is an error that says what writes it", "[rl][report]") {
  RunDir dir;
  SECTION("missing") {
    auto metrics = read_metrics(dir.metrics().string());
    REQUIRE_FALSE(metrics.has_value());
    CHECK(metrics.error().code() == ErrorCode::not_found);
    CHECK_THAT(metrics.error().message(), Catch::Contains("no metrics file at " + dir.metrics().string()));
    CHECK_THAT(metrics.error().message(), Catch::Contains("troupe rl train"));
    auto written = write_report(dir.path.string());
    REQUIRE_FALSE(written.has_value());
    CHECK(written.error().code() == ErrorCode::not_found);
    CHECK(dir.entries().empty());
  }
  SECTION("empty, or blank lines only") {
    for (const char* text : {"", "\n \n\n"}) {
      dir.write_metrics(text);
      auto metrics = read_metrics(dir.metrics().string());
      REQUIRE_FALSE(metrics.has_value());
      CHECK(metrics.error().code() == ErrorCode::invalid_argument);
      CHECK_THAT(metrics.error().message(), Catch::Contains(dir.metrics().string() + " is empty"));
      CHECK_THAT(metrics.error().message(), Catch::Contains("troupe rl train"));
    }
  }
}

TEST_CASE("report: strings from the file are escaped, never markup", "[rl][report]") {
  RunDir dir;
  const json lines[] = {
      {{"event", "run"},
       {"run_id", "<script>alert('id')</script>"},
       {"mode", "a\"sync"},
       {"config", {{"<b>key</b>", "</style><script>alert(1)</script>"}}}},
      {{"event", "step"}, {"step", 1}, {"wall_s", 1.0}, {"reward_mean", 0.5}},
      {{"event", "fault"}, {"step", 1}, {"wall_s", 1.5}, {"what", "<img src=x onerror=alert(2)>"}, {"action", "a & b"}},
      {{"event", "<svg onload=alert(3)>"}},
      {{"event", "end"}, {"status", "failed: <script>alert(4)</script>"}}};
  std::string text;
  for (const json& line : lines) text += line.dump() + "\n";
  dir.write_metrics(text);
  const std::string html = render_html(read_metrics(dir.metrics().string()).value());
  CHECK(count_of(html, "<script") == 0);
  CHECK(count_of(html, "<img") == 0);
  CHECK(count_of(html, "<b>") == 0);
  CHECK(count_of(html, "<svg onload") == 0);
  CHECK(count_of(html, "</style>") == 1);  // the page's own
  CHECK_THAT(html, Catch::Contains("&lt;script&gt;alert(&#39;id&#39;)&lt;/script&gt;"));
  CHECK_THAT(html, Catch::Contains("&lt;img src=x onerror=alert(2)&gt;"));
  CHECK_THAT(html, Catch::Contains("a &amp; b"));
  CHECK_THAT(html, Catch::Contains("mode: a&quot;sync"));
  CHECK_THAT(html, Catch::Contains("status: failed: &lt;script&gt;"));
  CHECK_THAT(html, Catch::Contains("<span class=\"badge status failed\">"));
  CHECK_THAT(html, Catch::Contains("Content-Security-Policy\" content=\"default-src 'none'"));
}

TEST_CASE("report: wall time is cumulative across a resume, plots over steps keep the redone steps", "[rl][report]") {
  RunDir dir;
  std::string text = json{{"event", "run"}, {"run_id", "resumed"}}.dump() + "\n";
  for (int s = 1; s <= 5; ++s) text += step_line(s, 10.0 * s).dump() + "\n";
  text += json{{"event", "checkpoint"}, {"step", 4}, {"wall_s", 42.0}, {"path", "ck/step-4"}}.dump() + "\n";
  // Killed after step 5 at 50 s; a new process resumes from step 4 with its
  // clock at 0 and redoes step 5.
  text += json{{"event", "resume"}, {"step", 4}, {"wall_s", 0.0}, {"from", "ck/step-4"}}.dump() + "\n";
  for (int s = 5; s <= 7; ++s) text += step_line(s, 8.0 * (s - 4)).dump() + "\n";
  text += json{{"event", "end"}, {"step", 7}, {"wall_s", 25.0}, {"status", "ok"}}.dump() + "\n";
  dir.write_metrics(text);

  auto metrics = read_metrics(dir.metrics().string());
  REQUIRE(metrics.has_value());
  REQUIRE(metrics->steps.size() == 8);
  CHECK(metrics->steps[4].when.run_wall_s == 50.0);
  CHECK(metrics->events[1].kind == EventKind::resume);
  CHECK(metrics->events[1].when.run_wall_s == 50.0);
  CHECK(metrics->steps[5].when.wall_s == 8.0);
  CHECK(metrics->steps[5].when.run_wall_s == 58.0);
  CHECK(metrics->steps[7].when.run_wall_s == 74.0);
  CHECK(metrics->end->when->run_wall_s == 75.0);

  const std::string html = render_html(*metrics);
  CHECK_THAT(html, Catch::Contains("<tr><th>Wall time</th><td class=\"num\">75.0 s</td></tr>"));
  CHECK_THAT(html, Catch::Contains("<tr><th>Steps</th><td class=\"num\">7 (1 redone after a resume)</td></tr>"));
  CHECK_THAT(html, Catch::Contains("resumed from ck/step-4"));
  CHECK_THAT(html, Catch::Contains("redoes step 5, logged before the stop"));
  CHECK(line_points(svg_by_id(html, "plot-reward-steps"), "reward_mean").size() == 7);
  const auto over_time = line_points(svg_by_id(html, "plot-reward-wall"), "reward_mean");
  REQUIRE(over_time.size() == 8);
  for (size_t i = 1; i < over_time.size(); ++i) CHECK(over_time[i].first > over_time[i - 1].first);
  CHECK(count_of(svg_by_id(html, "plot-reward-wall"), "class=\"marker marker-resume\"") == 1);
}

TEST_CASE("report: plots of one point, all-equal values, no evals or NaN and infinity still draw", "[rl][report]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  RunMetrics m;
  m.source = "memory";
  SECTION("one step, no evals") {
    StepRecord r;
    r.when = {3, 1.0, 1.0};
    r.reward_mean = 0.5;
    r.tokens_per_s = 1000;
    m.steps.push_back(r);
    const std::string html = render_html(m);
    const std::string reward = svg_by_id(html, "plot-reward-steps");
    CHECK(line_points(reward, "reward_mean").size() == 1);
    CHECK(count_of(reward, "<circle") == 1);  // a line of one point is invisible: its dot is not
    const std::string accuracy = svg_by_id(html, "plot-accuracy-steps");
    CHECK_THAT(accuracy, Catch::Contains("class=\"plot empty\""));
    CHECK_THAT(accuracy, Catch::Contains("no eval line with an accuracy yet"));
    CHECK_THAT(svg_by_id(html, "plot-time-split"), Catch::Contains("class=\"plot empty\""));
    CHECK_THAT(html, Catch::Contains("<tr><th>Final accuracy</th><td class=\"num\">no eval yet</td></tr>"));
  }
  SECTION("all-equal values, NaN and infinity") {
    for (int s = 0; s < 6; ++s) {
      StepRecord r;
      r.when = {s, 1.0 * s, 1.0 * s};
      r.reward_mean = s == 2 ? nan : s == 4 ? inf : 0.25;
      r.reward_std = s == 1 ? nan : 0.0;
      r.loss = -inf;
      r.time_s[0] = s == 3 ? nan : 1.0;
      m.steps.push_back(r);
    }
    const std::string html = render_html(m);
    const std::string reward = svg_by_id(html, "plot-reward-steps");
    const auto points = line_points(reward, "reward_mean");
    REQUIRE(points.size() == 4);
    for (const auto& [x, y] : points) {
      CHECK(std::isfinite(x));
      CHECK(y == points[0].second);  // equal values: one flat line, mid-plot
      CHECK(y > 30);
      CHECK(y < 216);
    }
    CHECK(count_of(reward, "nan") == 0);
    CHECK(count_of(reward, "inf") == 0);
    CHECK_THAT(svg_by_id(html, "plot-loss-steps"), Catch::Contains("class=\"plot empty\""));
    CHECK(count_of(svg_by_id(html, "plot-time-split"), "<rect class=\"part-generation\"") == 5);
  }
  SECTION("values near the limits of double") {
    for (int s = 0; s < 3; ++s) {
      StepRecord r;
      r.when = {s, 0, 0};
      r.reward_mean = s == 1 ? -1.7e308 : 1.7e308;
      r.tokens_per_s = 1e-310 * s;
      m.steps.push_back(r);
    }
    const std::string html = render_html(m);
    CHECK(line_points(svg_by_id(html, "plot-reward-steps"), "reward_mean").size() == 3);
    CHECK(line_points(svg_by_id(html, "plot-tokens-steps"), "tokens_per_s").size() == 3);
  }
}

TEST_CASE("report: a long run's time split is drawn as bins of steps, quickly", "[rl][report]") {
  RunDir dir;
  std::string text;
  for (int s = 1; s <= 5000; ++s) text += step_line(s, 2.0 * s).dump() + "\n";
  dir.write_metrics(text);
  const auto start = std::chrono::steady_clock::now();
  auto written = write_report(dir.path.string());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(written.has_value());
  const std::string html = read_file(*written);
  const std::string split = svg_by_id(html, "plot-time-split");
  CHECK(count_of(split, "<rect class=\"part-train\"") == 200);  // 25 steps a bar
  CHECK_THAT(html, Catch::Contains("each bar: the mean of 25 steps"));
  CHECK(line_points(svg_by_id(html, "plot-reward-steps"), "reward_mean").size() == 5000);
  CHECK(count_of(svg_by_id(html, "plot-reward-steps"), "<circle") == 0);
  CHECK(seconds < 5.0);
}

TEST_CASE("report: write_report writes report.html beside the metrics and returns its path", "[rl][report]") {
  RunDir dir;
  dir.write_metrics(realistic_run());
  auto written = write_report(dir.path.string());
  REQUIRE(written.has_value());
  CHECK(*written == (dir.path / "report.html").string());
  CHECK(dir.entries() == std::vector<std::string>{"metrics.jsonl", "report.html"});
  const std::string html = read_file(*written);
  CHECK(html.starts_with("<!DOCTYPE html>"));
  CHECK(html.ends_with("</html>\n"));
  // Again over the old page (a refresh while the run goes on).
  REQUIRE(write_report(dir.path.string()).has_value());
  CHECK(read_file(*written) == html);
}

TEST_CASE("report: a page that cannot be written is an error naming the path, the older page stays whole",
          "[rl][report]") {
  RunDir dir;
  dir.write_metrics(realistic_run());
  const fs::path page = dir.path / "report.html";
  SECTION("report.html is a directory: the rename fails and the temporary file goes") {
    fs::create_directory(page);
    auto written = write_report(dir.path.string());
    REQUIRE_FALSE(written.has_value());
    CHECK(written.error().code() == ErrorCode::storage);
    CHECK_THAT(written.error().message(), Catch::Contains("cannot write " + page.string()));
    CHECK_THAT(written.error().message(), Catch::Contains("renaming"));
    CHECK_THAT(written.error().message(), Catch::Contains("make the run directory writable"));
    CHECK(dir.entries() == std::vector<std::string>{"metrics.jsonl", "report.html"});
  }
  SECTION("the disk fills mid-write (a file size limit)") {
    REQUIRE(write_report(dir.path.string()).has_value());
    const std::string before = read_file(page);
    dir.write_metrics(realistic_run(40));
    auto written = with_file_size_limit(4096, [&] { return write_report(dir.path.string()); });
    REQUIRE_FALSE(written.has_value());
    CHECK(written.error().code() == ErrorCode::storage);
    CHECK_THAT(written.error().message(), Catch::Contains(page.string()));
    CHECK_THAT(written.error().message(), Catch::Contains("File too large"));
    CHECK(dir.entries() == std::vector<std::string>{"metrics.jsonl", "report.html"});
    CHECK(read_file(page) == before);
  }
  SECTION("a run directory that does not exist") {
    auto written = write_report((dir.path / "nope").string());
    REQUIRE_FALSE(written.has_value());
    CHECK(written.error().code() == ErrorCode::not_found);
    CHECK_THAT(written.error().message(), Catch::Contains((dir.path / "nope" / "metrics.jsonl").string()));
  }
}

TEST_CASE("report: numbers and strings are written for people and for HTML", "[rl][report]") {
  CHECK(number_text(0.731234) == "0.7312");
  CHECK(number_text(5100.2) == "5100");
  CHECK(number_text(34.5) == "34.5");
  CHECK(number_text(0) == "0");
  CHECK(number_text(1.5e-5) == "1.5e-05");
  CHECK(number_text(std::nan("")) == "NaN");
  CHECK(escape_html("<a href=\"x\">&'</a>") == "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
}
