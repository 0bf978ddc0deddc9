// The linear kernel for any CPU (see cpu/linear_kernel.h).
#define SPECDEC_CPU_ISA base
#include "cpu/linear_kernel.h"
