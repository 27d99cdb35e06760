"""mesh_shape on N slices (Multislice): data parallelism on the outer axis over the slices, and a shape that
cannot span them refused with the fix; the slice count from the launcher's MEGASCALE_NUM_SLICES on CPU."""

from __future__ import annotations

import jax
import pytest

from trainer.mesh import MeshError, resolve_mesh_shape, slice_count


@pytest.mark.parametrize("shape, devices, processes, slices, expected", [
    ("auto", 16, 4, 2, (2, 8, 1)),
    ("auto", 64, 16, 4, (4, 16, 1)),
    ("host_local", 16, 4, 2, (4, 4, 1)),
    ("-1,4,1", 16, 4, 2, (4, 4, 1)),
    ("4,-1,1", 32, 8, 2, (4, 8, 1)),
    ("auto", 16, 4, 1, (1, 16, 1)),  # one slice: as before
])
def test_mesh_shapes_on_slices(shape, devices, processes, slices, expected):
    assert resolve_mesh_shape(shape, devices, processes, slices) == expected


@pytest.mark.parametrize("shape, devices, processes, slices, words", [
    ("1,-1,1", 16, 4, 2, "dp=1, which cannot span 2 slices"),
    ("2,-1,1", 24, 6, 3, "dp=2, which cannot span 3 slices"),
    ("auto", 12, 3, 2, "do not split into 2 equal slices"),
])
def test_mesh_shapes_that_cannot_span_the_slices(shape, devices, processes, slices, words):
    with pytest.raises(MeshError, match=words):
        resolve_mesh_shape(shape, devices, processes, slices)


def test_slice_count_on_cpu_comes_from_the_launcher(monkeypatch):
    devices = jax.devices()
    monkeypatch.delenv("MEGASCALE_NUM_SLICES", raising=False)
    assert slice_count(devices) == 1
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "2")
    assert slice_count(devices) == 2
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "two")
    with pytest.raises(MeshError, match="MEGASCALE_NUM_SLICES='two' is not a whole number"):
        slice_count(devices)
