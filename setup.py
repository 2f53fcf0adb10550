from pathlib import Path

from setuptools import find_packages, setup

requirements = [
    line.strip()
    for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="minitorch-spec",
    version="0.1.0",
    description="Speculative decoding for reasoning models on MiniTorch, a from-scratch tensor framework",
    packages=find_packages(include=["minitorch", "minitorch.*", "project", "project.*"]),
    package_data={"minitorch": ["cuda_kernels/*"]},
    python_requires=">=3.10",
    install_requires=requirements,
    # --backend cuda: CuPy built for the CUDA major version of the user's driver (`nvidia-smi` prints it),
    # with the CUDA libraries it loads (cuBLAS, the runtime, NVRTC) from PyPI, so no CUDA toolkit is needed.
    extras_require={
        "cuda12": ["cupy-cuda12x[ctk]>=14"],
        "cuda13": ["cupy-cuda13x[ctk]>=14"],
        "ray": ["ray>=2.9"],  # benchmarks over a Ray cluster (--ray; docs/RAY.md)
    },
)
