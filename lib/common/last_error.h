// The calling thread's most recent error message, behind xpack_last_error().
#pragma once
#include <string>

namespace xpack {
void set_last_error(const std::string& message);
const char* last_error();
}  // namespace xpack
