"""GGUF quantized tensors -> PackedWeight (codes, int8 block scales, float32 super-block factors), no
float32 copy.

Each supported type stores, per block, a small header (fp16 scales, for K-quants 6-bit sub-block scales
and minimums) and packed 4/5/6/8-bit codes. Its dequantized value is `d * sc * code - dmin * m` in
float32, each product and the difference rounded separately (gguf.quants' numpy dequantizers):

  type        block x per  d, dmin (float32)   sc, m (int8)          code range         codes kept as
  Q8_0         32 x 1      d, -                1, -                  -128..127          int8
  Q4_0 / Q5_0  32 x 1      d, -                1, -                  -8..7 / -16..15    6 bits
  Q4_1         32 x 1      d, -m               1, 1                  0..15              nibbles
  Q5_1         32 x 1      d, -m               1, 1                  0..31              6 bits
  Q4_K / Q5_K  32 x 8      d, dmin             sc[j], m[j] (6-bit)   0..15 / 0..31      nibbles / 6 bits
  Q6_K         16 x 16     d, -                scales[j] (int8)      -32..31            6 bits

(6 bits: a nibble word pair plus a word of high bits per 16 inputs, code + 32 stored; minitorch/packed.py.)

Only the header layout is ours. The codes come from the gguf library itself: dequantizing a copy of the
blocks whose header is rewritten to scale 1 and offset 0 yields exactly the codes as floats. The
factors are the header's own numbers, and the kernel and PackedWeight.dequantize() multiply them in the
same float32 operations as gguf's dequantizers, so they reproduce `gguf.quants.dequantize` bit for bit
(tests/test_models_packed.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ..packed import PackedWeight
from ..tensor_data import MiniTorchError
from .errors import ModelLoadError

PACKED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
PACKED_FORMAT = 5  # bump when the cached layout changes (2: tiled codes, self-contained folder; 3: nibbles,
#                   int8 block scales under float32 super-block factors; 4: nibbles as uint32 words of 8;
#                   5: codes of -32..31 (Q6_K, Q5_K, Q5_0, Q5_1, Q4_0) as 6 bits, 3 uint32 words per 16 inputs)
_PARTS = ("q", "sc", "d", "m", "dmin")  # the tiled arrays of a PackedWeight, as PackedWeight.tiles orders them

_ONE_F16 = np.frombuffer(np.float16(1.0).tobytes(), dtype=np.uint8)  # fp16 1.0 as its two bytes
_ZERO_F16 = np.zeros(2, dtype=np.uint8)
# Q4_K/Q5_K 12-byte scale field giving every sub-block scale 1 and minimum 0 (see gguf Q4_K.get_scale_min)
_UNIT_K_SCALES = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], dtype=np.uint8)


def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    """(n_blocks, 1) float32 from the fp16 field at byte `off` of every block."""
    return np.ascontiguousarray(blocks[:, off:off + 2]).view(np.float16).astype(np.float32)


def _header(qtype: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray],
                                                Optional[np.ndarray], np.ndarray, int, int]:
    """(sc, d, m, dmin, unit_blocks, block, per) for raw blocks (n_blocks, type_size) of one type: sc, m
    int8 per block and d, dmin float32 per super-block, each (n_blocks, count) (m, dmin None: no offset)."""
    from gguf import quants

    unit = blocks.copy()
    if qtype in ("Q8_0", "Q4_0", "Q5_0"):
        d = _f16(blocks, 0)
        unit[:, 0:2] = _ONE_F16
        return np.ones(d.shape, np.int8), d, None, None, unit, 32, 1
    if qtype in ("Q4_1", "Q5_1"):
        d, m = _f16(blocks, 0), _f16(blocks, 2)
        unit[:, 0:2], unit[:, 2:4] = _ONE_F16, _ZERO_F16
        ones = np.ones(d.shape, np.int8)
        return ones, d, ones, -m, unit, 32, 1
    if qtype in ("Q4_K", "Q5_K"):
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        sc, m = quants.Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        unit[:, 0:2], unit[:, 2:4], unit[:, 4:16] = _ONE_F16, _ZERO_F16, _UNIT_K_SCALES
        sc, m = sc.reshape(len(blocks), 8), m.reshape(len(blocks), 8)  # 6-bit: 0..63, exact in int8
        return sc.astype(np.int8), d, m.astype(np.int8), dmin, unit, 32, 8
    if qtype == "Q6_K":
        scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8)
        d = _f16(blocks, 208)
        unit[:, 192:208], unit[:, 208:210] = 1, _ONE_F16
        return scales.copy(), d, None, None, unit, 16, 16
    raise ModelLoadError(f"no packed form for GGUF type {qtype} (packed: {', '.join(PACKED_TYPES)})")


def pack_raw(qtype: str, raw: np.ndarray, shape: tuple[int, int], name: str = "tensor",
             bits: Optional[int] = None) -> PackedWeight:
    """PackedWeight (N, K) from the raw bytes of a GGUF tensor of type `qtype` holding an (N, K) weight
    (bits None: nibbles or 6 bits where the codes fit, see packed.py; 8 forces int8 codes, the previous form)."""
    from gguf import GGMLQuantizationType, quants
    from gguf.constants import GGML_QUANT_SIZES

    gtype = GGMLQuantizationType[qtype]
    values_per_block, type_size = GGML_QUANT_SIZES[gtype]
    n, k = shape
    if k % values_per_block:
        raise ModelLoadError(f"{name}: {k} inputs are not a multiple of the {qtype} block of {values_per_block}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, type_size)
    if blocks.shape[0] * values_per_block != n * k:
        raise ModelLoadError(f"{name}: {blocks.shape[0]} {qtype} blocks do not hold a {n}x{k} weight")
    sc, d, m, dmin, unit, block, per = _header(qtype, blocks)
    codes = quants.dequantize(unit.reshape(n, -1), gtype).reshape(n, k)
    q = codes.astype(np.int8)
    if not np.array_equal(q.astype(np.float32), codes):  # would mean our header layout is wrong
        raise ModelLoadError(f"{name}: {qtype} codes did not decode to small integers")

    def rows(a: Optional[np.ndarray]) -> Optional[np.ndarray]:
        return None if a is None else np.ascontiguousarray(a.reshape(n, -1))

    return PackedWeight.from_blocks(q, block, per, rows(sc), rows(d), rows(m), rows(dmin), bits=bits)


def pack_tensor(tensor: Any, path: Union[str, Path] = "") -> Optional[PackedWeight]:
    """PackedWeight for a 2-d GGUF tensor of a packed type, else None (kept as float32)."""
    qtype = tensor.tensor_type.name
    shape = tuple(int(s) for s in reversed(tensor.shape))
    if qtype not in PACKED_TYPES or len(shape) != 2:
        return None
    return pack_raw(qtype, np.asarray(tensor.data), shape, f"GGUF file {path}: tensor {tensor.name}")


def build_packed_cache(path: Union[str, Path], out_dir: Path, progress: bool = True,
                       requantize: Optional[int] = None) -> None:
    """Everything a packed model needs from GGUF `path`, in out_dir: the packable weights as tiles
    ({name}.q/.scale/.offset.npy + packed.json), the other tensors (norms, biases, float tensors) as
    float32 weights/{name}.npy, config.json and the tokenizer files. No float32 copy of the big weights.
    requantize=4: weights with 6- or 8-bit codes stored with 4-bit codes instead (PackedWeight.requantized4).
    Written to a temporary sibling and renamed, so an interrupted run leaves nothing half-built."""
    from .gguf_io import building_folder, fill_cache_folder

    def store(tensor: Any, name: str, folder: Path) -> Optional[dict]:
        pw = pack_tensor(tensor, path)
        if pw is None:
            return None
        if requantize == 4:
            pw = pw.requantized4()
        for part, arr in zip(_PARTS, pw.tiles):  # tiled (packed.py)
            np.save(folder / f"{name}.{part}.npy", arr)
        return {"block": pw.block, "per": pw.per, "bits": pw.bits, "rows": pw.shape[0],
                "type": tensor.tensor_type.name, "requantized": bool(requantize)}

    with building_folder(out_dir, "packed.json") as tmp:
        manifest = fill_cache_folder(path, tmp, progress, "packing", store)
        (tmp / "packed.json").write_text(json.dumps({"format": PACKED_FORMAT, "tensors": manifest}, indent=1))


def load_packed(path: Union[str, Path], cache_dir: Optional[Union[str, Path]] = None,
                progress: bool = True, requantize: Optional[int] = None) -> tuple[Any, dict[str, Any], Path]:
    """(config, {hf_name: PackedWeight or float32 array, memory-mapped}, folder with tokenizer files) for
    GGUF `path`, built once into the cache (build_packed_cache), like gguf_io.load_gguf_weights."""
    from .config import Qwen2Config
    from .gguf_io import _check_complete, _first_line, cache_key, load_cached_arrays
    from .registry import cache_root

    q = f"-q{requantize}" if requantize else ""
    out_dir = cache_root(cache_dir) / "packed" / f"{cache_key(path)}-p{PACKED_FORMAT}{q}"
    if not (out_dir / "packed.json").is_file():
        build_packed_cache(path, out_dir, progress, requantize)
    config = Qwen2Config.from_json(out_dir / "config.json")
    manifest = json.loads((out_dir / "packed.json").read_text())["tensors"]
    weights: dict[str, Any] = {}
    for name, info in manifest.items():
        try:
            parts = [np.asarray(np.load(out_dir / f"{name}.{p}.npy", mmap_mode="r")) for p in _PARTS]
            weights[name] = PackedWeight.from_tiles(*parts, block=int(info["block"]), per=int(info["per"]),
                                                    bits=int(info["bits"]), n=int(info["rows"]))
        except (ValueError, OSError, KeyError, MiniTorchError) as e:
            raise ModelLoadError(f"corrupt packed weight {name} in {out_dir} ({_first_line(e)}); "
                                 "delete the folder and reload") from None
    weights.update(load_cached_arrays(out_dir))  # the tensors kept as float32 (norms, biases)
    _check_complete(set(weights), config, out_dir)
    return config, weights, out_dir
