#include "agent_actor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "agent/process.h"
#include "log.h"

namespace troupe::cluster {

AgentActor::AgentActor(std::string node_id, std::filesystem::path log_dir, std::string address)
    : node_id_(std::move(node_id)), log_dir_(std::move(log_dir)), address_(std::move(address)) {}

std::filesystem::path AgentActor::log_of(const char* prefix, const std::string& id) const {
  // Ids come from the head; keep them to a file name's characters anyway.
  std::string safe;
  for (char c : id) safe += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return log_dir_ / (prefix + safe + ".log");
}

namespace {
/// Waits for `pid` on a thread of its own (waitpid blocks) and calls `then`
/// with its status: a dead child is noticed at once.
std::thread wait_in_thread(pid_t pid, std::function<void(int)> then) {
  return std::thread([pid, then = std::move(then)] {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    then(status);
  });
}

/// CUDA_VISIBLE_DEVICES for a worker given the node's GPUs `gpus`: those
/// indices of the agent's own CUDA_VISIBLE_DEVICES when it has one (the
/// node's GPU i is the i-th the agent sees), else the indices themselves.
/// An index past the agent's list is left out: the worker must not get a
/// GPU that was not reserved for it (with none left it sees no GPU, and
/// says so when it asks for one).
std::string visible_gpus(const std::vector<uint32_t>& gpus, const char* inherited) {
  std::vector<std::string> seen;
  if (inherited != nullptr) {
    std::string_view rest(inherited);
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      if (!item.empty()) seen.emplace_back(item);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }
  std::string out;
  for (uint32_t g : gpus) {
    std::string id = inherited == nullptr ? std::to_string(g) : g < seen.size() ? seen[g] : std::string();
    if (id.empty()) continue;
    out += (out.empty() ? "" : ",") + id;
  }
  return out;
}
}  // namespace

Result<void> AgentActor::handle(const RunJob& m) {
  if (m.command.empty()) return error(ErrorCode::invalid_argument, "job: empty command");
  if (jobs_.count(m.id)) return error(ErrorCode::already_exists, "job " + m.id + " already runs here");
  std::filesystem::path log = log_of("job-", m.id);
  auto pid = start_process(ProcessSpec{m.command, m.env, log, /*die_with_agent=*/false});
  if (!pid) return error(pid.error().code(), "job: " + pid.error().message());
  Job& job = jobs_[m.id];
  job.pid = *pid;
  job.report_to = m.report_to;
  job.log = log;
  AnyRef me = self();
  std::string id = m.id;
  job.waiter = wait_in_thread(*pid, [me, id](int status) { (void)me.tell(JobExited{id, status}); });
  TROUPE_LOG(info, "event=job_started job={} pid={} command=\"{}\"", m.id, *pid, m.command[0]);
  return {};
}

void AgentActor::handle(const JobExited& m) {
  auto it = jobs_.find(m.id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (job.waiter.joinable()) job.waiter.join();
  job.running = false;
  int code = exit_code_of(m.status);
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
  std::filesystem::path log = log_of("job-", m.id);
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

Deferred<WorkerStarted> AgentActor::handle(const StartWorker& m) {
  auto reply = defer<WorkerStarted>();
  if (workers_.count(m.worker_id)) {
    reply.fail(Status(ErrorCode::already_exists, "worker " + m.worker_id + " already runs on node " + node_id_));
    return reply;
  }
  // The worker listens on the agent's host, any port.
  std::string listen = address_;
  if (auto colon = listen.rfind(':'); colon != std::string::npos) listen = listen.substr(0, colon) + ":0";
  std::filesystem::path log = log_of("worker-", m.worker_id);
  std::vector<std::string> env{std::string(kWorkerIdEnv) + "=" + m.worker_id,
                               std::string(kWorkerAgentEnv) + "=" + address_,
                               std::string(kWorkerListenEnv) + "=" + listen};
  // An idle worker polls the network for a while before it sleeps (fast
  // round trips); once this node has more workers than cores, that polling
  // takes the cores the others need, so further workers do not poll.
  if (getenv("TROUPE_WORKER_SPIN_US") == nullptr && workers_.size() + 1 > std::thread::hardware_concurrency()) {
    env.push_back("TROUPE_WORKER_SPIN_US=0");
  }
  if (m.limit_gpus) env.push_back("CUDA_VISIBLE_DEVICES=" + visible_gpus(m.gpus, getenv("CUDA_VISIBLE_DEVICES")));
  auto pid = start_process(ProcessSpec{{m.executable}, env, log, /*die_with_agent=*/true});
  if (!pid) {
    reply.fail(Status(pid.error().code(), "worker: " + pid.error().message()));
    return reply;
  }
  Worker& w = workers_[m.worker_id];
  w.pid = *pid;
  w.log = log;
  w.starting = reply;
  AnyRef me = self();
  std::string id = m.worker_id;
  w.waiter = wait_in_thread(*pid, [me, id](int status) { (void)me.tell(WorkerGone{id, status}); });
  // A program that never calls troupe::serve_if_worker() (nor connects to
  // the cluster) runs as a driver instead: say so rather than wait forever.
  after(kWorkerStartTimeout, [this, id] {
    auto it = workers_.find(id);
    if (it == workers_.end() || !it->second.starting.pending()) return;
    it->second.starting.fail(Status(
        ErrorCode::timeout, "worker " + id + " did not report ready within " +
                                std::to_string(kWorkerStartTimeout.count()) +
                                " ms: does the program call troupe::serve_if_worker() first in main()? (its output: " +
                                it->second.log.string() + ")"));
    ::kill(-it->second.pid, SIGKILL);
  });
  TROUPE_LOG(info, "event=worker_starting worker={} pid={} executable={}", m.worker_id, *pid, m.executable);
  return reply;
}

void AgentActor::handle(const WorkerReady& m) {
  auto it = workers_.find(m.worker_id);
  if (it == workers_.end()) return;
  it->second.ref = m.worker;
  if (it->second.starting.pending()) it->second.starting.complete(WorkerStarted{m.where, it->second.pid});
}

void AgentActor::handle(const WorkerGone& m) {
  auto it = workers_.find(m.id);
  if (it == workers_.end()) return;
  Worker& w = it->second;
  if (w.waiter.joinable()) w.waiter.join();
  int code = exit_code_of(m.status);
  TROUPE_LOG(info, "event=worker_exited worker={} exit_code={}", m.id, code);
  if (w.starting.pending()) {
    w.starting.fail(Status(ErrorCode::start_failed, "worker " + m.id + " exited with code " + std::to_string(code) +
                                                        " before it was ready (its output: " + w.log.string() + ")"));
  }
  if (head_) (void)head_.tell(WorkerExited{node_id_, m.id, m.status});
  workers_.erase(it);
}

Result<void> AgentActor::handle(const StopWorker& m) {
  auto it = workers_.find(m.worker_id);
  if (it == workers_.end()) return {};
  ::kill(-it->second.pid, SIGTERM);
  std::string id = m.worker_id;
  after(std::chrono::seconds(5), [this, id] {
    if (auto w = workers_.find(id); w != workers_.end()) ::kill(-w->second.pid, SIGKILL);
  });
  return {};
}

void AgentActor::on_stop(const ExitReason&) {
  for (auto& [id, job] : jobs_) {
    if (job.running) ::kill(-job.pid, SIGKILL);
    if (job.waiter.joinable()) job.waiter.join();
  }
  // Workers stop gracefully (their actors' final snapshots), or are killed
  // after the grace period.
  std::vector<pid_t> pids;
  for (auto& [id, w] : workers_) {
    ::kill(-w.pid, SIGTERM);
    pids.push_back(w.pid);
  }
  std::mutex mu;
  std::condition_variable cv;
  bool reaped = false;
  std::thread reaper([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, kWorkerStopGrace, [&] { return reaped; })) {
      for (pid_t pid : pids) ::kill(-pid, SIGKILL);
    }
  });
  for (auto& [id, w] : workers_) {
    if (w.waiter.joinable()) w.waiter.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    reaped = true;
  }
  cv.notify_all();
  reaper.join();
}

}  // namespace troupe::cluster
