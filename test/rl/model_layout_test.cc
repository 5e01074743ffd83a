// The policy model's configuration, parameter layout and tokenizer.
#include <catch2/catch.hpp>

#include "model/config.h"
#include "model/tokenizer.h"

using namespace troupe::rl::model;

TEST_CASE("model layout: tensors tile one buffer in the documented order with GPT-2's parameter count",
          "[rl][model]") {
  GptConfig cfg{.vocab_size = 259, .context_length = 32, .layers = 3, .heads = 4, .channels = 64};
  auto layout = ParamLayout::make(cfg);
  REQUIRE(layout.has_value());
  size_t expect = 0;
  for (const auto& t : layout->tensors()) {
    INFO(t.name);
    CHECK(t.offset == expect);  // no gaps, no overlap
    expect += t.count;
  }
  CHECK(layout->total() == expect);
  const size_t C = 64, V = 259, T = 32, L = 3;
  // GPT-2's count: embeddings, 12 C^2 + 13 C per layer, the final norm.
  CHECK(layout->total() == V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);
  CHECK(layout->tensors().front().name == "wte.weight");
  CHECK(layout->tensors().back().name == "ln_f.bias");
  REQUIRE(layout->find("h.2.attn.qkv.weight") != nullptr);
  CHECK(layout->find("h.2.attn.qkv.weight")->shape == std::vector<size_t>{3 * C, C});
  CHECK(layout->find("h.2.attn.qkv.weight")->offset == layout->layer(2).qkv_w);
  CHECK(layout->find("h.3.attn.qkv.weight") == nullptr);
  CHECK(layout->lm_head() == layout->wte());

  cfg.tied_embeddings = false;
  auto untied = ParamLayout::make(cfg);
  REQUIRE(untied.has_value());
  CHECK(untied->total() == layout->total() + V * C);
  CHECK(untied->tensors().back().name == "lm_head.weight");
  CHECK(untied->lm_head() == layout->total());
}

TEST_CASE("model layout: a bad configuration is refused with what is wrong", "[rl][model]") {
  GptConfig cfg{.vocab_size = 259, .context_length = 32, .layers = 2, .heads = 3, .channels = 64};
  auto r = ParamLayout::make(cfg);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == troupe::ErrorCode::invalid_argument);
  CHECK_THAT(r.error().message(), Catch::Contains("multiple of heads"));
  cfg.heads = 4;
  cfg.layers = 0;
  CHECK_FALSE(ParamLayout::make(cfg).has_value());
  cfg.layers = 1;
  cfg.channels = size_t{1} << 20;
  CHECK_FALSE(ParamLayout::make(cfg).has_value());
}

TEST_CASE("model tokenizer: any bytes round-trip, specials sit after the bytes and decode to nothing",
          "[rl][model]") {
  std::string text = "12+345=357\n";
  text.push_back('\0');
  text.push_back(static_cast<char>(0xff));
  auto tokens = ByteTokenizer::encode(text);
  CHECK(tokens.size() == text.size());
  CHECK(tokens[0] == '1');
  CHECK(tokens.back() == 255);
  CHECK(ByteTokenizer::decode(tokens) == text);
  tokens.insert(tokens.begin(), ByteTokenizer::kBos);
  tokens.push_back(ByteTokenizer::kEos);
  tokens.push_back(ByteTokenizer::kPad);
  tokens.push_back(4000);  // out of range: left out
  CHECK(ByteTokenizer::decode(tokens) == text);
  CHECK(ByteTokenizer::is_special(ByteTokenizer::kEos));
  CHECK_FALSE(ByteTokenizer::is_special(255));
  CHECK(ByteTokenizer::kVocabSize == 259);
}
