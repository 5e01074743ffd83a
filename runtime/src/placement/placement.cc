// Parsing and matching for the public placement types (troupe/placement.h).
#include "troupe/placement.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

namespace troupe {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

/// Splits on commas that are not inside parentheses.
std::vector<std::string_view> split_top(std::string_view s) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')') --depth;
    if (s[i] == ',' && depth == 0) {
      parts.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (!trim(s).empty()) parts.push_back(trim(s.substr(start)));
  return parts;
}

bool valid_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/';
  });
}

/// "key=value" pairs; `what` names the flag in errors.
Result<std::vector<std::pair<std::string_view, std::string_view>>> pairs(std::string_view text, const char* what) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  for (std::string_view part : split_top(text)) {
    auto eq = part.find('=');
    if (eq == std::string_view::npos) {
      return error(ErrorCode::invalid_argument,
                   std::string(what) + ": '" + std::string(part) + "' is not key=value");
    }
    std::string_view key = trim(part.substr(0, eq)), value = trim(part.substr(eq + 1));
    if (!valid_name(key)) {
      return error(ErrorCode::invalid_argument, std::string(what) + ": bad key '" + std::string(key) +
                                                    "' (letters, digits, _ - . / only)");
    }
    out.emplace_back(key, value);
  }
  return out;
}

}  // namespace

Result<PlacementStrategy> parse_strategy(std::string_view text) {
  std::string up(trim(text));
  for (char& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (up == "PACK") return PlacementStrategy::pack;
  if (up == "SPREAD") return PlacementStrategy::spread;
  if (up == "STRICT_PACK") return PlacementStrategy::strict_pack;
  if (up == "STRICT_SPREAD") return PlacementStrategy::strict_spread;
  return error(ErrorCode::invalid_argument, "placement strategy '" + std::string(text) +
                                                "': use PACK, SPREAD, STRICT_PACK or STRICT_SPREAD");
}

std::string_view to_string(PlacementStrategy strategy) {
  switch (strategy) {
    case PlacementStrategy::pack: return "PACK";
    case PlacementStrategy::spread: return "SPREAD";
    case PlacementStrategy::strict_pack: return "STRICT_PACK";
    case PlacementStrategy::strict_spread: return "STRICT_SPREAD";
  }
  return "?";
}

bool LabelCondition::matches(const Labels& labels) const {
  auto it = labels.find(key);
  bool in = it != labels.end() && std::find(values.begin(), values.end(), it->second) != values.end();
  return negate ? !in : in;
}

bool matches(const LabelSelector& selector, const Labels& labels) {
  return std::all_of(selector.begin(), selector.end(), [&](const LabelCondition& c) { return c.matches(labels); });
}

Result<LabelSelector> parse_label_selector(std::string_view text) {
  auto kv = pairs(text, "label selector");
  if (!kv) return error(kv.error());
  LabelSelector out;
  for (auto [key, value] : *kv) {
    LabelCondition c;
    c.key = std::string(key);
    if (!value.empty() && value.front() == '!') {
      c.negate = true;
      value = trim(value.substr(1));
    }
    if (value.starts_with("in(") && value.ends_with(")")) {
      for (std::string_view v : split_top(value.substr(3, value.size() - 4))) {
        if (v.empty()) {
          return error(ErrorCode::invalid_argument,
                       "label selector: empty value in '" + std::string(key) + "=" + std::string(value) + "'");
        }
        c.values.emplace_back(v);
      }
    } else {
      c.values.emplace_back(value);
    }
    if (c.values.empty() || c.values.front().empty()) {
      return error(ErrorCode::invalid_argument, "label selector: no value for '" + c.key + "'");
    }
    out.push_back(std::move(c));
  }
  return out;
}

Result<ResourceMap> parse_resources(std::string_view text) {
  auto kv = pairs(text, "resources");
  if (!kv) return error(kv.error());
  ResourceMap out;
  for (auto [key, value] : *kv) {
    double amount = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), amount);
    if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(amount) || amount < 0) {
      return error(ErrorCode::invalid_argument, "resources: '" + std::string(key) + "=" + std::string(value) +
                                                    "' needs a number >= 0");
    }
    out[std::string(key)] += amount;
  }
  return out;
}

Result<Labels> parse_labels(std::string_view text) {
  auto kv = pairs(text, "labels");
  if (!kv) return error(kv.error());
  Labels out;
  for (auto [key, value] : *kv) {
    if (value.empty()) return error(ErrorCode::invalid_argument, "labels: no value for '" + std::string(key) + "'");
    out[std::string(key)] = std::string(value);
  }
  return out;
}

}  // namespace troupe
