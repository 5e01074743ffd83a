// The layout of a mesh (Monarch's shapes): named dimensions with sizes, laid
// out row-major ({"hosts": 2, "gpus": 4}: hosts outer, gpus inner), each
// member with a global rank (its position in the whole mesh) and, in a view,
// coordinates. Views come from slicing (fix a dimension, or take a range of
// it), flattening and renaming; every view keeps its members' global ranks.
//
//   auto shape = Shape::make({{"hosts", 2}, {"gpus", 4}}).value();
//   auto host1 = shape.at("hosts", 1).value();          // {"gpus": 4}, ranks 4..7
//   auto evens = shape.range("gpus", 0, 4, 2).value();   // {"hosts": 2, "gpus": 2}, ranks 0,2,4,6
//   host1.rank(2);                                        // 6
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "troupe/codec.h"
#include "troupe/status.h"

namespace troupe {

class Shape {
 public:
  /// A whole mesh; every size must be >= 1 and names unique and non-empty.
  static Result<Shape> make(std::vector<std::pair<std::string, size_t>> dims);

  /// Dimension names and sizes, outermost first.
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<size_t>& sizes() const { return sizes_; }
  /// Members in this view.
  size_t size() const { return ranks_.size(); }
  /// Global ranks of this view's members, in view order (row-major).
  const std::vector<size_t>& ranks() const { return ranks_; }
  /// The global rank of the member at view index `index` (< size()).
  size_t rank(size_t index) const { return ranks_[index]; }
  /// Its coordinates in this view, one per dimension.
  std::vector<size_t> coords(size_t index) const;
  /// The view index at `coords`; an error names the bad coordinate.
  Result<size_t> index_of(const std::vector<size_t>& coords) const;
  /// The view index of a global rank, or an error when it is not in view.
  Result<size_t> index_of_rank(size_t rank) const;

  /// The members with `dim` = `value` (the dimension goes away).
  Result<Shape> at(const std::string& dim, size_t value) const;
  /// Several at() at once: `slice({{"hosts", 1}})`.
  Result<Shape> slice(const std::vector<std::pair<std::string, size_t>>& fixed) const;
  /// The members with `dim` in [begin, end) every `step` (the dimension stays).
  Result<Shape> range(const std::string& dim, size_t begin, size_t end, size_t step = 1) const;
  /// One dimension named `name` holding every member, in view order.
  Shape flatten(const std::string& name) const;
  /// The same view with a dimension renamed.
  Result<Shape> rename(const std::string& from, const std::string& to) const;

  /// "{hosts=2, gpus=4}".
  std::string to_string() const;

  TROUPE_FIELDS(names_, sizes_, ranks_);

 private:
  Result<size_t> dim_index(const std::string& dim) const;

  std::vector<std::string> names_;
  std::vector<size_t> sizes_;
  std::vector<size_t> ranks_;
};

}  // namespace troupe
