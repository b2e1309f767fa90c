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


def pipeline(paths: list[str], out_dir: str, tile: int = 256) -> dict[str, Any]:
    """Build the lazy pipeline: read, smooth, threshold, per-image stats, write tiles."""
    os.makedirs(out_dir, exist_ok=True)
    first = np.load(paths[0], mmap_mode="r")
    read = [
        da.from_delayed(dask.delayed(np.load)(p), shape=first.shape, dtype=first.dtype)
        for p in paths
    ]
    stack = da.stack(read).rechunk((1, tile, tile))
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


def run_demo(workdir: str, n_images: int = 16, size: int = 512) -> dict[str, Any]:
    """Make the images and compute the pipeline on the current Dask client."""
    paths = make_images(os.path.join(workdir, "images"), n_images, size)
    graph = pipeline(paths, os.path.join(workdir, "processed"))
    (result,) = dask.compute(graph)
    return result
