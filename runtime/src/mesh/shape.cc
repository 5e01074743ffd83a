#include "troupe/mesh_shape.h"

#include <set>

namespace troupe {

Result<Shape> Shape::make(std::vector<std::pair<std::string, size_t>> dims) {
  Shape s;
  std::set<std::string> seen;
  size_t total = 1;
  for (auto& [name, size] : dims) {
    if (name.empty()) return error(ErrorCode::invalid_argument, "shape: a dimension has no name");
    if (!seen.insert(name).second) {
      return error(ErrorCode::invalid_argument, "shape: dimension '" + name + "' appears twice");
    }
    if (size == 0) return error(ErrorCode::invalid_argument, "shape: dimension '" + name + "' has size 0");
    s.names_.push_back(name);
    s.sizes_.push_back(size);
    total *= size;
  }
  s.ranks_.resize(total);
  for (size_t i = 0; i < total; ++i) s.ranks_[i] = i;
  return s;
}

std::vector<size_t> Shape::coords(size_t index) const {
  std::vector<size_t> c(sizes_.size());
  for (size_t d = sizes_.size(); d-- > 0;) {
    c[d] = index % sizes_[d];
    index /= sizes_[d];
  }
  return c;
}

Result<size_t> Shape::index_of(const std::vector<size_t>& coords) const {
  if (coords.size() != sizes_.size()) {
    return error(ErrorCode::invalid_argument, "shape: " + std::to_string(coords.size()) + " coordinates for " +
                                                  std::to_string(sizes_.size()) + " dimensions " + to_string());
  }
  size_t index = 0;
  for (size_t d = 0; d < sizes_.size(); ++d) {
    if (coords[d] >= sizes_[d]) {
      return error(ErrorCode::invalid_argument, "shape: coordinate " + std::to_string(coords[d]) + " of '" +
                                                    names_[d] + "' is out of range (size " +
                                                    std::to_string(sizes_[d]) + ")");
    }
    index = index * sizes_[d] + coords[d];
  }
  return index;
}

Result<size_t> Shape::index_of_rank(size_t rank) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == rank) return i;
  }
  return error(ErrorCode::not_found, "shape: rank " + std::to_string(rank) + " is not in " + to_string());
}

Result<size_t> Shape::dim_index(const std::string& dim) const {
  for (size_t d = 0; d < names_.size(); ++d) {
    if (names_[d] == dim) return d;
  }
  return error(ErrorCode::invalid_argument, "shape: no dimension '" + dim + "' in " + to_string());
}

Result<Shape> Shape::range(const std::string& dim, size_t begin, size_t end, size_t step) const {
  auto d = dim_index(dim);
  if (!d) return error(d.error());
  end = std::min(end, sizes_[*d]);
  if (step == 0 || begin >= end) {
    return error(ErrorCode::invalid_argument, "shape: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                                  ") step " + std::to_string(step) + " of '" + dim +
                                                  "' selects nothing");
  }
  Shape out;
  out.names_ = names_;
  out.sizes_ = sizes_;
  out.sizes_[*d] = (end - begin + step - 1) / step;
  out.ranks_.reserve(ranks_.size() / sizes_[*d] * out.sizes_[*d]);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    size_t c = coords(i)[*d];
    if (c >= begin && c < end && (c - begin) % step == 0) out.ranks_.push_back(ranks_[i]);
  }
  return out;
}

Result<Shape> Shape::at(const std::string& dim, size_t value) const {
  auto d = dim_index(dim);
  if (!d) return error(d.error());
  if (value >= sizes_[*d]) {
    return error(ErrorCode::invalid_argument, "shape: " + dim + "=" + std::to_string(value) + " is out of range (size " +
                                                  std::to_string(sizes_[*d]) + ")");
  }
  auto r = range(dim, value, value + 1);
  if (!r) return r;
  r->names_.erase(r->names_.begin() + static_cast<std::ptrdiff_t>(*d));
  r->sizes_.erase(r->sizes_.begin() + static_cast<std::ptrdiff_t>(*d));
  return r;
}

Result<Shape> Shape::slice(const std::vector<std::pair<std::string, size_t>>& fixed) const {
  Shape out = *this;
  for (auto& [dim, value] : fixed) {
    auto next = out.at(dim, value);
    if (!next) return next;
    out = std::move(*next);
  }
  return out;
}

Shape Shape::flatten(const std::string& name) const {
  Shape out;
  out.names_ = {name};
  out.sizes_ = {ranks_.size()};
  out.ranks_ = ranks_;
  return out;
}

Result<Shape> Shape::rename(const std::string& from, const std::string& to) const {
  auto d = dim_index(from);
  if (!d) return error(d.error());
  if (to.empty()) return error(ErrorCode::invalid_argument, "shape: empty dimension name");
  if (to != from && dim_index(to)) {
    return error(ErrorCode::invalid_argument, "shape: dimension '" + to + "' exists already in " + to_string());
  }
  Shape out = *this;
  out.names_[*d] = to;
  return out;
}

std::string Shape::to_string() const {
  std::string s = "{";
  for (size_t d = 0; d < names_.size(); ++d) {
    if (d) s += ", ";
    s += names_[d] + "=" + std::to_string(sizes_[d]);
  }
  return s + "}";
}

}  // namespace troupe
