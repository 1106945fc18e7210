// Must not compile: solvers sit below layers.
#include "layers/linear.h"
