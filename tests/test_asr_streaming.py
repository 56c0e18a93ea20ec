"""VibeVoice-ASR-Streaming (kind asr-streaming, 1.5B and 7B): the hub layouts against the facts sheet's counts,
tiny checkpoints of both variants made, inspected and loaded strictly, the geometry and tokenizer read from
the checkpoint's own files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vibevoice_onnx.checkpoints.configs import full_config, model_dims
from vibevoice_onnx.checkpoints.inspect import inspect_checkpoint
from vibevoice_onnx.checkpoints.layouts import layout_for


@pytest.mark.parametrize("variant,parameters", [("1.5b", 2_814_116_321), ("7b", 8_674_021_857)])
def test_full_size_layouts_hold_the_released_checkpoints_counts(variant, parameters):
    """Facts sheet 12.4: 1,177 tensors (552 acoustic tokenizer, 276 semantic, 338 LM, one head, two connectors of
    five), and the parameter totals that the hub's BF16 file sizes pin."""
    config = full_config("asr-streaming", variant)
    dims = model_dims(config)
    layout = layout_for(dims)
    groups = {prefix: sum(t.name.startswith(prefix) for t in layout.tensors)
              for prefix in ("model.acoustic_tokenizer.", "model.semantic_tokenizer.", "model.language_model.")}
    assert dims.kind == "asr-streaming" and "diffusion_head_config" in config  # vestigial, and not a TTS model
    assert len(layout.tensors) == 1177 and list(groups.values()) == [552, 276, 338]
    assert layout.parameters == parameters
    assert dims.lm.tied_embeddings == (variant == "1.5b")
    head = layout.by_name()["lm_head.weight"]
    assert head.used == (variant == "7b")  # the 1.5B ships one, ties it away and never reads it


@pytest.fixture(scope="module")
def streaming_checkpoints(tmp_path_factory):
    from vibevoice_onnx.checkpoints.synthetic import make_checkpoint

    root = tmp_path_factory.mktemp("asr-streaming")
    for variant in ("1.5b", "7b"):
        make_checkpoint("asr-streaming", root / variant, size="tiny", seed=3, variant=variant)
    return root


@pytest.mark.parametrize("variant,shards", [("1.5b", 3), ("7b", 8)])
def test_tiny_checkpoints_match_their_layout_with_geometry_and_chunk_end_token(streaming_checkpoints, variant, shards):
    report = inspect_checkpoint(streaming_checkpoints / variant)
    assert report["ok"] and report["kind"] == "asr-streaming" and len(report["files"]) == shards
    assert report["streaming"].startswith("chunks of 22 frames (2.9333 s) + 4 of lookahead: windows of 83,200 samples")
    preprocessor = json.loads((streaming_checkpoints / variant / "preprocessor_config.json").read_text())
    assert preprocessor["normalize_audio"] is False
    tokens = {t["content"] for t in json.loads((streaming_checkpoints / variant / "tokenizer.json").read_text())["added_tokens"]}
    assert {"<|text_chunk_end|>", "<|object_ref_start|>", "<|object_ref_end|>"} <= tokens


def test_full_size_tokenizer_puts_the_chunk_end_where_the_released_one_has_it():
    from vibevoice_onnx.checkpoints.configs import STREAMING_TOKENS
    from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer

    tokenizer, ids = build_tokenizer("full", STREAMING_TOKENS)
    assert tokenizer.token_to_id("<|text_chunk_end|>") == 151665 and tokenizer.token_to_id("<|AUDIO|>") == 151666
    assert ids["<|object_ref_start|>"] == 151646  # the speech markers keep Qwen's ids


def test_a_checkpoint_without_geometry_or_chunk_end_token_cannot_stream(streaming_checkpoints, tmp_path):
    no_geometry = shutil.copytree(streaming_checkpoints / "1.5b", tmp_path / "no-geometry")
    (no_geometry / "preprocessor_config.json").unlink()
    report = inspect_checkpoint(no_geometry)
    assert not report["ok"] and "not a streaming checkpoint" in report["streaming_problem"]
    stock = shutil.copytree(streaming_checkpoints / "1.5b", tmp_path / "stock-tokenizer")
    data = json.loads((stock / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|text_chunk_end|>"]
    (stock / "tokenizer.json").write_text(json.dumps(data))
    report = inspect_checkpoint(stock)
    assert not report["ok"] and "no <|text_chunk_end|>" in report["streaming_problem"]


def test_strict_load_ties_the_1_5b_head_to_the_embedding_and_keeps_the_7bs_own(streaming_checkpoints):
    from safetensors import safe_open

    from vibevoice_onnx.checkpoints.files import open_checkpoint
    from vibevoice_onnx.reference.asr import load_asr

    for variant in ("1.5b", "7b"):
        root = streaming_checkpoints / variant
        model = load_asr(root).model
        files = open_checkpoint(root)
        with safe_open(str(root / files.tensors["lm_head.weight"].file), framework="pt") as f:
            shipped = f.get_tensor("lm_head.weight").float()
        embedding = model.model.language_model.embed_tokens.weight
        if variant == "1.5b":  # upstream's tie_weights: the logits come from the embedding, not the shipped head
            assert torch.equal(model.lm_head.weight, embedding) and not torch.equal(shipped, embedding)
        else:
            assert torch.equal(model.lm_head.weight, shipped)


def test_variant_is_for_streaming_checkpoints_only(tmp_path, capsys):
    from vibevoice_onnx.cli import EXIT_ERROR, main

    assert main(["make-checkpoint", "asr", str(tmp_path / "x"), "--variant", "7b"]) == EXIT_ERROR
    assert "--variant is for asr-streaming" in capsys.readouterr().err


# ---- the loop, against upstream's streaming_generate transcribed line by line ----

UPSTREAM_PROMPT = ("You are a helpful assistant that transcribes audio input into text output. Please transcribe the "
                   "following audios streamingly with these keys: speaker, content\n")


def speech_samples():
    """The real speech fixture at 24 kHz, not normalised (the streaming preprocessor says normalize_audio false);
    where ../shared is absent, verify's voiced stand-in of the fixture's length."""
    from vibevoice_onnx.verify.asr import verification_audio

    return verification_audio(None, None, normalize=False)[0]


@torch.no_grad()
def upstream_streaming_generate(model, tokenizer, audio, chunk_frames: int, lookahead_frames: int, hotwords: str,
                                max_new_tokens_per_chunk: int) -> list[list[int]]:
    """Upstream's streaming_generate (encode_mode "split_then_encode", temperature 0, the acoustic mean as the
    ports take it) written out with transformers' modules, one line per step of facts sheet 12.6-12.7."""
    import numpy as np
    from transformers.cache_utils import DynamicCache

    hop = 3200
    chunk, window = chunk_frames * hop, (chunk_frames + lookahead_frames) * hop
    lm, parts = model.model.language_model, model.model
    tce, eos = tokenizer.token_to_id("<|text_chunk_end|>"), tokenizer.token_to_id("<|endoftext|>")
    speech_start, speech_end = tokenizer.token_to_id("<|object_ref_start|>"), tokenizer.token_to_id("<|object_ref_end|>")
    text = UPSTREAM_PROMPT[:-1] + f" and extra info: {hotwords}\n" if hotwords else UPSTREAM_PROMPT
    prompt = tokenizer.encode(text, add_special_tokens=False).ids
    cache, length = DynamicCache(), 0

    def forward(embeds):
        nonlocal length
        positions = torch.arange(length, length + embeds.shape[1])[None]
        length += embeds.shape[1]
        return lm(inputs_embeds=embeds, position_ids=positions, past_key_values=cache, use_cache=True).last_hidden_state

    forward(lm.embed_tokens(torch.tensor([prompt])))  # prefill; its logits are discarded
    chunks, start = [], 0
    while start < len(audio):
        segment = np.zeros(window, np.float32)
        piece = audio[start:start + window]
        segment[:len(piece)] = piece  # pad_last_chunk
        wave = torch.from_numpy(segment)[None, None]
        acoustic = parts.acoustic_tokenizer_encoder(wave).latents  # cold: no cache carried from the last window
        semantic = parts.semantic_tokenizer_encoder(wave).latents
        features = parts.multi_modal_projector(acoustic, semantic)
        hidden = forward(torch.cat([lm.embed_tokens(torch.tensor([[speech_start]])), features,
                                    lm.embed_tokens(torch.tensor([[speech_end]]))], dim=1))
        tokens = []
        for _ in range(max_new_tokens_per_chunk):
            token = int(model.lm_head(hidden[:, -1]).argmax(-1))
            tokens.append(token)
            if token in (tce, eos):
                break
            hidden = forward(lm.embed_tokens(torch.tensor([[token]])))
        forward(lm.embed_tokens(torch.tensor([[tce]])))  # always fed once, its logits unused
        chunks.append(tokens)
        start += chunk
    return chunks


@pytest.mark.parametrize("variant", ["1.5b", "7b"])
def test_the_shared_loop_is_upstreams_token_for_token(streaming_checkpoints, variant):
    import numpy as np

    from vibevoice_onnx.checkpoints.configs import streaming_geometry
    from vibevoice_onnx.generation.asr_streaming import StreamingSession, split_windows
    from vibevoice_onnx.reference.asr import load_asr
    from vibevoice_onnx.text import load_tokenizer

    root = streaming_checkpoints / variant
    reference, tokenizer = load_asr(root), load_tokenizer(root / "tokenizer.json")
    geometry = streaming_geometry(json.loads((root / "preprocessor_config.json").read_text()))
    audio = speech_samples()[: 3 * geometry.chunk_samples + 5000]  # 4 windows, the last padded
    expected = upstream_streaming_generate(reference.model, tokenizer, audio, 22, 4, "VibeVoice", 7)
    session = StreamingSession(reference, tokenizer, geometry, hotwords="VibeVoice", max_tokens_per_chunk=7)
    results = [session.chunk(window) for window in split_windows(audio, geometry)]
    assert len(results) == len(expected) == 4
    assert [r.tokens for r in results] == expected
    assert [r.start for r in results] == pytest.approx([0, 2.9333, 5.8667, 8.8], abs=1e-3)
    assert all(np.isfinite(r.margins).all() for r in results)


def test_audio_fed_in_pieces_gives_the_windows_of_the_whole(streaming_checkpoints):
    import numpy as np

    from vibevoice_onnx.checkpoints.configs import streaming_geometry
    from vibevoice_onnx.generation.asr_streaming import WindowFeeder, split_windows

    geometry = streaming_geometry(json.loads((streaming_checkpoints / "1.5b" / "preprocessor_config.json").read_text()))
    audio = np.random.default_rng(0).standard_normal(2 * geometry.window_samples + 777).astype(np.float32)
    feeder, fed = WindowFeeder(geometry), []
    for piece in np.array_split(audio, 37):  # pieces of any size, as a microphone gives them
        fed += feeder.feed(piece)
    fed += feeder.finish()
    whole = list(split_windows(audio, geometry))
    assert len(fed) == len(whole) == -(-len(audio) // geometry.chunk_samples)
    assert all(np.array_equal(a, b) and means is None for (a, means), b in zip(fed, whole))


def test_windows_encoded_as_they_arrive_equal_each_window_encoded_whole(streaming_checkpoints):
    """Both encoders fed each window's whole frames as pieces arrive (two windows in flight over the lookahead),
    cold at each window's start, against each complete window encoded at once."""
    import numpy as np

    from vibevoice_onnx.checkpoints.configs import streaming_geometry
    from vibevoice_onnx.generation.asr_streaming import WindowFeeder, pad_window
    from vibevoice_onnx.reference.asr import load_asr

    root = streaming_checkpoints / "7b"
    geometry = streaming_geometry(json.loads((root / "preprocessor_config.json").read_text()))
    reference = load_asr(root)
    audio = speech_samples()[: 2 * geometry.chunk_samples + 20000]
    feeder, fed = WindowFeeder(geometry, reference), []
    for piece in np.array_split(audio, 23):
        fed += feeder.feed(piece)
    fed += feeder.finish()
    assert len(fed) == 3 and all(means is not None for _, means in fed)
    for window, means in fed:
        whole = reference.encode(pad_window(window, geometry)[None, None])
        for ours, theirs in zip(means, whole):
            assert ours.shape == theirs.shape == (1, 26, ours.shape[-1])
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
