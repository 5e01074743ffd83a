// Worker processes: a node agent starts the driver's own executable as a
// worker to host the actors the head places on its node, so that the user's
// actor classes are there without plugins. The program recognises that it
// was started as a worker by calling this first thing in main():
//
//   int main(int argc, char** argv) {
//     troupe::serve_if_worker();   // never returns in a worker process
//     ...                          // the driver
//   }
//
// (ClusterClient::connect calls it too, as a fallback for programs that
// forget.) See docs/cluster.md.
#pragma once

namespace troupe {

/// In a process a node agent started as a worker (the environment says so),
/// hosts actors until the agent or the head tells it to stop, or its agent
/// is gone, and then exits the process. Anywhere else, returns at once.
void serve_if_worker();

/// True in a process started as a worker.
bool is_worker_process();

}  // namespace troupe
