// Must not compile: layers sit below training.
#include "training/config/config.h"
