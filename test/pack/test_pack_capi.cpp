// The xpack_pack_* C API: open/validate codes, accessors, option/out struct sizes,
// per-handle messages, identity checks against trunk and source.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>

#include "gguf/gguf_model.h"
#include "pack/builder.h"
#include "pack_test_util.h"
#include "xpack/xpack.h"

using namespace xpack::test;

namespace {

struct Fixture {
  TempDir tmp;
  fs::path model, other_model, pack, trunk, other_trunk;
  Fixture() {
    model = synth(tmp / "m.gguf", "--arch kimi-k3 --layers 4 --experts 8 --top-k 2");
    other_model = synth(tmp / "o.gguf", "--arch kimi-k3 --layers 4 --experts 8 --top-k 2 --seed 2");
    build(model, tmp / "m");
    build(other_model, tmp / "o");
    pack = tmp / "m.xpack";
    trunk = tmp / "m.trunk.gguf";
    other_trunk = tmp / "o.trunk.gguf";
  }
};

int open_with(const fs::path& pack, const char* trunk, xpack_pack** out) {
  xpack_pack_options o;
  std::memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.trunk_path = trunk;
  return xpack_pack_open(pack.c_str(), &o, out);
}

}  // namespace

TEST_CASE("open, info, roles, offsets, read_object") {
  Fixture f;
  xpack_pack* p = nullptr;
  REQUIRE(xpack_pack_open(f.pack.c_str(), nullptr, &p) == 0);
  REQUIRE(p);
  CHECK(std::string(xpack_pack_path(p)) == f.pack.string());
  xpack_pack_info info;
  std::memset(&info, 0xAB, sizeof info);
  info.size = sizeof info;
  REQUIRE(xpack_pack_get_info(p, &info) == 0);
  CHECK(info.version == 1);
  CHECK(std::string(info.arch) == "kimi-k3");
  CHECK(info.n_layers == 3);  // block 0 is dense
  CHECK(info.n_experts == 8);
  CHECK(info.n_experts_used == 2);
  CHECK(info.n_roles == 3);
  CHECK(info.alignment == 4096);
  CHECK(info.data_start % 4096 == 0);
  CHECK(info.object_stride % 4096 == 0);
  CHECK(info.object_bytes <= info.object_stride);
  CHECK(info.file_size == fs::file_size(f.pack));
  CHECK(info.file_size == info.data_start + uint64_t(info.n_layers) * info.n_experts * info.object_stride);

  uint32_t block = 99, slot = 99;
  REQUIRE(xpack_pack_layer_block(p, 0, &block) == 0);
  CHECK(block == 1);
  REQUIRE(xpack_pack_layer_slot(p, 3, &slot) == 0);
  CHECK(slot == 2);
  CHECK(xpack_pack_layer_slot(p, 0, &slot) == XPACK_E_NOT_FOUND);
  CHECK(std::string(xpack_pack_errmsg(p)).find("block 0") != std::string::npos);
  CHECK(xpack_pack_layer_block(p, 3, &block) == XPACK_E_INVALID_ARG);

  int down = xpack_pack_find_role(p, "down");
  REQUIRE(down >= 0);
  CHECK(xpack_pack_find_role(p, "gate_up") == XPACK_E_NOT_FOUND);
  xpack_role_info ri;
  ri.size = sizeof ri;
  REQUIRE(xpack_pack_role_info(p, static_cast<uint32_t>(down), &ri) == 0);
  CHECK(std::string(ri.name) == "down");
  CHECK(ri.type == XPACK_TYPE_Q3_K);
  CHECK(ri.n_dims == 2);
  CHECK(ri.offset + ri.nbytes <= info.object_bytes);
  CHECK(xpack_pack_role_info(p, 3, &ri) == XPACK_E_INVALID_ARG);

  char name[64];
  REQUIRE(xpack_pack_role_source(p, static_cast<uint32_t>(down), 2, name, sizeof name) == 0);
  CHECK(std::string(name) == "blk.2.ffn_down_exps.weight");
  CHECK(xpack_pack_role_source(p, static_cast<uint32_t>(down), 2, name, 5) == XPACK_E_LIMIT);
  CHECK(xpack_pack_role_source(p, static_cast<uint32_t>(down), 0, name, sizeof name) == XPACK_E_NOT_FOUND);

  uint64_t off = 0;
  REQUIRE(xpack_pack_object_offset(p, 2, 7, &off) == 0);
  CHECK(off == info.data_start + (2 * 8 + 7) * info.object_stride);
  CHECK(xpack_pack_object_offset(p, 3, 0, &off) == XPACK_E_INVALID_ARG);
  CHECK(xpack_pack_object_offset(p, 0, 8, &off) == XPACK_E_INVALID_ARG);

  // read_object returns the same bytes the source holds for that expert.
  std::vector<uint8_t> obj(info.object_bytes);
  REQUIRE(xpack_pack_read_object(p, 1, 3, obj.data(), obj.size(), 1) == 0);
  auto model = xpack::gguf::Model::open(f.model.string());
  REQUIRE(model.ok());
  const auto* t = model->find_tensor("blk.2.ffn_down_exps.weight");
  REQUIRE(t);
  auto src = model->tensor_data(*t);
  REQUIRE(src.ok());
  CHECK(std::memcmp(obj.data() + ri.offset, *src + 3 * ri.nbytes, ri.nbytes) == 0);
  CHECK(xpack_pack_read_object(p, 1, 3, obj.data(), obj.size() - 1, 1) == XPACK_E_INVALID_ARG);
  uint64_t sum = 0;
  CHECK(xpack_pack_object_checksum(p, 1, 3, &sum) == 0);
  CHECK(sum != 0);

  xpack_pack_fault fault;
  fault.size = sizeof fault;
  CHECK(xpack_pack_validate(p, XPACK_VALIDATE_STRUCTURE, &fault) == 0);
  CHECK(xpack_pack_validate(p, XPACK_VALIDATE_CHECKSUMS, &fault) == 0);
  CHECK(xpack_pack_validate(p, 7, &fault) == XPACK_E_INVALID_ARG);
  xpack_pack_close(p);
  xpack_pack_close(nullptr);
}

TEST_CASE("validate reports the damaged object and role; read_object(verify) refuses it") {
  Fixture f;
  xpack_pack* p = nullptr;
  REQUIRE(xpack_pack_open(f.pack.c_str(), nullptr, &p) == 0);
  uint64_t off = 0;
  REQUIRE(xpack_pack_object_offset(p, 2, 6, &off) == 0);
  xpack_role_info ri;
  ri.size = sizeof ri;
  REQUIRE(xpack_pack_role_info(p, 1, &ri) == 0);  // "up"
  xpack_pack_close(p);
  auto bytes = read_file(f.pack);
  bytes[off + ri.offset + ri.nbytes - 1] ^= 0x80;
  write_file(f.pack, bytes);

  REQUIRE(xpack_pack_open(f.pack.c_str(), nullptr, &p) == 0);  // open is cheap: payload not read
  xpack_pack_fault fault;
  fault.size = sizeof fault;
  CHECK(xpack_pack_validate(p, XPACK_VALIDATE_STRUCTURE, &fault) == 0);
  CHECK(xpack_pack_validate(p, XPACK_VALIDATE_CHECKSUMS, &fault) == XPACK_E_OBJECT_CHECKSUM);
  CHECK(fault.layer == 3);
  CHECK(fault.expert == 6);
  CHECK(fault.role == 1);
  CHECK(std::string(xpack_pack_errmsg(p)).find("'up'") != std::string::npos);
  std::vector<uint8_t> obj(1 << 20);
  CHECK(xpack_pack_read_object(p, 2, 6, obj.data(), obj.size(), 1) == XPACK_E_OBJECT_CHECKSUM);
  CHECK(xpack_pack_read_object(p, 2, 6, obj.data(), obj.size(), 0) == 0);
  CHECK(xpack_pack_read_object(p, 2, 5, obj.data(), obj.size(), 1) == 0);
  xpack_pack_close(p);
}

TEST_CASE("open fails closed with specific codes") {
  Fixture f;
  const auto good = read_file(f.pack);
  xpack_pack* p = reinterpret_cast<xpack_pack*>(0x1);
  auto try_open = [&](const std::vector<uint8_t>& bytes) {
    write_file(f.tmp / "bad.xpack", bytes);
    p = reinterpret_cast<xpack_pack*>(0x1);
    int rc = xpack_pack_open((f.tmp / "bad.xpack").c_str(), nullptr, &p);
    CHECK(p == nullptr);
    if (rc != 0) CHECK(std::string(xpack_last_error()).size() > 0);
    return rc;
  };
  auto b = good;
  b[0] = 'Y';
  CHECK(try_open(b) == XPACK_E_BAD_MAGIC);
  b = good;
  wr32(b, 8, 9);
  reseal(b);
  CHECK(try_open(b) == XPACK_E_VERSION);
  b = good;
  b[130] ^= 1;  // inside the arch string
  CHECK(try_open(b) == XPACK_E_CHECKSUM);
  b = good;
  b[300] ^= 1;  // inside the index
  CHECK(try_open(b) == XPACK_E_CHECKSUM);
  CHECK(try_open(std::vector<uint8_t>(good.begin(), good.end() - 1)) == XPACK_E_SIZE_MISMATCH);
  CHECK(try_open(std::vector<uint8_t>(good.begin(), good.begin() + 100)) == XPACK_E_TRUNCATED);
  b = good;
  wr64(b, 32, rd64(b, 32) + 2048);  // stride
  wr64(b, 16, rd64(b, 24) + 24 * rd64(b, 32));
  reseal(b);
  CHECK(try_open(b) == XPACK_E_MISALIGNED);
  b = good;
  wr32(b, 56, 0x00FFFFFF);  // n_experts
  reseal(b);
  CHECK(try_open(b) == XPACK_E_LIMIT);
  CHECK(xpack_pack_open((f.tmp / "nope.xpack").c_str(), nullptr, &p) == -ENOENT);
  CHECK(xpack_pack_open(nullptr, nullptr, &p) == XPACK_E_INVALID_ARG);
  CHECK(xpack_pack_open(f.pack.c_str(), nullptr, nullptr) == XPACK_E_INVALID_ARG);
}

TEST_CASE("identity: trunk and source accepted, another model's refused") {
  Fixture f;
  xpack_pack* p = nullptr;
  CHECK(open_with(f.pack, f.trunk.c_str(), &p) == 0);
  xpack_pack_close(p);
  CHECK(open_with(f.pack, f.model.c_str(), &p) == 0);  // the original GGUF
  xpack_pack_close(p);
  CHECK(open_with(f.pack, f.other_trunk.c_str(), &p) == XPACK_E_IDENTITY);
  CHECK(p == nullptr);
  CHECK(std::string(xpack_last_error()).find("trunk") != std::string::npos);
  CHECK(open_with(f.pack, f.other_model.c_str(), &p) == XPACK_E_IDENTITY);
  CHECK(open_with(f.tmp / "o.xpack", f.trunk.c_str(), &p) == XPACK_E_IDENTITY);

  // options.size honoured: a caller whose struct ends before trunk_path gets no check.
  xpack_pack_options o;
  o.trunk_path = f.other_trunk.c_str();
  o.size = offsetof(xpack_pack_options, trunk_path);
  CHECK(xpack_pack_open(f.pack.c_str(), &o, &p) == 0);
  xpack_pack_close(p);
  o.size = 0;
  CHECK(xpack_pack_open(f.pack.c_str(), &o, &p) == XPACK_E_INVALID_ARG);

  // Output struct sizes honoured: a short info struct is not written past its size.
  REQUIRE(xpack_pack_open(f.pack.c_str(), nullptr, &p) == 0);
  xpack_pack_info info;
  std::memset(&info, 0x5A, sizeof info);
  info.size = offsetof(xpack_pack_info, n_layers);
  REQUIRE(xpack_pack_get_info(p, &info) == 0);
  CHECK(info.version == 1);
  CHECK(info.n_layers == 0x5A5A5A5Au);
  xpack_pack_close(p);
}

TEST_CASE("a FIFO given as pack, trunk or build source is refused without blocking") {
  TempDir tmp;
  auto model = synth(tmp / "m.gguf", "--arch kimi-k3 --layers 2 --experts 4 --top-k 2");
  build(model, tmp / "m");
  auto fifo = make_fifo(tmp / "fifo.xpack");
  auto pack = tmp / "m.xpack";

  int rc = 0;
  std::string msg;  // xpack_last_error() is per thread: read it on the opening one
  CHECK_MESSAGE(returns_without_writer(fifo, [&] {
                  xpack_pack* p = nullptr;
                  rc = xpack_pack_open(fifo.c_str(), nullptr, &p);
                  msg = xpack_last_error();
                  xpack_pack_close(p);
                }),
                "xpack_pack_open blocked on a FIFO");
  CHECK(rc == XPACK_E_INVALID_ARG);
  CHECK_MESSAGE(msg.find("FIFO") != std::string::npos, msg);

  // The trunk checked against the pack's identity is opened through the same path.
  CHECK_MESSAGE(returns_without_writer(fifo, [&] {
                  xpack_pack* p = nullptr;
                  rc = open_with(pack, fifo.c_str(), &p);
                  xpack_pack_close(p);
                }),
                "the trunk open blocked on a FIFO");
  CHECK(rc == XPACK_E_INVALID_ARG);

  // The builder's source.
  CHECK_MESSAGE(returns_without_writer(fifo, [&] {
                  xpack::pack::BuildOptions bo;
                  bo.source = fifo.string();
                  bo.out = (tmp / "from-fifo").string();
                  auto r = xpack::pack::build_pack(bo);
                  rc = r.ok() ? 0 : r.error().code;
                }),
                "build_pack blocked on a FIFO source");
  CHECK(rc == XPACK_E_INVALID_ARG);

  // The tools, end to end; timeout turns a regression into exit 124, not a hang.
  for (const std::string& cmd :
       {tool("xpack-inspect") + " " + q(fifo), tool("xpack-inspect") + " " + q(pack) + " --trunk " + q(fifo),
        tool("xpack-build") + " " + q(fifo) + " -o " + q(tmp / "out")}) {
    std::string out;
    int trc = run("timeout 20 " + cmd + " </dev/null", &out);
    CHECK_MESSAGE(trc != 124, cmd << ": blocked on the FIFO");
    CHECK_MESSAGE(trc != 0, cmd << ": " << out);
    CHECK_MESSAGE(out.find("FIFO") != std::string::npos, cmd << ": " << out);
  }
}
