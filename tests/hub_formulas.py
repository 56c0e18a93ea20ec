"""Components recomputed straight from hub tensors (upstream key names) with plain torch functions.

Written from the facts sheet (sections 1.2-1.4), independently of transformers' modules, so tests can check
that our key mapping puts every tensor where the architecture needs it.
"""

import math

import torch
import torch.nn.functional as F


def rms(x, weight=None, eps=1e-5):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


def head_from_hub(w, x, t, c, layers=4, p="model.prediction_head."):
    h = x @ w[p + "noisy_images_proj.weight"].T
    freqs = torch.exp(-math.log(10000) * torch.arange(128, dtype=torch.float32) / 128)
    emb = torch.cat([torch.cos(t[:, None] * freqs), torch.sin(t[:, None] * freqs)], dim=-1)  # cos half first
    t_emb = F.silu(emb @ w[p + "t_embedder.mlp.0.weight"].T) @ w[p + "t_embedder.mlp.2.weight"].T
    cond = c @ w[p + "cond_proj.weight"].T + t_emb
    for i in range(layers):
        q = f"{p}layers.{i}."
        shift, scale, gate = (F.silu(cond) @ w[q + "adaLN_modulation.1.weight"].T).chunk(3, dim=-1)
        hn = rms(h, w[q + "norm.weight"]) * (1 + scale) + shift
        ffn = (F.silu(hn @ w[q + "ffn.gate_proj.weight"].T) * (hn @ w[q + "ffn.up_proj.weight"].T)) @ w[q + "ffn.down_proj.weight"].T
        h = h + gate * ffn
    shift, scale = (F.silu(cond) @ w[p + "final_layer.adaLN_modulation.1.weight"].T).chunk(2, dim=-1)
    return (rms(h) * (1 + scale) + shift) @ w[p + "final_layer.linear.weight"].T


def causal_conv(x, weight, bias, groups=1):
    return F.conv1d(F.pad(x, (weight.shape[-1] - 1, 0)), weight, bias, groups=groups)


def block_from_hub(w, p, x):
    channels = x.shape[1]
    h = rms(x.transpose(1, 2), w[p + "norm.weight"]).transpose(1, 2)
    h = causal_conv(h, w[p + "mixer.conv.conv.conv.weight"], w[p + "mixer.conv.conv.conv.bias"], groups=channels)
    x = x + w[p + "gamma"][:, None] * h
    h = rms(x.transpose(1, 2), w[p + "ffn_norm.weight"])
    h = F.gelu(h @ w[p + "ffn.linear1.weight"].T + w[p + "ffn.linear1.bias"]) @ w[p + "ffn.linear2.weight"].T + w[p + "ffn.linear2.bias"]
    return x + w[p + "ffn_gamma"][:, None] * h.transpose(1, 2)


def decoder_from_hub(w, latents, ratios=(8, 5, 5, 4, 2, 2), depths=(2, 1, 1, 1, 1, 1, 1), p="model.acoustic_tokenizer.decoder."):
    x = causal_conv(latents.transpose(1, 2), w[p + "upsample_layers.0.0.conv.conv.weight"], w[p + "upsample_layers.0.0.conv.conv.bias"])
    for stage, depth in enumerate(depths):
        if stage:
            r = ratios[stage - 1]
            q = f"{p}upsample_layers.{stage}.0.convtr.convtr."
            x = F.conv_transpose1d(x, w[q + "weight"], w[q + "bias"], stride=r)[..., :-r]  # causal: trim r right
        for j in range(depth):
            x = block_from_hub(w, f"{p}stages.{stage}.{j}.", x)
    return causal_conv(x, w[p + "head.conv.conv.weight"], w[p + "head.conv.conv.bias"])


def encoder_from_hub(w, audio, p, ratios=(2, 2, 4, 5, 5, 8), depths=(1, 1, 1, 1, 1, 1, 2)):
    """audio [B, 1, N] (N a multiple of the hop) -> latents [B, N/hop, vae_dim]; strided convs pad r left."""
    x = causal_conv(audio, w[p + "downsample_layers.0.0.conv.conv.weight"], w[p + "downsample_layers.0.0.conv.conv.bias"])
    for stage, depth in enumerate(depths):
        if stage:
            r = ratios[stage - 1]
            q = f"{p}downsample_layers.{stage}.0.conv.conv."
            x = F.conv1d(F.pad(x, (r, 0)), w[q + "weight"], w[q + "bias"], stride=r)
        for j in range(depth):
            x = block_from_hub(w, f"{p}stages.{stage}.{j}.", x)
    return causal_conv(x, w[p + "head.conv.conv.weight"], w[p + "head.conv.conv.bias"]).transpose(1, 2)


def connector_from_hub(w, x, p):
    h = rms(x @ w[p + "fc1.weight"].T + w[p + "fc1.bias"], w[p + "norm.weight"], eps=1e-6)
    return h @ w[p + "fc2.weight"].T + w[p + "fc2.bias"]
