// Shim (see common.h): the controller's element sizes.
#ifndef HOROVOD_SHIM_CONTROLLER_H
#define HOROVOD_SHIM_CONTROLLER_H

#include "common.h"

namespace horovod {
namespace common {

struct Controller {
  int GetTypeSize(DataType t) const {
    return t == DataType::HOROVOD_FLOAT64 ? 8 : t == DataType::HOROVOD_FLOAT32 ? 4 : 2;
  }
};

} // namespace common
} // namespace horovod

#endif
