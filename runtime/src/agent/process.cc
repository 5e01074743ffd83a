#include "agent/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace troupe::cluster {

Result<pid_t> start_process(const ProcessSpec& spec) {
  if (spec.argv.empty()) return error(ErrorCode::invalid_argument, "no command");
  std::error_code ec;
  std::filesystem::create_directories(spec.log.parent_path(), ec);
  int out = ::open(spec.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    return error(ErrorCode::storage, "cannot write the log " + spec.log.string() + ": " + std::strerror(errno));
  }
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls until exec.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    bool replaced = false;
    for (auto& add : spec.env) {
      auto eq = add.find('=');
      if (eq != std::string::npos && kv.substr(0, eq + 1) == std::string_view(add).substr(0, eq + 1)) replaced = true;
    }
    if (!replaced) env_strings.emplace_back(kv);
  }
  for (auto& kv : spec.env) env_strings.push_back(kv);
  std::vector<char*> envp, argv;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int failed[2];  // the child's errno if exec fails; closed by a successful exec
  if (pipe2(failed, O_CLOEXEC) != 0) {
    ::close(out);
    return error(ErrorCode::storage, std::string("pipe: ") + std::strerror(errno));
  }
  pid_t parent = getpid();
  bool die_with_agent = spec.die_with_agent;
  pid_t pid = fork();
  if (pid < 0) {
    ::close(out);
    ::close(failed[0]);
    ::close(failed[1]);
    return error(ErrorCode::storage, std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);  // its own group: a stop reaches everything it started
    if (die_with_agent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the agent died before the prctl
    }
    // The agent blocks SIGTERM/SIGINT for its own signal thread; a child must
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
                 "cannot run '" + spec.argv[0] + "': " + std::strerror(err) + " (is it on the node's PATH?)");
  }
  return pid;
}

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
}

}  // namespace troupe::cluster
