"""xpack.Engine: io_uring reads of every object equal read_object; refusals."""

from __future__ import annotations

import numpy as np
import pytest

import xpack


def test_every_object_read_through_the_engine_equals_read_object(mixtral_pack, tmp_path):
    with xpack.Pack(mixtral_pack["pack"]) as p:
        try:
            e = xpack.Engine(p, slots=4)
        except xpack.XpackError as err:
            if err.code == xpack.Status.NO_DIRECT_IO:  # e.g. tmpfs: the buffered opt-in
                e = xpack.Engine(p, slots=4, direct_io=False)
            else:
                raise
        with e:
            todo = [(l, x) for l in range(p.info.n_layers) for x in range(p.info.n_experts)]
            free = list(range(4))
            seen = 0
            while todo or len(free) < 4:
                batch = []
                while todo and free:
                    l, x = todo.pop()
                    batch.append((l, x, free.pop()))
                if batch:
                    e.submit(batch)
                for c in e.reap(timeout_ms=-1):
                    assert c.ok, c.error
                    assert np.array_equal(e.slot_view(c.slot), p.read_object(c.layer, c.expert))
                    free.append(c.slot)
                    seen += 1
            assert seen == 12
            k = e.counters()
            assert k["objects_completed"] == 12 and k["io_errors"] == 0 and len(k["lat_log2_ns"]) == 64
            with pytest.raises(xpack.XpackError):
                e.submit([(0, 0, 9)])  # slot out of range
            with pytest.raises(xpack.XpackError):
                e.submit([(0, 0, 1), (1, 1, 1)])  # one slot twice
            with pytest.raises(xpack.XpackError):
                e.submit([(5, 0, 0)])  # no such layer
            with pytest.raises(ValueError):
                e.submit([(0, 0)])
            with pytest.raises(ValueError):
                e.submit([(0, -1, 0)])
            assert e.reap(timeout_ms=0) == []  # the refused batches queued nothing
        with pytest.raises(xpack.ClosedError):
            e.reap()
        with pytest.raises(ValueError):
            xpack.Engine(p, slots=0)
