"""What a VibeVoice-ASR-BitNet bundle holds: the ASR graphs (export/asr.py), its LM's seven projections per layer
as the reference's BitLinear traced with standard ops:

    a = 127 / Max(ReduceMax(Abs(x)), 1e-5)          per token
    x_q = Clip(Round(x · a), -128, 127)              integer values in fp32
    y = MatMul(x_q, Wtᵀ) / (a · s) + bias            Wt: an fp32 initializer holding only -1, 0, 1

Every product and partial sum of the MatMul is an integer below 2**24 (127 · 8960 at full size), so fp32
accumulation is exact in any order and the graph reproduces the integer arithmetic bit for bit. The LM graph's
ternary MatMuls are then packed as 2-bit MatMulNBits with scale 1 (precision.pack_ternary): the same products
exactly, in a twelfth of the bytes. The model is 1.5B parameters (11 GB in fp32): loaded whole, no weights
streamed from the shards.
"""

from __future__ import annotations

from .asr import graph_specs, host_tensors  # noqa: F401 (the ASR graphs, from the BitLinear reference)

# Seconds and peak GB per billion parameters of a first build + verify on 2 cores (build_cost), from the full-size
# synthetic checkpoint (2.81 B values; build 327 s at 15.4 GB, verify 269 s at 20.6 GB, docs/bitnet.md).
BUILD_COST = {"fp32": (212.0, 7.3)}


def pack(name: str, path, log) -> dict | None:
    """The LM graph's ternary weights packed (every precision: they are exact), after its export."""
    if name != "lm":
        return None
    from .precision import pack_ternary

    details = pack_ternary(path, path.with_name(path.name + ".data").exists())
    log(f"  {name}: {details['matmuls']} ternary MatMuls packed, {details['weight_bytes_before'] / 1e6:.1f} -> "
        f"{details['weight_bytes_after'] / 1e6:.1f} MB")
    return details


def load_model(checkpoint):
    from ..reference.asr_bitnet import load_asr_bitnet

    return load_asr_bitnet(checkpoint)
