/*
 * libxpack: stream the routed experts of a Mixture-of-Experts model from an NVMe
 * SSD into a byte-budgeted device cache.
 *
 * This header is the whole public contract of libxpack.so.
 *
 * Conventions (modelled on liburing, zstd and sqlite3):
 *  - Every symbol starts with xpack_ / XPACK_. Handles are opaque.
 *  - Every function that can fail returns int: 0 on success, a negative code on
 *    failure. Codes above XPACK_E_BASE are negated errno values (-ENOENT, -EIO ...),
 *    so the operating system's errno is preserved; codes at or below XPACK_E_BASE
 *    are libxpack's own (XPACK_E_*). xpack_strerror() names both.
 *  - Each handle keeps, per calling thread, the message of that thread's most
 *    recent failed call on it (xpack_gguf_errmsg, xpack_pack_errmsg ...), valid
 *    until that thread's next failing call on the handle: threads failing
 *    concurrently on one handle each read their own message. A failed open has no
 *    handle, so xpack_last_error() returns the calling thread's most recent message.
 *  - Constructors are xpack_X_open/create; destructors xpack_X_close/destroy
 *    accept NULL.
 *  - Structs are versioned by their size and grow only by appending fields, so
 *    old callers keep working when a struct grows (doc/api.md):
 *     - A struct passed alone (options in, info/counters out) starts with
 *       `size_t size`, set by the caller to sizeof(struct). On input libxpack
 *       reads only the fields that fit (the others take their defaults: a
 *       zero-filled struct means the defaults, and so does NULL); on output it
 *       writes only the fields that fit and sets size to the bytes it wrote.
 *       A size below sizeof(size_t) is refused with XPACK_E_INVALID_ARG.
 *     - An array of element structs (xpack_read_request, xpack_read_completion,
 *       xpack_expert_slot) has no size per element: the call that takes the
 *       array also takes `elem_size`, the caller's sizeof(element). libxpack
 *       steps through the array by elem_size and reads or writes only the first
 *       min(elem_size, its own sizeof) bytes of each element: fields a newer
 *       caller added are left as they were (ignored on input, where zero means
 *       the old behaviour), and nothing past an older caller's element is
 *       touched. An elem_size below the first version, XPACK_<NAME>_SIZE_V1, is
 *       refused with XPACK_E_INVALID_ARG and a message.
 *  - Every function states its thread safety.
 */
#ifndef XPACK_XPACK_H
#define XPACK_XPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(XPACK_BUILDING)
#define XPACK_API __attribute__((visibility("default")))
#else
#define XPACK_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                   */
/* ------------------------------------------------------------------------ */

#define XPACK_VERSION_MAJOR 0
#define XPACK_VERSION_MINOR 1
#define XPACK_VERSION_PATCH 0
#define XPACK_VERSION_NUMBER \
  (XPACK_VERSION_MAJOR * 10000 + XPACK_VERSION_MINOR * 100 + XPACK_VERSION_PATCH)
#define XPACK_VERSION_STRING "0.1.0"

/* The version of the library actually loaded, as XPACK_VERSION_NUMBER / _STRING.
 * Thread-safe. */
XPACK_API unsigned xpack_version_number(void);
XPACK_API const char *xpack_version(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

enum xpack_error {
  XPACK_OK = 0,
  XPACK_E_BASE = -1000,         /* codes <= this are libxpack's own */
  XPACK_E_INVALID_ARG = -1001,  /* NULL handle, bad option, index out of range */
  XPACK_E_FORMAT = -1002,       /* malformed file content not covered below */
  XPACK_E_TRUNCATED = -1003,    /* file ends before a structure it declares */
  XPACK_E_BAD_MAGIC = -1004,    /* not a GGUF / not an Expert Pack */
  XPACK_E_VERSION = -1005,      /* unsupported format version */
  XPACK_E_CHECKSUM = -1006,     /* header/index checksum mismatch */
  XPACK_E_SIZE_MISMATCH = -1007,/* file size differs from what the header implies */
  XPACK_E_MISALIGNED = -1008,   /* offset, length, stride or buffer not aligned */
  XPACK_E_IDENTITY = -1009,     /* pack was not built from this trunk/source */
  XPACK_E_UNKNOWN_TYPE = -1010, /* unknown ggml type id */
  XPACK_E_NOT_FOUND = -1011,    /* no such key, tensor, layer, role */
  XPACK_E_TYPE = -1012,         /* value has another type than the one asked for */
  XPACK_E_OBJECT_CHECKSUM = -1013, /* an expert object's payload is damaged */
  XPACK_E_SPLIT = -1014,        /* inconsistent or incomplete GGUF split set */
  XPACK_E_LIMIT = -1015,        /* a count or size beyond sane limits (hostile input) */
  XPACK_E_UNSUPPORTED = -1016,  /* valid input this version cannot handle */
  XPACK_E_NO_DIRECT_IO = -1017, /* O_DIRECT refused and buffered mode not requested */
  XPACK_E_CAPACITY = -1018,     /* cache budget holds fewer slots than top-k */
  XPACK_E_OVERLAP = -1019,      /* two tensors share bytes */
  XPACK_E_DUPLICATE = -1020,    /* duplicate key or tensor name */
  XPACK_E_URING = -1021,        /* io_uring unavailable (kernel refused it) */
  XPACK_E_DEVICE = -1022,       /* device backend (CUDA) error */
  XPACK_E_INTERNAL = -1099      /* a bug in libxpack */
};

/* A static English description of any return code (errno or XPACK_E_*).
 * Never returns NULL. Thread-safe. */
XPACK_API const char *xpack_strerror(int code);

/* Message of the calling thread's most recent failed libxpack call ("" if none).
 * Valid until the next failing call on this thread. Thread-safe (thread-local). */
XPACK_API const char *xpack_last_error(void);

/* ------------------------------------------------------------------------ */
/* ggml tensor types                                                         */
/* ------------------------------------------------------------------------ */

/* ggml type ids as stored in GGUF (only the ones libxpack knows are listed). */
enum xpack_ggml_type {
  XPACK_TYPE_F32 = 0,
  XPACK_TYPE_F16 = 1,
  XPACK_TYPE_Q4_0 = 2,
  XPACK_TYPE_Q4_1 = 3,
  XPACK_TYPE_Q5_0 = 6,
  XPACK_TYPE_Q5_1 = 7,
  XPACK_TYPE_Q8_0 = 8,
  XPACK_TYPE_Q8_1 = 9,
  XPACK_TYPE_Q2_K = 10,
  XPACK_TYPE_Q3_K = 11,
  XPACK_TYPE_Q4_K = 12,
  XPACK_TYPE_Q5_K = 13,
  XPACK_TYPE_Q6_K = 14,
  XPACK_TYPE_Q8_K = 15,
  XPACK_TYPE_I8 = 24,
  XPACK_TYPE_I16 = 25,
  XPACK_TYPE_I32 = 26,
  XPACK_TYPE_I64 = 27,
  XPACK_TYPE_F64 = 28,
  XPACK_TYPE_BF16 = 30,
  XPACK_TYPE_MXFP4 = 39
};

/* Name ("Q2_K"), elements per block and bytes per block of a ggml type.
 * Any out pointer may be NULL. Returns XPACK_E_UNKNOWN_TYPE for ids not in the
 * table. Thread-safe. */
XPACK_API int xpack_type_info(uint32_t type, const char **name, uint32_t *block_elems,
                              uint32_t *block_bytes);

/* ------------------------------------------------------------------------ */
/* GGUF reader (single files and gguf-split sets)                            */
/* ------------------------------------------------------------------------ */

typedef struct xpack_gguf xpack_gguf;

/* GGUF metadata value types (the ids stored in the file). */
enum xpack_gguf_value_type {
  XPACK_GGUF_U8 = 0, XPACK_GGUF_I8 = 1, XPACK_GGUF_U16 = 2, XPACK_GGUF_I16 = 3,
  XPACK_GGUF_U32 = 4, XPACK_GGUF_I32 = 5, XPACK_GGUF_F32 = 6, XPACK_GGUF_BOOL = 7,
  XPACK_GGUF_STRING = 8, XPACK_GGUF_ARRAY = 9, XPACK_GGUF_U64 = 10, XPACK_GGUF_I64 = 11,
  XPACK_GGUF_F64 = 12
};

enum xpack_gguf_flags {
  /* Open only the named file even if its name looks like a split shard. */
  XPACK_GGUF_SINGLE_FILE = 1u << 0
};

typedef struct xpack_gguf_options {
  size_t size;    /* sizeof(xpack_gguf_options) */
  uint32_t flags; /* XPACK_GGUF_* */
} xpack_gguf_options;

/* Opens a GGUF file. When the name matches NAME-0000k-of-0000N.gguf, all N shards
 * are found beside it, checked (split.no, split.count, split.tensors.count) and
 * presented as one tensor table; metadata comes from the first shard. Tensor data
 * is memory-mapped lazily. On failure *out is NULL and xpack_last_error() says why.
 * Thread-safe (distinct handles are independent). */
XPACK_API int xpack_gguf_open(const char *path, const xpack_gguf_options *opts,
                              xpack_gguf **out);
/* Closes the handle and unmaps its data. Accepts NULL. Not thread-safe with other
 * calls on the same handle. */
XPACK_API void xpack_gguf_close(xpack_gguf *g);
/* The message of the calling thread's most recent failed call on this handle
 * ("" if none), valid until that thread's next failing call on it. Thread-safe. */
XPACK_API const char *xpack_gguf_errmsg(const xpack_gguf *g);

/* All the metadata/tensor accessors below are thread-safe: a handle is read-only
 * after open (tensor data is mapped under an internal lock). Strings returned
 * live as long as the handle. */

XPACK_API uint32_t xpack_gguf_version(const xpack_gguf *g);
XPACK_API uint32_t xpack_gguf_shard_count(const xpack_gguf *g);
XPACK_API int64_t xpack_gguf_key_count(const xpack_gguf *g);
/* Index of a key, or XPACK_E_NOT_FOUND. */
XPACK_API int64_t xpack_gguf_find_key(const xpack_gguf *g, const char *key);
XPACK_API const char *xpack_gguf_key_name(const xpack_gguf *g, int64_t idx);
/* The value type (enum xpack_gguf_value_type) or a negative code. */
XPACK_API int xpack_gguf_key_type(const xpack_gguf *g, int64_t idx);
/* Any integer or bool value; XPACK_E_TYPE for other types, XPACK_E_LIMIT if a
 * u64 does not fit in int64_t. */
XPACK_API int xpack_gguf_get_int(const xpack_gguf *g, int64_t idx, int64_t *out);
/* F32/F64 (and integers, converted). */
XPACK_API int xpack_gguf_get_float(const xpack_gguf *g, int64_t idx, double *out);
XPACK_API int xpack_gguf_get_string(const xpack_gguf *g, int64_t idx, const char **s,
                                    size_t *len);
/* For an array value: element type and count. */
XPACK_API int xpack_gguf_get_array(const xpack_gguf *g, int64_t idx, int *elem_type,
                                   uint64_t *n);
XPACK_API int xpack_gguf_get_array_int(const xpack_gguf *g, int64_t idx, uint64_t i,
                                       int64_t *out);
XPACK_API int xpack_gguf_get_array_float(const xpack_gguf *g, int64_t idx, uint64_t i,
                                         double *out);
XPACK_API int xpack_gguf_get_array_string(const xpack_gguf *g, int64_t idx, uint64_t i,
                                          const char **s, size_t *len);

typedef struct xpack_tensor_info {
  size_t size;          /* sizeof(xpack_tensor_info), set by the caller */
  const char *name;     /* lives as long as the handle */
  uint32_t type;        /* enum xpack_ggml_type */
  uint32_t n_dims;
  uint64_t ne[4];       /* ne[0] is the contiguous dimension; unused dims are 1 */
  uint64_t nbytes;
  uint32_t shard;       /* 0-based shard index */
  uint64_t file_offset; /* absolute offset of the data in its shard file */
} xpack_tensor_info;

XPACK_API int64_t xpack_gguf_tensor_count(const xpack_gguf *g);
/* Index of a tensor by name, or XPACK_E_NOT_FOUND. */
XPACK_API int64_t xpack_gguf_find_tensor(const xpack_gguf *g, const char *name);
XPACK_API int xpack_gguf_tensor_info(const xpack_gguf *g, int64_t idx,
                                     xpack_tensor_info *out);
/* Pointer to the tensor's bytes (read-only mapping of its shard). */
XPACK_API int xpack_gguf_tensor_data(xpack_gguf *g, int64_t idx, const void **data);

/* ------------------------------------------------------------------------ */
/* Expert Pack (doc/pack-format.md)                                          */
/* ------------------------------------------------------------------------ */

typedef struct xpack_pack xpack_pack;

typedef struct xpack_pack_options {
  size_t size;            /* sizeof(xpack_pack_options) */
  /* If non-NULL, the trunk GGUF (or original GGUF) the pack must belong to:
   * open fails with XPACK_E_IDENTITY when its metadata identity differs. */
  const char *trunk_path;
} xpack_pack_options;

/* Opens an Expert Pack and checks everything that is cheap to check: magic,
 * version, header/index checksum, sizes, alignment of every offset and of the
 * stride, file size. Fails closed with a specific code. Payload checksums are
 * checked by xpack_pack_validate. Thread-safe (distinct handles). */
XPACK_API int xpack_pack_open(const char *path, const xpack_pack_options *opts,
                              xpack_pack **out);
/* Accepts NULL. Not thread-safe with other calls on the same handle. */
XPACK_API void xpack_pack_close(xpack_pack *p);
/* The message of the calling thread's most recent failed call on this handle
 * ("" if none), valid until that thread's next failing call on it. Thread-safe. */
XPACK_API const char *xpack_pack_errmsg(const xpack_pack *p);

enum xpack_validate_level {
  XPACK_VALIDATE_STRUCTURE = 0, /* what open checks, again */
  XPACK_VALIDATE_CHECKSUMS = 1  /* plus the xxh3-64 of every object's payload */
};

/* Where validation found damage. */
typedef struct xpack_pack_fault {
  size_t size;            /* sizeof(xpack_pack_fault) */
  uint32_t layer;         /* GGUF block index */
  uint32_t expert;
  int32_t role;           /* role index, or -1 when no role is blamed (bytes between
                             roles, or non-zero padding after the payload) */
} xpack_pack_fault;

/* Validates the pack. With XPACK_VALIDATE_CHECKSUMS reads every object; on the
 * first bad object (a checksum mismatch, or padding after the payload that is not
 * zero) returns XPACK_E_OBJECT_CHECKSUM and fills *fault (may be NULL).
 * Thread-safe (uses pread, no shared state). */
XPACK_API int xpack_pack_validate(xpack_pack *p, int level, xpack_pack_fault *fault);

typedef struct xpack_pack_info {
  size_t size;            /* sizeof(xpack_pack_info), set by the caller */
  uint32_t version;       /* format version */
  const char *arch;       /* general.architecture of the source */
  uint32_t n_layers;      /* MoE layers present (object table rows) */
  uint32_t n_experts;     /* routed experts per layer */
  uint32_t n_experts_used;/* top-k (0 if the source did not say) */
  uint32_t n_roles;
  uint32_t alignment;     /* 4096 */
  uint64_t data_start;
  uint64_t object_stride; /* bytes between consecutive objects, multiple of alignment */
  uint64_t object_bytes;  /* payload bytes of one object (<= stride) */
  uint64_t file_size;
  uint8_t source_sha256[32]; /* identity: SHA-256 over the source metadata section(s) */
} xpack_pack_info;

/* All accessors below are thread-safe (the handle is read-only after open). */
/* The path the pack was opened with. */
XPACK_API const char *xpack_pack_path(const xpack_pack *p);
XPACK_API int xpack_pack_get_info(const xpack_pack *p, xpack_pack_info *out);
/* GGUF block index of object-table row `layer_slot`. */
XPACK_API int xpack_pack_layer_block(const xpack_pack *p, uint32_t layer_slot,
                                     uint32_t *block);
/* Object-table row of GGUF block `block`, or XPACK_E_NOT_FOUND (a dense layer). */
XPACK_API int xpack_pack_layer_slot(const xpack_pack *p, uint32_t block,
                                    uint32_t *layer_slot);

typedef struct xpack_role_info {
  size_t size;          /* sizeof(xpack_role_info), set by the caller */
  const char *name;     /* "gate", "up", "down", "gate_up", ... */
  uint32_t type;        /* enum xpack_ggml_type */
  uint32_t n_dims;      /* dims of one expert's slice (the expert dim removed) */
  uint64_t ne[3];
  uint64_t offset;      /* byte offset inside every object */
  uint64_t nbytes;
} xpack_role_info;

XPACK_API int xpack_pack_role_info(const xpack_pack *p, uint32_t role,
                                   xpack_role_info *out);
/* Role index by name, or XPACK_E_NOT_FOUND. */
XPACK_API int xpack_pack_find_role(const xpack_pack *p, const char *name);
/* Source tensor name of a role in a given GGUF block (e.g. blk.3.ffn_up_exps.weight). */
XPACK_API int xpack_pack_role_source(const xpack_pack *p, uint32_t role, uint32_t block,
                                     char *buf, size_t buf_size);
/* Absolute file offset of object (layer_slot, expert):
 * data_start + (layer_slot * n_experts + expert) * object_stride. */
XPACK_API int xpack_pack_object_offset(const xpack_pack *p, uint32_t layer_slot,
                                       uint32_t expert, uint64_t *offset);
/* The stored xxh3-64 of an object's payload. */
XPACK_API int xpack_pack_object_checksum(const xpack_pack *p, uint32_t layer_slot,
                                         uint32_t expert, uint64_t *xxh3);
/* Synchronous convenience read of one object's payload (object_bytes) into buf;
 * verifies its checksum when verify != 0. Thread-safe (pread). */
XPACK_API int xpack_pack_read_object(xpack_pack *p, uint32_t layer_slot, uint32_t expert,
                                     void *buf, size_t buf_size, int verify);

/* ------------------------------------------------------------------------ */
/* I/O engine (io_uring O_DIRECT reads into registered staging slots)        */
/* ------------------------------------------------------------------------ */
/* The engine reads Expert Pack objects with io_uring (O_DIRECT, registered
 * buffers and files) into N staging slots of pinned-for-I/O host memory, and
 * reports each object as soon as all of its read_splits ranges arrived.
 * Design: doc/io.md. Single issuer: the first thread that submits or reaps owns
 * the ring; every call below except create/destroy/errmsg/get_counters/
 * slot_data must come from that thread. */

typedef struct xpack_engine xpack_engine;

/* Values of `direct_io` in xpack_engine_options and xpack_cache_options. */
enum xpack_io_mode {
  /* The default (1 means the same): O_DIRECT, and XPACK_E_NO_DIRECT_IO where the
   * filesystem refuses it; never a silent fallback. */
  XPACK_IO_DIRECT = 0,
  /* Read through the page cache, each read counted in fallback_count. */
  XPACK_IO_BUFFERED = -1
};

/* Values of `verify` in xpack_cache_options. */
enum xpack_verify_mode {
  /* The default (1 means the same): each object's xxh3-64 is checked when its read
   * completes, by a hash worker while the copy to the device runs; the expert is
   * ready (wait returns, its ready event is recorded) only once both finished and
   * the hash matched, and a mismatch fails that expert with XPACK_E_OBJECT_CHECKSUM,
   * so damaged bytes never reach a kernel (doc/cache.md has the measured cost). */
  XPACK_VERIFY_ON = 0,
  /* No check. */
  XPACK_VERIFY_OFF = -1
};

/* A zero-filled struct (with size set) means the defaults; so does NULL. The
 * defaults and limits stated here (staging buffers 8, queue depth 64, read
 * splits 1 of at most 256) have one home, lib/io/engine_defaults.h; a test
 * (cache_limits) checks these comments against it. */
typedef struct xpack_engine_options {
  size_t size;           /* sizeof(xpack_engine_options) */
  uint32_t slots;        /* staging slots (buffers), each one object (0 = default 8) */
  uint32_t queue_depth;  /* reads in flight at most, the ring size (1..4096, 0 = default 64) */
  uint32_t read_splits;  /* aligned ranges per object read (1..256, 0 = default 1) */
  int32_t sqpoll;        /* 1: kernel submission-polling thread (default 0) */
  int32_t direct_io;     /* enum xpack_io_mode (default XPACK_IO_DIRECT) */
  int32_t numa_node;     /* NUMA node for the staging memory, used when numa_bind = 1 */
  int32_t numa_bind;     /* 1: bind the staging memory to numa_node; 0 (default): any node */
} xpack_engine_options;

/* Fills *opts with the defaults (and opts->size). Thread-safe. */
XPACK_API int xpack_engine_options_init(xpack_engine_options *opts);

/* Creates an engine reading from pack `p` (which must outlive the engine): opens
 * the pack file O_DIRECT, sets up io_uring (SINGLE_ISSUER|DEFER_TASKRUN or the
 * best flags the kernel accepts), allocates and registers the staging slots
 * (raising RLIMIT_MEMLOCK's soft limit if needed). Errors: XPACK_E_URING (kernel
 * refused io_uring), XPACK_E_NO_DIRECT_IO, XPACK_E_LIMIT (locked-memory limit,
 * with what to set), XPACK_E_MISALIGNED, XPACK_E_INVALID_ARG. On failure *out is
 * NULL and xpack_last_error() says why. Thread-safe (distinct engines). */
XPACK_API int xpack_engine_create(xpack_pack *p, const xpack_engine_options *opts,
                                  xpack_engine **out);
/* Waits for reads in flight when called on the issuing thread, then frees
 * everything. Accepts NULL. Not thread-safe with other calls on the engine. */
XPACK_API void xpack_engine_destroy(xpack_engine *e);
/* Message of the calling thread's most recent failure on this engine ("" if
 * none), valid until that thread's next failing call on it; a failed read's
 * message is recorded for the thread that reaped it. Thread-safe. */
XPACK_API const char *xpack_engine_errmsg(const xpack_engine *e);

/* An element of xpack_engine_submit's array (versioned by elem_size). */
typedef struct xpack_read_request {
  uint32_t layer_slot;   /* object-table row (xpack_pack_layer_slot) */
  uint32_t expert;
  uint32_t slot;         /* staging slot, must not have a read in flight */
} xpack_read_request;
/* The smallest elem_size accepted: the fields of the first version. */
#define XPACK_READ_REQUEST_SIZE_V1 (offsetof(xpack_read_request, slot) + sizeof(uint32_t))

/* Queues n object reads and submits them with one io_uring_submit (up to the
 * queue depth; the rest enter as reads finish). elem_size: the caller's
 * sizeof(xpack_read_request). All or nothing: a request with an unknown object,
 * a slot out of range or busy, or a slot used twice rejects the whole batch
 * (XPACK_E_INVALID_ARG). Issuing thread only. */
XPACK_API int xpack_engine_submit(xpack_engine *e, const xpack_read_request *reqs, size_t n,
                                  size_t elem_size);

/* An element of xpack_engine_reap's array (versioned by elem_size). */
typedef struct xpack_read_completion {
  uint32_t slot;
  uint32_t layer_slot;
  uint32_t expert;
  int32_t status;        /* 0: slot holds the object; else -errno (e.g. -EIO) or
                            XPACK_E_TRUNCATED (file ended early); the slot is not ready */
} xpack_read_completion;
/* The smallest elem_size accepted: the fields of the first version. */
#define XPACK_READ_COMPLETION_SIZE_V1 (offsetof(xpack_read_completion, status) + sizeof(int32_t))

/* Reaps finished objects in completion order into out[0..max); elem_size: the
 * caller's sizeof(xpack_read_completion). timeout_ms: 0 = never block; < 0 =
 * block until at least one object finished (returns 0 at once when nothing is in
 * flight); > 0 = block at most that long. Returns the number written (>= 0) or a
 * negative code. Issuing thread only. */
XPACK_API int xpack_engine_reap(xpack_engine *e, xpack_read_completion *out, size_t max,
                                size_t elem_size, int timeout_ms);

/* The slot's bytes: valid only after a successful completion for it and until
 * the slot is submitted again. *bytes is the object payload size. Fails with
 * XPACK_E_INVALID_ARG when the slot is out of range or not ready (empty, being
 * read, or its read failed). Thread-safe with respect to the issuing thread only
 * for slots that thread does not resubmit meanwhile. */
XPACK_API int xpack_engine_slot_data(const xpack_engine *e, uint32_t slot, const void **data,
                                     size_t *bytes);

typedef struct xpack_engine_counters {
  size_t size;                 /* sizeof(xpack_engine_counters), set by the caller */
  uint64_t reads;              /* read operations that returned data (splits, retries) */
  uint64_t read_bytes;
  uint64_t objects_completed;
  uint64_t io_errors;          /* objects that failed */
  uint64_t fallback_count;     /* buffered reads (direct_io = XPACK_IO_BUFFERED) */
  uint64_t short_read_retries;
  uint64_t transient_retries;  /* EINTR / EAGAIN resubmissions */
  uint64_t lat_p50_ns;         /* per-object read latency quantiles */
  uint64_t lat_p99_ns;
  uint64_t lat_p999_ns;
  uint64_t lat_log2_ns[64];    /* objects with latency in [2^i, 2^(i+1)) ns */
  uint32_t ring_flags;         /* IORING_SETUP_* flags the ring runs with */
  /* Page size backing most of the staging memory, as measured after it was
   * populated: 2 MiB (huge pages: hugetlb, or transparent huge pages asked for
   * with MADV_HUGEPAGE) or 4096; 0 if unknown. With 4 KiB pages a read above
   * ~1 MiB needs more segments than NVMe queues take and is split (doc/io.md). */
  uint64_t staging_page_bytes;
  double staging_huge_fraction; /* fraction of the staging memory in huge pages */
} xpack_engine_counters;

/* Copies the counters. Not thread-safe with the issuing thread's calls (the
 * counters are plain integers): call it from the issuing thread. */
XPACK_API int xpack_engine_get_counters(const xpack_engine *e, xpack_engine_counters *out);

/* ------------------------------------------------------------------------ */
/* Expert cache                                                              */
/* ------------------------------------------------------------------------ */
/* Keeps the hottest expert objects in device memory (design: doc/cache.md). One
 * slot holds one whole object (all roles); the slot count comes from a byte
 * budget: floor(min(budget, free device memory - reserve) / slot stride).
 * xpack_cache_acquire returns at once with a slot and a ready event per expert:
 * hits are ready immediately, misses are read by an internal I/O thread
 * (io_uring) and each is copied to its slot as soon as it lands. Experts of an
 * acquire are protected from eviction until xpack_cache_release. Layers are
 * object-table rows of the pack (xpack_pack_layer_slot maps GGUF blocks).
 * Thread-safety: unless a function says otherwise, all cache functions are
 * thread-safe; several threads may acquire, wait and release concurrently on one
 * cache. A ticket must be released exactly once. */

typedef struct xpack_cache xpack_cache;

enum xpack_cache_policy {
  /* The default: evicts as whichever of LRU, decayed frequency (two half-lives) and
   * the hybrid would have hit most on the recent requests, judged by simulating each
   * on a cache of this size (doc/cache.md, "Eviction policy"). Until 0.1.x value 0
   * was HYBRID, which falls far below LRU where the hot set drifts. */
  XPACK_POLICY_ADAPTIVE = 0,
  XPACK_POLICY_LRU = 1,
  XPACK_POLICY_LFU = 2,
  XPACK_POLICY_HYBRID = 3, /* the seed's LFU/LRU hybrid: capped use count, ties by recency */
  XPACK_POLICY_DECAY = 4   /* decayed frequency (LRFU), half-life 1024 requests */
};

enum xpack_device_kind {
  XPACK_DEVICE_AUTO = 0, /* CUDA when built with it and a GPU is usable, else host */
  XPACK_DEVICE_CUDA = 1, /* fail with XPACK_E_DEVICE / XPACK_E_UNSUPPORTED without one */
  XPACK_DEVICE_HOST = 2  /* plain memory, copies on a worker thread (tests, CI) */
};

/* A zero-filled struct (with size set) means the defaults; so does NULL. The
 * I/O defaults and limits are xpack_engine_options' (one home:
 * lib/io/engine_defaults.h). */
typedef struct xpack_cache_options {
  size_t size;             /* sizeof(xpack_cache_options) */
  uint64_t budget_bytes;   /* device bytes for slots; 0 = all free memory - reserve */
  uint64_t reserve_bytes;  /* device bytes to leave free */
  int32_t policy;          /* enum xpack_cache_policy (default ADAPTIVE) */
  int32_t device;          /* enum xpack_device_kind (default AUTO) */
  int32_t cuda_device;     /* CUDA ordinal (default 0) */
  uint32_t staging_slots;  /* pinned staging buffers, one object each (1..4096, 0 = default 8) */
  uint32_t read_splits;    /* aligned ranges per object read (1..256, 0 = default 1) */
  uint32_t queue_depth;    /* io_uring reads in flight at most (1..4096, 0 = default 64) */
  int32_t direct_io;       /* enum xpack_io_mode (default XPACK_IO_DIRECT) */
  int32_t verify;          /* enum xpack_verify_mode (default XPACK_VERIFY_ON) */
  const char *stats_path;  /* JSON stats written atomically; NULL = none */
  uint64_t stats_interval; /* write every N releases, and at destroy (0 = destroy only) */
  const char *trace_path;  /* routing trace CSV step,layer,expert; NULL = none */
  uint64_t host_device_bytes; /* host device only: memory it pretends to have (0 = 16 GiB) */
  /* Pinned host memory for the host tier (0 = none): whole objects the device
   * evicted, copied device->host; a miss on one costs one host->device copy and no
   * read (doc/cache.md, "Host tier"). Frames of the aligned object size, one of
   * them kept free for swaps, at most one per object the slots cannot hold plus
   * that one; a non-zero value under two objects is XPACK_E_INVALID_ARG, memory
   * that cannot be mapped or pinned fails the create. */
  uint64_t host_cache_bytes;
} xpack_cache_options;

/* Fills *opts with the defaults (and opts->size). Thread-safe. */
XPACK_API int xpack_cache_options_init(xpack_cache_options *opts);

/* Creates a cache over pack `p` (which must outlive the cache). Errors:
 * XPACK_E_CAPACITY (fewer slots than the pack's top-k), XPACK_E_DEVICE,
 * XPACK_E_UNSUPPORTED (CUDA asked for, built without), the I/O engine's errors
 * (XPACK_E_URING, XPACK_E_NO_DIRECT_IO, XPACK_E_LIMIT), XPACK_E_INVALID_ARG. On
 * failure *out is NULL and xpack_last_error() says why. Thread-safe (distinct
 * caches). */
XPACK_API int xpack_cache_create(xpack_pack *p, const xpack_cache_options *opts,
                                 xpack_cache **out);
/* Finishes loads in flight, writes the stats file, frees everything. Accepts
 * NULL. Not thread-safe with other calls on the same cache. */
XPACK_API void xpack_cache_destroy(xpack_cache *c);
/* Message of the calling thread's most recent failed call on this cache ("" if
 * none), valid until that thread's next failing call on it. Thread-safe. */
XPACK_API const char *xpack_cache_errmsg(const xpack_cache *c);

typedef struct xpack_cache_info {
  size_t size;                /* sizeof(xpack_cache_info), set by the caller */
  uint32_t slot_count;
  uint32_t n_layers;
  uint32_t n_experts;
  uint64_t slot_stride;       /* bytes between slots (object_bytes rounded up to 256) */
  uint64_t object_bytes;
  const char *device_backend; /* "cuda" or "host"; lives as long as the cache */
  const char *policy;         /* "adaptive", "lru", "lfu", "hybrid", "decay" */
  uint32_t host_frames;       /* host tier frames, one object each (0 = no tier); it holds
                               * host_frames - 1 experts, one frame kept free for swaps */
  uint64_t host_frame_stride; /* bytes between frames (object_bytes rounded up to 4096) */
} xpack_cache_info;

/* Thread-safe. */
XPACK_API int xpack_cache_get_info(const xpack_cache *c, xpack_cache_info *out);

/* xpack_expert_slot.slot of an entry deferred by XPACK_ACQUIRE_DEFER (no slot yet). */
#define XPACK_SLOT_DEFERRED UINT32_MAX

/* One acquired expert: an element of the acquire calls' out array, and
 * xpack_cache_entry's result (versioned by elem_size). */
typedef struct xpack_expert_slot {
  uint32_t expert;
  uint32_t slot;       /* XPACK_SLOT_DEFERRED: not placed yet (data, ready_event NULL) */
  void *data;          /* device address of the object (roles at xpack_role_info.offset) */
  void *ready_event;   /* cudaEvent_t to wait on from a compute stream; NULL on host */
  int32_t hit;         /* 1 if it was resident (or already loading) */
  /* XPACK_EXPERT_SLOT_SIZE_V2 on: 1 if ready_event is recorded for this
   * object (its copy is enqueued), so a compute stream may wait on it instead of
   * xpack_cache_wait; 0 for a miss and for a hit on an expert still being read
   * (a prefetch in flight), whose ready_event is not recorded yet: a stream
   * waiting on it then would wait for nothing. */
  int32_t ready_recorded;
} xpack_expert_slot;
/* The smallest elem_size accepted: the fields of the first version. */
#define XPACK_EXPERT_SLOT_SIZE_V1 (offsetof(xpack_expert_slot, hit) + sizeof(int32_t))
/* The size with ready_recorded. */
#define XPACK_EXPERT_SLOT_SIZE_V2 (offsetof(xpack_expert_slot, ready_recorded) + sizeof(int32_t))

/* Requests n expert ids of one layer for n_tokens tokens (duplicates allowed;
 * n_tokens > 1 is prefill). Returns at once: out[i] describes experts[i]; the
 * data is usable after xpack_cache_wait, or, where out[i].ready_recorded is 1,
 * after ready_event on a stream.
 * elem_size: the caller's sizeof(xpack_expert_slot). *ticket identifies the
 * request for wait/release. XPACK_E_CAPACITY when the distinct experts cannot
 * all be placed because other requests protect too many slots (release some and
 * retry). Thread-safe. */
XPACK_API int xpack_cache_acquire(xpack_cache *c, uint32_t layer, const uint32_t *experts,
                                  size_t n, uint32_t n_tokens, xpack_expert_slot *out,
                                  size_t elem_size, uint64_t *ticket);
/* Flags of xpack_cache_acquire_ex. */
#define XPACK_ACQUIRE_DEFER 1u /* experts that cannot be placed now wait for slots */

/* xpack_cache_acquire with flags. With XPACK_ACQUIRE_DEFER the request may name
 * more distinct experts than the cache can place now (a prefill wider than the
 * cache): they are placed strictly in request order (after the first deferred
 * entry every later one is deferred too, even a resident one), before anything
 * acquired later, as slots are released; their out[i].slot is
 * XPACK_SLOT_DEFERRED until then.
 * Stream through them: xpack_cache_wait(i), read the slot from
 * xpack_cache_entry(i), compute, xpack_cache_release_expert(i). Nothing is
 * copied out of slots and no expert is skipped. Thread-safe. */
XPACK_API int xpack_cache_acquire_ex(xpack_cache *c, uint32_t layer, const uint32_t *experts,
                                     size_t n, uint32_t n_tokens, uint32_t flags,
                                     xpack_expert_slot *out, size_t elem_size,
                                     uint64_t *ticket);
/* The current description of entry `index` of a ticket (a deferred entry's slot
 * once it was placed); elem_size: the caller's sizeof(xpack_expert_slot).
 * Thread-safe. */
XPACK_API int xpack_cache_entry(xpack_cache *c, uint64_t ticket, size_t index,
                                xpack_expert_slot *out, size_t elem_size);
/* Ends the protection of one expert of a ticket early (every entry of the ticket
 * naming that expert); its slot may then be reused, e.g. by a deferred entry.
 * `compute_stream` as in xpack_cache_release. The ticket must still be
 * released. Thread-safe. */
XPACK_API int xpack_cache_release_expert(xpack_cache *c, uint64_t ticket, size_t index,
                                         void *compute_stream);
/* Blocks until expert `index` of the ticket is in its slot; returns its load's
 * error (-EIO, XPACK_E_OBJECT_CHECKSUM, ...) if it failed (the slot is then not
 * published). A deferred entry first waits for a slot; XPACK_E_CAPACITY if every
 * slot holds experts of this same ticket (release_expert some first).
 * Thread-safe. */
XPACK_API int xpack_cache_wait(xpack_cache *c, uint64_t ticket, size_t index);
/* Waits for every expert of the ticket; returns the first error. Thread-safe. */
XPACK_API int xpack_cache_wait_all(xpack_cache *c, uint64_t ticket);
/* acquire + wait_all. On a failed load the ticket is released and the error
 * returned (*ticket = 0). Thread-safe. */
XPACK_API int xpack_cache_acquire_blocking(xpack_cache *c, uint32_t layer,
                                           const uint32_t *experts, size_t n,
                                           uint32_t n_tokens, xpack_expert_slot *out,
                                           size_t elem_size, uint64_t *ticket);
/* Ends the ticket's protection; the handles in its xpack_expert_slot array
 * become invalid. `compute_stream` (cudaStream_t, or NULL): later copies into
 * these slots wait for work already enqueued there; with NULL the caller must
 * have finished reading the slots. Thread-safe. */
XPACK_API int xpack_cache_release(xpack_cache *c, uint64_t ticket, void *compute_stream);
/* Hint: load these experts if not resident, only into free slots or over
 * entries the policy values no more (never protected ones). Returns the number
 * of loads started (>= 0) or a negative code. Thread-safe. */
XPACK_API int xpack_cache_prefetch(xpack_cache *c, uint32_t layer, const uint32_t *experts,
                                   size_t n);

/* xpack_cache_prefetch_ex flags. */
#define XPACK_PREFETCH_CERTAIN 1u /* the caller knows these experts will be acquired */

/* xpack_cache_prefetch with flags; flags 0 is xpack_cache_prefetch. With
 * XPACK_PREFETCH_CERTAIN the hint is a fact, not a guess (deepseek4's
 * hash-routed layers, whose experts follow from the token id): each expert is
 * placed as a demand miss would be (over the policy's victim, even one the
 * policy values more), and it is protected from eviction until an acquire
 * names it or until the step after next starts (a step starts when a layer at
 * or below the previous acquire's is acquired): a hint given at the end of one
 * step stays protected through the next. Certain hints
 * hold at most half the slots at a time; the rest of the list is not loaded
 * (count the return value). Unknown flags: XPACK_E_INVALID_ARG. Thread-safe. */
XPACK_API int xpack_cache_prefetch_ex(xpack_cache *c, uint32_t layer, const uint32_t *experts,
                                      size_t n, uint32_t flags);
/* Device address of a slot. Thread-safe. */
XPACK_API int xpack_cache_slot_pointer(const xpack_cache *c, uint32_t slot, void **ptr);
/* Copies object_bytes of a slot to host memory (synchronous; for checks and
 * tests). Thread-safe; the content is only meaningful while the slot is held. */
XPACK_API int xpack_cache_read_slot(xpack_cache *c, uint32_t slot, void *dst, size_t dst_size);

typedef struct xpack_cache_counters {
  size_t size;               /* sizeof(xpack_cache_counters), set by the caller */
  uint64_t cache_hits;       /* distinct experts per acquire found resident */
  uint64_t cache_misses;
  uint64_t cache_evictions;
  uint64_t pack_reads;       /* objects read */
  uint64_t pack_read_bytes;
  uint64_t h2d_bytes;
  uint64_t fallback_count;   /* reads through the page cache */
  uint64_t io_errors;        /* objects that failed to arrive intact */
  uint64_t prefetch_issued;
  uint64_t prefetch_used;
  uint64_t prefetch_wasted;
  uint64_t acquires;
  uint64_t steps;            /* releases */
  uint64_t stall_ns;         /* time waiters spent blocked on misses */
  uint64_t stall_waits;
  uint64_t read_p50_ns, read_p99_ns; /* upper bounds, within 6.25 % of the true quantile */
  uint64_t h2d_p50_ns, h2d_p99_ns;
  uint32_t n_layers;         /* entries of the per-layer counters */
  uint64_t trace_write_errors; /* routing trace writes/flushes that failed (trace incomplete) */
  uint64_t staging_page_bytes; /* as in xpack_engine_counters, for the cache's staging memory */
  double staging_huge_fraction;
  uint64_t host_hits;        /* misses filled from the host tier, no read (within cache_misses) */
  uint64_t host_demotions;   /* evicted experts copied into the host tier */
  uint64_t host_evictions;   /* experts the host tier dropped for room */
  uint64_t d2h_bytes;        /* bytes of those demotions */
  uint64_t ssd_busy_ns;      /* time at least one object read was in flight (SSD busy time) */
} xpack_cache_counters;

/* A consistent snapshot of the counters. Thread-safe. */
XPACK_API int xpack_cache_get_counters(const xpack_cache *c, xpack_cache_counters *out);
typedef struct xpack_layer_counters {
  size_t size;           /* sizeof(xpack_layer_counters), set by the caller */
  uint64_t route_calls;  /* acquires of this layer */
  uint64_t route_tokens; /* tokens they were for (n_tokens summed) */
  uint64_t hits;         /* distinct experts per acquire found resident */
  uint64_t misses;
} xpack_layer_counters;

/* Per-layer counters (layer: object-table row, < xpack_cache_counters.n_layers)
 * of one consistent snapshot. XPACK_E_INVALID_ARG for a layer out of range or a
 * missing struct or size. Thread-safe. */
XPACK_API int xpack_cache_get_layer_counters(const xpack_cache *c, uint32_t layer,
                                             xpack_layer_counters *out);
/* Writes the stats JSON now (no-op without stats_path) and flushes the routing
 * trace (with trace_path); returns the first error (a trace that could not be
 * written completely also counts in trace_write_errors). Thread-safe. */
XPACK_API int xpack_cache_write_stats(xpack_cache *c);

#ifdef __cplusplus
}
#endif

#endif /* XPACK_XPACK_H */
