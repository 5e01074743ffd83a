// Starting the processes a node agent runs (jobs, workers): fork/exec with
// the output in a log file, in a process group of their own, with a clear
// error when the program cannot be run.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "troupe/status.h"

namespace troupe::cluster {

struct ProcessSpec {
  /// argv[0] is looked up on PATH.
  std::vector<std::string> argv;
  /// Added to (or replacing in) the agent's environment ("K=V").
  std::vector<std::string> env;
  /// stdout and stderr go here (truncated).
  std::filesystem::path log;
  /// The child is killed when the agent dies (workers: nothing would watch
  /// them any more). Jobs outlive a crashed agent, as Ray's do.
  bool die_with_agent = false;
};

/// Starts the process; fails (with errno's reason) when it cannot be run.
Result<pid_t> start_process(const ProcessSpec& spec);

/// A waitpid status as an exit code: the code, or -signal.
int exit_code_of(int status);

}  // namespace troupe::cluster
