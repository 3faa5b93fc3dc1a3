"""xpack.Cache on the host device (CI) and, where a GPU and torch exist, on CUDA
with zero-copy views; bad input raises and never crashes the interpreter."""

from __future__ import annotations

import gc
import json
import os
import threading

import numpy as np
import pytest

import xpack
from conftest import skip_absent


def host_cache(pack, n_slots=3, **kw):
    # A budget of n_slots objects (slots are 256-byte aligned; the pack's objects are).
    stride = (pack.info.object_bytes + 255) // 256 * 256
    return xpack.Cache(pack, budget_bytes=n_slots * stride, device="host", **kw)


def test_acquire_wait_view_equals_read_object_and_counts(mixtral_pack, tmp_path):
    stats = tmp_path / "stats.json"
    with xpack.Pack(mixtral_pack["pack"]) as p, host_cache(p, 3, stats_path=str(stats)) as c:
        assert c.info.device == "host" and c.info.slot_count == 3 and c.info.policy == "adaptive"
        with c.acquire(1, [2, 0]) as r:
            assert len(r) == 2 and not r.hit(0)
            v0, v1 = r.view(0), r.view(1)
            assert np.array_equal(v0, p.read_object(1, 2)) and np.array_equal(v1, p.read_object(1, 0))
            assert not v0.flags.writeable
            e = r.entry(0)
            assert e.expert == 2 and e.slot is not None and e.data != 0
        with c.acquire(1, [2]) as r:
            assert r.hit(0)
            assert np.array_equal(r.view(0), p.read_object(1, 2))
        k = c.counters()
        assert k["cache_hits"] == 1 and k["cache_misses"] == 2 and k["acquires"] == 2 and k["steps"] == 2
        lk = c.layer_counters(1)
        assert lk == {"route_calls": 2, "route_tokens": 2, "hits": 1, "misses": 2}
        assert c.layer_counters(0)["route_calls"] == 0
        with pytest.raises(xpack.XpackError):
            c.layer_counters(99)
        c.write_stats()
    assert json.loads(stats.read_text())  # the stats JSON parses


def test_a_wide_request_streams_through_few_slots_with_defer(mixtral_pack):
    with xpack.Pack(mixtral_pack["pack"]) as p, xpack.Cache(p, budget_bytes=0, device="host",
                                                            host_device_bytes=2 * ((p.info.object_bytes + 255) // 256 * 256)) as c:
        assert c.info.slot_count == 2
        with c.acquire(0, [0, 1, 2, 3], n_tokens=4, defer=True) as r:
            for i in range(4):
                assert np.array_equal(r.view(i), p.read_object(0, i))
                r.release_expert(i)
            with pytest.raises(xpack.ClosedError):
                r.view(0)
        assert c.counters()["cache_evictions"] >= 2


def test_a_host_tier_serves_evicted_experts_without_a_read(mixtral_pack):
    with xpack.Pack(mixtral_pack["pack"]) as p:
        frame = (p.info.object_bytes + 4095) // 4096 * 4096
        with host_cache(p, 2, policy="lru", host_cache_bytes=4 * frame) as c:
            assert c.info.host_frames == 4 and c.info.host_frame_stride == frame
            keys = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
            for _ in range(2):
                for layer, e in keys:  # 2 slots + 3 held in the tier: the second pass reads nothing
                    with c.acquire(layer, [e]) as r:
                        assert np.array_equal(r.view(0), p.read_object(layer, e))
            k = c.counters()
            assert k["cache_misses"] == 10 and k["pack_reads"] == 5 and k["host_hits"] == 5
            assert k["host_demotions"] == 8 and k["d2h_bytes"] == 8 * p.info.object_bytes
        with pytest.raises(xpack.XpackError, match="fewer than 2"):
            host_cache(p, 2, host_cache_bytes=frame)
        with pytest.raises(ValueError):
            host_cache(p, 2, host_cache_bytes=-1)


def test_a_certain_prefetch_displaces_what_a_guess_may_not(mixtral_pack):
    with xpack.Pack(mixtral_pack["pack"]) as p, host_cache(p, 2, policy="hybrid") as c:
        for _ in range(2):  # layer 0's experts 0 and 1, used twice: the hybrid values them
            for e in (0, 1):
                with c.acquire(0, [e]) as r:
                    r.view(0)  # waits: a slot whose read is in flight is never a victim
        assert c.prefetch(1, [2]) == 0  # a guess of an unseen expert displaces nothing
        assert c.prefetch(1, [2, 3], certain=True) == 1  # one of the two slots: half
        with c.acquire(1, [2]) as r:
            assert r.hit(0) and np.array_equal(r.view(0), p.read_object(1, 2))
        k = c.counters()
        assert k["prefetch_issued"] == 1 and k["prefetch_used"] == 1


def test_bad_input_raises_clearly(mixtral_pack, tmp_path):
    with xpack.Pack(mixtral_pack["pack"]) as p:
        with pytest.raises(ValueError):
            xpack.Cache(p, device="tpu")
        with pytest.raises(ValueError):
            xpack.Cache(p, policy="random")
        with pytest.raises(ValueError):
            xpack.Cache(p, budget_bytes=-1)
        with pytest.raises(TypeError):
            xpack.Cache("not a pack")
        with pytest.raises(xpack.XpackError) as e:
            host_cache(p, 1)  # fewer slots than top-k = 2
        assert e.value.code == xpack.Status.CAPACITY and "top-k" in str(e.value)
        c = host_cache(p, 2)
        for layer, experts in ((3, [0]), (-1, [0]), (0, [4]), (0, [-1])):
            with pytest.raises(IndexError):
                c.acquire(layer, experts)
        with pytest.raises(ValueError):
            c.acquire(0, [0], n_tokens=0)
        r = c.acquire(0, [1, 3])
        r.wait_all()  # a slot whose read is still in flight stays busy after the release
        r.release()
        with pytest.raises(xpack.ClosedError):
            r.release()  # exactly once
        with pytest.raises(xpack.ClosedError):
            r.wait(0)
        with pytest.raises(xpack.ClosedError):
            r.view(1)
        # A request held when the cache is closed keeps the C cache until it is gone.
        held = c.acquire(0, [0, 2])
        view = held.view(0)
        c.close()
        with pytest.raises(xpack.ClosedError):
            c.acquire(0, [0])
        with pytest.raises(xpack.ClosedError):
            c.counters()
        assert np.array_equal(view, p.read_object(0, 0))  # still valid memory
        held.release()
        del held
        gc.collect()
        assert view.sum() >= 0  # the view alone still keeps the memory
        del view
        gc.collect()
    # A cache outlives its pack's close(): the C pack stays open under it.
    p = xpack.Pack(mixtral_pack["pack"])
    c = host_cache(p, 2)
    p.close()
    with c.acquire(2, [3, 1]) as r:
        assert r.view(0).nbytes == c.info.object_bytes
    c.close()


def test_a_damaged_object_fails_its_wait_and_names_it(mixtral_pack, tmp_path):
    import shutil
    bad = tmp_path / "bad.xpack"
    shutil.copyfile(mixtral_pack["pack"], bad)
    with xpack.Pack(bad) as p:
        off = p.object_offset(1, 3) + 64
    with open(bad, "r+b") as f:
        f.seek(off)
        f.write(b"\x5a\xa5")
    with xpack.Pack(bad) as p:
        with host_cache(p, 3) as c:
            with c.acquire(1, [3, 2]) as r:
                assert np.array_equal(r.view(1), p.read_object(1, 2))
                with pytest.raises(xpack.XpackError) as e:
                    r.wait(0)
                assert "3" in str(e.value)
        with host_cache(p, 3, verify=False) as c:  # the opt-out delivers the damaged bytes
            with c.acquire(1, [3]) as r:
                assert r.view(0)[64] == 0x5a


def test_threads_acquire_and_release_concurrently(mixtral_pack):
    errors = []
    with xpack.Pack(mixtral_pack["pack"]) as p, host_cache(p, 6) as c:
        want = {(l, e): p.read_object(l, e) for l in range(3) for e in range(4)}

        def worker(seed):
            rng = np.random.default_rng(seed)
            for _ in range(40):
                layer = int(rng.integers(0, 3))
                experts = [int(x) for x in rng.choice(4, size=2, replace=False)]
                try:
                    with c.acquire(layer, experts) as r:
                        for i, e in enumerate(experts):
                            if not np.array_equal(r.view(i), want[(layer, e)]):
                                errors.append((layer, e))
                except xpack.XpackError as err:
                    if err.code != xpack.Status.CAPACITY:  # all slots protected by others: retry later
                        errors.append(str(err))
        threads = [threading.Thread(target=worker, args=(s,)) for s in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


@pytest.mark.gpu
def test_cuda_slot_view_is_zero_copy_in_torch(mixtral_pack):
    try:
        import torch
    except ImportError as e:
        skip_absent("capability", f"torch is absent: {e}")
    if not torch.cuda.is_available():
        skip_absent("capability", "no CUDA device for torch")
    with xpack.Pack(mixtral_pack["pack"]) as p:
        try:
            c = xpack.Cache(p, budget_bytes=64 << 20, device="cuda")
        except xpack.XpackError as e:
            if e.code == xpack.Status.UNSUPPORTED:
                skip_absent("capability", f"libxpack built without CUDA: {e}")
            raise
        with c:
            assert c.info.device == "cuda"
            with c.acquire(2, [1, 3]) as r:
                v = r.view(0)
                t = torch.from_dlpack(v)
                assert t.is_cuda and t.dtype == torch.uint8 and t.numel() == c.info.object_bytes
                assert t.data_ptr() == v.ptr  # the slot itself, no copy
                assert np.array_equal(t.cpu().numpy(), p.read_object(2, 1))
                t2 = torch.as_tensor(r.view(1), device="cuda")  # __cuda_array_interface__
                assert t2.data_ptr() == r.entry(1).data
                assert np.array_equal(t2.cpu().numpy(), p.read_object(2, 3))
                s = torch.cuda.Stream()
                v.wait_on(s.cuda_stream)  # a stream waits on the slot's ready event
                with torch.cuda.stream(s):
                    total = int(t.to(torch.int64).sum().item())
                assert total == int(p.read_object(2, 1).astype(np.int64).sum())
                r.release(stream=torch.cuda.current_stream().cuda_stream)
