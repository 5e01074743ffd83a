// Cross-process benchmarks: an actor in this process asks one in another
// process (a copy of this program started with --serve), over TCP loopback
// and over UCX (shared memory). The raw floor is ucx_perftest on the same
// machine, same transport and message size, run in the same invocation:
//   ask round trip        vs 2 x ucp_am_lat one-way latency
//   tell throughput       vs ucp_am_bw message rate
//   remote-buffer reads   vs ucp_put_bw bandwidth
//   large messages        vs the remote-buffer read of the same size
// Both processes run one scheduler thread unless BENCH_THREADS says
// otherwise: two processes on this 2-core machine, one core each, as
// ucx_perftest runs.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../common/report.h"
#include "../common/sampler.h"
#include "troupe/troupe.h"

using namespace std::chrono_literals;
using troupe::bench::emit;
using troupe::bench::quantile;

namespace {

struct Blob {
  std::string data;
  TROUPE_MESSAGE(Blob, data);
};
struct Tick {
  std::string data;
  TROUPE_MESSAGE(Tick, data);
};
/// A large payload as troupe::Bytes: sent from where it lies, received as
/// a slice of the frame (no copy into or out of the frame).
struct Chunk {
  troupe::Bytes data;
  TROUPE_MESSAGE(Chunk, data);
};
struct Total {
  TROUPE_MESSAGE(Total);
};
struct GetRegion {
  TROUPE_MESSAGE(GetRegion);
};

constexpr size_t kRegionBytes = size_t{256} << 20;

class Echo : public troupe::Actor<Echo, Blob, Tick, Chunk, Total, GetRegion> {
 public:
  explicit Echo(troupe::RemoteBuffer region) : region_(std::move(region)) {}
  std::string handle(Blob&& b) { return std::move(b.data); }
  void handle(const Tick&) { ++ticks_; }
  void handle(const Chunk&) { ++ticks_; }
  int64_t handle(const Total&) { return ticks_; }
  troupe::RemoteBuffer handle(const GetRegion&) { return region_; }

 private:
  int64_t ticks_ = 0;
  troupe::RemoteBuffer region_;
};

class Pinger : public troupe::bench::Sampler<Pinger, Echo> {
 public:
  explicit Pinger(size_t size) : payload_(size, 'p') {}
  void next() {
    loop_.next([this] {
      ask(to_, Blob{payload_}).then([this](troupe::Result<std::string> r) {
        if (!r) throw std::runtime_error("remote bench: " + r.error().to_string());
        loop_.record();
        next();
      });
    });
  }

 private:
  std::string payload_;
};

size_t threads_from_env() {
  const char* t = std::getenv("BENCH_THREADS");
  return t ? std::strtoul(t, nullptr, 10) : 1;
}

/// The runtimes here get their work from the network: sleep_when_idle on,
/// unless BENCH_POLLING=1 asks for the default scheduler polling.
bool sleep_when_idle() {
  const char* p = std::getenv("BENCH_POLLING");
  return !(p && std::string(p) == "1");
}

int serve(const std::string& token, const std::string& scheme) {
  troupe::RuntimeConfig cfg;
  cfg.listen = scheme + "://127.0.0.1:0";
  cfg.cluster_token = token;
  cfg.log_level = "warn";
  cfg.threads = threads_from_env();
  cfg.sleep_when_idle = sleep_when_idle();
  troupe::Runtime rt(cfg);
  // Allocated by the runtime (over UCX: shared memory a reader on this host
  // maps), the way a buffer made to be read remotely should be; touched, so
  // that no page faults land in the measurement.
  auto reg = rt.allocate_buffer(kRegionBytes);
  if (!reg) return std::fprintf(stderr, "serve: %s\n", reg.error().to_string().c_str()), 1;
  std::memset(reg->data(), 'r', kRegionBytes);
  auto s = rt.publish("echo", rt.spawn<Echo>(reg->handle()));
  if (!s.ok()) return std::fprintf(stderr, "serve: %s\n", s.to_string().c_str()), 1;
  std::printf("%s\n", rt.address().c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

/// The server process: a copy of this program with --serve.
struct Server {
  pid_t pid = -1;
  int in = -1;
  std::string address;
  Server(const std::string& token, const std::string& scheme) {
    int to[2], from[2];
    // Close-on-exec: neither this child nor others (ucx_perftest) may keep
    // a pipe end open, or the server never sees end-of-file on its stdin.
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) std::abort();
    pid = fork();
    if (pid == 0) {
      dup2(to[0], 0);
      dup2(from[1], 1);
      execl("/proc/self/exe", "remote_bench", "--serve", token.c_str(), scheme.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    in = to[1];
    char c;
    while (read(from[0], &c, 1) == 1 && c != '\n') address += c;
    close(from[0]);
  }
  ~Server() {
    close(in);
    int status;
    waitpid(pid, &status, 0);
  }
};

/// Runs ucx_perftest (server + client) and returns the client's "Final:"
/// numbers: {p50 latency us, average latency us, message rate}.
struct PerfResult {
  bool ok = false;
  double p50_us = 0, avg_us = 0, msg_rate = 0, bytes_per_s = 0;
};
PerfResult ucx_perftest(const std::string& tls, const std::string& test, size_t size, int iters, int port,
                        int warmup = 10000) {
  std::string env = "UCX_TLS=" + tls + " UCX_MM_ERROR_HANDLING=y ";
  std::string server = env + "timeout 120 ucx_perftest -p " + std::to_string(port) + " >/dev/null 2>&1 &";
  if (std::system(server.c_str()) != 0) return {};
  std::string client = env + "timeout 120 ucx_perftest 127.0.0.1 -p " + std::to_string(port) + " -t " + test +
                       " -s " + std::to_string(size) + " -n " + std::to_string(iters) + " -w " + std::to_string(warmup) +
                       " 2>&1";
  // The server needs a moment to listen; the client exits at once if it is
  // not there yet, so retry a bounded number of times.
  for (int attempt = 0; attempt < 50; ++attempt) {
    FILE* p = popen(client.c_str(), "r");
    if (!p) return {};
    char line[512];
    PerfResult r;
    while (std::fgets(line, sizeof(line), p)) {
      double iters_done, p50, avg, overall, bw_avg, bw_all, rate_avg, rate_all;
      if (std::sscanf(line, "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &iters_done, &p50, &avg, &overall, &bw_avg,
                      &bw_all, &rate_avg, &rate_all) == 8) {
        r = {true, p50, avg, rate_all, bw_all * 1024 * 1024};  // ucx_perftest's MB are MiB
      }
    }
    pclose(p);
    if (r.ok) return r;
    std::this_thread::sleep_for(50ms);
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--serve") return serve(argv[2], argv[3]);
  bool quick = troupe::bench::quick(argc, argv);
  const std::string token = "bench-token";
  int port = 20000 + static_cast<int>(getpid() % 20000);
  // UCX here picks shared memory for a peer on the same host; its floor is
  // ucx_perftest over shared memory. TCP's floor is ucx_perftest over TCP.
  struct Case {
    const char* scheme;
    const char* raw_tls;
    const char* raw_name;
    const char* rtt_target;
  };
  for (const Case& c : {Case{"tcp", "tcp", "UCX_TLS=tcp", "ratio <= 2"},
                        Case{"ucx", "sm,self", "UCX_TLS=sm (shared memory)", "ratio <= 4"}}) {
    // BENCH_TRANSPORT=tcp|ucx runs one transport only (for profiling).
    if (const char* only = std::getenv("BENCH_TRANSPORT"); only && std::string(only) != c.scheme) continue;
    Server server(token, c.scheme);
    if (server.address.empty()) return std::fprintf(stderr, "remote_bench: the server did not start\n"), 1;
    troupe::RuntimeConfig cfg;
    cfg.cluster_token = token;
    cfg.log_level = "warn";
    cfg.threads = threads_from_env();
    cfg.sleep_when_idle = sleep_when_idle();
    cfg.transport = c.scheme;
    troupe::Runtime rt(cfg);
    auto echo = rt.resolve<Echo>(server.address + "/echo");
    if (!echo) return std::fprintf(stderr, "remote_bench: %s\n", echo.error().to_string().c_str()), 1;
    // BENCH_REMOTE_LARGE_ONLY=1 skips the asks and small tells (for
    // profiling the reads and large messages).
    const bool large_only = std::getenv("BENCH_REMOTE_LARGE_ONLY") != nullptr;
    for (size_t size : {size_t{8}, size_t{4096}}) {
      if (large_only) break;
      int n = quick ? 2000 : 20000;
      if (const char* asks = std::getenv("BENCH_ASKS")) n = std::atoi(asks);  // longer runs for profiling
      auto pinger = rt.spawn<Pinger>(size);
      auto samples = pinger.ask(troupe::bench::RunSamples<Echo>{*echo, n}, 600s).get();
      if (!samples) return std::fprintf(stderr, "remote_bench: %s\n", samples.error().to_string().c_str()), 1;
      double p50 = quantile(*samples, 0.5), p99 = quantile(*samples, 0.99);
      auto raw = ucx_perftest(c.raw_tls, "ucp_am_lat", size, n, port++);
      double raw_rtt = raw.ok ? 2 * raw.p50_us : 0;
      std::string base = std::string("ucx_perftest ucp_am_lat ") + c.raw_name + ", 2 x one-way p50";
      std::string name = std::string("remote.ask_rtt_") + c.scheme + "_" + std::to_string(size) + "B";
      emit(name, "p50", p50, "us", base, raw_rtt, c.rtt_target);
      emit(name, "p99", p99, "us", base, raw_rtt, "report");

      int64_t count = quick ? 50'000 : 500'000;
      if (size > 8) count /= 4;
      auto before = echo->ask(Total{}).get().value_or(0);
      std::string payload(size, 't');
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < count; ++i) {
        while (echo->tell(Tick{payload}).code() == troupe::ErrorCode::mailbox_full) std::this_thread::sleep_for(20us);
      }
      if (std::getenv("BENCH_DEBUG")) std::fprintf(stderr, "sent in %.3f s\n", troupe::bench::seconds_since(t0));
      auto after = echo->ask(Total{}, 600s).get().value_or(0);
      double secs = troupe::bench::seconds_since(t0);
      if (after - before != count) {
        std::fprintf(stderr, "remote_bench: %lld ticks lost\n", static_cast<long long>(count - (after - before)));
      }
      auto raw_bw = ucx_perftest(c.raw_tls, "ucp_am_bw", size, static_cast<int>(count), port++);
      emit(std::string("remote.tell_throughput_") + c.scheme + "_" + std::to_string(size) + "B", "messages_per_s",
           count / secs, "msg/s", std::string("ucx_perftest ucp_am_bw ") + c.raw_name + " message rate",
           raw_bw.ok ? raw_bw.msg_rate : 0,
           std::string(c.scheme) == "ucx" && size == 8 ? "value >= 1000000" : "report");
    }

    // Remote-buffer reads: one-sided gets over UCX, request/response frames
    // over TCP. Floor: ucx_perftest ucp_put_bw, same size and transport.
    auto region = echo->ask(GetRegion{}).get();
    if (!region) return std::fprintf(stderr, "remote_bench: %s\n", region.error().to_string().c_str()), 1;
    std::vector<char> local(kRegionBytes, 'l');
    std::map<size_t, double> read_gbps;  // by MiB: the floor of the large messages below
    for (size_t mib : {size_t{1}, size_t{4}, size_t{16}, size_t{64}, size_t{256}}) {
      if (std::getenv("BENCH_SKIP_READS")) break;  // profiling the messages alone (no floor then)
      size_t bytes = mib << 20;
      int reps = static_cast<int>(std::max<size_t>(3, (quick ? 512 : 4096) / mib));
      if (auto w = region->read_into(local.data(), bytes, 0, 600s).get(); !w) {
        return std::fprintf(stderr, "remote_bench: %s\n", w.error().to_string().c_str()), 1;
      }
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) (void)region->read_into(local.data(), bytes, 0, 600s).get();
      double gbps = static_cast<double>(bytes) * reps / troupe::bench::seconds_since(t0) / 1e9;
      read_gbps[mib] = gbps;
      // UCX's own TCP put is slow for large sizes: a few repetitions keep the
      // floor's run within ucx_perftest's time limit; bandwidth is an average.
      auto raw = ucx_perftest(c.raw_tls, "ucp_put_bw", bytes, std::min(reps, mib >= 16 ? 4 : reps), port++, 2);
      emit(std::string("remote.buffer_read_") + c.scheme + "_" + std::to_string(mib) + "MiB", "bandwidth", gbps,
           "GB/s", std::string("ucx_perftest ucp_put_bw ") + c.raw_name, raw.ok ? raw.bytes_per_s / 1e9 : 0,
           std::string(c.scheme) == "ucx" && mib >= 64 ? "ratio >= 0.85" : "report");
    }

    // Large messages: the same bytes carried in tells (encoded, framed,
    // decoded), against the remote-buffer read of that size just measured.
    // What a program that sends tensors as messages gets; troupe's own
    // large transfers (weights, state, collectives' chunks of at most
    // chunk_bytes) go by reads or in chunks.
    // Each size twice: a std::string field (encoded into the frame, decoded
    // out of it: copied on both sides) and a troupe::Bytes field (sent from
    // where it lies, received as a slice of the frame).
    auto run_large = [&](size_t mib, auto make) {
      size_t bytes = mib << 20;
      int64_t count = static_cast<int64_t>(std::max<size_t>(4, (quick ? 256 : 1024) / mib));
      auto message = make(bytes);
      (void)echo->tell(message);  // warm-up: buffers of this size on both sides
      auto before = echo->ask(Total{}, 600s).get().value_or(0);
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < count; ++i) {
        while (echo->tell(message).code() == troupe::ErrorCode::mailbox_full) std::this_thread::sleep_for(100us);
      }
      auto after = echo->ask(Total{}, 600s).get().value_or(0);
      double secs = troupe::bench::seconds_since(t0);
      if (after - before != count) {
        std::fprintf(stderr, "remote_bench: %lld large messages lost\n", static_cast<long long>(count - (after - before)));
      }
      return static_cast<double>(bytes) * count / secs / 1e9;
    };
    // One at a time (an ask each, as the reads go): the receiver's buffer
    // of the last frame is back before the next comes, so this row shows
    // the frames' own cost without a pipeline's memory (receive_pool.h;
    // TROUPE_RECEIVE_POOL_MIB=0 turns the pool off to compare).
    auto run_asks = [&](size_t mib) {
      size_t bytes = mib << 20;
      int reps = static_cast<int>(std::max<size_t>(3, (quick ? 512 : 4096) / mib));
      Chunk message{troupe::Bytes(std::string(bytes, 'm'))};
      (void)echo->ask(message, 600s).get();  // warm-up
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) {
        if (auto r = echo->ask(message, 600s).get(); !r) {
          std::fprintf(stderr, "remote_bench: %s\n", r.error().to_string().c_str());
          return 0.0;
        }
      }
      return static_cast<double>(bytes) * reps / troupe::bench::seconds_since(t0) / 1e9;
    };
    std::vector<size_t> large_mib{1, 4, 16, 64};
    if (const char* e = std::getenv("BENCH_REMOTE_LARGE_MIB")) large_mib = {std::stoul(e)};  // one size (profiling)
    for (size_t mib : large_mib) {
      emit(std::string("remote.message_ask_bytes_") + c.scheme + "_" + std::to_string(mib) + "MiB", "bandwidth",
           run_asks(mib), "GB/s", "remote-buffer read of the same size (this run)", read_gbps[mib], "report");
      double as_string = run_large(mib, [](size_t n) { return Tick{std::string(n, 'm')}; });
      emit(std::string("remote.message_bandwidth_") + c.scheme + "_" + std::to_string(mib) + "MiB", "bandwidth",
           as_string, "GB/s", "remote-buffer read of the same size (this run)", read_gbps[mib], "report");
      double as_bytes = run_large(mib, [](size_t n) { return Chunk{troupe::Bytes(std::string(n, 'm'))}; });
      emit(std::string("remote.message_bandwidth_bytes_") + c.scheme + "_" + std::to_string(mib) + "MiB", "bandwidth",
           as_bytes, "GB/s", "remote-buffer read of the same size (this run)", read_gbps[mib], "report");
    }
  }
  return 0;
}
