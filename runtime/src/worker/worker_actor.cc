#include "worker/worker_actor.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <future>
#include <thread>

#include "log.h"
#include "troupe/detail/actor_class.h"
#include "troupe/worker.h"

namespace troupe::cluster {

WorkerActor::WorkerActor(Runtime* rt, std::string worker_id, AnyRef agent, std::function<void()> done)
    : rt_(rt), worker_id_(std::move(worker_id)), agent_(std::move(agent)), done_(std::move(done)) {}

void WorkerActor::on_start() {
  // A worker lives as long as its agent: the agent gone (killed, stopped),
  // nothing would watch or restart this process's actors any more.
  monitor(agent_, [this](const Down& d) {
    TROUPE_LOG(warn, "event=worker_exiting worker={} reason=\"its agent is gone ({})\"", worker_id_,
               d.reason.to_string());
    done_();
  });
}

Deferred<Location> WorkerActor::handle(const CreateActor& m) {
  auto reply = defer<Location>();
  if (m.head) {
    std::lock_guard<std::mutex> lock(head_->mu);
    head_->head = m.head;
  }
  if (auto it = actors_.find(m.actor_id); it != actors_.end()) {  // a retried request
    if (it->second.started) {
      reply.complete(it->second.where);
    } else {
      it->second.waiting.push_back(reply);
    }
    return reply;
  }
  detail::ActorClassFactory make = detail::find_actor_class(m.class_key);
  if (make == nullptr) {
    reply.fail(Status(ErrorCode::not_found, "worker " + worker_id_ + ": this program has no actor class " +
                                                m.class_key + " (workers run the driver's executable: was it rebuilt since?)"));
    return reply;
  }
  SpawnOptions options;
  options.name = m.actor_id;
  options.mailbox_bound = static_cast<size_t>(m.mailbox_bound);
  options.snapshot_every = m.snapshot_every;
  auto spec = make(m.args, std::move(options));
  if (!spec) {
    reply.fail(spec.error());
    return reply;
  }
  spec->snapshot = m.snapshot;
  std::shared_ptr<HeadBox> head = head_;
  std::string id = m.actor_id;
  spec->on_snapshot = [head, id](const std::string& bytes) {
    AnyRef h;
    {
      std::lock_guard<std::mutex> lock(head->mu);
      head->latest[id] = bytes;
      h = head->head;
    }
    if (h) (void)h.tell(SaveSnapshot{id, bytes});
  };
  // The constructor runs on the actor's own first start, not on this
  // thread (a slow one would hold every other creation and stop here). A
  // start that succeeded comes back as HostedStarted; one that failed as
  // the actor's end (the monitor below), with the bare reason. The ref id
  // is known only once the spawn returns: whichever of the two comes second
  // sends the message.
  struct StartSignal {
    std::mutex mu;
    uint64_t ref_id = 0;
    bool started = false;
  };
  auto signal = std::make_shared<StartSignal>();
  AnyRef me = self();
  AnyRef ref(detail::spawn_from_spec(*rt_, std::move(*spec), [me, id, signal](Status s) {
    if (!s.ok()) return;
    std::lock_guard<std::mutex> lock(signal->mu);
    signal->started = true;
    if (signal->ref_id != 0) (void)me.tell(HostedStarted{id, signal->ref_id});
  }));
  if (!ref) {
    reply.fail(Status(ErrorCode::shutting_down, "worker " + worker_id_ + " is shutting down"));
    return reply;
  }
  auto where = rt_->locate(ref);
  if (!where) {
    rt_->stop(ref);
    reply.fail(where.error());
    return reply;
  }
  Location loc{where->first, where->second};
  Hosted& hosted = actors_[id];
  hosted.ref = ref;
  hosted.where = loc;
  hosted.waiting.push_back(reply);
  {
    // The start may have ended already (on another thread): then say so here.
    std::lock_guard<std::mutex> lock(signal->mu);
    signal->ref_id = loc.id;
    if (signal->started) (void)self().tell(HostedStarted{id, loc.id});
  }
  monitor(ref, [this, id, loc](const Down& d) {
    auto it = actors_.find(id);
    if (it == actors_.end() || it->second.where.id != loc.id) return;
    if (!it->second.started) {
      // Gone before its start was answered: the start failed (its creation's
      // answer says why; the head records it, with no exit to report).
      start_ended(id, it->second,
                  Status(ErrorCode::start_failed, d.reason.message.empty() ? d.reason.to_string() : d.reason.message));
      return;
    }
    actors_.erase(it);
    {
      std::lock_guard<std::mutex> lock(head_->mu);
      head_->latest.erase(id);
    }
    if (AnyRef h = head_->get()) {
      (void)h.tell(ActorExited{id, loc, d.reason.abnormal(), d.reason.to_string()});
    }
  });
  return reply;
}

void WorkerActor::handle(const HostedStarted& m) {
  auto it = actors_.find(m.actor_id);
  if (it == actors_.end() || it->second.where.id != m.ref_id || it->second.started) return;
  start_ended(m.actor_id, it->second, Status());
}

void WorkerActor::start_ended(const std::string& id, Hosted& h, const Status& outcome) {
  std::vector<Deferred<Location>> waiting = std::move(h.waiting);
  h.waiting.clear();
  if (outcome.ok()) {
    h.started = true;
    for (auto& w : waiting) w.complete(h.where);
    return;
  }
  actors_.erase(id);
  {
    std::lock_guard<std::mutex> lock(head_->mu);
    head_->latest.erase(id);
  }
  for (auto& w : waiting) w.fail(outcome);
}

void WorkerActor::handle(const StopActor& m) {
  auto it = actors_.find(m.actor_id);
  if (it != actors_.end()) rt_->stop(it->second.ref);
}

Snapshots WorkerActor::handle(const AdoptWorker& m) {
  Snapshots out;
  for (auto& [id, hosted] : actors_) out.hosted.push_back(id);
  std::lock_guard<std::mutex> lock(head_->mu);
  head_->head = m.head;
  out.latest = head_->latest;
  return out;
}

namespace {

std::string take_env(const char* name) {
  const char* v = getenv(name);
  std::string s = v ? v : "";
  unsetenv(name);  // processes the actors start are not workers
  return s;
}

int run_worker(const std::string& worker_id, const std::string& agent_address, const std::string& listen) {
  // SIGTERM (the agent stopping, StopWorker) ends the worker gracefully: its
  // actors stop in order and take their final snapshots. The signal is
  // taken by a thread of its own; every other thread, the runtime's
  // included, inherits the blocked mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  RuntimeConfig cfg;
  cfg.listen = listen;
  if (const char* spin = getenv("TROUPE_WORKER_SPIN_US")) cfg.network_spin = std::chrono::microseconds(std::atoll(spin));
  // A worker's work comes from the network, and workers often outnumber
  // the cores: CAF's moderate idle phase (each idle scheduler thread waking
  // every few tens of microseconds for a while after every message) then
  // takes the cores from whatever computes (a collective's arena, a model
  // step). Measured on 2 cores: a 4-process arena allreduce of 64 MiB 1.7
  // -> 2.1-2.3 GB/s, mesh call and cast to 8 and 64 actors 20-35% faster,
  // the main RL job 21.1 -> 19.4-19.9 s. TROUPE_WORKER_SLEEP_WHEN_IDLE=0
  // restores it.
  const char* sleep_env = getenv("TROUPE_WORKER_SLEEP_WHEN_IDLE");
  cfg.sleep_when_idle = sleep_env == nullptr || std::string(sleep_env) != "0";
  auto scheme = listen.find("://");
  cfg.transport = scheme == std::string::npos ? "tcp" : listen.substr(0, scheme);
  Runtime rt(cfg);
  if (rt.address().empty()) {
    std::fprintf(stderr, "troupe worker %s: cannot listen on %s\n", worker_id.c_str(), listen.c_str());
    return 1;
  }
  // Up to most of the agent's 30 s start bound: a machine starting many
  // workers at once (or running them under a sanitizer) is slow to answer.
  auto agent = rt.resolve_any(agent_address + "/troupe.agent", std::chrono::seconds(25));
  if (!agent) {
    std::fprintf(stderr, "troupe worker %s: its agent at %s does not answer: %s\n", worker_id.c_str(),
                 agent_address.c_str(), agent.error().message().c_str());
    return 1;
  }
  std::promise<void> done;
  std::once_flag once;
  auto worker = rt.spawn<WorkerActor>(&rt, worker_id, *agent, [&] { std::call_once(once, [&] { done.set_value(); }); });
  auto where = rt.locate(worker);
  if (!where) {
    std::fprintf(stderr, "troupe worker %s: %s\n", worker_id.c_str(), where.error().message().c_str());
    return 1;
  }
  if (Status s = agent->tell(WorkerReady{worker_id, worker, Location{where->first, where->second}}); !s.ok()) {
    std::fprintf(stderr, "troupe worker %s: cannot report to its agent: %s\n", worker_id.c_str(), s.message().c_str());
    return 1;
  }
  TROUPE_LOG(info, "event=worker_serving worker={} address={}", worker_id, rt.address());
  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::call_once(once, [&] { done.set_value(); });
  });
  signals.detach();  // blocked in sigwait until the process ends
  done.get_future().wait();
  (void)rt.shutdown();
  return 0;
}

}  // namespace
}  // namespace troupe::cluster

namespace troupe {

bool is_worker_process() { return getenv(cluster::kWorkerIdEnv) != nullptr; }

void serve_if_worker() {
  if (!is_worker_process()) return;
  // Workers move large messages (collectives' chunks, weights): keep freed
  // blocks for reuse instead of unmapping and faulting fresh zeroed pages in
  // for every one.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  std::string id = cluster::take_env(cluster::kWorkerIdEnv);
  std::string agent = cluster::take_env(cluster::kWorkerAgentEnv);
  std::string listen = cluster::take_env(cluster::kWorkerListenEnv);
  std::exit(cluster::run_worker(id, agent, listen));
}

}  // namespace troupe
