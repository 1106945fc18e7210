// Must not compile: framework sits below layers (tests/walls/CMakeLists.txt).
#include "layers/linear.h"
