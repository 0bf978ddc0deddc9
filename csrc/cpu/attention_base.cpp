// The tree-attention kernel for any CPU (see cpu/attention_kernel.h).
#define SPECDEC_CPU_ISA base
#include "cpu/attention_kernel.h"
