#include "forge/common/activity.h"

namespace forge {

Activity& activity() {
  // One record per process: the loop, the communicators and the watchdog thread all see this one.
  static Activity record;
  return record;
}

}  // namespace forge
