"""The gates of a fixed-shape realtime bundle (export/fixed.py): each graph against the fp32 reference, the
decoder's tiles against the untiled reference decode (never a golden clamped to the tile), the closed loop
against the reference and against the default-profile bundle of the same checkpoint and precision beside it."""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..errors import VibeVoiceError
from ..families import family
from ..generation.realtime import GenerationResult, realtime_frames
from ..reference.realtime import RealtimeModel, TorchRealtimeBackend
from ..runtime.bundle import Bundle
from ..runtime.realtime import FixedRealtimeBackend, OnnxRealtimeBackend
from ..sampling import NoiseSource
from .calibration import EOS, calibrated_gates
from .common import (SEED, Gate, Limits, Probe, Tolerance, cache_layers, cfg_steps, compare, head_gate, lm_step, module_gate,
                     prefilled)

CFG_SCALE, STEPS = family("realtime").defaults.cfg_scale, family("realtime").defaults.steps  # as the default profile's


def lm_text_gate(model: RealtimeModel, runtime: FixedRealtimeBackend, probe: Probe, limit: Tolerance) -> Gate:
    """lower_lm_text: a whole and a padded window (5 then 3 tokens) after a 7-token prefix, against the
    reference LM: the second window also checks what the first wrote into the cache."""
    prefix = prefilled(model.language_model, probe, 7)
    ours = runtime.text_stream(cache_layers(prefix))
    outputs, references, position = [], [], 7
    for count in (5, 3):
        embeds = probe.tokens(count)
        outputs.append(ours.step(embeds))
        references.append(lm_step(model.language_model, embeds, np.arange(position, position + count)[None], prefix))
        position += count
    return compare("lower_lm_text (5 tokens, then 3 padded to 5)", outputs, references, limit)


def guided_gate(model: RealtimeModel, runtime: FixedRealtimeBackend, probe: Probe, limit: Tolerance) -> Gate:
    """upper_lm_text and upper_lm_step: the CFG streams (rows of different lengths in one cache) against the
    reference's two separate streams: speech, a 3-token text window (positive only), speech twice."""
    positive = prefilled(model.tts_language_model, probe, 9)
    negative = prefilled(model.tts_language_model, probe, 2)
    ours = runtime.guided_streams(cache_layers(positive), cache_layers(negative))
    reference = TorchRealtimeBackend(model).guided_streams(cache_layers(positive), cache_layers(negative))
    return compare("upper_lm_text + upper_lm_step: CFG streams", *cfg_steps(ours, reference, probe), limit)


def decoder_tile_gates(model: RealtimeModel, runtime: FixedRealtimeBackend, probe: Probe, limit: Tolerance) -> list[Gate]:
    """The reference's whole decode of 2T + 1 frames is the golden: the tiles (T a call, the last frame in a
    padded tile), frame by frame, and a run shorter than a tile (its first frames, against the reference's
    decode of just those frames, never a golden clamped to T)."""
    tile = runtime.decoder.frames
    latents = runtime.unscale(probe.normal(1, 2 * tile + 1, model.dims.head.latent))

    def golden(count: int) -> np.ndarray:
        return model.decode(torch.from_numpy(latents[:, :count])).numpy()[0, 0]

    whole, _ = runtime.decode_frames(latents, runtime.new_decoder_state())
    state, pieces = runtime.new_decoder_state(), []
    for frame in range(latents.shape[1]):
        audio, state = runtime.decode_frames(latents[:, frame:frame + 1], state)
        pieces.append(audio)
    frames = latents.shape[1]
    expected = golden(frames)
    gates = [compare(f"acoustic_decoder_tile: {frames} frames in tiles of {tile} == whole reference decode",
                     [whole], [expected], limit),
             compare(f"acoustic_decoder_tile: {frames} frames one at a time == whole reference decode",
                     [np.concatenate(pieces)], [expected], limit)]
    if tile > 1:
        short = tile - 1
        first, _ = runtime.decode_frames(latents[:, :short], runtime.new_decoder_state())
        gates.append(compare(f"acoustic_decoder_tile: a run of {short} frame(s) (shorter than a tile) == the "
                             "reference's decode of those frames", [first], [golden(short)], limit))
    return gates


def graph_gates(model: RealtimeModel, runtime: FixedRealtimeBackend, log, limit: Tolerance) -> list[Gate]:
    probe = Probe(lambda ids: model.embed_text(torch.from_numpy(ids)).numpy(), model.dims.lm.vocab)
    log("  per-graph gates (fixed shapes)")
    gates = [lm_text_gate(model, runtime, probe, limit), guided_gate(model, runtime, probe, limit)]
    conditions = lm_step(model.tts_language_model, probe.tokens(4), np.arange(4)[None], DynamicCache())[0]
    gates.append(head_gate(model.diffusion_head, runtime.velocity, conditions, probe, limit))
    gates.append(module_gate("acoustic_connector", model.acoustic_connector, runtime.connect,
                             probe.normal(1, 1, model.dims.head.latent), limit))
    gates.append(module_gate("eos_classifier (host)", model.eos_classifier,
                             lambda h: np.array([[runtime.eos_logit(row[None])] for row in h], np.float32),
                             conditions, limit))
    return gates + decoder_tile_gates(model, runtime, probe, limit)


def dynamic_sibling(bundle: Bundle) -> Bundle | None:
    """The default-profile bundle of the same checkpoint, device and precision beside this one, if built."""
    path = bundle.path.parent / f"{bundle.info.device}_{bundle.info.precision}"
    try:
        sibling = Bundle(path)
    except VibeVoiceError:  # absent or unreadable: the gate against it is then not run, and says so
        return None
    return sibling if sibling.info.source_hash == bundle.info.source_hash else None


def against_dynamic(bundle: Bundle, runtime: FixedRealtimeBackend, prompt, ids, runs: dict) -> tuple[list[Gate], dict]:
    """The same loop (noise, prompt, text, length) on the default-profile bundle: a new path against the old,
    judged as the free run is (verify.calibration), with the dynamic bundle's run in the reference's place."""
    sibling = dynamic_sibling(bundle)
    if sibling is None:
        return [], {"against_dynamic": f"not run: no default-profile bundle at {bundle.path.parent}/"
                                       f"{bundle.info.device}_{bundle.info.precision}"}
    ours, dynamic = runs["free"], GenerationResult()
    noise = NoiseSource.from_seed(SEED, runtime.bundle.dims.head.latent)
    for _ in realtime_frames(OnnxRealtimeBackend(sibling), prompt, ids, noise, CFG_SCALE, STEPS, len(ours.latents),
                             dynamic, stop_on_eos=False):
        pass
    gates, _ = calibrated_gates("closed loop, fixed == dynamic bundle", ours, dynamic, runs["perturbed"], runs["error"],
                                EOS, f"{dynamic.frames} frames against {sibling.path}")
    return gates, {"against_dynamic": str(sibling.path)}


def mobile_notes(bundle: Bundle) -> list[str]:
    """verify's table shows what the build's usability check found for each graph."""
    lines = ["mobile usability (onnxruntime's checker; nodes each provider would take, partitions):"]
    for name, graph in bundle.info.graphs.items():
        usability = graph.get("mobile") or {}
        cells = [f"{ep} {u['supported_nodes']}/{u['nodes']} in {u['partitions']}"
                 + (f" (not: {', '.join(op.split(':')[-1] for op in u['unsupported_ops'])})" if u['unsupported_ops'] else "")
                 for ep, u in usability.items()]
        lines.append(f"  {name}: {'; '.join(cells) or 'not checked'}")
    return lines


def run_gates(bundle: Bundle, model: RealtimeModel, prompt, ids, log, limits: Limits, closed_loop) -> tuple[list[Gate], dict]:
    runtime = FixedRealtimeBackend(bundle)
    gates = graph_gates(model, runtime, log, limits.graph)
    log("  closed loop: the whole generation, fixed-shape runtime vs reference")
    runs: dict = {}  # the free-running loop, judged against the reference and the dynamic bundle
    loop, loop_info = closed_loop(model, runtime, prompt, ids, limits, runs=runs)
    log("  closed loop against the default-profile bundle")
    dynamic, dynamic_info = against_dynamic(bundle, runtime, prompt, ids, runs)
    return gates + loop + dynamic, {"closed_loop": loop_info, **dynamic_info, "notes": mobile_notes(bundle)}
