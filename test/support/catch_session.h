// Catch2's session, for the test executables' own main(): the framework is
// compiled once (catch_session.cc) rather than in each of them.
#pragma once

namespace troupe::test {

/// Runs the tests the command line selects (Catch::Session().run); the
/// process's exit status.
int run_catch_session(int argc, char** argv);

}  // namespace troupe::test
