# troupe's wire protocol. Every frame on a connection is one `Frame` message
# (the header), optionally followed by raw payload bytes that travel outside
# Cap'n Proto so that large payloads need no copy (UCX rendezvous, one TCP
# write). See docs/transports.md.
@0xb1c3e5d7a9f20461;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire::schema");

const protocolVersion :UInt32 = 1;

# First frame in each direction. A connection whose Hello does not carry the
# cluster's token, or a protocol version this node does not speak, is refused
# with a HelloReply that says why, then closed.
struct Hello {
  protocolVersion @0 :UInt32;
  nodeId @1 :UInt64;
  token @2 :Data;
  # Where the sender accepts connections (so that refs it sends can be dialled).
  listenAddress @3 :Text;
}

struct HelloReply {
  accepted @0 :Bool;
  nodeId @1 :UInt64;
  listenAddress @2 :Text;
  # Why the connection was refused, for the peer's log.
  error @3 :Text;
}

# A reference to an actor on some node: the node's listen address and the
# actor's id there.
struct ActorAddress {
  node @0 :Text;
  id @1 :UInt64;
}

# A user message, or the reply to an ask.
struct Envelope {
  enum Kind {
    tell @0;
    ask @1;
    reply @2;
    error @3;
  }
  kind @0 :Kind;
  # Sending actor's id on the sending node (0 when not sent by an actor).
  source @1 :UInt64;
  # Target actor's id on the receiving node.
  destination @2 :UInt64;
  # Per-connection sequence number: frames are delivered in this order.
  sequence @3 :UInt64;
  # Stable id of the message type (hash of its registered name).
  typeId @4 :UInt64;
  # Ask id chosen by the asker; echoed in the reply or error.
  correlation @5 :UInt64;
  # For kind = error: an ErrorCode value and the message.
  errorCode @6 :UInt8;
  errorMessage @7 :Text;
}

# Name service between two nodes: resolve a published name to an actor id.
struct Resolve {
  correlation @0 :UInt64;
  name @1 :Text;
}

struct Resolved {
  correlation @0 :UInt64;
  # 0 when the name is not published.
  id @1 :UInt64;
  error @2 :Text;
}

# Watch an actor on the receiving node; `Down` is sent when it stops.
struct Monitor {
  actor @0 :UInt64;
}

struct Down {
  actor @0 :UInt64;
  reasonKind @1 :UInt8;
  reason @2 :Text;
}

# A registered memory region, as passed inside messages (Monarch's RDMABuffer).
struct BufferHandle {
  # The owner's listen address.
  owner @0 :Text;
  # Region id on the owner (for transports that emulate RMA).
  region @1 :UInt64;
  address @2 :UInt64;
  length @3 :UInt64;
  # Transport-specific packed remote key (UCX rkey); empty for TCP.
  key @4 :Data;
}

# Emulated RMA (TCP): read or write a region of the receiving node.
struct RegionRequest {
  correlation @0 :UInt64;
  region @1 :UInt64;
  offset @2 :UInt64;
  length @3 :UInt64;
  write @4 :Bool;  # write: the payload holds the bytes
}

struct RegionResponse {
  correlation @0 :UInt64;
  error @1 :Text;  # empty on success; a read's bytes are the payload
}

struct Frame {
  union {
    hello @0 :Hello;
    helloReply @1 :HelloReply;
    envelope @2 :Envelope;
    resolve @3 :Resolve;
    resolved @4 :Resolved;
    monitor @5 :Monitor;
    down @6 :Down;
    regionRequest @7 :RegionRequest;
    regionResponse @8 :RegionResponse;
    # Liveness probe; carries the sender's monotonic time in microseconds.
    heartbeat @9 :UInt64;
    # The sender is closing the connection on purpose, and why.
    goodbye @10 :Text;
  }
}
