// Safetensors checkpoints: the model and a training state round-trip (bit
// for bit in F32, within bf16's precision in BF16), the bytes follow the
// format's spec, files as Python's safetensors writes them are read, every
// malformed file is refused with a message naming the problem, a model of
// another config is refused by name, and a failed write leaves nothing
// behind (and an older checkpoint intact).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "model/adamw.h"
#include "model/gpt.h"
#include "model/safetensors.h"
#include "support/temp_files.h"

using namespace troupe::rl::model;
using troupe::ErrorCode;
using troupe::Status;
namespace fs = std::filesystem;
using troupe::test::read_file;
using troupe::test::TempDir;
using troupe::test::with_file_size_limit;
using troupe::test::write_file;

namespace {

GptConfig tiny(bool tied = true) {
  return GptConfig{
      .vocab_size = 13, .context_length = 6, .layers = 2, .heads = 2, .channels = 8, .tied_embeddings = tied};
}

std::string u64_le(uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

// A file of `header` (padded with spaces to 8 when asked) and `data`.
std::string file_bytes(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return u64_le(header.size()) + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::vector<float> floats_of(const SafetensorsTensor& t) {
  REQUIRE(t.dtype == Dtype::f32);
  std::vector<float> out(t.data.size() / 4);
  std::memcpy(out.data(), t.data.data(), t.data.size());
  return out;
}

// One forward on a fixed batch: the per-token losses.
std::vector<float> losses_of(Gpt<float>& m) {
  std::vector<int32_t> tokens = {1, 5, 2, 12, 0, 7, 7, 3, 9, 4, 11, 6};
  std::vector<int32_t> targets = {5, 2, 12, 0, 3, 7, 3, 9, 4, 11, 6, 1};
  REQUIRE(m.forward(tokens.data(), targets.data(), 2, 6).ok());
  return std::vector<float>(m.losses(), m.losses() + 12);
}

// One training step on batch `b` (0 or 1).
void train_step(Gpt<float>& m, AdamW& opt, int b) {
  std::vector<int32_t> tokens =
      b == 0 ? std::vector<int32_t>{1, 5, 2, 12, 0, 7} : std::vector<int32_t>{3, 3, 8, 1, 0, 2};
  std::vector<int32_t> targets =
      b == 0 ? std::vector<int32_t>{5, 2, 12, 0, 7, 4} : std::vector<int32_t>{3, 8, 1, 0, 2, 9};
  REQUIRE(m.forward(tokens.data(), targets.data(), 1, 6).ok());
  m.zero_grad();
  std::vector<float> dl(6, 1.0f / 6);
  m.backward(dl.data());
  opt.step(m.params(), m.grads());
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// read_safetensors on `bytes` must fail as malformed, naming the file and `what`.
void check_malformed(const TempDir& dir, const std::string& bytes, const std::string& what) {
  fs::path p = dir.path / "bad.safetensors";
  write_file(p, bytes);
  auto r = read_safetensors(p);
  INFO("expected: " << what);
  REQUIRE_FALSE(r.has_value());
  INFO(r.error().to_string());
  CHECK(r.error().code() == ErrorCode::malformed);
  CHECK_THAT(r.error().message(), Catch::Contains(p.string()));
  CHECK_THAT(r.error().message(), Catch::Contains(what));
}

const std::string kF32Entry = R"({"dtype":"F32","shape":[2],"data_offsets":)";

}  // namespace

TEST_CASE("safetensors: a random model round-trips bit for bit in F32 and computes the same losses",
          "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  for (bool tied : {true, false}) {
    INFO("tied embeddings " << tied);
    auto a = Gpt<float>::make(tiny(tied)).value();
    a.init_random(42);
    fs::path p = dir.path / "model.safetensors";
    REQUIRE(save_model(p, a.layout(), a.params(), {{"run", "test-1"}}).ok());

    auto b = Gpt<float>::make(tiny(tied)).value();
    REQUIRE(load_model(p, b.layout(), b.params()).ok());
    CHECK(same_bits(a.params(), b.params(), a.layout().total()));
    CHECK(losses_of(a) == losses_of(b));

    auto config = read_model_config(p);
    REQUIRE(config.has_value());
    CHECK(config->vocab_size == 13);
    CHECK(config->context_length == 6);
    CHECK(config->layers == 2);
    CHECK(config->heads == 2);
    CHECK(config->channels == 8);
    CHECK(config->tied_embeddings == tied);

    auto file = read_safetensors(p);
    REQUIRE(file.has_value());
    CHECK(file->metadata().at("run") == "test-1");
    CHECK(file->metadata().at("troupe.format") == "troupe-gpt-1");
    REQUIRE(file->tensors().size() == a.layout().tensors().size());
    for (const TensorSpec& s : a.layout().tensors()) {
      const SafetensorsTensor* t = file->find(s.name);
      REQUIRE(t != nullptr);
      CHECK(t->shape == s.shape);
    }
    CHECK((file->find("lm_head.weight") != nullptr) == !tied);
  }
}

TEST_CASE("safetensors: BF16 weights are half the size, within bf16's precision, and widen exactly",
          "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  auto a = Gpt<float>::make(tiny()).value();
  a.init_random(7);
  const size_t n = a.layout().total();
  fs::path f32 = dir.path / "f32.safetensors", bf16 = dir.path / "bf16.safetensors";
  REQUIRE(save_model(f32, a.layout(), a.params()).ok());
  REQUIRE(save_model(bf16, a.layout(), a.params(), {}, Dtype::bf16).ok());
  size_t data_bytes = 0;
  auto bf16_file = read_safetensors(bf16).value();
  for (const auto& t : bf16_file.tensors()) {
    CHECK(t.dtype == Dtype::bf16);
    data_bytes += t.data.size();
  }
  CHECK(data_bytes == 2 * n);

  auto b = Gpt<float>::make(tiny()).value();
  REQUIRE(load_model(bf16, b.layout(), b.params()).ok());
  for (size_t i = 0; i < n; ++i) {
    // Round to nearest: within half a unit of bf16's 8-bit significand.
    CHECK(std::abs(b.params()[i] - a.params()[i]) <= std::abs(a.params()[i]) * std::ldexp(1.0f, -8));
  }
  auto la = losses_of(a), lb = losses_of(b);
  for (size_t i = 0; i < la.size(); ++i) CHECK(lb[i] == Approx(la[i]).epsilon(1e-2));

  // Values that are bf16 already survive another round trip unchanged.
  fs::path again = dir.path / "again.safetensors";
  REQUIRE(save_model(again, b.layout(), b.params(), {}, Dtype::bf16).ok());
  auto c = Gpt<float>::make(tiny()).value();
  REQUIRE(load_model(again, c.layout(), c.params()).ok());
  CHECK(same_bits(b.params(), c.params(), n));
}

TEST_CASE("safetensors: BF16 rounds to nearest even and keeps NaN, infinity and the sign of zero",
          "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  auto layout = ParamLayout::make(tiny()).value();
  std::vector<float> p(layout.total(), 0.0f);
  const float cases[] = {
      1.0f + std::ldexp(1.0f, -8),                          // a tie: to even, 1
      1.0f + std::ldexp(3.0f, -8),                          // a tie: to even, 1 + 2^-6
      1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20),  // just past a tie: up
      -2.5f,
      -0.0f,
      std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::max(),  // rounds up to infinity, as it should
      std::numeric_limits<float>::quiet_NaN(),
      std::bit_cast<float>(0x7f800001u),  // a NaN whose truncation would be infinity
      std::numeric_limits<float>::denorm_min(),
  };
  const uint16_t want[] = {0x3f80, 0x3f82, 0x3f81, 0xc020, 0x8000, 0x7f80, 0x7f80, 0x7fc0, 0x7fc0, 0x0000};
  std::copy(std::begin(cases), std::end(cases), p.begin());
  fs::path path = dir.path / "bf16.safetensors";
  REQUIRE(save_model(path, layout, p.data(), {}, Dtype::bf16).ok());
  auto file = read_safetensors(path).value();
  const SafetensorsTensor* wte = file.find("wte.weight");
  REQUIRE(wte != nullptr);
  for (size_t i = 0; i < std::size(want); ++i) {
    uint16_t got;
    std::memcpy(&got, wte->data.data() + 2 * i, 2);
    INFO("case " << i);
    CHECK(got == want[i]);
  }
  std::vector<float> back(layout.total());
  REQUIRE(load_model(path, layout, back.data()).ok());
  CHECK(back[0] == 1.0f);
  CHECK(back[3] == -2.5f);
  CHECK(std::signbit(back[4]));
  CHECK(std::isinf(back[6]));
  CHECK(std::isnan(back[7]));
  CHECK(std::isnan(back[8]));
}

TEST_CASE("safetensors: training resumed from a checkpoint matches uninterrupted training bit for bit",
          "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  const AdamWConfig oc{.learning_rate = 1e-2, .warmup_steps = 2, .decay_steps = 10};
  auto a = Gpt<float>::make(tiny(false)).value();
  a.init_random(3);
  AdamW opt_a(a.layout(), oc);
  train_step(a, opt_a, 0);
  train_step(a, opt_a, 1);
  fs::path p = dir.path / "state.safetensors";
  REQUIRE(save_training_state(p, a.layout(), a.params(), opt_a, {{"data.position", "2"}}).ok());
  train_step(a, opt_a, 0);
  train_step(a, opt_a, 1);

  auto b = Gpt<float>::make(tiny(false)).value();
  AdamW opt_b(b.layout(), oc);
  auto meta = load_training_state(p, b.layout(), b.params(), opt_b);
  REQUIRE(meta.has_value());
  CHECK(meta->at("data.position") == "2");
  CHECK(opt_b.steps() == 2);
  train_step(b, opt_b, 0);
  train_step(b, opt_b, 1);

  const size_t n = a.layout().total();
  CHECK(same_bits(a.params(), b.params(), n));
  CHECK(same_bits(opt_a.m().data(), opt_b.m().data(), n));
  CHECK(same_bits(opt_a.v().data(), opt_b.v().data(), n));
  CHECK(opt_a.steps() == opt_b.steps());

  // A training state loads as a model (the optimizer's tensors are skipped)...
  auto c = Gpt<float>::make(tiny(false)).value();
  REQUIRE(load_model(p, c.layout(), c.params()).ok());
  // ...but a model is no training state.
  fs::path model = dir.path / "model.safetensors";
  REQUIRE(save_model(model, c.layout(), c.params()).ok());
  auto r = load_training_state(model, c.layout(), c.params(), opt_b);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message(), Catch::Contains("troupe.optimizer.step"));
  CHECK(opt_b.steps() == 4);  // untouched
}

TEST_CASE("safetensors: adamw restore refuses moments of another size and changes nothing", "[rl][safetensors]") {
  auto layout = ParamLayout::make(tiny()).value();
  AdamW opt(layout, AdamWConfig{});
  auto s = opt.restore(std::vector<float>(3), std::vector<float>(layout.total()), 5);
  CHECK(s.code() == ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("3"));
  CHECK(opt.steps() == 0);
  CHECK(opt.restore(std::vector<float>(layout.total(), 1.0f), std::vector<float>(layout.total(), 2.0f), 5).ok());
  CHECK(opt.steps() == 5);
  CHECK(opt.m()[0] == 1.0f);
  CHECK(opt.v()[0] == 2.0f);
}

TEST_CASE("safetensors: the bytes follow the spec (length, JSON header, 8-byte alignment, contiguous offsets)",
          "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  auto m = Gpt<float>::make(tiny(false)).value();
  m.init_random(5);
  fs::path p = dir.path / "model.safetensors";
  REQUIRE(save_model(p, m.layout(), m.params(), {{"note", "caf\xc3\xa9 \"quoted\"\n"}}).ok());
  const std::string bytes = read_file(p);
  REQUIRE(bytes.size() >= 8);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  REQUIRE(8 + n <= bytes.size());
  CHECK((8 + n) % 8 == 0);
  const std::string header = bytes.substr(8, n);
  CHECK(header.front() == '{');
  const size_t last = header.find_last_not_of(' ');
  CHECK(header[last] == '}');
  CHECK(n - last - 1 < 8);  // only the padding follows
  auto j = nlohmann::json::parse(header);
  REQUIRE(j.is_object());
  CHECK(j["__metadata__"]["note"] == "caf\xc3\xa9 \"quoted\"\n");
  CHECK(j["__metadata__"]["troupe.channels"] == "8");
  CHECK(j["__metadata__"]["troupe.tied_embeddings"] == "false");
  const size_t data_bytes = bytes.size() - 8 - n;
  size_t expect = 0;
  for (const TensorSpec& s : m.layout().tensors()) {
    INFO(s.name);
    const auto& e = j.at(s.name);
    CHECK(e.at("dtype") == "F32");
    CHECK(e.at("shape").get<std::vector<size_t>>() == s.shape);
    auto offsets = e.at("data_offsets").get<std::vector<size_t>>();
    REQUIRE(offsets.size() == 2);
    CHECK(offsets[0] == expect);
    CHECK(offsets[1] == expect + 4 * s.count);
    CHECK(std::memcmp(bytes.data() + 8 + n + offsets[0], m.params() + s.offset, 4 * s.count) == 0);
    expect = offsets[1];
  }
  CHECK(expect == data_bytes);
  CHECK(j.size() == m.layout().tensors().size() + 1);
}

TEST_CASE("safetensors: files as Python's safetensors writes them are read", "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  SECTION("mixed dtypes, keys out of offset order, a __metadata__ and space padding") {
    // save_file({"weight": f32 (2,3), "bias": bf16 (3,), "ids": i64 (2,)}, metadata={"format": "pt"}):
    // data sorted by dtype alignment, then name.
    std::vector<int64_t> ids = {-1, 1LL << 40};
    std::vector<float> weight = {0.5f, -1.25f, 3.0f, 1e-3f, -0.0f, 7.0f};
    std::vector<uint16_t> bias = {0x3f80, 0xc000, 0x3e80};  // 1, -2, 0.25
    std::string header =
        R"({"__metadata__":{"format":"pt"},"bias":{"dtype":"BF16","shape":[3],"data_offsets":[64,70]},)"
        R"("ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
        R"("weight":{"dtype":"F32","shape":[2,3],"data_offsets":[16,40]},)"
        R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[40,40]},)"
        R"("scalar":{"dtype":"F64","shape":[],"data_offsets":[40,48]},)"
        R"("flags":{"dtype":"BOOL","shape":[2,8],"data_offsets":[48,64]}})";
    std::string data = raw(ids) + raw(weight) + raw(std::vector<double>{2.5}) + std::string(16, '\1') + raw(bias);
    fs::path p = dir.path / "python.safetensors";
    write_file(p, file_bytes(header, data));
    auto r = read_safetensors(p);
    REQUIRE(r.has_value());
    auto& f = *r;
    CHECK(f.metadata() == SafetensorsMetadata{{"format", "pt"}});
    REQUIRE(f.tensors().size() == 6);
    CHECK(f.tensors()[0].name == "ids");  // in data order
    CHECK(f.tensors().back().name == "bias");
    const SafetensorsTensor* w = f.find("weight");
    REQUIRE(w != nullptr);
    CHECK(w->shape == std::vector<size_t>{2, 3});
    CHECK(floats_of(*w) == weight);
    const SafetensorsTensor* b = f.find("bias");
    REQUIRE(b != nullptr);
    CHECK(b->dtype == Dtype::bf16);
    CHECK(b->data.size() == 6);
    CHECK(f.find("ids")->dtype == Dtype::i64);
    CHECK(std::memcmp(f.find("ids")->data.data(), ids.data(), 16) == 0);
    CHECK(f.find("empty")->data.empty());
    CHECK(f.find("scalar")->shape.empty());
    CHECK(f.find("scalar")->dtype == Dtype::f64);
    CHECK(f.find("flags")->dtype == Dtype::boolean);
    CHECK(f.find("missing") == nullptr);
  }
  SECTION("the reference implementation's own example: one F32 tensor, a 64-byte header") {
    std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
    REQUIRE(header.size() == 64);
    fs::path p = dir.path / "attn.safetensors";
    write_file(p, file_bytes(header, raw(std::vector<float>{0, 1, 2, 3, 4, 5})));
    auto r = read_safetensors(p);
    REQUIRE(r.has_value());
    CHECK(floats_of(*r->find("attn.0")) == std::vector<float>{0, 1, 2, 3, 4, 5});
    CHECK(r->metadata().empty());
  }
  SECTION("an unpadded header (older writers): the data is unaligned and still read right") {
    std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
    REQUIRE(header.size() % 4 != 0);
    fs::path p = dir.path / "unpadded.safetensors";
    write_file(p, file_bytes(header, raw(std::vector<float>{1.5f, -2, 3}), /*pad=*/false));
    auto r = read_safetensors(p);
    REQUIRE(r.has_value());
    CHECK(floats_of(*r->find("w")) == std::vector<float>{1.5f, -2, 3});
  }
  SECTION("no tensors at all") {
    fs::path p = dir.path / "empty.safetensors";
    write_file(p, file_bytes("{}", ""));
    auto r = read_safetensors(p);
    REQUIRE(r.has_value());
    CHECK(r->tensors().empty());
  }
  SECTION("the model's tensors from elsewhere, without troupe's metadata, in BF16, load") {
    auto layout = ParamLayout::make(tiny()).value();
    std::vector<uint16_t> ones(layout.total(), 0x3f80);
    std::vector<SafetensorsTensor> tensors;
    for (const TensorSpec& s : layout.tensors()) {
      tensors.push_back({s.name, Dtype::bf16, s.shape, std::as_bytes(std::span(ones.data() + s.offset, s.count))});
    }
    fs::path p = dir.path / "foreign.safetensors";
    REQUIRE(write_safetensors(p, tensors, {{"format", "pt"}}).ok());
    std::vector<float> params(layout.total(), 0.0f);
    REQUIRE(load_model(p, layout, params.data()).ok());
    CHECK(std::all_of(params.begin(), params.end(), [](float x) { return x == 1.0f; }));
    auto config = read_model_config(p);
    REQUIRE_FALSE(config.has_value());
    CHECK_THAT(config.error().message(), Catch::Contains("no troupe.format"));
  }
}

TEST_CASE("safetensors: every malformed file is refused with a message naming the problem", "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  const std::string eight(8, '\0');
  check_malformed(dir, "", "0 bytes, shorter than the 8-byte header length");
  check_malformed(dir, "abcde", "5 bytes, shorter than the 8-byte header length");
  check_malformed(dir, u64_le(200'000'000) + "{}", "header length 200000000 is past the limit");
  check_malformed(dir, u64_le(~uint64_t{0}) + "{}", "past the limit");
  check_malformed(dir, u64_le(1000) + "{}      ", "header length 1000 runs past the end of the file (16 bytes");
  check_malformed(dir, file_bytes("{not json", ""), "not valid JSON");
  check_malformed(dir, file_bytes("", ""), "not valid JSON");
  check_malformed(dir, file_bytes("{\"a\xff\":1}", ""), "not valid JSON");
  check_malformed(dir, file_bytes("[1,2]", ""), "JSON but not an object");
  check_malformed(dir, file_bytes(std::string(100000, '[') + std::string(100000, ']'), ""), "not an object");
  check_malformed(dir, file_bytes("{} trailing", ""), "not valid JSON");
  check_malformed(dir, file_bytes(R"({"a":3})", ""), "tensor \"a\": its entry is not an object");
  check_malformed(dir, file_bytes(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight), "tensor \"a\": no dtype");
  check_malformed(dir, file_bytes(R"({"a":{"dtype":"F4X","shape":[2],"data_offsets":[0,8]}})", eight),
                  "tensor \"a\": dtype \"F4X\" is not one of the format's");
  check_malformed(dir, file_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
                  "tensor \"a\": shape is not an array of non-negative integers");
  check_malformed(dir, file_bytes(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", eight),
                  "shape is not an array");
  check_malformed(dir, file_bytes(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", eight),
                  "shape is not an array");
  check_malformed(dir, file_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", eight), "data_offsets is not [begin, end]");
  check_malformed(dir, file_bytes(R"({"a":)" + kF32Entry + "[0,8,8]}}", eight), "data_offsets is not [begin, end]");
  check_malformed(dir, file_bytes(R"({"a":)" + kF32Entry + "[8,0]}}", eight), "with begin <= end");
  check_malformed(dir, file_bytes(R"({"a":)" + kF32Entry + "[0,99999999999999999999]}}", eight), "data_offsets is not");
  check_malformed(dir, file_bytes(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(20, 'x')),
                  "tensor \"a\": shape [2, 3] of F32 is 24 bytes, but data_offsets [0, 20] span 20");
  check_malformed(dir,
                  file_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight),
                  "tensor \"a\": shape [4294967296, 4294967296] overflows");
  check_malformed(dir, file_bytes(R"({"a":)" + kF32Entry + "[0,8]}}", "abcd"),
                  "tensor \"a\": data_offsets [0, 8] run past the data's 4 bytes");
  check_malformed(dir, file_bytes(R"({"a":)" + kF32Entry + "[0,8]},\"b\":" + kF32Entry + "[4,12]}}", "0123456789ab"),
                  "tensor \"b\" overlaps tensor \"a\"");
  check_malformed(dir,
                  file_bytes(R"({"a":)" + kF32Entry + "[0,8]},\"b\":" + kF32Entry + "[12,20]}}", std::string(20, 'x')),
                  "data bytes from 8 to 12 belong to no tensor");
  check_malformed(dir, file_bytes(R"({"a":)" + kF32Entry + "[4,12]}}", std::string(12, 'x')),
                  "data bytes from 0 to 4 belong to no tensor");
  check_malformed(dir, file_bytes(R"({"a":)" + kF32Entry + "[0,8]}}", std::string(11, 'x')),
                  "data bytes from 8 to 11 (the end of the file) belong to no tensor");
  check_malformed(dir,
                  file_bytes(R"({"a":)" + kF32Entry + "[0,8]},\"a\":" + kF32Entry + "[8,16]}}", std::string(16, 'x')),
                  "the header has the key \"a\" more than once");
  check_malformed(dir, file_bytes(R"({"a":{"dtype":"F32","dtype":"F64","shape":[2],"data_offsets":[0,8]}})", eight),
                  "the header has the key \"dtype\" more than once");
  check_malformed(dir, file_bytes(R"({"__metadata__":{"k":1}})", ""), "__metadata__ \"k\" is number, not a string");
  check_malformed(dir, file_bytes(R"({"__metadata__":["x"]})", ""), "__metadata__ is not an object of strings");
  check_malformed(dir, file_bytes("{\"a\\n\":3}", ""), "tensor \"a\\n\"");  // a name with a newline, escaped

  SECTION("a directory is no file, and a missing file is not_found") {
    auto r = read_safetensors(dir.path);
    REQUIRE_FALSE(r.has_value());
    CHECK_THAT(r.error().message(), Catch::Contains("not a regular file"));
    auto missing = read_safetensors(dir.path / "nope.safetensors");
    REQUIRE_FALSE(missing.has_value());
    CHECK(missing.error().code() == ErrorCode::not_found);
    CHECK_THAT(missing.error().message(), Catch::Contains("nope.safetensors"));
    CHECK(read_model_config(dir.path / "nope.safetensors").error().code() == ErrorCode::not_found);
  }
  SECTION("read_model_config checks the header it reads, and the data's extent") {
    fs::path p = dir.path / "short.safetensors";
    write_file(p, file_bytes(R"({"a":)" + kF32Entry + "[0,8]}}", "abcd"));
    auto r = read_model_config(p);
    REQUIRE_FALSE(r.has_value());
    CHECK_THAT(r.error().message(), Catch::Contains("run past the data's 4 bytes"));
  }
}

TEST_CASE("safetensors: random corruption of a valid file is refused cleanly or read within bounds",
          "[rl][safetensors]") {
  auto layout =
      ParamLayout::make(GptConfig{.vocab_size = 3, .context_length = 2, .layers = 1, .heads = 1, .channels = 1})
          .value();
  TempDir dir("troupe-safetensors");
  std::vector<float> params(layout.total(), 0.25f);
  fs::path p = dir.path / "model.safetensors";
  REQUIRE(save_model(p, layout, params.data()).ok());
  const std::string good = read_file(p);
  std::mt19937 rng(1);
  size_t accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bad = good;
    switch (rng() % 3) {
      case 0:  // flip a few bytes, mostly in the header
        for (int k = 0; k < 3; ++k)
          bad[rng() % std::min<size_t>(bad.size(), 400)] ^= static_cast<char>(1 + rng() % 255);
        break;
      case 1:  // truncate
        bad.resize(rng() % bad.size());
        break;
      default:  // a digit of the header changed
        for (size_t at = rng() % bad.size(); at < bad.size(); ++at) {
          if (bad[at] >= '0' && bad[at] <= '9') {
            bad[at] = static_cast<char>('0' + rng() % 10);
            break;
          }
        }
    }
    std::vector<std::byte> bytes(bad.size());
    std::memcpy(bytes.data(), bad.data(), bad.size());
    auto r = parse_safetensors(std::move(bytes), "fuzz");
    if (!r) {
      CHECK(r.error().code() == ErrorCode::malformed);
      continue;
    }
    ++accepted;
    size_t total = 0;
    for (const auto& t : r->tensors()) total += t.data.size();
    CHECK(total <= bad.size());
    // What parses must load or be refused, never more.
    fs::path q = dir.path / "accepted.safetensors";
    write_file(q, bad);
    std::vector<float> out(layout.total());
    Status s = load_model(q, layout, out.data());
    if (!s.ok()) CHECK(s.code() != ErrorCode::storage);
  }
  CHECK(accepted < 3000);
}

TEST_CASE("safetensors: a checkpoint of another config is refused, naming the tensor or setting", "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  auto small = Gpt<float>::make(tiny()).value();
  small.init_random(1);
  fs::path p = dir.path / "small.safetensors";
  REQUIRE(save_model(p, small.layout(), small.params()).ok());

  GptConfig wide = tiny();
  wide.channels = 16;
  auto wide_layout = ParamLayout::make(wide).value();
  std::vector<float> params(wide_layout.total(), 9.0f);
  Status s = load_model(p, wide_layout, params.data());
  CHECK(s.code() == ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains(p.string()));
  CHECK_THAT(s.message(), Catch::Contains("channels 8 in the file, 16 in the model"));
  CHECK(std::all_of(params.begin(), params.end(), [](float x) { return x == 9.0f; }));  // untouched

  GptConfig heads = tiny();
  heads.heads = 4;  // shows in no shape: only the metadata tells
  auto heads_layout = ParamLayout::make(heads).value();
  CHECK_THAT(load_model(p, heads_layout, params.data()).message(),
             Catch::Contains("heads 2 in the file, 4 in the model"));

  // Without troupe's metadata the shapes still tell.
  auto file = read_safetensors(p).value();
  fs::path bare = dir.path / "bare.safetensors";
  REQUIRE(write_safetensors(bare, file.tensors()).ok());
  s = load_model(bare, wide_layout, params.data());
  CHECK(s.code() == ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("tensor wte.weight has shape [13, 8], the model wants [13, 16]"));
  CHECK(std::all_of(params.begin(), params.end(), [](float x) { return x == 9.0f; }));

  GptConfig deeper = tiny();
  deeper.layers = 3;
  auto deeper_layout = ParamLayout::make(deeper).value();
  std::vector<float> deeper_params(deeper_layout.total());
  CHECK_THAT(load_model(bare, deeper_layout, deeper_params.data()).message(),
             Catch::Contains("tensor h.2.ln_1.weight is missing"));

  // An untied checkpoint has an lm_head.weight that a tied model lacks.
  auto untied = Gpt<float>::make(tiny(false)).value();
  std::vector<SafetensorsTensor> tensors;
  for (const TensorSpec& t : untied.layout().tensors()) {
    tensors.push_back({t.name, Dtype::f32, t.shape, std::as_bytes(std::span(untied.params() + t.offset, t.count))});
  }
  REQUIRE(write_safetensors(bare, tensors).ok());
  CHECK_THAT(load_model(bare, small.layout(), params.data()).message(),
             Catch::Contains("tensor \"lm_head.weight\" is not one of the model's"));

  // A dtype the model cannot take.
  tensors.pop_back();
  std::vector<uint16_t> halves(tensors[0].data.size() / 4);
  tensors[0].dtype = Dtype::f16;
  tensors[0].data = std::as_bytes(std::span(halves));
  REQUIRE(write_safetensors(bare, tensors).ok());
  CHECK_THAT(load_model(bare, small.layout(), params.data()).message(),
             Catch::Contains("tensor wte.weight is F16; only F32 and BF16 load"));
}

TEST_CASE("safetensors: writes refuse bad tensors and reserved metadata keys", "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  fs::path p = dir.path / "x.safetensors";
  std::vector<float> four(4, 1.0f);
  auto data = std::as_bytes(std::span(four));
  auto write = [&](std::vector<SafetensorsTensor> ts, SafetensorsMetadata meta = {}) {
    return write_safetensors(p, ts, meta);
  };
  Status s = write({{"a", Dtype::f32, {2, 2}, data}, {"a", Dtype::f32, {4}, data}});
  CHECK(s.code() == ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("tensor \"a\" is given twice"));
  CHECK_THAT(write({{"a", Dtype::f32, {3}, data}}).message(),
             Catch::Contains("shape [3] of F32 needs 12 bytes, the data has 16"));
  CHECK_THAT(write({{"__metadata__", Dtype::f32, {4}, data}}).message(), Catch::Contains("may not be named"));
  CHECK_THAT(write({{"", Dtype::f32, {4}, data}}).message(), Catch::Contains("may not be named"));
  CHECK_THAT(write({{"a", Dtype::f32, {4}, data}}, {{"k", "\xff"}}).message(), Catch::Contains("not valid UTF-8"));
  CHECK(dir.entries().empty());

  auto layout = ParamLayout::make(tiny()).value();
  std::vector<float> params(layout.total());
  s = save_model(p, layout, params.data(), {{"troupe.layers", "7"}});
  CHECK(s.code() == ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("metadata key troupe.layers is reserved"));
  CHECK_THAT(save_model(p, layout, params.data(), {}, Dtype::f16).message(), Catch::Contains("F32 or BF16"));
  CHECK(dir.entries().empty());
}

TEST_CASE("safetensors: a failed write names the path and the OS's reason and leaves no temporary file",
          "[rl][safetensors]") {
  TempDir dir("troupe-safetensors");
  auto layout = ParamLayout::make(tiny()).value();
  std::vector<float> params(layout.total(), 0.5f);

  SECTION("a directory that does not exist") {
    fs::path p = dir.path / "nope" / "model.safetensors";
    Status s = save_model(p, layout, params.data());
    CHECK(s.code() == ErrorCode::storage);
    CHECK_THAT(s.message(), Catch::Contains(p.string()));
    CHECK_THAT(s.message(), Catch::Contains("No such file or directory"));
    CHECK(dir.entries().empty());
  }
  SECTION("a parent that is a file") {
    write_file(dir.path / "file", "x");
    Status s = save_model(dir.path / "file" / "model.safetensors", layout, params.data());
    CHECK(s.code() == ErrorCode::storage);
    CHECK_THAT(s.message(), Catch::Contains("Not a directory"));
    CHECK(dir.entries() == std::vector<std::string>{"file"});
  }
  SECTION("a target that is a directory: the rename fails and the temporary file goes") {
    fs::create_directory(dir.path / "model.safetensors");
    Status s = save_model(dir.path / "model.safetensors", layout, params.data());
    CHECK(s.code() == ErrorCode::storage);
    CHECK_THAT(s.message(), Catch::Contains("renaming"));
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
  }
  SECTION("the disk fills mid-write (a file size limit): the older checkpoint stays whole") {
    fs::path p = dir.path / "model.safetensors";
    REQUIRE(save_model(p, layout, params.data()).ok());
    const std::string before = read_file(p);
    std::vector<float> newer(layout.total(), -1.0f);
    Status s = with_file_size_limit(4096, [&] { return save_model(p, layout, newer.data()); });
    CHECK(s.code() == ErrorCode::storage);
    CHECK_THAT(s.message(), Catch::Contains(p.string()));
    CHECK_THAT(s.message(), Catch::Contains("File too large"));
    CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
    CHECK(read_file(p) == before);
    std::vector<float> loaded(layout.total());
    REQUIRE(load_model(p, layout, loaded.data()).ok());
    CHECK(loaded == params);
  }
}

TEST_CASE("safetensors: a model with a value head round-trips, and a head mismatch is named",
          "[rl][safetensors][value_head]") {
  TempDir dir;
  GptConfig config = tiny(false);
  config.value_head = true;
  auto a = Gpt<float>::make(config).value();
  a.init_random(42);
  for (size_t i = a.layout().policy_count(); i < a.layout().total(); ++i)
    a.params()[i] = 0.01f * static_cast<float>(i % 7);
  fs::path p = dir.path / "critic.safetensors";
  REQUIRE(save_model(p, a.layout(), a.params()).ok());

  auto b = Gpt<float>::make(config).value();
  REQUIRE(load_model(p, b.layout(), b.params()).ok());
  CHECK(same_bits(a.params(), b.params(), a.layout().total()));
  CHECK(losses_of(a) == losses_of(b));
  CHECK(std::vector<float>(a.values(), a.values() + 12) == std::vector<float>(b.values(), b.values() + 12));
  auto recorded = read_model_config(p);
  REQUIRE(recorded.has_value());
  CHECK(*recorded == config);
  auto file = read_safetensors(p).value();
  CHECK(file.metadata().at("troupe.value_head") == "true");
  REQUIRE(file.find("value_head.weight") != nullptr);
  CHECK(file.find("value_head.weight")->shape == std::vector<size_t>{8});
  CHECK(file.find("value_head.bias")->shape == std::vector<size_t>{1});

  // Into a model without a head, and the other way: the setting is named.
  auto policy = Gpt<float>::make(tiny(false)).value();
  Status s = load_model(p, policy.layout(), policy.params());
  CHECK(s.code() == ErrorCode::invalid_argument);
  CHECK_THAT(s.message(), Catch::Contains("a value head in the file, no value head in the model"));
  policy.init_random(3);
  fs::path q = dir.path / "policy.safetensors";
  REQUIRE(save_model(q, policy.layout(), policy.params()).ok());
  CHECK_THAT(load_model(q, b.layout(), b.params()).message(),
             Catch::Contains("no value head in the file, a value head in the model"));
  // A policy checkpoint starts a critic through the policy-only layout: the
  // policy prefix is filled, the head left as it was.
  const std::vector<float> head(b.params() + b.layout().policy_count(), b.params() + b.layout().total());
  REQUIRE(load_model(q, policy.layout(), b.params()).ok());
  CHECK(same_bits(policy.params(), b.params(), b.layout().policy_count()));
  CHECK(std::equal(head.begin(), head.end(), b.params() + b.layout().policy_count()));

  // A checkpoint from before the key existed has no head; a bad value is named.
  auto policy_file = read_safetensors(q).value();
  SafetensorsMetadata meta = policy_file.metadata();
  meta.erase("troupe.value_head");
  fs::path old = dir.path / "old.safetensors";
  REQUIRE(write_safetensors(old, policy_file.tensors(), meta).ok());
  CHECK(read_model_config(old).value().value_head == false);
  CHECK(load_model(old, policy.layout(), policy.params()).ok());
  meta["troupe.value_head"] = "yes";
  REQUIRE(write_safetensors(old, policy_file.tensors(), meta).ok());
  auto bad = read_model_config(old);
  REQUIRE_FALSE(bad.has_value());
  CHECK_THAT(bad.error().message(), Catch::Contains("troupe.value_head"));
}
