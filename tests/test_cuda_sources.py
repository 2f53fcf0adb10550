"""CPU checks of the CUDA kernel sources (kernels/*.cu), so that a kernel edit that breaks them fails without a GPU:
- the deliberately broken kernels the GPU tests build (tests/cuda_helpers.py BROKEN_KERNELS) still patch the
  current sources: every correct text occurs exactly once, so the patched source differs from the product's;
- the product kernels keep no broken-variant or diagnostic switch (one path each, kernels/NOTES.md);
- the launcher's attention limits are the kernel's."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuda_helpers import BROKEN_KERNELS, broken_source
from minitorch.cuda.runtime import nvrtc_source

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


@pytest.mark.parametrize("variant", sorted(BROKEN_KERNELS))
def test_broken_variant_patches_its_kernel_once(variant: str) -> None:
    file, src = broken_source(variant)
    assert src != nvrtc_source(file)
    for good, bad in BROKEN_KERNELS[variant][1]:
        assert good != bad


def test_the_product_kernels_have_no_build_switches() -> None:
    """No *_BROKEN variant, no diagnostic (ATT_STOP) and no `#ifndef X / #define X default` A/B knob is left."""
    for p in sorted(KERNELS.rglob("*.cu*")):
        text = p.read_text()
        assert "_BROKEN" not in text and "ATT_STOP" not in text, p.name
        guarded = re.findall(r"#ifndef\s+(\w+)\s*\n\s*#define\s+\1\b", text)
        assert guarded == [], f"{p.name}: build switches {guarded}"


def test_the_launcher_checks_the_attention_kernels_head_dim_limit() -> None:
    from minitorch.cuda import launch

    src = (KERNELS / "attention.cu").read_text()
    assert int(re.search(r"#define ATT_DMAX (\d+)", src).group(1)) == launch.ATT_DMAX
    assert int(re.search(r"#define ATT_RMAX (\d+)", src).group(1)) == launch.ATT_RMAX
