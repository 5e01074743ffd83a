// The only file that sees Cap'n Proto: encodes and decodes the plain structs
// of wire_types.h. Kept C++17-compatible (see wire_types.h).
#include <cstring>
#include <type_traits>
#include <utility>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "troupe.capnp.h"
#include "wire_types.h"

namespace troupe::wire {

namespace {

template <class>
inline constexpr bool kAlwaysFalse = false;

kj::ArrayPtr<const kj::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const kj::byte*>(s.data()), s.size()};
}

std::string to_string(capnp::Data::Reader d) { return {reinterpret_cast<const char*>(d.begin()), d.size()}; }
std::string to_string(capnp::Text::Reader t) { return {t.cStr(), t.size()}; }

template <class T>
bool ok(Message* out, T&& value) {
  *out = std::forward<T>(value);
  return true;
}

bool fail(std::string* err, std::string message) {
  *err = std::move(message);
  return false;
}

}  // namespace

const char* message_name(const Message& m) {
  static constexpr const char* kNames[] = {"hello",   "hello_reply", "envelope",        "resolve",
                                           "resolved", "monitor",     "down",            "region_request",
                                           "region_response", "heartbeat", "goodbye"};
  return kNames[m.index()];
}

std::string capnp_encode(const Message& m) {
  // A first segment on the stack covers every frame but those with long
  // strings, so encoding usually allocates only the output.
  capnp::word scratch[128];
  std::memset(scratch, 0, sizeof(scratch));  // Cap'n Proto requires a zeroed first segment
  capnp::MallocMessageBuilder builder(kj::arrayPtr(scratch, 128));
  auto frame = builder.initRoot<schema::Frame>();
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Hello>) {
          auto h = frame.initHello();
          h.setProtocolVersion(v.protocol_version);
          h.setNodeId(v.node_id);
          h.setToken(bytes_of(v.token));
          h.setListenAddress(v.listen_address);
        } else if constexpr (std::is_same_v<T, HelloReply>) {
          auto h = frame.initHelloReply();
          h.setAccepted(v.accepted);
          h.setNodeId(v.node_id);
          h.setListenAddress(v.listen_address);
          h.setError(v.error);
        } else if constexpr (std::is_same_v<T, EnvelopeHeader>) {
          auto e = frame.initEnvelope();
          e.setKind(static_cast<schema::Envelope::Kind>(v.kind));
          e.setSource(v.source);
          e.setDestination(v.destination);
          e.setSequence(v.sequence);
          e.setTypeId(v.type_id);
          e.setCorrelation(v.correlation);
          e.setErrorCode(v.error_code);
          if (!v.error_message.empty()) e.setErrorMessage(v.error_message);
        } else if constexpr (std::is_same_v<T, Resolve>) {
          auto r = frame.initResolve();
          r.setCorrelation(v.correlation);
          r.setName(v.name);
        } else if constexpr (std::is_same_v<T, Resolved>) {
          auto r = frame.initResolved();
          r.setCorrelation(v.correlation);
          r.setId(v.id);
          r.setError(v.error);
        } else if constexpr (std::is_same_v<T, MonitorRequest>) {
          frame.initMonitor().setActor(v.actor);
        } else if constexpr (std::is_same_v<T, DownNotice>) {
          auto d = frame.initDown();
          d.setActor(v.actor);
          d.setReasonKind(v.reason_kind);
          d.setReason(v.reason);
        } else if constexpr (std::is_same_v<T, RegionRequest>) {
          auto r = frame.initRegionRequest();
          r.setCorrelation(v.correlation);
          r.setRegion(v.region);
          r.setOffset(v.offset);
          r.setLength(v.length);
          r.setWrite(v.write);
        } else if constexpr (std::is_same_v<T, RegionResponse>) {
          auto r = frame.initRegionResponse();
          r.setCorrelation(v.correlation);
          r.setError(v.error);
        } else if constexpr (std::is_same_v<T, Heartbeat>) {
          frame.setHeartbeat(v.time_us);
        } else if constexpr (std::is_same_v<T, Goodbye>) {
          frame.setGoodbye(v.reason);
        } else {
          static_assert(kAlwaysFalse<T>, "encode: unhandled message type");
        }
      },
      m);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

bool capnp_decode(const void* words, size_t word_count, Message* out, std::string* err) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = word_count * 4 + 64;  // no amplification beyond the bytes received
  options.nestingLimit = 8;
  try {
    capnp::FlatArrayMessageReader reader(
        kj::arrayPtr(static_cast<const capnp::word*>(words), word_count), options);
    auto frame = reader.getRoot<schema::Frame>();
    switch (frame.which()) {
      case schema::Frame::HELLO: {
        auto h = frame.getHello();
        return ok(out, Hello{h.getProtocolVersion(), h.getNodeId(), to_string(h.getToken()),
                             to_string(h.getListenAddress())});
      }
      case schema::Frame::HELLO_REPLY: {
        auto h = frame.getHelloReply();
        return ok(out, HelloReply{h.getAccepted(), h.getNodeId(), to_string(h.getListenAddress()),
                                  to_string(h.getError())});
      }
      case schema::Frame::ENVELOPE: {
        auto e = frame.getEnvelope();
        auto kind = static_cast<uint16_t>(e.getKind());
        if (kind > static_cast<uint16_t>(EnvelopeKind::error)) {
          return fail(err, "frame: unknown envelope kind " + std::to_string(kind));
        }
        return ok(out, EnvelopeHeader{static_cast<EnvelopeKind>(kind), e.getSource(), e.getDestination(),
                                      e.getSequence(), e.getTypeId(), e.getCorrelation(), e.getErrorCode(),
                                      to_string(e.getErrorMessage())});
      }
      case schema::Frame::RESOLVE: {
        auto r = frame.getResolve();
        return ok(out, Resolve{r.getCorrelation(), to_string(r.getName())});
      }
      case schema::Frame::RESOLVED: {
        auto r = frame.getResolved();
        return ok(out, Resolved{r.getCorrelation(), r.getId(), to_string(r.getError())});
      }
      case schema::Frame::MONITOR:
        return ok(out, MonitorRequest{frame.getMonitor().getActor()});
      case schema::Frame::DOWN: {
        auto d = frame.getDown();
        return ok(out, DownNotice{d.getActor(), d.getReasonKind(), to_string(d.getReason())});
      }
      case schema::Frame::REGION_REQUEST: {
        auto r = frame.getRegionRequest();
        return ok(out, RegionRequest{r.getCorrelation(), r.getRegion(), r.getOffset(), r.getLength(), r.getWrite()});
      }
      case schema::Frame::REGION_RESPONSE: {
        auto r = frame.getRegionResponse();
        return ok(out, RegionResponse{r.getCorrelation(), to_string(r.getError())});
      }
      case schema::Frame::HEARTBEAT:
        return ok(out, Heartbeat{frame.getHeartbeat()});
      case schema::Frame::GOODBYE:
        return ok(out, Goodbye{to_string(frame.getGoodbye())});
    }
    return fail(err, "frame: unknown frame kind " + std::to_string(static_cast<int>(frame.which())) +
                     " (a newer protocol version?)");
  } catch (const kj::Exception& e) {
    return fail(err, "frame: malformed header: " + std::string(e.getDescription().cStr()));
  }
}


}  // namespace troupe::wire
