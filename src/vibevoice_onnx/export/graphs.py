"""The standalone graphs of a realtime bundle: torch wrappers with flat tensor signatures, and their export.

Each wrapper turns one reference component into a function of plain tensors (KV caches and conv states as
explicit inputs/outputs), so onnxruntime can drive it from numpy. Export uses torch.onnx (dynamo).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.export import Dim
from transformers.cache_utils import DynamicCache

from ..reference.modules import ConvState, RealtimeModel, conv_state_specs

OPSET = 18
EXTERNAL_DATA_BYTES = 64 * 2**20  # graphs with more weights than this keep them in a .onnx.data file


def kv_names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


class LanguageModelGraph(nn.Module):
    """One Qwen2 stack with its KV cache as inputs (past length P may be 0) and outputs (length P+S).

    The attention mask [B, P+S] lets the runtime batch the positive and negative CFG streams, the shorter
    one left-padded (mask 0); position ids are explicit because the two streams sit at different positions.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        # A shallow view of the model without its token embedding: the host embeds, the graph never does.
        self.lm = copy.copy(lm)
        self.lm._modules = dict(lm._modules)
        self.lm._modules["embed_tokens"] = None
        self.layers = len(lm.layers)

    def forward(self, inputs_embeds, attention_mask, position_ids, *past):
        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.layers)])
        out = self.lm(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                      past_key_values=cache, use_cache=True)
        return (out.last_hidden_state, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


class DecoderGraph(nn.Module):
    def __init__(self, model: RealtimeModel):
        super().__init__()
        self.decoder = model.acoustic_decoder

    def forward(self, latents):
        return self.decoder(latents.transpose(1, 2)).audio


class StreamingDecoderGraph(nn.Module):
    """Decode F new frames with every conv's state passed in and returned (facts sheet 4.4)."""

    def __init__(self, model: RealtimeModel):
        super().__init__()
        self.decoder = model.acoustic_decoder
        self.specs = conv_state_specs(self.decoder)

    def forward(self, latents, *states):
        state = ConvState({key: s for (key, _, _), s in zip(self.specs, states)})
        audio = self.decoder(latents.transpose(1, 2), padding_cache=state).audio
        return (audio, *[state.tensors[key] for key, _, _ in self.specs])


@dataclass
class GraphSpec:
    """What to export: a wrapper, example inputs, names and dynamic axes."""

    name: str
    module: nn.Module
    example: tuple
    inputs: list[str]
    outputs: list[str]
    dynamic: tuple  # torch.export dynamic_shapes, one entry per forward parameter (varargs: one tuple)
    extra: dict = field(default_factory=dict)  # manifest additions (e.g. state specs)


def realtime_graph_specs(model: RealtimeModel) -> list[GraphSpec]:
    dims = model.dims
    hidden, latent = dims.lm.hidden, dims.head.latent
    max_positions = dims.tts_lm.max_positions
    g = torch.Generator().manual_seed(0)

    batch = Dim("batch", min=1, max=64)

    def lm_spec(name: str, lm: nn.Module, q) -> GraphSpec:
        seq, past = Dim("sequence", min=1, max=max_positions), Dim("past_sequence", min=0, max=max_positions)
        example_past = tuple(torch.randn(2, q.kv_heads, 5, q.head_dim, generator=g) for _ in range(2 * q.layers))
        mask = torch.ones(2, 8, dtype=torch.long)
        mask[1, :2] = 0
        return GraphSpec(
            name,
            LanguageModelGraph(lm),
            (torch.randn(2, 3, hidden, generator=g), mask, torch.arange(5, 8)[None].repeat(2, 1), *example_past),
            ["inputs_embeds", "attention_mask", "position_ids", *kv_names(q.layers, "past_key_values")],
            ["hidden_states", *kv_names(q.layers, "present")],
            ({0: batch, 1: seq}, {0: batch, 1: Dim.AUTO}, {0: batch, 1: seq}, tuple({0: batch, 2: past} for _ in example_past)),
        )

    frames = Dim("frames", min=1, max=4096)
    decoder = model.acoustic_decoder
    state_specs = conv_state_specs(decoder)
    states = tuple(torch.zeros(1, c, n) for _, c, n in state_specs)
    return [
        lm_spec("lower_lm", model.language_model, dims.lm),
        lm_spec("upper_lm", model.tts_language_model, dims.tts_lm),
        GraphSpec(
            "diffusion_head",
            model.diffusion_head,
            (torch.randn(2, latent, generator=g), torch.tensor([999.0, 999.0]), torch.randn(2, hidden, generator=g)),
            ["noisy_latents", "timesteps", "condition"],
            ["velocity"],
            ({0: batch}, {0: batch}, {0: batch}),
        ),
        GraphSpec(
            "acoustic_connector",
            model.acoustic_connector,
            (torch.randn(1, 2, latent, generator=g),),
            ["latents"],
            ["embeddings"],
            ({0: batch, 1: frames},),
        ),
        GraphSpec(
            "eos_classifier",
            model.eos_classifier,
            (torch.randn(2, hidden, generator=g),),
            ["hidden_states"],
            ["logits"],
            ({0: batch},),
        ),
        GraphSpec(
            "acoustic_decoder",
            DecoderGraph(model),
            (torch.randn(1, 3, latent, generator=g),),
            ["latents"],
            ["audio"],
            ({1: frames},),
        ),
        GraphSpec(
            "acoustic_decoder_stream",
            StreamingDecoderGraph(model),
            (torch.randn(1, 2, latent, generator=g), *states),
            ["latents", *[f"state.{key}" for key, _, _ in state_specs]],
            ["audio", *[f"new_state.{key}" for key, _, _ in state_specs]],
            ({1: frames}, tuple({} for _ in states)),
            extra={"states": [{"name": key, "channels": c, "length": n} for key, c, n in state_specs]},
        ),
    ]


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def export_graph(spec: GraphSpec, out_dir: Path, log: Callable[[str], None] = print) -> Path:
    path = Path(out_dir) / f"{spec.name}.onnx"
    external = _param_bytes(spec.module) > EXTERNAL_DATA_BYTES
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            spec.module.eval(),
            spec.example,
            dynamo=True,
            input_names=spec.inputs,
            output_names=spec.outputs,
            dynamic_shapes=spec.dynamic,
            opset_version=OPSET,
            optimize=True,
            verbose=False,
        )
    program.save(str(path), external_data=external)
    log(f"  exported {spec.name} ({_param_bytes(spec.module) / 1e6:.1f} MB of weights)")
    return path
