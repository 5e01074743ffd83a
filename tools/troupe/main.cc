// The `troupe` command line: start a head or a node agent (in the background,
// or in the foreground with --block), look at a cluster, stop what was
// started on this machine. Exit codes: 0 ok, 1 the operation failed (a head
// that does not answer, a port in use), 2 bad usage (a flag, a value).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster/daemons.h"
#include "troupe/cluster.h"
#include "troupe/runtime.h"
#include "rl_command.h"
#include "troupe/worker.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kFailed = 1;
constexpr int kUsage = 2;

fs::path troupe_home() {
  if (const char* h = std::getenv("TROUPE_HOME"); h && *h) return h;
  const char* home = std::getenv("HOME");
  return fs::path(home && *home ? home : "/tmp") / ".troupe";
}
fs::path run_dir() { return troupe_home() / "run"; }

int fail(const std::string& message, int code = kFailed) {
  std::fprintf(stderr, "troupe: %s\n", message.c_str());
  return code;
}

/// The pid files of processes `troupe start` launched on this machine.
struct Started {
  pid_t pid;
  std::string role;
  std::string address;
  fs::path file;
};
/// Whether `pid` is still a troupe process (a pid file outlives a process
/// killed with -9, and its pid may have been given to another program).
bool is_troupe(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmdline((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return cmdline.find("troupe") != std::string::npos && cmdline.find("--block") != std::string::npos;
}

std::vector<Started> started() {
  std::vector<Started> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(run_dir(), ec)) {
    std::ifstream f(e.path());
    json j = json::parse(f, nullptr, false);
    if (j.is_discarded() || !j.contains("pid")) continue;
    pid_t pid = j["pid"].get<pid_t>();
    if (!is_troupe(pid)) {
      std::error_code gone;
      fs::remove(e.path(), gone);  // stale: that process is gone
      continue;
    }
    out.push_back({pid, j.value("role", "?"), j.value("address", ""), e.path()});
  }
  return out;
}

/// The head to talk to: --address, else $TROUPE_ADDRESS, else the head
/// started on this machine. A bare HOST:PORT takes the scheme of a daemon
/// started here at that address (a UCX head's `ucx://`); else it is TCP.
std::string head_address(const std::string& flag) {
  std::string address = flag;
  if (address.empty()) {
    if (const char* a = std::getenv("TROUPE_ADDRESS"); a && *a) address = a;
  }
  if (address.empty()) {
    for (auto& s : started()) {
      if (s.role == "head") return s.address;
    }
    return {};
  }
  if (address.find("://") != std::string::npos) return address;
  for (auto& s : started()) {
    const auto scheme_end = s.address.find("://");
    if (scheme_end != std::string::npos && s.address.substr(scheme_end + 3) == address) return s.address;
  }
  return address;
}

/// Blocks SIGINT/SIGTERM in every thread (call before any thread starts),
/// so that wait_for_signal() can take them.
void block_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}
void wait_for_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
}

/// Foreground part of `troupe start`: tells the parent (TROUPE_READY_FD)
/// when it answers, keeps a pid file while it runs.
struct Foreground {
  std::string role;
  fs::path pid_file;
  int ready_fd = -1;

  explicit Foreground(std::string r) : role(std::move(r)) {
    if (const char* fd = std::getenv("TROUPE_READY_FD")) ready_fd = std::atoi(fd);
    unsetenv("TROUPE_READY_FD");
  }
  void ready(const std::string& address) {
    std::error_code ec;
    fs::create_directories(run_dir(), ec);
    pid_file = run_dir() / (role + "-" + std::to_string(getpid()) + ".json");
    std::ofstream(pid_file) << json{{"pid", getpid()}, {"role", role}, {"address", address}}.dump() << "\n";
    say("ok " + address);
    std::fprintf(stderr, "troupe: %s running at %s (pid %d)\n", role.c_str(), address.c_str(), getpid());
  }
  void say(const std::string& line) {
    if (ready_fd < 0) return;
    std::string l = line + "\n";
    (void)!write(ready_fd, l.data(), l.size());
    close(ready_fd);
    ready_fd = -1;
  }
  ~Foreground() {
    std::error_code ec;
    if (!pid_file.empty()) fs::remove(pid_file, ec);
  }
};

/// Background part of `troupe start`: re-runs this command with --block in a
/// new session, logs to ~/.troupe/logs, and waits for its first line.
int daemonize(const std::string& role, std::vector<std::string> args) {
  std::error_code ec;
  fs::create_directories(troupe_home() / "logs", ec);
  int fds[2];
  if (pipe(fds) != 0) return fail("start: pipe: " + std::string(std::strerror(errno)));
  auto log_of = [&](pid_t p) { return troupe_home() / "logs" / (role + "-" + std::to_string(p) + ".log"); };
  pid_t pid = fork();
  if (pid < 0) return fail("start: fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    close(fds[0]);
    setsid();
    fs::path log = log_of(getpid());
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int in = open("/dev/null", O_RDONLY);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    if (in >= 0) dup2(in, 0);
    setenv("TROUPE_READY_FD", std::to_string(fds[1]).c_str(), 1);
    args.push_back("--block");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(fds[1]);
  fs::path log = log_of(pid);
  std::string line;
  pollfd p{fds[0], POLLIN, 0};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (poll(&p, 1, 200) <= 0) continue;
    char c;
    if (read(fds[0], &c, 1) != 1 || c == '\n') break;
    line += c;
  }
  close(fds[0]);
  if (line.rfind("ok ", 0) == 0) {
    std::string address = line.substr(3);
    std::printf("troupe: %s started at %s (pid %d, log %s)\n", role.c_str(), address.c_str(), pid, log.c_str());
    if (role == "head") std::printf("troupe: add nodes with: troupe start --address %s\n", address.c_str());
    return 0;
  }
  std::string why = line.rfind("error ", 0) == 0 ? line.substr(6) : "it exited or did not answer within 30 s";
  return fail("start: the " + role + " did not start: " + why + " (log: " + log.string() + ")");
}

std::string fmt_resources(const troupe::ResourceMap& r) {
  std::string s;
  for (auto& [k, v] : r) {
    if (!s.empty()) s += " ";
    char buf[64];
    if (k == "memory") {
      std::snprintf(buf, sizeof(buf), "%s=%.1fGiB", k.c_str(), v / (1 << 30));
    } else {
      std::snprintf(buf, sizeof(buf), "%s=%g", k.c_str(), v);
    }
    s += buf;
  }
  return s;
}

json to_json(const troupe::LabelSelector& selector) {
  json out = json::array();
  for (auto& c : selector) out.push_back({{"key", c.key}, {"values", c.values}, {"negate", c.negate}});
  return out;
}

json to_json(const troupe::ActorInfo& a) {
  const troupe::ActorOptions& o = a.options;
  json options = {{"name", o.name},
                  {"ns", o.ns},
                  {"resources", o.resources},
                  {"placement_group", o.placement_group},
                  {"bundle", o.bundle},
                  {"label_selector", to_json(o.label_selector)},
                  {"max_restarts", o.max_restarts},
                  {"max_task_retries", o.max_task_retries},
                  {"detached", o.detached},
                  {"snapshot_every", o.snapshot_every},
                  {"mailbox_bound", o.mailbox_bound},
                  {"dedicated_process", o.dedicated_process},
                  {"colocate_with", o.colocate_with},
                  {"restore_from", o.restore_from}};
  return {{"id", a.id},
          {"class_name", a.class_name},
          {"state", a.state},
          {"reason", a.reason},
          {"node", a.node},
          {"worker", a.worker},
          {"address", a.address},
          {"ref_id", a.ref_id},
          {"restarts", a.restarts},
          {"options", options}};
}

/// "ns::Counter(int, std::string)" -> "ns::Counter": the class without its
/// constructor's argument types (matching the last, outermost parentheses, so
/// that "(anonymous namespace)::Counter(int)" keeps its namespace).
std::string short_class(const std::string& key) {
  if (key.empty() || key.back() != ')') return key;
  int depth = 0;
  for (size_t i = key.size(); i-- > 0;) {
    if (key[i] == ')') ++depth;
    if (key[i] == '(' && --depth == 0) return key.substr(0, i);
  }
  return key;
}

/// "ns/name", or "-" for an anonymous actor.
std::string actor_name(const troupe::ActorInfo& a) {
  return a.options.name.empty() ? "-" : a.options.ns + "/" + a.options.name;
}

void print_actors(const std::vector<troupe::ActorInfo>& actors) {
  std::printf("%-24s %-24s %-10s %-16s %-8s %-20s %s\n", "ID", "CLASS", "STATE", "NODE", "RESTARTS", "NAME", "REASON");
  for (auto& a : actors) {
    std::printf("%-24s %-24s %-10s %-16s %-8u %-20s %s\n", a.id.c_str(), short_class(a.class_name).c_str(),
                a.state.c_str(), a.node.empty() ? "-" : a.node.c_str(), a.restarts, actor_name(a).c_str(),
                a.state == "alive" ? "" : a.reason.c_str());
  }
}

json to_json(const troupe::ClusterStatus& st) {
  json nodes = json::array(), pgs = json::array();
  for (auto& n : st.nodes) {
    nodes.push_back({{"id", n.id}, {"address", n.address}, {"state", n.state}, {"total", n.total},
                     {"free", n.free}, {"labels", n.labels}, {"silent_ms", n.silent_ms},
                     {"connected", n.connected}});
  }
  for (auto& g : st.placement_groups) {
    json bundles = json::array();
    for (auto& b : g.spec.bundles) bundles.push_back(b.resources);
    pgs.push_back({{"id", g.id},
                   {"name", g.spec.name},
                   {"strategy", std::string(troupe::to_string(g.spec.strategy))},
                   {"state", g.state},
                   {"reason", g.reason},
                   {"bundles", bundles},
                   {"bundle_nodes", g.bundle_nodes}});
  }
  json jobs = json::array();
  for (auto& j : st.jobs) {
    jobs.push_back({{"id", j.id}, {"command", j.command}, {"node", j.node}, {"state", j.state},
                    {"exit_code", j.exit_code}, {"message", j.message}, {"submitted_ms", j.submitted_ms},
                    {"ended_ms", j.ended_ms}});
  }
  json actors = json::array();
  for (auto& a : st.actors) actors.push_back(to_json(a));
  return {{"head", st.head_address},         {"nodes", nodes}, {"placement_groups", pgs}, {"jobs", jobs},
          {"actors_by_state", st.actors_by_state}, {"actors", actors}};
}

/// A driver's runtime and its connection to the head, for one command.
struct Driver {
  std::unique_ptr<troupe::Runtime> rt;
  std::optional<troupe::ClusterClient> cluster;
};
troupe::Result<Driver> connect_driver(const std::string& flag) {
  std::string address = head_address(flag);
  if (address.empty()) {
    return troupe::error(troupe::ErrorCode::not_found,
                         "no head address: pass --address HOST:PORT, set TROUPE_ADDRESS, or start one with "
                         "`troupe start --head`");
  }
  troupe::RuntimeConfig cfg;
  cfg.transport = address.rfind("ucx://", 0) == 0 ? "ucx" : "tcp";
  cfg.log_level = "error";
  Driver d;
  d.rt = std::make_unique<troupe::Runtime>(cfg);
  auto cluster = troupe::ClusterClient::connect(*d.rt, address, std::chrono::seconds(5));
  if (!cluster) {
    if (address.find("://") == std::string::npos) {
      return troupe::error(cluster.error().code(), cluster.error().message() + " (" + address +
                                                       " was tried over TCP; a head started with --transport ucx "
                                                       "on another machine is ucx://" + address + ")");
    }
    return troupe::error(cluster.error());
  }
  d.cluster = *cluster;
  return d;
}

troupe::Result<troupe::ClusterStatus> fetch_status(const std::string& flag) {
  auto d = connect_driver(flag);
  if (!d) return troupe::error(d.error());
  return d->cluster->status(std::chrono::seconds(5));
}

void print_status(const troupe::ClusterStatus& st) {
  size_t alive = 0;
  for (auto& n : st.nodes) alive += n.state == "alive";
  std::printf("head %s\nnodes: %zu alive, %zu dead\n", st.head_address.c_str(), alive, st.nodes.size() - alive);
  for (auto& n : st.nodes) {
    std::printf("  %-24s %-6s %s\n      free:  %s\n      total: %s\n", n.id.c_str(), n.state.c_str(),
                n.address.c_str(), fmt_resources(n.free).c_str(), fmt_resources(n.total).c_str());
  }
  std::printf("placement groups: %zu\n", st.placement_groups.size());
  for (auto& g : st.placement_groups) {
    std::printf("  %-20s %-13s %-12s %zu bundles%s%s\n", g.id.c_str(), std::string(to_string(g.spec.strategy)).c_str(),
                g.state.c_str(), g.spec.bundles.size(), g.reason.empty() ? "" : "  reason: ", g.reason.c_str());
  }
  std::printf("jobs: %zu\n", st.jobs.size());
  for (auto& j : st.jobs) {
    std::printf("  %-24s %-10s on %-16s %s\n", j.id.c_str(), j.state.c_str(), j.node.c_str(),
                j.command.empty() ? "" : j.command[0].c_str());
  }
  // Actors: counts by state, then the ones waiting (pending, restarting) with why.
  std::map<std::string, int64_t> by_state = st.actors_by_state;
  std::string counts;
  for (const char* s : {"alive", "pending", "restarting", "dead"}) {
    counts += (counts.empty() ? "" : ", ") + std::to_string(by_state[s]) + " " + s;
    by_state.erase(s);
  }
  for (auto& [s, n] : by_state) counts += ", " + std::to_string(n) + " " + s;  // starting, recovering, ...
  std::printf("actors: %s\n", counts.c_str());
  constexpr size_t kMaxWaiting = 20;
  size_t waiting = 0;
  for (auto& a : st.actors) {
    if (a.state != "pending" && a.state != "restarting") continue;
    if (++waiting > kMaxWaiting) continue;
    std::printf("  %-24s %-24s %-10s %s\n", a.id.c_str(), short_class(a.class_name).c_str(), a.state.c_str(),
                a.reason.empty() ? "-" : a.reason.c_str());
  }
  if (waiting > kMaxWaiting) {
    std::printf("  ... and %zu more (troupe list actors)\n", waiting - kMaxWaiting);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // `troupe rl train` starts worker processes from this executable: in
  // one, this serves actors and never returns.
  troupe::serve_if_worker();
  CLI::App app{"troupe: a distributed actor runtime. Start a cluster, look at it, stop it, run RL jobs.", "troupe"};
  app.require_subcommand(1);
  auto rl_cmd = troupe::cli::add_rl_commands(app);
  std::vector<std::string> args(argv, argv + argc);

  // troupe start
  auto* start = app.add_subcommand("start", "Start a head (--head) or a node agent (--address) on this machine");
  bool is_head = false, block = false;
  std::string address, host = "127.0.0.1", data_dir, transport = "tcp", resources_text, labels_text, node_id;
  int port = 6380;
  double cpus = -1, gpus = -1, memory = -1;
  int64_t heartbeat_ms = 250, dead_after_ms = 2000;
  start->add_flag("--head", is_head, "Start the head (control plane)");
  start->add_option("--address", address,
                    "The head to join (HOST:PORT), for a node agent; 'auto': the head started on this machine");
  start->add_option("--port", port, "Head: the port to listen on")->check(CLI::Range(0, 65535));
  start->add_option("--host", host, "The IP address to listen on and advertise");
  start->add_option("--data-dir", data_dir, "Head: where its state lives (default ~/.troupe/head)");
  start->add_option("--transport", transport, "tcp or ucx")->check(CLI::IsMember({"tcp", "ucx"}));
  start->add_option("--cpus", cpus, "Agent: CPUs to offer (default: all cores)");
  start->add_option("--gpus", gpus, "Agent: GPUs to offer (default: what the CUDA driver reports)");
  start->add_option("--memory", memory, "Agent: memory to offer, bytes (default: all)");
  start->add_option("--resources", resources_text, "Agent: custom resources, k=v,... (e.g. TPU=4)");
  start->add_option("--labels", labels_text, "Agent: node labels, k=v,... (e.g. rack=r1,zone=z2)");
  start->add_option("--node-id", node_id, "Agent: this node's id (default: hostname-pid)");
  start->add_option("--heartbeat-ms", heartbeat_ms, "Head: heartbeat period")->check(CLI::Range(10, 60000));
  start->add_option("--dead-after-ms", dead_after_ms, "Head: a node silent this long is dead")
      ->check(CLI::Range(50, 600000));
  start->add_flag("--block", block, "Run in the foreground until SIGINT/SIGTERM");

  // troupe status / list
  std::string status_address;
  bool as_json = false;
  auto* status = app.add_subcommand("status", "Nodes, their resources, placement groups and their state");
  status->add_option("--address", status_address, "The head (default: $TROUPE_ADDRESS or the local head)");
  status->add_flag("--json", as_json, "Print JSON");
  auto* list = app.add_subcommand("list", "List nodes, actors or placement groups");
  std::string what;
  list->add_option("what", what, "nodes|actors|pgs")->required()->check(CLI::IsMember({"nodes", "actors", "pgs"}));
  list->add_option("--address", status_address, "The head (default: $TROUPE_ADDRESS or the local head)");
  list->add_flag("--json", as_json, "Print JSON");

  // troupe job
  auto* job = app.add_subcommand("job", "Run commands on the cluster and follow them");
  job->require_subcommand(1);
  std::string job_address, job_id, job_node;
  std::vector<std::string> job_command, job_env;
  auto* submit = job->add_subcommand("submit", "Run a command on a node: troupe job submit [--node N] -- CMD ...");
  submit->add_option("--address", job_address, "The head (default: $TROUPE_ADDRESS or the local head)");
  submit->add_option("--node", job_node, "The node to run it on (default: any alive node)");
  submit->add_option("--env", job_env, "K=V added to its environment (repeatable)");
  submit->footer("The command and its arguments follow the options, after --");
  auto* job_status = job->add_subcommand("status", "A job's state and exit code");
  auto* job_logs = job->add_subcommand("logs", "A job's output (stdout and stderr)");
  auto* job_stop = job->add_subcommand("stop", "Stop a job (SIGTERM to its processes, SIGKILL after 5 s)");
  for (auto* sub : {job_status, job_logs, job_stop}) {
    sub->add_option("id", job_id, "The job id (troupe job submit prints it)")->required();
    sub->add_option("--address", job_address, "The head (default: $TROUPE_ADDRESS or the local head)");
  }

  // troupe stop
  auto* stop = app.add_subcommand("stop", "Stop the heads and agents `troupe start` launched on this machine");
  int grace_s = 10;
  stop->add_option("--grace", grace_s, "Seconds to wait before SIGKILL")->check(CLI::Range(0, 3600));

  // Everything after `--` is a job's command, its flags included: split it
  // off before CLI11 sees the rest.
  int parsed_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--") {
      job_command.assign(argv + i + 1, argv + argc);
      parsed_argc = i;
      break;
    }
  }
  try {
    app.parse(parsed_argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "troupe: %s (see troupe %s--help)\n", e.what(),
                 app.get_subcommands().empty() ? "" : (app.get_subcommands()[0]->get_name() + " ").c_str());
    return kUsage;
  }

  if (*rl_cmd.rl) return troupe::cli::run_rl_command(rl_cmd);
  if (*start) {
    if (is_head == !address.empty()) {
      return fail("start: give --head to start a head, or --address HOST:PORT to join one", kUsage);
    }
    troupe::ResourceMap overrides;
    if (!resources_text.empty()) {
      auto r = troupe::parse_resources(resources_text);
      if (!r) return fail("start: " + r.error().message(), kUsage);
      overrides = *r;
    }
    if (cpus >= 0) overrides["CPU"] = cpus;
    if (gpus >= 0) overrides["GPU"] = gpus;
    if (memory >= 0) overrides["memory"] = memory;
    troupe::Labels labels;
    if (!labels_text.empty()) {
      auto l = troupe::parse_labels(labels_text);
      if (!l) return fail("start: " + l.error().message(), kUsage);
      labels = *l;
    }
    if (address == "auto") {
      address = head_address("");
      if (address.empty()) return fail("start: --address auto: no head runs on this machine (troupe start --head)");
      for (size_t i = 0; i + 1 < args.size(); ++i) {
        if (args[i] == "--address" && args[i + 1] == "auto") args[i + 1] = address;
      }
    }
    std::string role = is_head ? "head" : "agent";
    if (!block) return daemonize(role, args);

    block_signals();
    Foreground fg(role);
    troupe::Status s;
    if (is_head) {
      troupe::cluster::HeadOptions o;
      o.listen = transport + "://" + host + ":" + std::to_string(port);
      o.data_dir = data_dir.empty() ? troupe_home() / "head" : fs::path(data_dir);
      o.config.heartbeat = std::chrono::milliseconds(heartbeat_ms);
      o.config.dead_after = std::chrono::milliseconds(dead_after_ms);
      s = troupe::cluster::run_head(o, [&](const std::string& a) { fg.ready(a); }, wait_for_signal);
    } else {
      troupe::cluster::AgentOptions o;
      o.head = address;
      o.node_id = node_id;
      o.resources = troupe::cluster::detect_resources(overrides);
      o.labels = labels;
      o.log_dir = troupe_home() / "logs";
      std::string scheme = address.rfind("ucx://", 0) == 0 ? "ucx" : transport;
      o.listen = scheme + "://" + host + ":0";
      s = troupe::cluster::run_agent(o, [&](const std::string& a) { fg.ready(a); }, wait_for_signal);
    }
    if (!s.ok()) {
      fg.say("error " + s.message());
      return fail(role + ": " + s.message());
    }
    return 0;
  }

  if (*list && what == "actors") {
    auto d = connect_driver(status_address);
    if (!d) return fail("list: " + d.error().message());
    auto actors = d->cluster->list_actors(std::chrono::seconds(5));
    if (!actors) return fail("list: " + actors.error().message());
    if (as_json) {
      json items = json::array();
      for (auto& a : *actors) items.push_back(to_json(a));
      std::printf("%s\n", items.dump(2).c_str());
    } else {
      print_actors(*actors);
    }
    return 0;
  }

  if (*status || *list) {
    auto st = fetch_status(status_address);
    if (!st) return fail(std::string(*status ? "status" : "list") + ": " + st.error().message());
    json j = to_json(*st);
    if (*list) {
      json items = what == "nodes" ? j["nodes"] : j["placement_groups"];
      if (as_json) {
        std::printf("%s\n", items.dump(2).c_str());
      } else {
        for (auto& item : items) {
          std::printf("%-24s %s\n", item["id"].get<std::string>().c_str(), item["state"].get<std::string>().c_str());
        }
      }
      return 0;
    }
    if (as_json) {
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      print_status(*st);
    }
    return 0;
  }

  if (*job) {
    auto d = connect_driver(job_address);
    if (!d) return fail("job: " + d.error().message());
    auto& cluster = *d->cluster;
    if (*submit) {
      if (job_command.empty()) return fail("job submit: no command (troupe job submit -- CMD ...)", kUsage);
      auto id = cluster.submit_job(job_command, job_node, job_env);
      if (!id) return fail("job submit: " + id.error().message());
      std::printf("%s\n", id->c_str());
      return 0;
    }
    if (*job_status) {
      auto j = cluster.job(job_id);
      if (!j) return fail("job status: " + j.error().message());
      std::printf("%s %s on %s exit_code=%d%s%s\n", j->id.c_str(), j->state.c_str(), j->node.c_str(), j->exit_code,
                  j->message.empty() ? "" : " ", j->message.c_str());
      return 0;
    }
    if (*job_logs) {
      uint64_t offset = 0;
      for (;;) {
        auto chunk = cluster.job_logs(job_id, offset);
        if (!chunk) return fail("job logs: " + chunk.error().message());
        if (chunk->empty()) break;
        std::fwrite(chunk->data(), 1, chunk->size(), stdout);
        offset += chunk->size();
      }
      return 0;
    }
    if (*job_stop) {
      auto s = cluster.stop_job(job_id);
      if (!s.ok()) return fail("job stop: " + s.message());
      std::printf("troupe: stopping %s\n", job_id.c_str());
      return 0;
    }
  }

  if (*stop) {
    auto procs = started();
    if (procs.empty()) {
      std::printf("troupe: nothing started on this machine\n");
      return 0;
    }
    for (auto& p : procs) {
      if (kill(p.pid, SIGTERM) != 0) {
        std::error_code ec;
        fs::remove(p.file, ec);  // already gone
      }
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
    for (auto& p : procs) {
      while (kill(p.pid, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling another process's exit
      }
      if (kill(p.pid, 0) == 0) {
        kill(p.pid, SIGKILL);
        std::printf("troupe: %s (pid %d) did not stop in %d s: killed\n", p.role.c_str(), p.pid, grace_s);
      } else {
        std::printf("troupe: stopped %s (pid %d)\n", p.role.c_str(), p.pid);
      }
      std::error_code ec;
      fs::remove(p.file, ec);
    }
    return 0;
  }
  return kUsage;
}
