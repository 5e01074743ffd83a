// troupe: typed actors, supervision trees and a runtime to host them.
// Include this one header; see README.md and docs/ for the guide.
#pragma once

#include "troupe/actor.h"        // IWYU pragma: export
#include "troupe/actor_ref.h"    // IWYU pragma: export
#include "troupe/exit_reason.h"  // IWYU pragma: export
#include "troupe/future.h"       // IWYU pragma: export
#include "troupe/message.h"      // IWYU pragma: export
#include "troupe/remote_buffer.h" // IWYU pragma: export
#include "troupe/runtime.h"      // IWYU pragma: export
#include "troupe/status.h"       // IWYU pragma: export
#include "troupe/supervisor.h"   // IWYU pragma: export
