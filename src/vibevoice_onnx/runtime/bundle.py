"""An ONNX bundle on disk: its manifest, its onnxruntime sessions, host tensors, tokenizer and voices."""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path

import ml_dtypes
import numpy as np

from ..checkpoints.configs import ModelDims, model_dims
from ..errors import BundleError, VibeVoiceError
from ..families import family
from ..options import check_optional
from ..voices import check_voice_fits, load_voice
from .device import GraphSession, Placement, StaticBinding
from .manifest import FORMAT_VERSION, MANIFEST, Manifest, damaged, recordable, validate_manifest  # noqa: F401 (their old home)

HOST_TENSORS = "host.safetensors"
MODEL_CARD = "README.md"  # a pushed bundle's model card: documentation, never loaded
VOICES = "voices"
_VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# Distributions that each install the same `onnxruntime` package folder: two of them at once overwrite each
# other's files, and which providers `import onnxruntime` then offers depends on which was installed last.
ONNXRUNTIME_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino",
                             "onnxruntime-qnn")


def installed_distributions() -> set[str]:
    """The names of the installed Python distributions, normalized (lower case, dashes)."""
    from importlib.metadata import distributions

    return {re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() for d in distributions()}


def runtime_clash(installed: set[str]) -> str | None:
    """What is wrong when more than one onnxruntime distribution is installed (None when at most one is)."""
    found = [name for name in ONNXRUNTIME_DISTRIBUTIONS if name in installed]
    if len(found) < 2:
        return None
    return (f"{' and '.join(found)} are installed together and share one onnxruntime folder; keep only one: "
            f"pip uninstall -y {' '.join(found)} && pip install onnxruntime-gpu")


def voice_path(bundle_dir: Path, name: str) -> Path:
    """Where voice NAME lives; names are plain (no separators), so a path never leaves voices/."""
    if not _VOICE_NAME.fullmatch(name):
        raise VibeVoiceError(f"'{name}' is not a usable voice name (letters, digits, '.', '_', '-'; at most 64)")
    return Path(bundle_dir) / VOICES / f"{name}.safetensors"


_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
                       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def map_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as read-only memory maps: a token-embedding table (0.5 GB for the realtime
    model, 2.2 GB for ASR) then costs memory only for the rows a run looks up. safetensors' own numpy loader
    copies every tensor, so the header (8-byte length, JSON) is read here; every entry is checked against the
    file's size, so a truncated file fails here rather than at its first use."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if not 2 <= length <= size - 8:
            raise ValueError(f"header length {length} does not fit a file of {size} bytes")
        header = json.loads(f.read(length))
    start, tensors = 8 + length, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]])
        shape, (begin, end) = tuple(int(d) for d in entry["shape"]), (int(o) for o in entry["data_offsets"])
        if end - begin != int(np.prod(shape)) * dtype.itemsize or begin < 0 or start + end > size:
            raise ValueError(f"{name}: its data does not fit the file (truncated?)")
        tensors[name] = (np.memmap(path, dtype, "r", start + begin, shape).view(np.ndarray) if end > begin
                         else np.zeros(shape, dtype))  # plain arrays over the map (the map stays open as their base)
    return tensors


def file_record(path: Path) -> dict:
    """A file's size and sha256, as the manifest's `files` record keeps them."""
    from ..outputs import file_sha256

    return {"size": path.stat().st_size, "sha256": file_sha256(path)}


def bundle_files(root: Path) -> list[str]:
    """Every file of a bundle directory but its manifest, as relative POSIX paths (voices/NAME.safetensors)."""
    root = Path(root)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and p.name not in (MANIFEST, MODEL_CARD) and not p.name.startswith("."))


def write_manifest(bundle_dir: Path, manifest: dict, action: str = "writing the manifest") -> None:
    """Replace a bundle's manifest atomically (a reader sees the old one or the new one, never half)."""
    from ..outputs import atomic_file

    with atomic_file(Path(bundle_dir) / MANIFEST, action) as partial:
        partial.write_text(json.dumps(manifest, indent=2) + "\n")


def rerecord(bundle_dir: Path) -> None:
    """The bundle's manifest recording its files as they now are (a copy whose files were changed on purpose)."""
    write_manifest(bundle_dir, record_files(bundle_dir, json.loads((Path(bundle_dir) / MANIFEST).read_text())))


def record_files(bundle_dir: Path, manifest: dict, names: list[str] | None = None) -> dict:
    """`manifest` with the sizes and sha256 of `names` (default: every file of the bundle) recorded under
    `files`, where pull and push check them; a name no longer on disk leaves the record."""
    root = Path(bundle_dir)
    files = dict(manifest.get("files") or {})
    for name in bundle_files(root) if names is None else names:
        if (root / name).is_file():
            files[name] = file_record(root / name)
        else:
            files.pop(name, None)
    return {**manifest, "files": dict(sorted(files.items()))}


def _first_line(error: Exception, limit: int = 200) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:limit]


_shared_pool_threads: int | None = None  # set once share_threads() has made this process's one pool


def share_threads(threads: int | None = None) -> int:
    """From now on, run every session this process creates in one onnxruntime thread pool of `threads`
    (default: the cores this process may use); returns its size.

    The realtime loop calls seven sessions in turn, hundreds of small operators each. With a pool per
    session, spinning must be off (seven pools' spinning workers steal the cores from each other), so every
    operator wakes a sleeping worker; one shared pool keeps one worker spinning between operators (full-size
    realtime int8 on 2 cores: RTF 0.53 -> 0.46). onnxruntime then refuses any session in this process that
    asks for a pool of its own, including ones that other code creates: so this is for a process that runs
    vibevoice-onnx alone (the command line turns it on for its runtime commands), never a library default."""
    global _shared_pool_threads
    import os

    wanted = check_optional("threads", threads) or len(os.sched_getaffinity(0))
    if _shared_pool_threads is None:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

        ort_state.set_global_thread_pool_sizes(wanted, 1)
        _shared_pool_threads = wanted
    elif threads is not None and wanted != _shared_pool_threads:
        raise VibeVoiceError(f"this process already shares one onnxruntime pool of {_shared_pool_threads} threads; "
                             f"it cannot change to {wanted}")
    return _shared_pool_threads


def shared_pool_threads() -> int | None:
    """The size of this process's shared pool, or None while each session has its own."""
    return _shared_pool_threads


def cpu_session_options(threads: int | None = None):
    """Options for a CPU session of this process: in the shared pool once share_threads() made it, else in a
    pool of its own of `threads` (default: onnxruntime's) that sleeps between operators."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if _shared_pool_threads is not None:
        if threads is not None and threads != _shared_pool_threads:
            raise VibeVoiceError(f"this process shares one onnxruntime pool of {_shared_pool_threads} threads; "
                                 f"a session of {threads} threads cannot be made")
        options.use_per_session_threads = False
        return options
    if threads:
        options.intra_op_num_threads = threads
    # The loop runs seven sessions in turn: threads that spin after one session's call steal the cores from
    # the next (measured: 35% slower generation on 2 cores with spinning on).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class Bundle:
    """Opens a bundle directory. Sessions are created on first use, with the given providers/options."""

    def __init__(self, path: Path, providers: list | None = None, session_options=None, threads: int | None = None,
                 bound: bool = True, cuda_graphs: bool = False, profile_dir: Path | None = None):
        self.path = Path(path)
        self.info = Manifest.read(self.path)  # the manifest, checked and typed: read its fields here
        self.manifest = self.info.raw  # manifest.json as written, a dict (the package reads `info`; users may read this)
        for name, graph in self.info.graphs.items():
            for file in (graph["file"], graph.get("external_data")):
                if file and not (self.path / file).is_file():
                    raise damaged(self.path / file, f"the graph file of '{name}' is missing")
        self.providers = providers or self.default_providers()
        self.session_options = session_options
        self.threads = check_optional("threads", threads)
        # every graph call through I/O binding, state on the device (runtime.device); unbound: verify's other path
        self.placement = Placement.of(self.providers, bound)
        # every graph in buffers of its own bound once (runtime.device.StaticBinding), captured as a CUDA graph
        # on its first call and replayed after: the fixed profile's static shapes are what that needs
        self.static_graphs = cuda_graphs
        if cuda_graphs and (self.info.profile_name != "fixed" or self.placement.device != "cuda"):
            raise BundleError(f"{self.path}: CUDA graphs need a bundle of the fixed profile built for CUDA "
                              "(build --profile fixed --device cuda); this one is "
                              f"{self.info.profile_name}, for {self.info.device}")
        self._sessions: dict = {}
        self._voice_files: dict = {}  # voices given as files or URLs, read once
        self.timings: dict[str, list[float]] | None = None  # graph -> seconds per call, once time_calls() is on
        self.profile_dir = profile_dir  # onnxruntime's profiler on every session, its files here (bench --profile)

    def default_providers(self) -> list[str]:
        """The device the bundle was built for; a CUDA bundle without a CUDA provider is refused, never run
        on the CPU behind the user's back."""
        if self.info.device != "cuda":
            return ["CPUExecutionProvider"]
        clash = runtime_clash(installed_distributions())
        if clash:
            raise BundleError(f"{self.path}: is built for CUDA, but {clash}")
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BundleError(f"{self.path}: is built for CUDA, but this onnxruntime has no CUDA provider "
                              "(install onnxruntime-gpu in place of onnxruntime, on a machine with an NVIDIA GPU: "
                              "pip uninstall -y onnxruntime && pip install onnxruntime-gpu)")
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def time_calls(self) -> dict[str, list[float]]:
        """From now on, record the wall time of every graph call (bench's per-component breakdown)."""
        self.timings = {}
        for session in self._sessions.values():
            session.timings = self.timings
        return self.timings

    def end_profiling(self) -> dict[str, Path]:
        """Each profiled session's profile written: {graph: its onnxruntime profile (Chrome trace JSON)}."""
        return {name: Path(session.session.end_profiling()) for name, session in self._sessions.items()}

    def weight_bytes(self, name: str) -> int:
        """Bytes of graph `name` on disk (its weights, essentially): what one call reads from memory."""
        graph = self.graph(name)
        return sum((self.path / f).stat().st_size for f in (graph["file"], graph.get("external_data")) if f)

    @property
    def kind(self) -> str:
        return self.info.kind

    @cached_property
    def dims(self) -> ModelDims:
        return model_dims(self.info.config, str(self.info.path))

    @property
    def profile(self) -> str:
        """"dynamic" (the default build), or "fixed" (`build --profile fixed`: static shapes, export/fixed.py)."""
        return self.info.profile_name

    @cached_property
    def streaming_geometry(self):
        """ASR-Streaming's windows, from the checkpoint's preprocessor config the build recorded."""
        from ..checkpoints.configs import streaming_geometry

        return streaming_geometry(self.info.preprocessor, f"{self.info.path}: the preprocessor record")

    def require_kind(self, *kinds: str) -> None:
        if self.kind not in kinds:
            raise BundleError(f"{self.path}: is a bundle of kind '{self.kind}'; this needs kind "
                              + " or ".join(f"'{kind}'" for kind in kinds))

    def require_usable(self) -> None:
        """The one admission rule of every command and API that runs a bundle (speak, transcribe, serve): refuse
        a bundle whose gates failed, and a reduced-precision one whose closed loop has not run (a quantized
        graph that passes its own gate can still ruin generation once its errors feed back). Callers skip it
        when asked to (--force, force=True)."""
        problem = self.unusable()
        if problem is not None:
            raise BundleError(problem)

    def unusable(self, forcible: bool = True) -> str | None:
        """Why require_usable refuses the bundle (None: it does not); `forcible`: with how --force overrides it,
        which a caller without that option (the browser's page) leaves out."""
        parity, precision = self.info.parity, self.info.precision
        if parity and not parity.get("passed"):
            failed = ", ".join(g["name"] for g in parity["gates"] if not g["passed"])
            return (f"{self.path}: failed its parity gates ({failed}), so it is not usable"
                    + ("; pass --force (force=True) to use it anyway" if forcible else ""))
        if not parity and precision != "fp32":
            return (f"{self.path}: this {precision} bundle has not been verified; run `vibevoice-onnx verify "
                    f"{self.path}` first (its closed loop must pass)"
                    + (", or pass --force (force=True)" if forcible else ""))
        return None

    def check_files(self) -> None:
        """Every file of the bundle is the one its manifest records (size and sha256), and no file is there that
        it does not record: what pull and push rely on, whoever changed a file on the way."""
        recorded = self.info.files
        if not recorded:
            raise BundleError(f"{self.path}: its manifest records no file hashes, so its files cannot be checked "
                              "(build it again with this version)")
        present = bundle_files(self.path)
        for name in present:
            if name not in recorded:
                raise BundleError(f"{self.path / name}: this file is not one the bundle's manifest records; "
                                  "the bundle was changed after it was built, so it is refused")
        for name, expected in recorded.items():
            if name not in present:
                raise BundleError(f"{self.path / name}: this file of the bundle is missing")
            if not isinstance(expected, dict) or file_record(self.path / name) != {
                    "size": expected.get("size"), "sha256": expected.get("sha256")}:
                raise BundleError(f"{self.path / name}: this file does not match the sha256 its manifest records; "
                                  "it was changed or damaged on the way, so the bundle is refused")

    def session(self, name: str):
        if name not in self._sessions:
            import onnxruntime as ort

            if name not in self.info.graphs:
                raise BundleError(f"{self.path}: the bundle has no '{name}' graph")
            options = self.session_options
            if options is None:
                options = cpu_session_options(self.threads)
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                # onnxruntime's memory arena keeps a session's largest activations for good, so it is off, except
                # for streaming conv stacks (graphs with states): called again and again on the same shapes with
                # large activations, they reuse their buffers instead of allocating and page-faulting them afresh
                # on every call (full-size realtime decoder: ~10 ms less a frame). Their memory pattern is off: it
                # would keep one whole-plan block per input shape (the first frame alone, then groups), where the
                # arena reuses its chunks across shapes (realtime int8 peak 1.07 -> 1.03 GB at the same speed).
                streaming = bool(self.info.graphs[name].get("states"))
                options.enable_cpu_mem_arena = streaming
                options.enable_mem_pattern = not streaming
                if self.profile_dir is not None:
                    options.enable_profiling = True
                    options.profile_file_prefix = str(Path(self.profile_dir) / name)
            elif _shared_pool_threads is not None and options.use_per_session_threads:
                raise VibeVoiceError("this process shares one onnxruntime thread pool (share_threads): session "
                                     "options must set use_per_session_threads = False")
            path = self.path / self.info.graphs[name]["file"]
            static = StaticBinding(name, self.info.graphs[name], self.placement) if self.static_graphs else None
            try:
                session = ort.InferenceSession(str(path), options, providers=self.session_providers(static is not None))
            except Exception as e:  # onnxruntime raises its own pybind classes (InvalidProtobuf, Fail, ...)
                raise damaged(path, f"onnxruntime cannot load the graph ({_first_line(e)})") from None
            self._sessions[name] = GraphSession(name, session, self.placement, self.timings, static)
        return self._sessions[name]

    def session_providers(self, cuda_graph: bool) -> list:
        """The bundle's providers, the CUDA one asked to capture and replay the session as a CUDA graph."""
        if not cuda_graph or self.placement.device != "cuda":
            return self.providers
        return [("CUDAExecutionProvider", {"device_id": self.placement.device_id, "enable_cuda_graph": "1"})
                if provider == "CUDAExecutionProvider" else provider for provider in self.providers]

    def release(self, name: str) -> None:
        """Drop graph `name`'s session (and its weights) until it is needed again."""
        self._sessions.pop(name, None)

    def close(self) -> None:
        """Every session released now, however many objects still refer to them (a later call through one of
        them fails instead of holding the weights in memory), and the host tensors' mappings dropped."""
        for graph in self._sessions.values():
            graph.session = None
        self._sessions.clear()
        self.__dict__.pop("host", None)

    def graph(self, name: str) -> dict:
        return self.info.graphs[name]

    @cached_property
    def host(self) -> dict[str, np.ndarray]:
        path = self.path / self.info.host_tensors
        try:
            return map_safetensors(path)
        except FileNotFoundError:
            raise damaged(path, "the host tensors are missing") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise damaged(path, f"the host tensors cannot be read ({_first_line(e)})") from None

    def host_tensors(self, *names: str) -> list[np.ndarray]:
        missing = [n for n in names if n not in self.host]
        if missing:
            raise damaged(self.path / self.info.host_tensors, f"no {', '.join(missing)} in the host tensors")
        for name in names:  # the small ones (scales, type rows) are where a NaN would hide; checking is cheap
            if self.host[name].size <= 1 << 16 and not np.isfinite(np.asarray(self.host[name], np.float32)).all():
                raise damaged(self.path / self.info.host_tensors, f"host tensor {name} holds NaN or infinity")
        return [self.host[n] for n in names]

    @cached_property
    def tokenizer(self):
        from ..text import load_tokenizer

        return load_tokenizer(self.path / self.info.tokenizer_file)

    # -- voices -----------------------------------------------------------------------------------------
    def voices(self) -> list[str]:
        folder = self.path / VOICES
        return sorted(p.name[: -len(".safetensors")] for p in folder.glob("*.safetensors")) if folder.is_dir() else []

    def voice(self, spec: str):
        """A voice: one of the bundle's by name (a cached prompt for realtime, a voice sample for 1.5B and Large),
        or a voice file by path or http(s) URL (downloaded once into the cache): an upstream preset (.pt) for
        realtime, an audio sample for 1.5B and Large, read as `voices import` reads it."""
        spec = str(spec)
        if spec in self.voices():
            return self.check_voice_file(voice_path(self.path, spec))
        from ..hub.home import is_url, local_file

        if is_url(spec) or Path(spec).is_file():
            if spec not in self._voice_files:
                self._voice_files[spec] = self.read_voice_source(local_file(spec))
            return self._voice_files[spec]
        available = ", ".join(self.voices()) or "none; import one with `vibevoice-onnx voices import`"
        raise VibeVoiceError(f"{self.path}: has no voice '{spec}' (available: {available}), and it is no voice file "
                             "or http(s) URL")

    def read_voice_source(self, path: Path):
        """A voice from a file as users have them (an upstream preset for realtime, any audio for 1.5B and Large),
        refused where it does not fit this model."""
        if family(self.kind).voices == "preset":
            from ..voices import read_upstream_preset

            prompt = read_upstream_preset(Path(path))
            check_voice_fits(prompt, self.expected_voice_shapes(), str(path))
            return prompt
        from ..audio import voice_from_file

        return voice_from_file(Path(path))

    def check_voice_file(self, path: Path):
        """Read a voice file of this bundle's kind, refusing one that does not fit the model."""
        if family(self.kind).voices == "preset":
            prompt = load_voice(path)
            check_voice_fits(prompt, self.expected_voice_shapes(), str(path))
            return prompt
        from ..audio import load_voice_sample

        return load_voice_sample(path)

    def expected_voice_shapes(self) -> dict:
        lm, tts = self.dims.lm, self.dims.tts_lm
        return {"hidden": lm.hidden, "kv_heads": lm.kv_heads, "head_dim": lm.head_dim,
                "lm_layers": lm.layers, "tts_lm_layers": tts.layers}
