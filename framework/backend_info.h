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

namespace internal {
// The same as MatrixProductBackendName, under the kernels' name (the bench
// command reports it; framework/kernels/gemm.h declares it too).
const char* GemmBackendName();
}  // namespace internal

}  // namespace stillpoint
