// troupe::init: join a cluster, or start an embedded one (a head and one
// agent, each a runtime on threads of this process).
#include "troupe/init.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "cluster/daemons.h"
#include "log.h"
#include "troupe/worker.h"

namespace troupe {

namespace {

/// One daemon (head or agent) running on a thread of this process until
/// stop(); start() waits until it answers or fails.
class EmbeddedDaemon {
 public:
  using Run = std::function<Status(const cluster::ReadyFn&, const cluster::WaitFn&)>;

  Result<std::string> start(Run run, std::chrono::milliseconds timeout) {
    thread_ = std::thread([this, run = std::move(run)] {
      Status s = run(
          [this](const std::string& address) {
            std::lock_guard<std::mutex> lock(mu_);
            address_ = address;
            cv_.notify_all();
          },
          [this] {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return stopping_; });
          });
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = s.ok() ? Status(ErrorCode::start_failed, "it stopped") : s;
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !address_.empty() || ended_.has_value(); })) {
      return error(ErrorCode::timeout, "it did not answer within " + std::to_string(timeout.count()) + " ms");
    }
    if (address_.empty()) return error(*ended_);
    return address_;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  ~EmbeddedDaemon() { stop(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string address_;
  std::optional<Status> ended_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

struct Session::Impl {
  // Destroyed in reverse: the driver first (its owned actors stop), then the
  // agent (its workers with it), then the head, then its state.
  std::filesystem::path data_dir;
  EmbeddedDaemon head;
  EmbeddedDaemon agent;
  std::string address;
  std::unique_ptr<Runtime> rt;
  std::optional<ClusterClient> client;

  ~Impl() {
    client.reset();
    if (rt) (void)rt->shutdown();
    rt.reset();
    agent.stop();
    head.stop();
    if (!data_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(data_dir, ec);
    }
  }
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;
Runtime& Session::runtime() { return *impl_->rt; }
const ClusterClient& Session::cluster() const { return *impl_->client; }
const std::string& Session::address() const { return impl_->address; }
bool Session::embedded() const { return !impl_->data_dir.empty(); }

namespace {

// The local IPv4 address that packets to the host of `address`
// ("[scheme://]host:port") leave from, found by connecting a UDP socket
// (nothing is sent); 127.0.0.1 when that cannot be told.
std::string local_address_towards(const std::string& address) {
  std::string host = address;
  if (auto p = host.find("://"); p != std::string::npos) host = host.substr(p + 3);
  if (auto p = host.rfind(':'); p != std::string::npos) host = host.substr(0, p);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN];
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return out;
}

}  // namespace

Result<std::unique_ptr<Session>> init(InitOptions options) {
  serve_if_worker();
  auto impl = std::make_unique<Session::Impl>();
  std::string address = options.address;
  if (address.empty()) {
    if (const char* env = std::getenv("TROUPE_ADDRESS")) address = env;
  }
  if (address.empty()) {
    // One secret for the embedded cluster, its driver and its workers (which
    // inherit the environment), without touching ~/.troupe.
    if (options.runtime.cluster_token.empty() && std::getenv("TROUPE_CLUSTER_TOKEN") == nullptr) {
      std::random_device rd;
      std::string token;
      for (int i = 0; i < 4; ++i) token += std::to_string(rd());
      setenv("TROUPE_CLUSTER_TOKEN", token.c_str(), 1);
    } else if (!options.runtime.cluster_token.empty()) {
      setenv("TROUPE_CLUSTER_TOKEN", options.runtime.cluster_token.c_str(), 1);
    }
    if (std::getenv("TROUPE_LOG_LEVEL") == nullptr) setenv("TROUPE_LOG_LEVEL", options.cluster_log_level.c_str(), 1);
    std::error_code ec;
    impl->data_dir = std::filesystem::temp_directory_path(ec) /
                     ("troupe-embedded-" + std::to_string(getpid()) + "-" +
                      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    cluster::HeadOptions head;
    // The embedded cluster speaks the driver's transport (tcp, or ucx:
    // shared memory and one-sided remote-buffer reads between its processes).
    head.listen = options.runtime.transport + "://127.0.0.1:0";
    head.data_dir = impl->data_dir / "head";
    auto head_address = impl->head.start(
        [head](const cluster::ReadyFn& ready, const cluster::WaitFn& wait) { return cluster::run_head(head, ready, wait); },
        options.timeout);
    if (!head_address) {
      return error(head_address.error().code(), "init: the embedded head did not start: " + head_address.error().message());
    }
    cluster::AgentOptions agent;
    agent.head = *head_address;
    agent.listen = options.runtime.transport + "://127.0.0.1:0";
    agent.node_id = "local-" + std::to_string(getpid());
    agent.resources = cluster::detect_resources(options.resources);
    agent.labels = options.labels;
    agent.log_dir = impl->data_dir / "logs";
    auto agent_address = impl->agent.start(
        [agent](const cluster::ReadyFn& ready, const cluster::WaitFn& wait) {
          return cluster::run_agent(agent, ready, wait);
        },
        options.timeout);
    if (!agent_address) {
      return error(agent_address.error().code(),
                   "init: the embedded node agent did not start: " + agent_address.error().message());
    }
    address = *head_address;
  }
  RuntimeConfig cfg = options.runtime;
  auto scheme = address.find("://");
  if (scheme != std::string::npos) cfg.transport = address.substr(0, scheme);
  // Where the cluster's processes can reach this driver: the address this
  // machine sends from towards the head (loopback for a head on this
  // machine). UCX answers on connections of its own, so an actor on
  // another host must be able to dial the driver back.
  if (cfg.listen.empty()) cfg.listen = cfg.transport + "://" + local_address_towards(address) + ":0";
  impl->rt = std::make_unique<Runtime>(cfg);
  auto client = ClusterClient::connect(*impl->rt, address, options.timeout);
  if (!client) return error(client.error().code(), "init: " + client.error().message());
  impl->client = std::move(*client);
  impl->address = impl->client->address();
  return std::make_unique<Session>(std::move(impl));
}

}  // namespace troupe
