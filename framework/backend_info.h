// Which compute kernels this build of the framework uses, for run records
// (training/provenance.h) and benchmark reports. The kernels themselves are
// private to the framework (framework/kernels/).
#pragma once

namespace stillpoint {

// "openblas" or "eigen": what runs the matrix products the packed float32
// kernel does not take (CMake option STILLPOINT_USE_OPENBLAS).
const char* MatrixProductBackendName();

// float32 lanes of the SIMD packets compiled in (4 with SSE, 8 with AVX, 16
// with AVX-512).
int SimdFloatLanes();

}  // namespace stillpoint
