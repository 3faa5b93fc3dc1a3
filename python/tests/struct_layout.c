/* Prints sizeof and offsetof of every struct the Python binding mirrors, as
 * JSON, from the real header: test_layout.py compares them with ctypes. A
 * field added to a struct changes its sizeof, so a mirror left behind fails. */
#include <stddef.h>
#include <stdio.h>

#include "xpack/xpack.h"

#define BEGIN(T) printf("%s\"%s\": {\"sizeof\": %zu", first ? "" : ", ", #T, sizeof(T)), first = 0
#define FIELD(T, f) printf(", \"%s\": %zu", #f, offsetof(T, f))
#define END() printf("}")

int main(void) {
  int first = 1;
  printf("{");
  BEGIN(xpack_pack_options); FIELD(xpack_pack_options, size); FIELD(xpack_pack_options, trunk_path); END();
  BEGIN(xpack_pack_fault); FIELD(xpack_pack_fault, size); FIELD(xpack_pack_fault, layer);
  FIELD(xpack_pack_fault, expert); FIELD(xpack_pack_fault, role); END();
  BEGIN(xpack_pack_info); FIELD(xpack_pack_info, size); FIELD(xpack_pack_info, version);
  FIELD(xpack_pack_info, arch); FIELD(xpack_pack_info, n_layers); FIELD(xpack_pack_info, n_experts);
  FIELD(xpack_pack_info, n_experts_used); FIELD(xpack_pack_info, n_roles); FIELD(xpack_pack_info, alignment);
  FIELD(xpack_pack_info, data_start); FIELD(xpack_pack_info, object_stride); FIELD(xpack_pack_info, object_bytes);
  FIELD(xpack_pack_info, file_size); FIELD(xpack_pack_info, source_sha256); END();
  BEGIN(xpack_role_info); FIELD(xpack_role_info, size); FIELD(xpack_role_info, name); FIELD(xpack_role_info, type);
  FIELD(xpack_role_info, n_dims); FIELD(xpack_role_info, ne); FIELD(xpack_role_info, offset);
  FIELD(xpack_role_info, nbytes); END();
  printf("}\n");
  return 0;
}
