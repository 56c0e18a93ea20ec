"""The gates of a realtime bundle against the fp32 PyTorch reference.

Per graph on realistic inputs (LM caches from real prefills, head conditions from real LM outputs), KV
incremental decode against a full prefill, streaming decode against whole decode, and the closed loop: the
whole generation run by the torch-free runtime and by the reference with the same noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from ..generation.realtime import GenerationResult, eos_fires, realtime_frames
from ..reference.modules import ConvState, as_tensor, conv_state_specs
from ..reference.realtime import RealtimeModel, TorchRealtimeBackend, generate
from ..runtime.bundle import Bundle
from ..runtime.realtime import OnnxRealtimeBackend
from ..sampling import NoiseSource
from ..text import encode_tts_text
from ..voices import VoicePrompt
from .common import F32, MIN_COSINE, Gate, cache_layers, compare, cosine

CLOSED_LOOP_TEXT = (
    "The quick brown fox jumps over the lazy dog. Speech synthesis turns written text into spoken audio, "
    "one frame at a time."
)
CLOSED_LOOP_FRAMES = 18  # three speech windows, interleaved with the first three text windows
EOS_NOISE_FLOOR = 1e-2  # |EOS logit| below this is a decision two faithful implementations may split


class GraphGates:
    """Each graph of the bundle against the reference module it came from."""

    def __init__(self, model: RealtimeModel, runtime: OnnxRealtimeBackend, seed: int = 0):
        self.model, self.runtime = model, runtime
        self.rng = np.random.default_rng(seed)
        self.vocab = model.dims.lm.vocab

    def _tokens(self, count: int) -> np.ndarray:
        return self.model.embed_text(torch.from_numpy(self.rng.integers(0, self.vocab, (1, count)))).numpy()

    def _prefilled(self, run, count: int) -> DynamicCache:
        cache = DynamicCache()
        run(as_tensor(self._tokens(count)), torch.arange(count)[None], cache)
        return cache

    def language_model(self, name: str, run, past: int, new: int) -> Gate:
        cache = self._prefilled(run, past)
        flat_past = self.runtime.flat_cache(cache_layers(cache))
        embeds = self._tokens(new)
        positions = np.arange(past, past + new, dtype=np.int64)[None]
        reference = run(as_tensor(embeds), torch.from_numpy(positions), cache).numpy()
        hidden, present = self.runtime.unbatched(name)(embeds, positions, flat_past)
        return compare(f"{name} (past {past}, new {new})", [hidden, *present], [reference, *self.runtime.flat_cache(cache_layers(cache))])

    def incremental_equals_prefill(self, name: str, length: int = 8, prefix: int = 3) -> Gate:
        embeds = self._tokens(length)
        run = self.runtime.unbatched(name)
        empty = self.runtime.flat_cache(self._empty_layers(name))
        full, full_present = run(embeds, np.arange(length)[None], empty)
        hidden, cache = run(embeds[:, :prefix], np.arange(prefix)[None], empty)
        pieces = [hidden]
        for i in range(prefix, length):
            hidden, cache = run(embeds[:, i : i + 1], np.array([[i]]), cache)
            pieces.append(hidden)
        return compare(f"{name} KV: prefill {prefix} + {length - prefix} steps == prefill {length}",
                       [np.concatenate(pieces, axis=1), *cache], [full, *full_present])

    def _empty_layers(self, name: str):
        q = self.model.dims.lm if name == "lower_lm" else self.model.dims.tts_lm
        empty = np.zeros((1, q.kv_heads, 0, q.head_dim), F32)
        return [(empty, empty)] * q.layers

    def batched_guidance(self) -> Gate:
        """The runtime's batch-2 CFG streams (padded, masked) against two separate reference streams."""
        positive, negative = self._prefilled(self.model.upper_step, 9), self._prefilled(self.model.upper_step, 2)
        ours = self.runtime.guided_streams(cache_layers(positive), cache_layers(negative))
        reference = TorchRealtimeBackend(self.model).guided_streams(cache_layers(positive), cache_layers(negative))
        outputs, references = [], []
        for step in range(4):  # speech, a 3-token text window (positive only), then speech again
            if step == 1:
                embeds = self._tokens(3)
                outputs.append(ours.text(embeds))
                references.append(reference.text(embeds))
            else:
                embeds = self._tokens(1)
                outputs += ours.speech(embeds)
                references += reference.speech(embeds)
        return compare("upper_lm: batched CFG streams == separate streams", outputs, references)

    def conditions(self, count: int) -> np.ndarray:
        cache = DynamicCache()
        return self.model.upper_step(as_tensor(self._tokens(count)), torch.arange(count)[None], cache)[0].numpy()

    def diffusion_head(self) -> Gate:
        conditions = self.conditions(4)
        noisy = self.rng.standard_normal((4, self.model.dims.head.latent)).astype(F32)
        timesteps = np.array([999, 799, 400, 200], F32)
        ours = self.runtime.velocity(noisy, timesteps, conditions)
        reference = self.model.predict_velocity(as_tensor(noisy), as_tensor(timesteps), as_tensor(conditions)).numpy()
        return compare("diffusion_head", [ours], [reference])

    def connector(self) -> Gate:
        latents = self.rng.standard_normal((1, 4, self.model.dims.head.latent)).astype(F32)
        return compare("acoustic_connector", [self.runtime.connect(latents)], [self.model.connect(as_tensor(latents)).numpy()])

    def eos(self) -> Gate:
        hidden = self.conditions(4)
        ours = self.runtime.sessions["eos_classifier"].run(None, {"hidden_states": hidden})[0]
        return compare("eos_classifier", [ours], [self.model.eos_logit(as_tensor(hidden)).numpy()])

    def _decoder_latents(self, frames: int) -> np.ndarray:
        z = self.rng.standard_normal((1, frames, self.model.dims.head.latent)).astype(F32)
        return self.runtime.unscale(z)

    def decoder_whole(self) -> Gate:
        latents = self._decoder_latents(6)
        ours = self.runtime.bundle.session("acoustic_decoder").run(None, {"latents": latents})[0]
        return compare("acoustic_decoder (6 frames)", [ours], [self.model.decode(as_tensor(latents)).numpy()])

    def decoder_stream(self) -> Gate:
        latents = self._decoder_latents(3)
        state = ConvState.zeros(conv_state_specs(self.model.acoustic_decoder))
        ours_state = self.runtime.new_decoder_state()
        outputs, references = [], []
        for i in range(3):  # the first frame starts from zeros, the later ones from a carried state
            ours, ours_state = self.runtime.decode_frame(latents[:, i : i + 1], ours_state)
            reference = self.model.decode_stream(as_tensor(latents[:, i : i + 1]), state)[0, 0].numpy()
            outputs += [ours]
            references += [reference]
        outputs += ours_state
        references += [state.tensors[s["name"]].numpy() for s in self.runtime.decoder.states]
        return compare("acoustic_decoder_stream (3 frames, states)", outputs, references)

    def stream_equals_whole(self, frames: int = 8) -> Gate:
        latents = self._decoder_latents(frames)
        whole = self.runtime.bundle.session("acoustic_decoder").run(None, {"latents": latents})[0][0, 0]
        state, pieces = self.runtime.new_decoder_state(), []
        for i in range(frames):
            chunk, state = self.runtime.decode_frame(latents[:, i : i + 1], state)
            pieces.append(chunk)
        return compare(f"decoder: {frames} streamed frames == whole decode", [np.concatenate(pieces)], [whole])


def closed_loop(model: RealtimeModel, runtime: OnnxRealtimeBackend, prompt: VoicePrompt, ids: list[int],
                seed: int = 1234, frames: int = CLOSED_LOOP_FRAMES) -> tuple[list[Gate], dict]:
    """The whole generation, `frames` long in both implementations: EOS is decided every frame but not acted
    on, so the gate judges agreement however early a (random) checkpoint would stop."""
    noise = NoiseSource.from_seed(seed, model.dims.head.latent)
    reference = generate(model, prompt, ids, noise, cfg_scale=1.5, steps=5, max_frames=frames, stop_on_eos=False)
    ours = GenerationResult()
    for _ in realtime_frames(runtime, prompt, ids, noise, 1.5, 5, frames, ours, stop_on_eos=False):
        pass
    complete = ours.frames == reference.frames == frames
    latent_cosines = [cosine(a, b) for a, b in zip(ours.latents, reference.latents)]
    latent_diff = max((float(np.abs(a - b).max()) for a, b in zip(ours.latents, reference.latents)), default=0.0)
    audio_cos = cosine(ours.audio, reference.audio) if complete else 0.0
    audio_diff = float(np.abs(ours.audio - reference.audio).max()) if complete else float("inf")
    windows = -(-len(ids) // 5)
    detail = f"{frames} frames, {min(windows, -(-frames // 6))} text windows, cfg 1.5, 5 steps, seed {seed}"
    if not complete:
        detail += f"; the runs ended after {ours.frames} (runtime) and {reference.frames} (reference) frames"
    eos_gate, eos_info = eos_agreement(ours, reference)
    gates = [
        Gate("closed loop: per-frame latent min cosine", min(latent_cosines) if latent_cosines else None, latent_diff,
             complete and min(latent_cosines) >= MIN_COSINE, detail),
        Gate("closed loop: audio cosine", audio_cos, audio_diff, complete and audio_cos >= MIN_COSINE, detail),
        eos_gate,
    ]
    return gates, {"frames": frames, "text_tokens": len(ids), "seed": seed, **eos_info}


def eos_agreement(runtime: GenerationResult, reference: GenerationResult) -> tuple[Gate, dict]:
    """Per-frame EOS decisions agree wherever the reference logit is clear of the noise floor."""
    ours, theirs = runtime.eos_logits, reference.eos_logits
    decided = [i for i, logit in enumerate(theirs) if abs(logit) > EOS_NOISE_FLOOR]
    disagree = [i for i in decided if i < len(ours) and eos_fires(ours[i]) != eos_fires(theirs[i])]
    diff = max((abs(a - b) for a, b in zip(ours, theirs)), default=0.0)
    info = {"eos_frame_reference": reference.eos_frame, "eos_frame_runtime": runtime.eos_frame}
    passed = len(ours) == len(theirs) and not disagree
    detail = (f"{len(decided)} of {len(theirs)} frames clear of the ±{EOS_NOISE_FLOOR} noise floor, "
              f"{len(disagree)} disagree{' (frames ' + ', '.join(map(str, disagree[:10])) + ')' if disagree else ''}; "
              f"EOS would first fire after frame {info['eos_frame_runtime']} (runtime) / {info['eos_frame_reference']} "
              f"(reference); max |Δ eos logit| {diff:.2e}")
    return Gate("closed loop: per-frame EOS decisions agree", None, diff, passed, detail), info


def verification_prompt(bundle: Bundle, model: RealtimeModel, voice: str | None) -> tuple[VoicePrompt, str]:
    """A bundle voice when asked for, else a prompt the reference computes from this very checkpoint.

    The default matters on synthetic checkpoints: a real preset's caches in a random-weight model make the
    loop chaotic (a 1e-4 nudge of one frame's noise grows ~3x per frame), which would measure the model, not
    the port. A prompt from the model's own forward pass keeps the loop as stable as the model is.
    """
    if voice is not None:
        return bundle.voice(voice), voice
    from ..reference.presets import as_voice_prompt, prompt_from_text

    return as_voice_prompt(prompt_from_text(model, bundle.tokenizer, "A voice prompt.\n")), "(computed by the reference)"


def run_gates(bundle: Bundle, checkpoint: Path, voice: str | None, log) -> tuple[list[Gate], dict]:
    from ..reference.loading import load_realtime

    model = load_realtime(checkpoint)
    runtime = OnnxRealtimeBackend(bundle)
    graphs = GraphGates(model, runtime)
    gates = []
    log("  per-graph gates")
    gates.append(graphs.language_model("lower_lm", model.lower_step, past=7, new=5))
    gates.append(graphs.language_model("upper_lm", model.upper_step, past=11, new=5))
    gates.append(graphs.language_model("upper_lm", model.upper_step, past=16, new=1))
    gates += [graphs.diffusion_head(), graphs.connector(), graphs.eos(), graphs.decoder_whole(), graphs.decoder_stream()]
    log("  KV cache and streaming gates")
    gates += [graphs.incremental_equals_prefill("lower_lm"), graphs.incremental_equals_prefill("upper_lm"),
              graphs.batched_guidance(), graphs.stream_equals_whole()]
    log("  closed loop: the whole generation, runtime vs reference")
    prompt, voice = verification_prompt(bundle, model, voice)
    ids = encode_tts_text(bundle.tokenizer, CLOSED_LOOP_TEXT)
    loop_gates, loop_info = closed_loop(model, runtime, prompt, ids)
    return gates + loop_gates, {"closed_loop": {**loop_info, "voice": voice},
                                "thresholds": {"eos_noise_floor": EOS_NOISE_FLOOR}}
