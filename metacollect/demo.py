"""The reference workflow of the metadata-map work: image processing on dask.array.

Synthetic microscope-like images are written as ``.npy`` files, read back lazily, smoothed
with an overlapping stencil, thresholded and labelled per tile, reduced to per-image
statistics, and the processed stack is written back to disk - real file I/O in every step,
the shape of a typical imaging pipeline.
"""

from __future__ import annotations

import os
from typing import Any

import dask
import dask.array as da
import numpy as np
from distributed import span


def make_images(directory: str, n_images: int = 16, size: int = 512, seed: int = 0) -> list[str]:
    """Write ``n_images`` synthetic images (bright blobs on noise) and return their paths."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    paths = []
    for i in range(n_images):
        img = rng.normal(0.1, 0.05, (size, size))
        for cy, cx, r in rng.uniform((0, 0, size / 40), (size, size, size / 12), (12, 3)):
            img += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
        path = os.path.join(directory, f"image-{i:04d}.npy")
        np.save(path, img.astype(np.float32))
        paths.append(path)
    return paths


def _smooth(block: np.ndarray) -> np.ndarray:
    """3x3 box filter (the overlap supplies the borders)."""
    out = block.copy()
    acc = np.zeros_like(block)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            acc += np.roll(np.roll(block, dy, axis=-2), dx, axis=-1)
    out[...] = acc / 9.0
    return out


def _save(block: np.ndarray, directory: str, block_info: Any = None) -> np.ndarray:
    loc = block_info[0]["chunk-location"] if block_info else (0, 0, 0)
    np.save(os.path.join(directory, "tile-" + "-".join(map(str, loc)) + ".npy"), block)
    return np.array([[[block.size]]], dtype=np.int64)


def read_stack(paths: list[str], tile: int = 256) -> da.Array:
    """The images as one lazy stack in tiles (one read task per image)."""
    first = np.load(paths[0], mmap_mode="r")
    read = [
        da.from_delayed(dask.delayed(np.load)(p), shape=first.shape, dtype=first.dtype)
        for p in paths
    ]
    return da.stack(read).rechunk((1, tile, tile))


def process(stack: da.Array, out_dir: str) -> dict[str, Any]:
    """Smooth, threshold, per-image stats, write tiles (lazy)."""
    os.makedirs(out_dir, exist_ok=True)
    smooth = stack.map_overlap(_smooth, depth=(0, 1, 1), boundary="reflect")
    mask = smooth > smooth.mean(axis=(1, 2), keepdims=True) + 2 * smooth.std(
        axis=(1, 2), keepdims=True
    )
    stats = {
        "foreground_fraction": mask.mean(axis=(1, 2)),
        "mean_intensity": smooth.mean(axis=(1, 2)),
        "max_intensity": smooth.max(axis=(1, 2)),
    }
    written = da.map_blocks(
        _save,
        smooth * mask,
        out_dir,
        dtype=np.int64,
        chunks=(1, 1, 1),
    ).sum()
    return {**stats, "written_values": written}


def pipeline(paths: list[str], out_dir: str, tile: int = 256) -> dict[str, Any]:
    """Build the lazy pipeline: read, smooth, threshold, per-image stats, write tiles."""
    return process(read_stack(paths, tile), out_dir)


def run_demo(workdir: str, n_images: int = 16, size: int = 512) -> dict[str, Any]:
    """Make the images and compute the pipeline on the current Dask client."""
    paths = make_images(os.path.join(workdir, "images"), n_images, size)
    # in Dask spans, as users name the stages of a workflow: the store's span summary then
    # says where each stage's time went
    with span("image-pipeline"):
        with span("read"):
            stack = read_stack(paths).persist()
        with span("process"):
            (result,) = dask.compute(process(stack, os.path.join(workdir, "processed")))
    return result
