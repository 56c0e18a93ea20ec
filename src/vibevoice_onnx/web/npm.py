"""The JavaScript a site runs, from the npm registry by pinned version and sha256 (as Hub downloads are checked),
cached under $VIBEVOICE_ONNX_HOME/downloads: users need no Node toolchain, and nothing of it is committed here."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import VibeVoiceError
from ..hub.home import fetch_url

REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str  # of the registry's tarball
    files: tuple[tuple[str, str], ...]  # (path in the package, path in the site)

    @property
    def url(self) -> str:
        return f"{REGISTRY}/{self.name}/-/{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"


# onnxruntime-web's WASM build: the CPU provider compiled to WebAssembly (SIMD, threads where the page is
# cross-origin isolated), with the contrib operators the bundles use (GroupQueryAttention, MatMulNBits,
# DynamicQuantizeMatMul, SimplifiedLayerNormalization); and its WebGPU build (the C++ WebGPU provider, with the CPU
# provider for the nodes WebGPU has no kernel for, in an asyncify WebAssembly), which the page loads instead where
# it runs on WebGPU.
ONNXRUNTIME_WEB = Package("onnxruntime-web", "1.31.1",
                          "bdccdb9fbb9ab537247c0c734e9b1d2b1b338b4f2a09faa58f0dc1cfa27c312c",
                          (("dist/ort.wasm.min.mjs", "ort/ort.wasm.min.mjs"),
                           ("dist/ort-wasm-simd-threaded.mjs", "ort/ort-wasm-simd-threaded.mjs"),
                           ("dist/ort-wasm-simd-threaded.wasm", "ort/ort-wasm-simd-threaded.wasm"),
                           ("dist/ort.webgpu.min.mjs", "ort/ort.webgpu.min.mjs"),
                           ("dist/ort-wasm-simd-threaded.asyncify.mjs", "ort/ort-wasm-simd-threaded.asyncify.mjs"),
                           ("dist/ort-wasm-simd-threaded.asyncify.wasm", "ort/ort-wasm-simd-threaded.asyncify.wasm"),
                           ("package.json", "ort/package.json")))  # its licence (MIT) is named there: no LICENSE file
# Hugging Face's tokenizers in plain JavaScript: reads the bundle's tokenizer.json as the Python `tokenizers` does.
TOKENIZERS = Package("@huggingface/tokenizers", "0.2.0",
                     "2800014c83b8186b2e4210c20672f1fb65a12cef85d7e95e0f2003e022611b4a",
                     (("dist/tokenizers.min.mjs", "tokenizers/tokenizers.min.mjs"), ("LICENSE", "tokenizers/LICENSE")))
PACKAGES = (ONNXRUNTIME_WEB, TOKENIZERS)
MAX_TARBALL_BYTES = 64 * 2**20


def unpack(package: Package, site: Path) -> None:
    """`package`'s files into `site`, from its tarball (downloaded once, checked every time)."""
    tarball = fetch_url(package.url, timeout=120, sha256=package.sha256, limit=MAX_TARBALL_BYTES,
                        what=f"the {package.name} package")
    with tarfile.open(tarball, "r:gz") as archive:
        for inside, target in package.files:
            try:
                member = archive.extractfile(f"package/{inside}")
            except KeyError:
                member = None
            if member is None:
                raise VibeVoiceError(f"{package.url}: has no {inside}, which this version expects")
            path = site / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(member.read())
