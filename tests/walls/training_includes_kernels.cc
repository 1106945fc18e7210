// Must not compile: the kernels are private to framework.
#include "framework/kernels/vector_math.h"
