#include "xpack/xpack.h"

extern "C" XPACK_API unsigned xpack_version_number(void) { return XPACK_VERSION_NUMBER; }
extern "C" XPACK_API const char* xpack_version(void) { return XPACK_VERSION_STRING; }
