"""Host image preparation: CPU seconds per image patch of a Qwen2-VL-style processor.

EasyR1 (hiyouga/EasyR1 @b44b311b669bf1fd1aa2fc36f2251482ba33cb16) prepares every image of a
step on the host more than once: each rollout rank resizes its prompts' images
(verl/workers/rollout/vllm_rollout_spmd.py:54-80 `_process_multi_modal_data` ->
verl/utils/dataset.py:54-78 `process_image`) and hands them to vLLM with its multi-modal
preprocessor cache turned off (vllm_rollout_spmd.py:121 `disable_mm_preprocessor_cache`), so
the engine runs the HF image processor on each prompt; each trainer rank then runs
`process_image` and the image processor again for the distinct prompts of its chunk
(verl/workers/fsdp_workers.py:503-548 `_process_multi_modal_inputs`, cached by uid for the
step's later calls). This benchmark does one such preparation per image, as that code does it:
decode the stored PNG, scale it up to the processor's min_pixels (EasyR1's data.min_pixels
262,144, examples/config.yaml), then transformers' Qwen2-VL image processor (its PIL / numpy
backend, `Qwen2VLImageProcessorPil`: resize to a multiple of 28, rescale, normalize, patchify
into 14 x 14 x 2 patches). It prints CPU seconds (`time.process_time`, one thread, as a Ray
rank of num_cpus 1 runs it) per image and per patch, best of a few repeats: the figure behind
the EasyR1 profile's `host_image_prep_s_per_patch` (placer/spec/framework.py). It prints, never
asserts a time. Needs transformers (and Pillow), which the planner itself does not.
"""
from __future__ import annotations

import io
import math
import os
import time
from typing import Any

import numpy as np

MIN_PIXELS = 262_144  # EasyR1 examples/config.yaml data.min_pixels
MAX_PIXELS = 4_194_304  # data.max_pixels
SIDE = 300  # a Geometry3K-sized figure, smaller than min_pixels: scaled up to 512 x 512
IMAGES = 60
REPEATS = 3


def figure_png(side: int = SIDE) -> bytes:
    """A white line drawing (a geometry figure's look), stored as PNG bytes as the data set is."""
    from PIL import Image
    arr = np.full((side, side, 3), 255, np.uint8)
    for k in range(0, side, 7):
        arr[k, :, :] = 0
        arr[:, (3 * k) % side, :] = 0
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def process_image(data: bytes, min_pixels: int = MIN_PIXELS,
                  max_pixels: int = MAX_PIXELS) -> Any:
    """EasyR1's verl/utils/dataset.py:54-78: open, scale into [min_pixels, max_pixels], RGB."""
    from PIL import Image
    image: Any = Image.open(io.BytesIO(data))
    image.load()
    area = image.width * image.height
    if area > max_pixels or area < min_pixels:
        f = math.sqrt((max_pixels if area > max_pixels else min_pixels) / area)
        image = image.resize((int(image.width * f), int(image.height * f)))
    return image.convert("RGB") if image.mode != "RGB" else image


def seconds_per_image(processor: Any, data: bytes) -> tuple[float, int]:
    """Best-of-`REPEATS` CPU seconds of one preparation, and the patches it makes."""
    patches = int(processor(images=[process_image(data)], return_tensors="np")
                  ["pixel_values"].shape[0])
    best = math.inf
    for _ in range(REPEATS):
        t0 = time.process_time()
        for _ in range(IMAGES):
            processor(images=[process_image(data)], return_tensors="np")
        best = min(best, (time.process_time() - t0) / IMAGES)
    return best, patches


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before transformers loads torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    proc = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    s, patches = seconds_per_image(proc, figure_png())
    print(f"transformers {transformers.__version__}, Qwen2VLImageProcessorPil, a {SIDE} x {SIDE} "
          f"PNG scaled to min_pixels, best of {REPEATS} x {IMAGES}: {s * 1e3:.1f} ms CPU per "
          f"image, {patches} patches, {s / patches * 1e6:.1f} us per patch")


if __name__ == "__main__":
    main()
