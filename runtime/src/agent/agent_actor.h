// The node agent's actor: who it is (the head watches it, so that the agent
// process dying marks the node dead at once), and the jobs it runs: each a
// child process in its own process group, its output in a log file, its end
// reported to the head.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "cluster/protocol.h"
#include "troupe/actor.h"

namespace troupe::cluster {

/// From a job's waiter thread to the agent's actor.
struct JobExited {
  std::string id;
  int status = 0;  // as waitpid gives it
};
/// From a worker's waiter thread to the agent's actor.
struct WorkerGone {
  std::string id;
  int status = 0;
};
/// From the agent's registration thread: the head it is registered with now
/// (after a head restart, a new one).
struct HeadChanged {
  AnyRef head;
};

class AgentActor final : public Actor<AgentActor, GetNodeId, RunJob, ReadJobLog, StopJob, JobExited, HeadChanged,
                                      StartWorker, WorkerReady, WorkerGone, StopWorker> {
 public:
  /// How long a worker has to report ready.
  static constexpr std::chrono::milliseconds kWorkerStartTimeout{30'000};
  /// How long a worker has to stop gracefully (SIGTERM) when the agent stops.
  static constexpr std::chrono::milliseconds kWorkerStopGrace{2'000};

  /// `address`: the agent's own, which its workers dial.
  AgentActor(std::string node_id, std::filesystem::path log_dir, std::string address);

  std::string handle(const GetNodeId&) { return node_id_; }
  Result<void> handle(const RunJob& m);
  Result<std::string> handle(const ReadJobLog& m);
  Result<void> handle(const StopJob& m);
  void handle(const JobExited& m);
  /// Tells the new head how the jobs it may not know the end of ended.
  void handle(const HeadChanged& m);

  /// Starts a worker process (the answer comes once it serves).
  Deferred<WorkerStarted> handle(const StartWorker& m);
  void handle(const WorkerReady& m);
  void handle(const WorkerGone& m);
  Result<void> handle(const StopWorker& m);

  /// Stops what still runs (SIGKILL to each job's and worker's process group).
  void on_stop(const ExitReason& reason) override;

 private:
  struct Job {
    pid_t pid = -1;
    AnyRef report_to;
    std::filesystem::path log;
    bool stop_requested = false;
    bool running = true;
    std::thread waiter;
  };
  struct Worker {
    pid_t pid = -1;
    std::filesystem::path log;
    Deferred<WorkerStarted> starting;
    AnyRef ref;
    std::thread waiter;
  };
  std::filesystem::path log_of(const char* prefix, const std::string& id) const;

  std::string node_id_;
  std::filesystem::path log_dir_;
  std::string address_;
  std::map<std::string, Worker> workers_;
  std::map<std::string, Job> jobs_;
  /// Ended jobs, told again to each new head (a head that was down when a
  /// job ended learns it when the agent registers with it again).
  std::map<std::string, JobEnded> ended_;
  AnyRef head_;
};

}  // namespace troupe::cluster
