#include "daemons.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#if TROUPE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "agent/agent_actor.h"
#include "cluster/protocol.h"
#include "head/store.h"
#include "log.h"
#include "troupe/actor.h"
#include "troupe/runtime.h"

namespace troupe::cluster {

namespace {

std::string scheme_of(const std::string& address) {
  auto p = address.find("://");
  return p == std::string::npos ? "tcp" : address.substr(0, p);
}

// `address` with `scheme` when it names none (a bare HOST:PORT).
std::string with_scheme(const std::string& address, const std::string& scheme = "tcp") {
  return address.find("://") == std::string::npos ? scheme + "://" + address : address;
}

}  // namespace

Status run_head(const HeadOptions& options, const ReadyFn& ready, const WaitFn& wait) {
  if (options.data_dir.empty()) return Status(ErrorCode::invalid_argument, "head: no --data-dir");
  auto store = Store::open(options.data_dir);
  if (!store) return store.error();
  RuntimeConfig cfg;
  cfg.listen = with_scheme(options.listen);
  cfg.transport = scheme_of(cfg.listen);
  Runtime rt(cfg);
  if (rt.address().empty()) {
    return Status(ErrorCode::invalid_argument, "head: cannot listen on " + cfg.listen +
                                                   " (is the port in use? pick another with --port)");
  }
  HeadConfig config = options.config;
  config.address = rt.address();
  config.ref_at = [&rt](const std::string& address, uint64_t id) { return rt.ref_at(address, id); };
  auto head = rt.spawn<HeadActor>(std::shared_ptr<Store>(std::move(*store)), config);
  if (Status s = rt.publish(kHeadName, head); !s.ok()) return s;
  TROUPE_LOG(info, "event=head_started address={} data_dir={}", rt.address(), options.data_dir.string());
  ready(rt.address());
  wait();
  TROUPE_LOG(info, "event=head_stopping");
  return rt.shutdown();
}

ResourceMap detect_resources(const ResourceMap& overrides) {
  ResourceMap r;
  r["CPU"] = std::max(1u, std::thread::hardware_concurrency());
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) r["memory"] = static_cast<double>(pages) * static_cast<double>(page);
  int gpus = 0;
#if TROUPE_WITH_CUDA
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
#endif
  if (gpus > 0) r["GPU"] = gpus;
  for (auto& [k, v] : overrides) r[k] = v;
  return r;
}

Status run_agent(const AgentOptions& options, const ReadyFn& ready, const WaitFn& wait) {
  if (options.head.empty()) return Status(ErrorCode::invalid_argument, "agent: no head address (--address)");
  RuntimeConfig cfg;
  cfg.listen = with_scheme(options.listen);
  // A bare head address speaks the agent's own transport (`troupe start
  // --transport ucx --address HOST:PORT`).
  const std::string head = with_scheme(options.head, scheme_of(cfg.listen));
  cfg.transport = scheme_of(head);
  Runtime rt(cfg);
  if (rt.address().empty()) return Status(ErrorCode::invalid_argument, "agent: cannot listen on " + cfg.listen);
  RegisterNode reg;
  reg.node_id = options.node_id;
  if (reg.node_id.empty()) {
    char host[256] = "node";
    gethostname(host, sizeof(host) - 1);
    reg.node_id = std::string(host) + "-" + std::to_string(getpid());
  }
  auto agent = rt.spawn<AgentActor>(reg.node_id, options.log_dir, rt.address());
  if (Status s = rt.publish(kAgentName, agent); !s.ok()) return s;
  reg.address = rt.address();
  reg.resources = options.resources;
  reg.labels = options.labels;
  reg.agent = agent;
  const std::string head_uri = head + "/" + kHeadName;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool announced = false;
  // Register, beat, and start over whenever the head is lost: a head that
  // restarts finds its nodes again this way.
  std::thread beat([&] {
    auto backoff = std::chrono::milliseconds(100);
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      lock.unlock();
      auto head = rt.resolve_any(head_uri, std::chrono::seconds(5));
      Result<Registered> ok = head ? head->ask<Registered>(reg, std::chrono::seconds(10)).get()
                                   : Result<Registered>(error(head.error()));
      lock.lock();
      if (!ok) {
        TROUPE_LOG(warn, "event=register_failed head={} reason=\"{}\" retry_in_ms={}", options.head,
                   ok.error().message(), backoff.count());
        cv.wait_for(lock, backoff, [&] { return stopping; });
        backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        continue;
      }
      backoff = std::chrono::milliseconds(100);
      TROUPE_LOG(info, "event=node_registered node={} head={}", reg.node_id, options.head);
      (void)agent.tell(HeadChanged{*head});
      if (!announced) {
        announced = true;
        lock.unlock();
        ready(rt.address());
        lock.lock();
      }
      auto period = std::chrono::milliseconds(std::max<int64_t>(10, ok->heartbeat_ms));
      while (!stopping) {
        if (cv.wait_for(lock, period, [&] { return stopping; })) break;
        lock.unlock();
        auto alive = head->ask<bool>(NodeHeartbeat{reg.node_id}, period * 4).get();
        lock.lock();
        if (!alive || !*alive) {
          TROUPE_LOG(warn, "event=head_lost node={} reason=\"{}\"", reg.node_id,
                     alive ? "the head does not know this node (restarted, or declared it dead)"
                           : alive.error().message());
          break;  // register again
        }
      }
    }
  });
  wait();
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
  }
  cv.notify_all();
  beat.join();
  // Say goodbye (bounded: a head that is away learns it from the lost
  // connection instead).
  if (auto head = rt.resolve_any(head_uri, std::chrono::milliseconds(500))) {
    (void)head->ask<void>(LeaveNode{reg.node_id}, std::chrono::milliseconds(1000)).get();
  }
  return rt.shutdown();
}

}  // namespace troupe::cluster
