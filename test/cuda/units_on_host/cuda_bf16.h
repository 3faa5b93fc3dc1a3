// Host stand-in for CUDA's cuda_bf16.h (see cuda_host.h): the decode units
// turn bf16 into float by a shift, so only the common names are needed.
#pragma once

#include "cuda_host.h"
