// Compiles: layers see solvers and framework.
#include "framework/ops.h"
#include "solvers/implicit_solve.h"
