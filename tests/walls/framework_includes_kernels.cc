// Compiles: framework sources see their own kernels and public headers.
#include "framework/kernels/gemm.h"
#include "framework/ops.h"
