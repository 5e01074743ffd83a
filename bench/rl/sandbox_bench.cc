// The code sandbox's cost per run (rl/reward/sandbox.h): a trivial Python
// program (`pass`) run in a sandbox, serially, against the floor of plain
// fork + exec + wait of the same interpreter and arguments in the same run;
// the same sandbox without its memory cgroup (memory_cgroup.h), for what
// the cgroup costs;
// and code_rewards' throughput (one sandbox per completion, the harness, the
// completion's tests) at 2 at a time, against twice the plain rate: over
// distinct completions, and over groups of 8 samples whose repeats run once.
// Needs root, like the sandbox.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "../common/report.h"
#include "reward/sandbox.h"
#include "tasks/code.h"

using troupe::bench::emit;
using troupe::bench::quantile;
using troupe::bench::seconds_since;
using namespace troupe::rl;
using Clock = std::chrono::steady_clock;

namespace {

// Seconds for fork + exec of `argv` with stdout and stderr on /dev/null,
// then waitpid.
double plain_run_seconds(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "sandbox bench: %s failed\n", argv[0].c_str());
    std::exit(1);
  }
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = troupe::bench::quick(argc, argv) ? 10 : 50;
  if (troupe::Status s = reward::sandbox_available(); !s.ok()) {
    std::fprintf(stderr, "sandbox bench: %s\n", s.to_string().c_str());
    return 1;
  }
  const std::vector<std::string> python = {std::string(reward::kPython), "-I", "-S", "-B", "-c", "pass"};
  const troupe::Status cgroup = reward::sandbox_memory_cgroup_available();
  if (!cgroup.ok()) {
    std::fprintf(stderr, "sandbox bench: runs without a memory cgroup: %s\n", cgroup.to_string().c_str());
  }
  reward::SandboxLimits no_cgroup;
  no_cgroup.total_memory_bytes = 0;
  std::vector<double> sandboxed, without_cgroup, plain;
  // In turn, so that the three see the same machine.
  for (int i = 0; i < runs; ++i) {
    plain.push_back(plain_run_seconds(python));
    for (auto* limits : {&no_cgroup, static_cast<reward::SandboxLimits*>(nullptr)}) {
      const auto t0 = Clock::now();
      auto r = reward::run_sandboxed({.argv = python, .files = {}, .stdin_data = {}},
                                     limits != nullptr ? *limits : reward::SandboxLimits{});
      const double seconds = seconds_since(t0);
      if (!r || !r->succeeded()) {
        std::fprintf(stderr, "sandbox bench: a sandboxed run failed: %s\n",
                     r ? r->err.c_str() : r.error().to_string().c_str());
        return 1;
      }
      (limits != nullptr ? without_cgroup : sandboxed).push_back(seconds);
    }
  }
  const double sandbox_ms = quantile(sandboxed, 0.5) * 1e3, plain_ms = quantile(plain, 0.5) * 1e3;
  emit("sandbox", "python_pass_run_p50", sandbox_ms, "ms", "fork_exec_python_p50", plain_ms, "< 2x fork+exec");
  emit("sandbox", "python_pass_run_no_memory_cgroup_p50", quantile(without_cgroup, 0.5) * 1e3, "ms",
       "fork_exec_python_p50", plain_ms, "");

  // code_reward: 2 sandboxes at a time over a batch of reference answers.
  auto problems = tasks::CodeTask::make({}, 1).value().take(static_cast<size_t>(runs));
  std::vector<std::string> completions;
  for (const auto& p : problems) completions.push_back(p.reference);
  const auto t0 = Clock::now();
  auto rewards = tasks::code_rewards(problems, completions, tasks::code_limits(), 2);
  const double seconds = seconds_since(t0);
  if (!rewards) {
    std::fprintf(stderr, "sandbox bench: %s\n", rewards.error().to_string().c_str());
    return 1;
  }
  // The floor: two plain fork + exec runs at a time, one per core.
  emit("sandbox", "code_rewards_per_s_2_concurrent", static_cast<double>(runs) / seconds, "1/s",
       "fork_exec_python_per_s_x2", 2e3 / plain_ms, "");

  // Groups of 8 samples as a policy that has mostly learned gives them:
  // 5 right answers, 2 of the weak teacher's, 1 broken. Repeats on the
  // same tests run once.
  std::vector<tasks::CodeProblem> grouped;
  std::vector<std::string> answers;
  std::mt19937_64 rng(9);
  for (const auto& p : problems) {
    for (int k = 0; k < 8; ++k) {
      grouped.push_back(p);
      answers.push_back(k < 5 ? p.reference : k < 7 ? tasks::CodeTask::weak_teacher_answer(p, 1.0, rng) : "x+");
    }
  }
  size_t made = 0;
  const auto g0 = Clock::now();
  auto group_rewards = tasks::code_rewards(grouped, answers, tasks::code_limits(), 2, &made);
  const double group_seconds = seconds_since(g0);
  if (!group_rewards) {
    std::fprintf(stderr, "sandbox bench: %s\n", group_rewards.error().to_string().c_str());
    return 1;
  }
  std::fprintf(stderr, "sandbox bench: %zu completions in groups of 8 made %zu sandboxed runs\n", grouped.size(), made);
  emit("sandbox", "code_rewards_per_s_2_concurrent_groups_of_8", static_cast<double>(grouped.size()) / group_seconds,
       "1/s", "fork_exec_python_per_s_x2", 2e3 / plain_ms, "");
  return 0;
}
