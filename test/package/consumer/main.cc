// Uses troupe through its installed headers only; no CAF headers are needed.
#include <troupe/troupe.h>

struct Square {
  int x;
};
class Squarer : public troupe::Actor<Squarer, Square> {
 public:
  int handle(const Square& m) { return m.x * m.x; }
};

int main() {
  troupe::Runtime rt;
  auto s = rt.spawn<Squarer>();
  auto r = s.ask(Square{12}).get();
  return r && *r == 144 ? 0 : 1;
}
