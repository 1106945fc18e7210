#include "framework/backend_info.h"

#include "framework/kernels/gemm.h"
#include "framework/kernels/vector_math.h"

namespace stillpoint {

const char* MatrixProductBackendName() { return internal::GemmBackendName(); }

int SimdFloatLanes() { return static_cast<int>(internal::kVecBlock); }

}  // namespace stillpoint
