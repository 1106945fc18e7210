// Must not compile: the command-line program sits above the training library.
#include "training/cli/cli_commands.h"
