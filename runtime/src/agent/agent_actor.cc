#include "agent_actor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "log.h"

extern char** environ;

namespace troupe::cluster {

AgentActor::AgentActor(std::string node_id, std::filesystem::path log_dir)
    : node_id_(std::move(node_id)), log_dir_(std::move(log_dir)) {}

std::filesystem::path AgentActor::log_of(const std::string& id) const {
  // Ids come from the head; keep them to a file name's characters anyway.
  std::string safe;
  for (char c : id) safe += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return log_dir_ / ("job-" + safe + ".log");
}

Result<void> AgentActor::handle(const RunJob& m) {
  if (m.command.empty()) return error(ErrorCode::invalid_argument, "job: empty command");
  if (jobs_.count(m.id)) return error(ErrorCode::already_exists, "job " + m.id + " already runs here");
  std::error_code ec;
  std::filesystem::create_directories(log_dir_, ec);
  std::filesystem::path log = log_of(m.id);
  int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return error(ErrorCode::storage, "job: cannot write its log " + log.string() + ": " + std::strerror(errno));
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls until exec.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (auto& kv : m.env) env_strings.push_back(kv);
  std::vector<char*> envp, argv;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = m.command;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int failed[2];  // the child's errno if exec fails; closed by a successful exec
  if (pipe2(failed, O_CLOEXEC) != 0) {
    ::close(out);
    return error(ErrorCode::storage, std::string("job: pipe: ") + std::strerror(errno));
  }
  pid_t pid = fork();
  if (pid < 0) {
    ::close(out);
    ::close(failed[0]);
    ::close(failed[1]);
    return error(ErrorCode::storage, std::string("job: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);  // its own group: a stop reaches everything it started
    // The agent blocks SIGTERM/SIGINT for its own signal thread; a job must
    // not inherit that (or a stop would never reach it).
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    int in = ::open("/dev/null", O_RDONLY);
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    execvpe(argv[0], argv.data(), envp.data());
    int err = errno;
    (void)!write(failed[1], &err, sizeof(err));
    _exit(127);
  }
  ::close(out);
  ::close(failed[1]);
  int err = 0;
  ssize_t got = read(failed[0], &err, sizeof(err));
  ::close(failed[0]);
  if (got == sizeof(err)) {
    waitpid(pid, nullptr, 0);
    return error(ErrorCode::invalid_argument,
                 "job: cannot run '" + m.command[0] + "': " + std::strerror(err) + " (is it on the node's PATH?)");
  }
  Job& job = jobs_[m.id];
  job.pid = pid;
  job.report_to = m.report_to;
  job.log = log;
  AnyRef me = self();
  std::string id = m.id;
  job.waiter = std::thread([pid, me, id] {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    (void)me.tell(JobExited{id, status});
  });
  TROUPE_LOG(info, "event=job_started job={} pid={} command=\"{}\"", m.id, pid, m.command[0]);
  return {};
}

void AgentActor::handle(const JobExited& m) {
  auto it = jobs_.find(m.id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.waiter.joinable()) job.waiter.join();
  job.running = false;
  int code = WIFEXITED(m.status) ? WEXITSTATUS(m.status) : WIFSIGNALED(m.status) ? -WTERMSIG(m.status) : -1;
  TROUPE_LOG(info, "event=job_ended job={} exit_code={} stopped={}", m.id, code, job.stop_requested);
  JobEnded ended{m.id, code, job.stop_requested};
  // To the head that started it, or (it restarted since) the one now.
  if (!job.report_to || !job.report_to.tell(ended).ok()) {
    if (head_) (void)head_.tell(ended);
  }
  constexpr size_t kRemembered = 1000;
  if (ended_.size() >= kRemembered) ended_.erase(ended_.begin());
  ended_[m.id] = ended;
}

void AgentActor::handle(const HeadChanged& m) {
  head_ = m.head;
  for (auto& [id, ended] : ended_) (void)head_.tell(ended);
}

Result<std::string> AgentActor::handle(const ReadJobLog& m) {
  std::filesystem::path log = log_of(m.id);
  std::ifstream f(log, std::ios::binary);
  if (!f) return error(ErrorCode::not_found, "job " + m.id + ": no log on node " + node_id_);
  f.seekg(0, std::ios::end);
  uint64_t size = static_cast<uint64_t>(f.tellg());
  if (m.offset >= size) return std::string();
  uint64_t n = std::min<uint64_t>({size - m.offset, m.max_bytes, uint64_t{16} << 20});
  std::string out(n, '\0');
  f.seekg(static_cast<std::streamoff>(m.offset));
  f.read(out.data(), static_cast<std::streamsize>(n));
  out.resize(static_cast<size_t>(f.gcount()));
  return out;
}

Result<void> AgentActor::handle(const StopJob& m) {
  auto it = jobs_.find(m.id);
  if (it == jobs_.end()) return error(ErrorCode::not_found, "job " + m.id + " does not run on node " + node_id_);
  Job& job = it->second;
  if (!job.running) return {};
  job.stop_requested = true;
  ::kill(-job.pid, SIGTERM);
  std::string id = m.id;
  after(std::chrono::seconds(5), [this, id] {
    auto j = jobs_.find(id);
    if (j != jobs_.end() && j->second.running) ::kill(-j->second.pid, SIGKILL);
  });
  return {};
}

void AgentActor::on_stop(const ExitReason&) {
  for (auto& [id, job] : jobs_) {
    if (job.running) ::kill(-job.pid, SIGKILL);
    if (job.waiter.joinable()) job.waiter.join();
  }
}

}  // namespace troupe::cluster
