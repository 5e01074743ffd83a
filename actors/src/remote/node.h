// A node is this process's presence on the network: it owns a transport,
// does the handshake (protocol version, node id, cluster token), maps actor
// ids to local cells for peers and remote actors to local proxy cells, and
// turns connection loss into prompt errors (peer_lost) and down notices.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <caf/all.hpp>

#include "transport.h"
#include "troupe/detail/message.h"
#include "troupe/remote_buffer.h"
#include "troupe/status.h"

namespace troupe::detail {

class Cell;
class Node;
class RuntimeImpl;

/// The remote actor a proxy cell stands for.
struct RemoteTarget {
  std::weak_ptr<Node> node;
  std::string address;
  uint64_t id = 0;
  /// Set (before the asks in flight fail) once the connection to its
  /// process is lost; the proxy's own end follows asynchronously.
  std::atomic<bool> lost{false};
};

struct NodeConfig {
  /// Where to accept connections ("tcp://127.0.0.1:0"); empty: dial only.
  std::string listen;
  /// "tcp" or "ucx": used when `listen` names no scheme or is empty.
  std::string transport = "tcp";
  /// The cluster token every peer must present.
  std::string token;
  wire::Limits limits;
  /// See RuntimeConfig::max_send_queue_bytes.
  uint64_t max_send_queue_bytes = uint64_t{2} << 30;
  /// See RuntimeConfig::slowest_frame_bytes_per_s.
  uint64_t slowest_frame_bytes_per_s = uint64_t{64} << 20;
  std::chrono::milliseconds heartbeat_interval{200};
  /// A peer silent for this long is declared lost.
  std::chrono::milliseconds dead_after{1000};
};

/// Resolves the cluster token: the configured one, else TROUPE_CLUSTER_TOKEN,
/// else the file $TROUPE_HOME/cluster_token (default ~/.troupe), created with
/// a fresh random token on first use.
Result<std::string> resolve_cluster_token(const std::string& configured);

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node(RuntimeImpl* rt, NodeConfig config);
  ~Node();

  /// Starts the transport (and listens when configured).
  Status start();
  /// This node's address for peers ("tcp://127.0.0.1:41234"), or "" when it
  /// does not listen.
  std::string address() const;
  /// Closes every connection; pending asks fail with peer_lost.
  void stop();

  /// Makes a local actor reachable as NAME by other processes.
  Status publish(const std::string& name, CellControl* cell);
  /// Finds NAME on the node at `address`, returning a proxy ref. Blocks up
  /// to `timeout`.
  Result<CellPtr> resolve(const std::string& address, const std::string& name, std::chrono::milliseconds timeout);

  /// Sends an envelope to the remote actor behind `proxy` (any thread). On
  /// failure the reply is failed with the reason, except where `kept` is
  /// given and the message could not leave because the connection is gone
  /// (peer_lost): then `env` keeps its message and reply, and *kept is true.
  Status send_envelope(Cell* proxy, Envelope& env, bool* kept = nullptr);

  /// Remote buffers: registration, and reads/writes from any thread.
  Result<RemoteBuffer> register_region(void* data, size_t size);
  /// Allocates and registers `size` bytes (see Runtime::allocate_buffer);
  /// the handle and where the bytes are.
  Result<std::pair<RemoteBuffer, void*>> allocate_region(size_t size);
  void deregister_region(uint64_t region);
  /// Reads (or writes) through a handle; completes `reply` (a
  /// ReplyTo<void>) from whichever thread finishes the operation.
  void region_op(const RemoteBuffer& buffer, void* ptr, size_t n, uint64_t offset, bool write, ReplyRef reply);

  /// Ref encoding (codec): export a local cell / resolve an address + id.
  void encode_ref(codec::Writer& w, CellControl* cell);
  /// Where a cell is reachable from other processes (what encode_ref
  /// writes); exports a local one.
  Result<std::pair<std::string, uint64_t>> locate(CellControl* cell);
  /// The cell for actor `id` at `address`: local when it is this node's,
  /// else a proxy. False (with `error` set) for a bad address.
  bool ref_for(const std::string& address, uint64_t id, CellPtr* out, std::string* error);

  // Internal, used by RemoteReply.
  void send_reply(transport::PeerId peer, uint64_t correlation, std::string bytes, std::vector<codec::Splice> splices);
  void send_error(transport::PeerId peer, uint64_t correlation, const Status& status);

 private:
  struct Peer {
    transport::PeerId id = 0;
    bool inbound = false;
    bool ready = false;    // handshake done
    std::string address;   // the peer's listen address (known after the handshake)
    uint64_t node_id = 0;  // the peer node's id (inbound: from its hello)
    Status refused;        // why the handshake failed, if it did
    // This node refused the peer's hello and left the connection open for
    // the dialer to read why (the heartbeat sweep closes it).
    std::atomic<bool> refused_here{false};
    std::atomic<bool> leaving{false};  // it said goodbye: its loss is expected
    std::mutex send_mu;    // orders sequence numbers with transport sends
    uint64_t next_seq = 1;
    uint64_t expect_seq = 1;  // transport thread only
    std::atomic<int64_t> last_recv_us{0};
    std::atomic<int64_t> last_send_us{0};
    struct PendingAsk {
      ReplyRef reply;
      // Its frame is on its way to the transport: its sender, not the loss
      // handler, settles it (see send_envelope).
      bool sending = false;
    };
    std::map<uint64_t, PendingAsk> asks;  // correlation -> asker (under Node::mu_)
    Status lost;  // why the connection was lost, once it was (under Node::mu_)
  };
  struct PendingResolve {
    ReplyRef reply;  // FutureState<uint64_t>
    std::string address;
  };

  std::shared_ptr<Peer> peer_for(const std::string& address, Status* why);
  Status send_frame(Peer& peer, const wire::Message& header, std::string payload,
                    std::vector<codec::Splice> splices = {});
  std::shared_ptr<Peer> find_peer(transport::PeerId id);
  CellPtr proxy_for(const std::string& address, uint64_t id);
  CellPtr find_export(uint64_t id);

  // Transport events (transport thread).
  void on_connected(transport::PeerId id, bool inbound);
  void on_frame(transport::PeerId id, transport::InFrame frame);
  void handle_frame(transport::PeerId id, transport::InFrame frame);
  void on_lost(transport::PeerId id, Status why);
  void on_envelope(const std::shared_ptr<Peer>& peer, const wire::EnvelopeHeader& h, std::string payload);

  void heartbeat_loop();

  RuntimeImpl* rt_;
  NodeConfig config_;
  uint64_t node_id_;
  std::unique_ptr<transport::Transport> transport_;
  std::string address_;

  mutable std::mutex mu_;
  std::unordered_map<transport::PeerId, std::shared_ptr<Peer>> peers_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> by_address_;
  std::unordered_map<uint64_t, caf::weak_actor_ptr> exports_;  // local actor id -> cell
  std::unordered_map<std::string, uint64_t> names_;
  std::map<std::pair<std::string, uint64_t>, caf::weak_actor_ptr> proxies_;
  std::unordered_map<uint64_t, PendingResolve> resolves_;
  std::unordered_set<transport::PeerId> lost_early_;  // see peer_for()
  struct Region {
    std::byte* data;
    size_t size;
    uint64_t transport_region;  // 0: not registered with the transport
    bool heap_owned = false;    // allocated here (not by the transport): freed on deregistration
  };
  std::unordered_map<uint64_t, Region> regions_;
  std::atomic<uint64_t> next_region_{1};
  struct PendingRegionOp {
    ReplyRef reply;  // ReplyTo<void>
    void* dst;       // reads copy here
    size_t n;
    std::string address;
  };
  std::unordered_map<uint64_t, PendingRegionOp> region_ops_;
  std::atomic<uint64_t> next_correlation_{1};
  /// When the frame being handled now started (0: none). A frame that takes
  /// long to handle (decoding a huge payload) stalls this node's reading;
  /// peers are not to blame for the silence meanwhile.
  std::atomic<int64_t> handling_since_us_{0};

  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool stopping_ = false;
  std::thread hb_thread_;
};

}  // namespace troupe::detail
