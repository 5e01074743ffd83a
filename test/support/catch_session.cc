// Catch2's implementation (CATCH_CONFIG_RUNNER: no main of its own), built
// once as an object library and linked into every test executable.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_session.h"

int troupe::test::run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
