"""Voice presets: reading upstream's `.pt` files safely, and the bundle's own torch-free voice format.

An upstream realtime preset (facts sheet 2.4) is a torch zip archive whose pickle holds four cached prompt
outputs (`lm`, `tts_lm`, `neg_lm`, `neg_tts_lm`), each a `BaseModelOutputWithPast` with a legacy
`DynamicCache` (`_seen_tokens`, `key_cache`, `value_cache`), tensors in bf16 saved on `cuda:0`.
It is read here without torch and without executing arbitrary pickle code: the unpickler resolves only an
allow-list of globals (stand-ins for the two transformers classes, the tensor rebuild function, the storage
types, OrderedDict) and anything else is refused.
"""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from .errors import VibeVoiceError
from .families import FAMILIES

PROMPT_ENTRIES = ("lm", "tts_lm", "neg_lm", "neg_tts_lm")

_STORAGE_DTYPES = {
    "BFloat16Storage": ml_dtypes.bfloat16,
    "HalfStorage": np.float16,
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "BoolStorage": np.bool_,
}


class _ModelOutput(dict):
    """Stand-in for transformers' BaseModelOutputWithPast: REDUCE(args), SETITEMS, then BUILD."""

    _FIELDS = ("last_hidden_state", "past_key_values", "hidden_states", "attentions")

    def __init__(self, *args):
        super().__init__()
        for name, value in zip(self._FIELDS, args):
            setattr(self, name, value)

    def __setstate__(self, state):
        self.__dict__.update(state)


class _LegacyDynamicCache:
    """Stand-in for the pre-4.56 DynamicCache: NEWOBJ(), then BUILD with its attribute dict."""

    def __setstate__(self, state):
        self.__dict__.update(state)


class _StorageType:
    def __init__(self, name: str):
        self.name = name


MAX_ELEMENTS = 2**28  # far above any preset tensor; refuses absurd sizes before allocating


class _BadTensor(ValueError):
    pass


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    """numpy view of a torch tensor, after checking that every element it addresses lies in its storage."""
    size, stride = tuple(size), tuple(stride)
    if not (isinstance(offset, int) and len(size) == len(stride) and all(isinstance(n, int) for n in size + stride)):
        raise _BadTensor("tensor geometry is not integral")
    if offset < 0 or any(n < 0 for n in size) or any(s < 0 for s in stride) or math.prod(size) > MAX_ELEMENTS:
        raise _BadTensor(f"tensor geometry offset={offset} size={size} stride={stride} is not allowed")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if last >= len(storage):
        raise _BadTensor(f"tensor of size {size} reaches element {last} of a storage of {len(storage)}")
    itemsize = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride), writeable=False
    )
    return np.ascontiguousarray(view)


class _PresetUnpickler(pickle.Unpickler):
    _ALLOWED = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("collections", "OrderedDict"): dict,
        ("transformers.modeling_outputs", "BaseModelOutputWithPast"): _ModelOutput,
        ("transformers.cache_utils", "DynamicCache"): _LegacyDynamicCache,
    }

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, source: Path):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix, self.source = archive, prefix, source

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise VibeVoiceError(
            f"{self.source}: refused to load: the preset references '{module}.{name}', which a voice preset "
            "never contains (only tensors and transformers' cached prompt outputs are allowed)"
        )

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise VibeVoiceError(f"{self.source}: refused to load: unknown persistent object {pid!r:.80}")
        _, storage_type, key, _location, numel = pid  # location (e.g. cuda:0) is irrelevant: we read bytes
        if not isinstance(numel, int) or numel < 0:
            raise VibeVoiceError(f"{self.source}: refused to load: storage {key} has an invalid size")
        try:
            raw = self.archive.read(f"{self.prefix}data/{key}")
        except KeyError:
            raise VibeVoiceError(f"{self.source}: storage {key} is missing from the archive") from None
        dtype = np.dtype(_STORAGE_DTYPES[storage_type.name])
        if len(raw) < numel * dtype.itemsize:
            raise VibeVoiceError(f"{self.source}: storage {key} is truncated")
        return np.frombuffer(raw, dtype=dtype, count=numel)


def _read_pickle(path: Path) -> dict:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise VibeVoiceError(_not_a_preset(path, e)) from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise VibeVoiceError(f"{path}: expected one <root>/data.pkl in the archive, found {len(pickles)}")
        prefix = pickles[0][: -len("data.pkl")]
        try:
            return _PresetUnpickler(archive.read(pickles[0]), archive, prefix, path).load()
        except VibeVoiceError:
            raise
        except _BadTensor as e:
            raise VibeVoiceError(f"{path}: refused to load: {e}") from None
        except Exception as e:
            raise VibeVoiceError(f"{path}: the preset pickle is malformed ({type(e).__name__}: {e})") from None


def _not_a_preset(path: Path, error: Exception) -> str:
    """Why `path` is no preset, in the words its user needs: a recording given for a realtime voice is the usual
    case (voices cloned from audio are another kind's)."""
    import soundfile as sf

    try:
        audio = sf.info(str(path))
    except Exception:  # noqa: BLE001 - libsndfile's own error types: it is not audio either
        return f"{path}: not a torch zip archive ({error})"
    cloners = " and ".join(f.title for f in FAMILIES if f.voices == "audio")
    return (f"{path}: is a {audio.format} recording, but a realtime voice is a preset: the cached prompt "
            "upstream's tools save as a .pt file (Microsoft's demo/voices/streaming_model/*.pt), imported with "
            f"`vibevoice-onnx voices import`; a voice cloned from audio is what {cloners} do")


@dataclass
class VoicePrompt:
    """The cached prompt of one voice, as the realtime generation loop needs it (numpy, any float dtype)."""

    lm: list[tuple[np.ndarray, np.ndarray]]  # lower LM (K, V) per layer, [1, kv_heads, L_lm, head_dim]
    tts_lm: list[tuple[np.ndarray, np.ndarray]]  # upper LM, [1, kv_heads, L_tts, head_dim]
    neg_tts_lm: list[tuple[np.ndarray, np.ndarray]]  # negative upper LM, [1, kv_heads, L_neg, head_dim]
    neg_condition: np.ndarray  # [hidden]: neg_tts_lm.last_hidden_state[0, -1], the first CFG condition
    tts_condition: np.ndarray  # [hidden]: tts_lm.last_hidden_state[0, -1]

    @property
    def lengths(self) -> dict[str, int]:
        return {name: getattr(self, name)[0][0].shape[2] for name in ("lm", "tts_lm", "neg_tts_lm")}

    @property
    def hidden(self) -> int:
        return int(self.neg_condition.shape[-1])

    def shape_summary(self) -> dict:
        k = self.lm[0][0]
        return {
            "hidden": self.hidden,
            "kv_heads": int(k.shape[1]),
            "head_dim": int(k.shape[3]),
            "lm_layers": len(self.lm),
            "tts_lm_layers": len(self.tts_lm),
            **{f"{name}_length": n for name, n in self.lengths.items()},
        }


def _cache_layers(entry, name: str, path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    cache = getattr(entry, "past_key_values", None)
    keys, values = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values) or not keys:
        raise VibeVoiceError(f"{path}: '{name}' has no legacy DynamicCache with key_cache/value_cache lists")
    layers = list(zip(keys, values))
    for i, (k, v) in enumerate(layers):
        if not (isinstance(k, np.ndarray) and k.ndim == 4 and k.shape == v.shape and k.shape[0] == 1):
            raise VibeVoiceError(f"{path}: '{name}' layer {i} K/V are not matching [1, heads, length, dim] tensors")
    length = layers[0][0].shape[2]
    if any(k.shape[2] != length for k, _ in layers):
        raise VibeVoiceError(f"{path}: '{name}' layers hold caches of different lengths")
    hidden = getattr(entry, "last_hidden_state", None)
    if not isinstance(hidden, np.ndarray) or hidden.ndim != 3 or hidden.shape[1] != length:
        raise VibeVoiceError(f"{path}: '{name}' last_hidden_state does not cover the {length} cached positions")
    return layers


def read_upstream_preset(path: Path) -> VoicePrompt:
    path = Path(path)
    data = _read_pickle(path)
    if not isinstance(data, dict) or set(data) != set(PROMPT_ENTRIES):
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise VibeVoiceError(f"{path}: a realtime voice preset holds {', '.join(PROMPT_ENTRIES)}; this one holds {keys}")
    caches = {name: _cache_layers(data[name], name, path) for name in PROMPT_ENTRIES}
    return VoicePrompt(
        lm=caches["lm"],
        tts_lm=caches["tts_lm"],
        neg_tts_lm=caches["neg_tts_lm"],
        neg_condition=np.ascontiguousarray(data["neg_tts_lm"].last_hidden_state[0, -1]),
        tts_condition=np.ascontiguousarray(data["tts_lm"].last_hidden_state[0, -1]),
    )


# ---------------------------------------------------------------------------------------------------------
# The bundle's voice format: one safetensors file per voice, tensors in the preset's own dtype.

def check_voice_fits(prompt: VoicePrompt, expected: dict, source: str) -> None:
    """Refuse a voice whose shapes do not fit the model; `expected` has hidden, kv_heads, head_dim, layers."""
    actual = prompt.shape_summary()
    for key in ("hidden", "kv_heads", "head_dim", "lm_layers", "tts_lm_layers"):
        if actual[key] != expected[key]:
            raise VibeVoiceError(
                f"{source}: does not fit this model: {key.replace('_', ' ')} is {actual[key]} in the preset "
                f"but {expected[key]} in the model"
            )
    layers = {"lm": expected["lm_layers"], "tts_lm": expected["tts_lm_layers"], "neg_tts_lm": expected["tts_lm_layers"]}
    for name, count in layers.items():
        caches = getattr(prompt, name)
        if len(caches) != count:
            raise VibeVoiceError(f"{source}: does not fit this model: {name} has {len(caches)} layers, the model {count}")
        for i, (k, v) in enumerate(caches):
            if k.shape[1] != expected["kv_heads"] or k.shape[3] != expected["head_dim"] or k.shape != v.shape:
                raise VibeVoiceError(f"{source}: does not fit this model: {name} layer {i} caches have shape {list(k.shape)}")
    for name in ("neg_condition", "tts_condition"):
        if getattr(prompt, name).shape != (expected["hidden"],):
            raise VibeVoiceError(f"{source}: does not fit this model: {name} is not a [{expected['hidden']}] vector")
    arrays = [prompt.neg_condition, prompt.tts_condition] + [t for name in layers for pair in getattr(prompt, name) for t in pair]
    if not all(np.isfinite(np.asarray(a, np.float32)).all() for a in arrays):
        raise VibeVoiceError(f"{source}: holds NaN or infinity in its cached prompt, so it cannot be used as a voice")


def save_voice(prompt: VoicePrompt, path: Path, metadata: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    tensors = {"neg_condition": prompt.neg_condition, "tts_condition": prompt.tts_condition}
    for name in ("lm", "tts_lm", "neg_tts_lm"):
        for i, (k, v) in enumerate(getattr(prompt, name)):
            tensors[f"{name}.{i}.key"] = np.ascontiguousarray(k)
            tensors[f"{name}.{i}.value"] = np.ascontiguousarray(v)
    save_file(tensors, str(path), metadata={k: str(v) for k, v in metadata.items()})


def load_voice(path: Path, dtype=np.float32) -> VoicePrompt:
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except Exception as e:
        raise VibeVoiceError(f"{path}: not a readable voice file ({e})") from None

    def layers(name: str):
        out, i = [], 0
        while f"{name}.{i}.key" in tensors:
            out.append((tensors[f"{name}.{i}.key"].astype(dtype), tensors[f"{name}.{i}.value"].astype(dtype)))
            i += 1
        if not out or any(k.ndim != 4 or k.shape != v.shape for k, v in out):
            raise VibeVoiceError(f"{path}: not a vibevoice-onnx voice file (no valid '{name}' cache)")
        return out

    missing = [name for name in ("neg_condition", "tts_condition") if name not in tensors]
    if missing:
        raise VibeVoiceError(f"{path}: not a vibevoice-onnx voice file (no {', '.join(missing)})")
    return VoicePrompt(
        lm=layers("lm"),
        tts_lm=layers("tts_lm"),
        neg_tts_lm=layers("neg_tts_lm"),
        neg_condition=tensors["neg_condition"].astype(dtype),
        tts_condition=tensors["tts_condition"].astype(dtype),
    )
