// Actor meshes on a real cluster: 8 worker processes across 2 agents laid out
// as {hosts: 2, procs: 4}; calls gather replies in rank order, slices select
// by coordinates, a dead member shows up as a partial failure, and the
// restarted process brings its actor back at its coordinates.
#include <signal.h>
#include <unistd.h>

#include <set>
#include <thread>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/local_cluster.h"
#include "support/scoped_env.h"
#include "troupe/mesh.h"

using namespace std::chrono_literals;
using troupe::ErrorCode;
using namespace troupe::test;

namespace {

struct WhoIs {
  TROUPE_MESSAGE_NAMED(WhoIs, "test.mesh.WhoIs");
};
struct Bump {
  int n = 0;
  TROUPE_MESSAGE_NAMED(Bump, "test.mesh.Bump", n);
};
struct Seen {
  TROUPE_MESSAGE_NAMED(Seen, "test.mesh.Seen");
};
/// Works `ms` (in the member's process) before it answers with its pid; the
/// member in process `slow_pid` works `slow_ms` instead.
struct Work {
  int ms = 0;
  int64_t slow_pid = 0;
  int slow_ms = 0;
  TROUPE_MESSAGE_NAMED(Work, "test.mesh.Work", ms, slow_pid, slow_ms);
};
/// The member in process `pid` fails this call; the others answer.
struct FailIn {
  int64_t pid = 0;
  TROUPE_MESSAGE_NAMED(FailIn, "test.mesh.FailIn", pid);
};

/// A mesh member: says which process it is in, counts casts it received.
class Member : public troupe::Actor<Member, WhoIs, Bump, Seen, FailIn, Work> {
 public:
  explicit Member(std::string tag) : tag_(std::move(tag)) {}
  std::string handle(const WhoIs&) { return tag_ + ":" + std::to_string(getpid()); }
  void handle(const Bump& m) { seen_ += m.n; }
  int handle(const Seen&) { return seen_; }
  int64_t handle(const Work& m) {
    std::this_thread::sleep_for(std::chrono::milliseconds(getpid() == m.slow_pid ? m.slow_ms : m.ms));  // the work
    return getpid();
  }
  int handle(const FailIn& m) {
    if (m.pid == getpid()) fail("asked to fail");
    return 1;
  }

 private:
  std::string tag_;
  int seen_ = 0;
};

struct GetFailures {};
/// A mesh's owner: keeps the failures it is told of.
class MeshOwner : public troupe::Actor<MeshOwner, troupe::MeshFailure, GetFailures> {
 public:
  void handle(const troupe::MeshFailure& f) { got_.push_back(f); }
  std::vector<troupe::MeshFailure> handle(const GetFailures&) { return got_; }

 private:
  std::vector<troupe::MeshFailure> got_;
};

/// Polls the members' Seen totals until each has at least `want(i)` (a cast
/// goes through other processes, so a later call may overtake it), then
/// returns them: more than wanted would mean a duplicate delivery.
template <class Mesh, class Want>
std::vector<int> seen_when_arrived(const Mesh& mesh, Want want) {
  std::vector<int> got;
  for (int attempt = 0; attempt < 500; ++attempt) {
    auto seen = mesh.call(Seen{});
    got.clear();
    bool arrived = seen.ok();
    for (size_t i = 0; i < seen.size() && arrived; ++i) {
      got.push_back(*seen[i]);
      arrived = *seen[i] >= want(i);
    }
    if (arrived) return got;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling other processes' state
  }
  return got;
}

int64_t pid_of(const std::string& who) { return std::stoll(who.substr(who.find(':') + 1)); }

struct VisibleGpus {
  TROUPE_MESSAGE_NAMED(VisibleGpus, "test.mesh.VisibleGpus");
};
/// Says which GPUs its process may use: "pid CUDA_VISIBLE_DEVICES", or
/// "pid (unset)".
class GpuView : public troupe::Actor<GpuView, VisibleGpus> {
 public:
  std::string handle(const VisibleGpus&) {
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    return std::to_string(getpid()) + " " + (v != nullptr ? v : "(unset)");
  }
};

/// The GPUs of a GpuView's reply.
std::vector<std::string> gpus_of(const std::string& reply) {
  std::vector<std::string> out;
  std::string rest = reply.substr(reply.find(' ') + 1);
  if (rest == "(unset)") return {"(unset)"};
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    if (comma > start) out.push_back(rest.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

using MeshCluster = EightProcessMesh;

}  // namespace

TEST_CASE("meshes: a mesh of 8 processes across 2 agents answers a call in rank order, one process each",
          "[cluster][mesh]") {
  MeshCluster m;
  REQUIRE(m.procs.processes().size() == 8);
  auto mesh = m.procs.spawn<Member>({}, "m").value();
  auto replies = mesh.call(WhoIs{});
  REQUIRE(replies.ok());
  REQUIRE(replies.size() == 8);
  std::set<int64_t> pids;
  std::set<std::string> nodes;
  for (size_t i = 0; i < replies.size(); ++i) {
    pids.insert(pid_of(*replies[i]));
    nodes.insert(mesh.info(i).node);
    CHECK(replies.shape().rank(i) == i);
  }
  CHECK(pids.size() == 8);   // a process per member
  CHECK(nodes.size() == 2);  // over both agents
  CHECK(pids.count(getpid()) == 0);

  // A slice: host 1's members, in order, are global ranks 4..7.
  auto host1 = mesh.slice({{"hosts", 1}}).value();
  auto from1 = host1.call(WhoIs{});
  REQUIRE(from1.ok());
  REQUIRE(from1.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(*from1[i] == *replies[4 + i]);
  // A range of a dimension: procs 1 and 3 on both hosts.
  auto odd = mesh.range("procs", 1, 4, 2).value();
  CHECK(odd.shape().ranks() == std::vector<size_t>{1, 3, 5, 7});
  CHECK(*odd.call(WhoIs{})[2] == *replies[5]);
}

TEST_CASE("meshes: cast reaches every member of a slice exactly once", "[cluster][mesh]") {
  MeshCluster m;
  auto mesh = m.procs.spawn<Member>({}, "m").value();
  auto host0 = mesh.slice({{"hosts", 0}}).value();
  REQUIRE(host0.cast(Bump{1}).ok());
  REQUIRE(mesh.cast(Bump{10}).ok());
  auto want = [](size_t i) { return i < 4 ? 11 : 10; };
  auto seen = seen_when_arrived(mesh, want);
  REQUIRE(seen.size() == 8);
  for (size_t i = 0; i < 8; ++i) CHECK(seen[i] == want(i));
}

TEST_CASE("meshes: a failing member is a partial failure, the others' replies stay in rank order",
          "[cluster][mesh]") {
  MeshCluster m;
  auto mesh = m.procs.spawn<Member>({.max_restarts = -1}, "m").value();
  auto who = mesh.call(WhoIs{});
  REQUIRE(who.ok());
  auto partial = mesh.call(FailIn{pid_of(*who[5])});
  CHECK_FALSE(partial.ok());
  auto errors = partial.errors();
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].first == 5);
  CHECK(errors[0].second.code() == ErrorCode::handler_failed);
  CHECK_THAT(errors[0].second.message(), Catch::Contains("asked to fail"));
  for (size_t i = 0; i < 8; ++i) {
    if (i != 5) CHECK(*partial[i] == 1);
  }
}

TEST_CASE("meshes: kill -9 of a member's process: it restarts and answers again at its coordinates",
          "[cluster][mesh]") {
  MeshCluster m;
  auto mesh = m.procs.spawn<Member>({.max_restarts = -1}, "m").value();
  auto before = mesh.call(WhoIs{});
  REQUIRE(before.ok());
  int64_t victim = pid_of(*before[5]);
  REQUIRE(::kill(static_cast<pid_t>(victim), SIGKILL) == 0);
  // Its process and actor come back (the anchor first, then the member in
  // it); the same mesh reaches it at rank 5, the others untouched.
  bool back = false;
  troupe::Result<std::string> five = troupe::error(ErrorCode::timeout, "not yet");
  for (int i = 0; i < 100 && !back; ++i) {
    five = mesh.member(5).ask(WhoIs{}, 5s).get();  // the first may have been in flight at the kill
    back = five.has_value();
  }
  REQUIRE(back);
  CHECK(pid_of(*five) != victim);
  CHECK(mesh.member(5).ask(WhoIs{}).get().value() == *five);
  auto after = mesh.call(WhoIs{});
  REQUIRE(after.ok());
  for (size_t i = 0; i < 8; ++i) {
    if (i != 5) CHECK(*after[i] == *before[i]);
  }
  CHECK(m.local.cluster.actor(mesh.info(5).id).value().restarts == 1);
}

TEST_CASE("meshes: the mesh's owner is told which member failed and why, and the member rejoins",
          "[cluster][mesh]") {
  MeshCluster m;
  auto mesh = m.procs.spawn<Member>({.max_restarts = -1}, "m").value();
  auto owner = m.local.rt.spawn<MeshOwner>();
  REQUIRE(mesh.supervise(owner).ok());
  int64_t victim = pid_of(mesh.member(6).ask(WhoIs{}).get().value());
  REQUIRE(::kill(static_cast<pid_t>(victim), SIGKILL) == 0);
  std::vector<troupe::MeshFailure> failures;
  for (int i = 0; i < 500 && failures.empty(); ++i) {
    failures = owner.ask(GetFailures{}).get().value();
    if (failures.empty()) std::this_thread::sleep_for(10ms);  // polling the owner's record
  }
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].rank == 6);
  CHECK(failures[0].coords == std::vector<size_t>{1, 2});
  CHECK(failures[0].restarting);
  CHECK(failures[0].actor_id == mesh.info(6).id);
  CHECK_THAT(failures[0].reason, Catch::Contains("worker process died"));
  // It rejoins: the next call is whole again.
  troupe::Result<std::string> back = troupe::error(ErrorCode::timeout, "not yet");
  for (int i = 0; i < 100 && !back; ++i) back = mesh.member(6).ask(WhoIs{}, 5s).get();
  REQUIRE(back.has_value());
  CHECK(mesh.call(WhoIs{}).ok());
}

TEST_CASE("meshes: several actors per process: the shape gets a dimension, and a cast reaches each once",
          "[cluster][mesh]") {
  MeshCluster m;
  auto mesh = m.procs.spawn_per_process<Member>(2, "local", {}, "m").value();
  CHECK(mesh.shape().to_string() == "{hosts=2, procs=4, local=2}");
  REQUIRE(mesh.size() == 16);
  auto who = mesh.call(WhoIs{});
  REQUIRE(who.ok());
  for (size_t i = 0; i < 16; i += 2) CHECK(pid_of(*who[i]) == pid_of(*who[i + 1]));  // same process
  REQUIRE(mesh.range("local", 1, 2).value().cast(Bump{5}).ok());
  REQUIRE(mesh.cast(Bump{1}).ok());
  auto want = [](size_t i) { return i % 2 == 1 ? 6 : 1; };
  auto seen = seen_when_arrived(mesh, want);
  REQUIRE(seen.size() == 16);
  for (size_t i = 0; i < 16; ++i) CHECK(seen[i] == want(i));
}

TEST_CASE("meshes: stream gives replies as they come, choose spreads asks over the least loaded members",
          "[cluster][mesh]") {
  MeshCluster m;
  auto mesh = m.procs.spawn<Member>({}, "m").value();
  int64_t slow = pid_of(mesh.member(2).ask(WhoIs{}).get().value());
  auto stream = mesh.stream(Work{0, slow, 300});
  std::vector<size_t> order;
  while (auto reply = stream.next()) {
    REQUIRE(reply->second.has_value());
    order.push_back(reply->first);
  }
  REQUIRE(order.size() == 8);
  CHECK(order.back() == 2);  // the slow one comes last
  CHECK(std::set<size_t>(order.begin(), order.end()).size() == 8);

  // Eight asks at once, each taking a while: one per member.
  std::vector<troupe::Future<int64_t>> chosen;
  for (int i = 0; i < 8; ++i) chosen.push_back(mesh.choose(Work{200, 0, 0}));
  std::set<int64_t> pids;
  for (auto& f : chosen) pids.insert(f.get().value());
  CHECK(pids.size() == 8);
}

TEST_CASE("meshes: a proc mesh on named nodes puts each process where it is told", "[cluster][mesh]") {
  LocalCluster local(2);
  auto shape = troupe::Shape::make({{"procs", 3}}).value();
  auto procs = troupe::ProcMesh::create_on_nodes(local.cluster, shape, {"a2", "a1", "a2"}).value();
  CHECK(procs.processes()[0].node == "a2");
  CHECK(procs.processes()[1].node == "a1");
  CHECK(procs.processes()[2].node == "a2");
  auto mesh = procs.spawn<Member>({}, "n").value();
  auto who = mesh.call(WhoIs{});
  REQUIRE(who.ok());
  CHECK(pid_of(*who[0]) != pid_of(*who[2]));  // a process each, even on one node
  CHECK(mesh.info(1).node == "a1");
  auto bad = troupe::ProcMesh::create_on_nodes(local.cluster, shape, {"a1"});
  REQUIRE_FALSE(bad.has_value());
  CHECK_THAT(bad.error().message(), Catch::Contains("3 processes but 1 nodes"));
}

TEST_CASE("meshes: each process of a GPU bundle sees only the GPUs reserved for it, again after a restart",
          "[cluster][mesh]") {
  LocalCluster local{0};
  // The agent is shown 4 of a machine's GPUs (as a container or a job
  // scheduler would); the node's GPUs 0..3 are those.
  ScopedEnv shown("CUDA_VISIBLE_DEVICES", "4,5,6,7");
  local.agents.push_back(launch(local.home, {"start", "--address", local.head_process->address(), "--node-id", "g1",
                                             "--cpus", "8", "--gpus", "4"}));
  REQUIRE(status_until(local.cluster, 5s, [](auto& st) { return st.nodes.size() == 1; }));

  // One process per bundle: a whole GPU, two whole GPUs, two half GPUs,
  // and none.
  troupe::PlacementGroupSpec spec;
  spec.strategy = troupe::PlacementStrategy::pack;
  spec.bundles = {troupe::Bundle{{{"CPU", 0.5}, {"GPU", 1}}}, troupe::Bundle{{{"CPU", 0.5}, {"GPU", 2}}},
                  troupe::Bundle{{{"CPU", 0.5}, {"GPU", 0.5}}}, troupe::Bundle{{{"CPU", 0.5}, {"GPU", 0.5}}},
                  troupe::Bundle{{{"CPU", 0.5}}}};
  auto pg = local.cluster.create_placement_group(spec).value();
  auto procs = troupe::ProcMesh::create(local.cluster, troupe::Shape::make({{"procs", 5}}).value(), pg).value();
  auto mesh = procs.spawn<GpuView>({.max_restarts = -1}).value();
  auto replies = mesh.call(VisibleGpus{});
  REQUIRE(replies.ok());
  std::vector<std::vector<std::string>> seen;
  for (size_t i = 0; i < 5; ++i) seen.push_back(gpus_of(*replies[i]));
  INFO(*replies[0] << " | " << *replies[1] << " | " << *replies[2] << " | " << *replies[3] << " | " << *replies[4]);
  REQUIRE(seen[0].size() == 1);
  REQUIRE(seen[1].size() == 2);
  REQUIRE(seen[2].size() == 1);
  CHECK(seen[3] == seen[2]);  // two halves share one GPU
  // No GPU asked for: not narrowed (as Ray leaves a zero-GPU actor), the agent's view.
  CHECK(seen[4] == std::vector<std::string>{"4", "5", "6", "7"});
  // The whole GPUs and the shared one are distinct, and all are the agent's.
  std::set<std::string> ids{seen[0][0], seen[1][0], seen[1][1], seen[2][0]};
  CHECK(ids == std::set<std::string>{"4", "5", "6", "7"});

  // The two-GPU process dies: its new process gets GPUs again, and only
  // the ones its predecessor gave back (the others are still held).
  const int64_t victim = std::stoll(replies[1]->substr(0, replies[1]->find(' ')));
  REQUIRE(::kill(static_cast<pid_t>(victim), SIGKILL) == 0);
  troupe::Result<std::string> again = troupe::error(ErrorCode::timeout, "not yet");
  for (int i = 0; i < 100; ++i) {
    again = mesh.member(1).ask(VisibleGpus{}, 5s).get();  // the first may have been in flight at the kill
    if (again && std::stoll(again->substr(0, again->find(' '))) != victim) break;
  }
  REQUIRE(again.has_value());
  CHECK(std::stoll(again->substr(0, again->find(' '))) != victim);
  auto regained = gpus_of(*again);
  CHECK(std::set<std::string>(regained.begin(), regained.end()) ==
        std::set<std::string>(seen[1].begin(), seen[1].end()));
}
