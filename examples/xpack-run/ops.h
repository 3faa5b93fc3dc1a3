// What graphs compute with: the backend's named operations (backend.h) and the
// exact decoders of the GGUF weight formats those operations are defined over
// (dequant.h).
#pragma once

#include "backend.h"
#include "dequant.h"
