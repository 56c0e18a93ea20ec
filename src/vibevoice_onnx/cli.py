"""The `vibevoice-onnx` command line.

Each subcommand imports what it needs when it runs, so the runtime commands (speak, voices) work on the
base install without torch, and a user error is one sentence on stderr, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import threading
from pathlib import Path

from .families import KINDS, PRECISIONS, family
from .errors import VibeVoiceError
from .options import cli_type

EXIT_MISMATCH = 1  # the command ran, and what it checked is not right (inspect mismatch, failed gate)
EXIT_ERROR = 2  # the command could not run on this input
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a Unix tool killed by SIGPIPE reports
DEMO_TEXT = "Hello from vibevoice-onnx. This speech comes from ONNX graphs, with no PyTorch at run time."


def cmd_inspect(args) -> int:
    from .checkpoints.inspect import format_report, inspect_checkpoint

    report = inspect_checkpoint(Path(args.checkpoint))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["ok"] else EXIT_MISMATCH


def cmd_make_checkpoint(args) -> int:
    from .checkpoints.synthetic import make_checkpoint

    out = Path(args.out_dir)

    def add_preset(checkpoint: Path) -> None:
        # Realtime voices exist only as presets (no acoustic encoder): make one in upstream's format.
        from .reference.loading import load_realtime
        from .reference.presets import write_synthetic_preset
        from .text import load_tokenizer

        write_synthetic_preset(load_realtime(checkpoint, quiet=True), load_tokenizer(checkpoint / "tokenizer.json"),
                               checkpoint / "voices" / "synthetic.pt", args.seed)
        print(f"  voice preset: {out / 'voices' / 'synthetic.pt'} (made with the PyTorch reference)", file=sys.stderr)

    make_checkpoint(args.kind, out, size=args.size, seed=args.seed, dtype=args.dtype,
                    extras=add_preset if family(args.kind).voices == "preset" else None, variant=args.variant)
    print(out)
    return 0


def cmd_build(args) -> int:
    from .export.build import build_bundle

    profile = None
    if args.profile == "fixed":
        from .export.fixed import FixedProfile

        profile = FixedProfile.from_options(args.cache, args.decoder_frames, args.ort_format)
    elif args.cache is not None or args.decoder_frames is not None or args.ort_format:
        raise VibeVoiceError("--cache, --decoder-frames and --ort-format go with --profile fixed")
    write = {"auto": None, "written": True, "traced": False}[args.graphs]
    bundle = build_bundle(Path(args.checkpoint), Path(args.out_root), args.precision, args.device,
                          Path(args.tokenizer) if args.tokenizer else None, profile, write=write)
    print(bundle)
    return 0


def cmd_verify(args) -> int:
    from .export.makers import torch_installed
    from .verify.judge import format_table, sibling_teacher, verify_bundle

    teacher = Path(args.teacher) if args.teacher else None
    if teacher is None and not torch_installed():
        teacher = sibling_teacher(Path(args.bundle))
    record = verify_bundle(Path(args.bundle), Path(args.checkpoint) if args.checkpoint else None, args.voice,
                           teacher=teacher)
    print(json.dumps(record, indent=2) if args.json else format_table(record))
    if not record["passed"]:
        return EXIT_MISMATCH
    return EXIT_ERROR if "not_recorded" in record else 0


def cmd_voices_import(args) -> int:
    from .runtime.voice_store import import_voice

    name, summary = import_voice(Path(args.bundle), args.source, args.name, args.force)
    if "lm_length" in summary:
        print(f"imported voice '{name}': lm {summary['lm_length']} and tts_lm {summary['tts_lm_length']} cached positions")
    else:
        print(f"imported voice '{name}': {summary['seconds']:.2f} s, {summary['frames']} frames "
              f"(from {summary['sample_rate']} Hz, {summary['channels']} channel{'s' * (summary['channels'] > 1)})")
    return 0


def cmd_voices_list(args) -> int:
    from .runtime.voice_store import list_voices

    voices = list_voices(Path(args.bundle))
    if args.json:
        print(json.dumps(voices, indent=2))
    elif not voices:
        print("no voices (import one with `vibevoice-onnx voices import BUNDLE PRESET.pt`)")
    for v in [] if args.json else voices:
        if "lm_length" in v:
            print(f"{v['name']:<24} lm {v['lm_length']:>4}  tts_lm {v['tts_lm_length']:>4}  neg_tts_lm {v['neg_tts_lm_length']}")
        else:
            print(f"{v['name']:<24} {v['seconds']:8.2f} s  {v['frames']:>5} frames  from {v.get('source', '?')}")
    return 0


def cmd_speak(args) -> int:
    from .commands.speak import speak_command

    return speak_command(args)


def cmd_decode(args) -> int:
    import soundfile as sf

    from .outputs import atomic_file, check_output_file, os_error_or
    from .runtime.speech import open_tts
    from .sampling import read_npy

    check_output_file(Path(args.output))
    latents = read_npy(Path(args.latents), "latents")
    audio, rate = open_tts(Path(args.bundle), threads=args.threads).decode(latents)
    with atomic_file(Path(args.output), "writing the WAV file") as partial:
        try:
            sf.write(partial, audio, rate, subtype="PCM_16" if args.wav_format == "pcm16" else "FLOAT", format="WAV")
        except sf.LibsndfileError as e:
            raise os_error_or(e, f"{args.output}: cannot write the WAV file ({e})") from None
    print(f"decoded {len(latents)} frames ({len(audio) / rate:.2f} s) into {args.output}", file=sys.stderr)
    return 0


def _item_defaults(text: str | None) -> dict:
    if text is None:
        return {}
    try:
        defaults = json.loads(text)
    except ValueError as e:
        raise VibeVoiceError(f"--defaults is not JSON ({e})") from None
    if not isinstance(defaults, dict) or "id" in defaults:
        raise VibeVoiceError("--defaults takes a JSON object of item fields other than \"id\", such as "
                             "'{\"max_new_tokens\": 2000}'")
    return defaults


def cmd_transcribe(args) -> int:
    from .commands.transcribe import transcribe_files

    return transcribe_files(args)


def cmd_batch(args) -> int:
    if args.items is None:
        raise VibeVoiceError("batch needs ITEMS after the model")
    try:
        from .cluster.jobs import run_job
    except ImportError as e:
        raise VibeVoiceError(f"batch jobs need the cluster extra (pip install 'vibevoice-onnx[cluster]'): {e}") from None
    summary = run_job(args.task, Path(args.bundle), Path(args.items), Path(args.output), address=args.address,
                      workers=args.workers, threads_per_worker=args.threads_per_worker, force=args.force,
                      log=lambda line: print(line, file=sys.stderr, flush=True), defaults=_item_defaults(args.defaults))
    if summary["failed"]:
        raise VibeVoiceError(f"{summary['failed']} of {summary['items']} items failed: their errors are in "
                             f"{Path(args.output) / 'manifest.jsonl'}")
    return 0


def cmd_bench(args) -> int:
    from .commands.bench import bench_command

    return bench_command(args)


def cmd_push(args) -> int:
    from .hub.publish import push

    push(Path(args.bundle), args.repo_id, private=args.private, revision=args.revision,
         dry_run=Path(args.dry_run) if args.dry_run else None, base_model=args.base_model,
         log=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


def cmd_pull(args) -> int:
    from .hub.publish import pull

    print(pull(args.repo_id, args.revision, Path(args.local_dir) if args.local_dir else None,
               log=lambda line: print(line, file=sys.stderr, flush=True)))
    return 0


def cmd_web(args) -> int:
    from .web.site import site_server, write_site

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    site = write_site(Path(args.bundle), Path(args.output), force=args.force, log=log)
    print(site, flush=True)
    if args.check:
        from .web.check import check_site
        from .web.site import GATES_RECORD

        log(f"checking the page in headless Chromium ({args.check}) against the Python runtime")
        record = check_site(site, Path(args.bundle), args.check, log=log)
        log(f"browser gates {'passed' if record['passed'] else 'FAILED'}: {site / GATES_RECORD}")
        if not record["passed"]:
            return 1
    if args.preview is not None:
        import signal

        def stop(signum, frame):  # set here: a shell that started it in the background may have it ignore SIGINT
            raise KeyboardInterrupt

        for stopping in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stopping, stop)
        server = site_server(site, args.preview)
        log(f"serving {site} at http://127.0.0.1:{server.server_address[1]}/ (this machine only; Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


def cmd_cache_list(args) -> int:
    from .hub.cache import cached_bundles, home_summary

    entries = cached_bundles()
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    print(f"bundle cache: {home_summary()}", file=sys.stderr)
    if not entries:
        print("no cached bundles (a checkpoint given to speak, transcribe, serve ... is built here on first use)",
              file=sys.stderr)
    for entry in entries:
        source = entry["source"]
        origin = (f"{source['repo']}@{source.get('revision', 'main')} ({source.get('commit', '?')[:12]})"
                  if source.get("repo") else source.get("path", "?"))
        print(f"{origin}  {entry['kind']} {entry['variant']}  {entry['bytes'] / 1e9:.2f} GB  {entry['verdict']}  "
              f"{entry['path']}")
    print(f"{len(entries)} bundles, {sum(e['bytes'] for e in entries) / 1e9:.2f} GB", file=sys.stderr)
    return 0


def cmd_cache_remove(args) -> int:
    from .hub.cache import remove_cached

    removed = remove_cached(args.ref)
    if not removed:
        raise VibeVoiceError(f"no cached bundle matches '{args.ref}' (see `vibevoice-onnx cache list`)")
    for path in removed:
        print(f"removed {path}", file=sys.stderr)
    return 0


def server_settings(args):
    """The limits a server command's options give (serve, wyoming)."""
    from .serve import API_KEY_ENV, Settings

    return Settings(max_active=args.max_active, max_batch=args.max_batch, max_queue=args.max_queue,
                    max_input_chars=args.max_input_chars, max_upload_mb=args.max_upload_mb,
                    api_key=getattr(args, "api_key", None) or os.environ.get(API_KEY_ENV) or None,
                    body_timeout=args.body_timeout, max_frames=args.max_frames)


def cmd_serve(args) -> int:
    try:
        from .serve import run
        from .serve.models import parse_aliases
    except ImportError as e:
        raise VibeVoiceError(f"serving needs the serve extra (pip install 'vibevoice-onnx[serve]'): {e}") from None
    settings = server_settings(args)
    bundles, aliases = [Path(b) for b in args.bundle], parse_aliases(args.voice_alias or [])
    try:
        if args.ray:
            _serve_on_ray(args, bundles, settings, aliases)
        else:
            if args.address or args.replicas is not None or args.autoscale is not None:
                raise VibeVoiceError("--address, --replicas and --autoscale go with --ray")
            run(bundles, settings, host=args.host, port=args.port, threads=args.threads, force=args.force,
                aliases=aliases, log_level=args.log_level)
    except Terminated:  # uvicorn re-raises the SIGTERM it handled once it has shut down: a clean stop
        print("stopped", file=sys.stderr)
    return 0


def cmd_wyoming(args) -> int:
    try:
        from .serve.models import parse_aliases
        from .serve.wyoming import run
    except ImportError as e:
        raise VibeVoiceError(f"the Wyoming server needs the wyoming extra (pip install 'vibevoice-onnx[wyoming]'): "
                             f"{e}") from None
    run([Path(b) for b in args.bundle], server_settings(args), uri=args.uri, seed=args.seed, announce=args.zeroconf,
        max_new_tokens=args.max_new_tokens,
        threads=args.threads, force=args.force, aliases=parse_aliases(args.voice_alias or []),
        log_level=args.log_level)
    print("stopped", file=sys.stderr)
    return 0


def _serve_on_ray(args, bundles: list[Path], settings, aliases: dict[str, str]) -> None:
    try:
        from .cluster.serving import Replicas, run
    except ImportError as e:
        raise VibeVoiceError(f"serve --ray needs the cluster extra (pip install 'vibevoice-onnx[cluster]'): {e}") from None
    replicas = Replicas.parse(args.replicas, args.autoscale)
    run(bundles, settings, replicas, host=args.host, port=args.port, address=args.address, threads=args.threads,
        force=args.force, aliases=aliases, log=lambda line: print(line + " (Ctrl-C or SIGTERM stops)",
                                                                  file=sys.stderr, flush=True))


def cmd_demo(args) -> int:
    """The main job on an embedded default: a tiny synthetic realtime checkpoint, end to end."""
    work = Path(args.workdir)
    checkpoint = work / "checkpoint"
    steps = []
    if not (checkpoint / "config.json").is_file():
        steps.append(["make-checkpoint", "realtime", str(checkpoint), "--size", "tiny"])
    bundle = work / "onnx" / "realtime" / "cpu_fp32"
    steps += [
        ["inspect", str(checkpoint)],
        ["build", str(checkpoint), "-o", str(work / "onnx")],
        ["voices", "import", str(bundle), str(checkpoint / "voices" / "synthetic.pt"), "--force"],
        ["verify", str(bundle)],
        # Random weights learn no stopping point, so the demo caps the length (a real checkpoint stops on EOS).
        ["speak", str(bundle), DEMO_TEXT, "--voice", "synthetic", "--seed", "7", "--max-frames", "24",
         "-o", str(work / "speech.wav")],
    ]
    for step in steps:
        print(f"\n$ vibevoice-onnx {shlex.join(step)}", flush=True)  # quoted as a shell takes it: copy and paste
        code = main(step)
        if code:
            return code
    return 0


MODEL_HELP = ("a bundle directory, a checkpoint directory (built and verified into the cache on first use), or a Hub "
              "repository id ORG/NAME[@REVISION] of an upstream checkpoint or a prebuilt bundle")


def add_model_options(p, several: bool = False, then: str | None = None) -> None:
    """--model and the options that pick the bundle a checkpoint or Hub id stands for. The model is --model or the
    first positional; `then`: the positional that follows it, which takes the first one's place with --model (a
    list: the model is its first item); `several`: the positional and --model each name any number of models."""
    p.add_argument("--model", metavar="MODEL", action="append" if several else "store",
                   help=MODEL_HELP + (" (repeatable)" if several else ""))
    p.set_defaults(models_then=then, several_models=several)
    p.add_argument("--precision", choices=PRECISIONS,
                   help="the bundle of a checkpoint or Hub checkpoint to use, built on first use (default: the "
                   "fastest whose gates pass on the device: int8 on a CPU, else fp32, said in one sentence); a "
                   "bundle's own must match")
    p.add_argument("--device", choices=["cpu", "cuda"], help="the execution provider the bundle is for (default cpu)")
    p.add_argument("--revision", help="a Hub repository's branch, tag or commit (as ORG/NAME@REVISION)")
    p.add_argument("--tokenizer", metavar="PATH", help="a checkpoint without a tokenizer: this Qwen2.5 tokenizer.json "
                   "(default: the one matching its LM, fetched from the Hub)")


def take_models(args) -> None:
    """The command's model, from --model or its first positional (the others then move up one), resolved to a
    bundle directory: fetched, built and verified as the reference needs (hub.resolve_bundle)."""
    from .hub import resolve_bundle

    def resolve(ref) -> str:
        return str(resolve_bundle(ref, precision=args.precision, device=args.device, revision=args.revision,
                                  tokenizer=args.tokenizer))

    if args.several_models:
        refs = list(args.bundle or ()) + list(args.model or ())
        if not refs:
            raise VibeVoiceError(f"{args.command} needs at least one model: a bundle, a checkpoint or a Hub id")
        args.bundle = [resolve(ref) for ref in refs]
        return
    then = args.models_then
    following = getattr(args, then) if then else None
    if isinstance(following, list):  # the model, then a list (transcribe's audio): --model leaves the list whole
        if not args.model:
            args.model, following[:] = following[0], following[1:]
        if not following:
            raise VibeVoiceError(f"give the model and then the {then}: {args.command} MODEL {then.upper()}... "
                                 f"(or --model MODEL {then.upper()}...)")
    elif args.model:
        if args.bundle is not None and (then is None or following is not None):
            raise VibeVoiceError("--model names the model: give it no positional MODEL as well")
        if then:
            setattr(args, then, args.bundle)
    else:
        args.model = args.bundle
    if args.model is None:
        raise VibeVoiceError(f"{args.command} needs a model: a bundle, a checkpoint or a Hub id (or --model)")
    args.bundle = resolve(args.model)


def listen_uri(text: str) -> str:
    """--uri as argparse checks it (exit 2 with usage): errors.listen_address's rule."""
    from .errors import listen_address

    try:
        listen_address(text)
    except VibeVoiceError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_server_options(p) -> None:
    """The limits and settings every server command takes (serve, wyoming), spelled once."""
    p.add_argument("--threads", type=cli_type("threads"), help="onnxruntime threads, shared by all (default: all cores)")
    p.add_argument("--max-active", type=int, default=4, metavar="N", help="generations running at once (default 4)")
    p.add_argument("--max-batch", type=int, default=4, metavar="N", help="concurrent generations of a bundle batched "
                   "step by step, each weight read once for all (transcriptions: their greedy decoding; default 4: on "
                   "2 cores at int8, realtime 1.38x the throughput of one stream, `bench --streams`); 1: each runs on "
                   "its own")
    p.add_argument("--max-queue", type=int, default=16, metavar="N", help="requests waiting for one; beyond, "
                   "refused as busy (HTTP: a 429 with Retry-After; Wyoming: an error event) (default 16)")
    p.add_argument("--max-input-chars", type=int, default=4096, metavar="N", help="longest speech input (default 4096)")
    p.add_argument("--max-upload-mb", type=float, default=25.0, metavar="MB", help="largest upload (default 25)")
    p.add_argument("--log-level", choices=("debug", "info", "warning"), default="info", help="info: a line per "
                   "request; debug: also the traceback of any failure, which info logs as one line with the request's id")
    p.add_argument("--max-frames", type=cli_type("max_frames"), metavar="N", help="the most latent frames a speech "
                   "request may generate, 7.5 a second of audio (default: as many as the model's context holds)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS", help="time for a request body "
                   "to arrive (default 30)")
    p.add_argument("--voice-alias", action="append", metavar="NAME=VOICE", help="map a voice name (OpenAI's alloy, "
                   "echo, ...) to a bundle voice (repeatable)")
    p.add_argument("--force", action="store_true", help="serve bundles that failed their gates or, quantized, "
                   "have not been verified")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vibevoice-onnx",
        description="Turn VibeVoice checkpoints into verified ONNX bundles and run them without PyTorch.",
    )
    parser.add_argument("--version", action=_Version, help="print the package's version and onnxruntime's, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of these; `vibevoice-onnx COMMAND --help` lists its options")

    p = sub.add_parser("inspect", help="recognise a checkpoint and compare it strictly with its layout")
    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR", help="a checkpoint folder as the Hub has it (config.json "
                   "and safetensors shards)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("make-checkpoint", help="write a synthetic checkpoint in the exact hub layout")
    p.add_argument("kind", choices=KINDS, help="the model to imitate")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write (config, shards, tokenizer; for realtime a "
                   "voice preset under voices/)")
    p.add_argument("--size", choices=["tiny", "full"], default="tiny", help="tiny: a few MB with the released layout's "
                   "names and a reduced width and depth, for tests (default); full: the released shapes, for benchmarks")
    p.add_argument("--seed", type=cli_type("seed"), default=0, help="the random weights' seed (default 0)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   help="the weights' dtype (default: the hub checkpoint's, bfloat16 for most kinds)")
    p.add_argument("--variant", choices=["1.5b", "7b"], help="asr-streaming: the released size to make (default 1.5b)")
    p.set_defaults(func=cmd_make_checkpoint)

    p = sub.add_parser("build", help="export a checkpoint into a verified-format ONNX bundle")
    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR", help="the checkpoint folder to export")
    p.add_argument("--graphs", choices=["auto", "written", "traced"], default="auto", help="written: the graphs "
                   "written from the checkpoint without PyTorch (every kind, dynamic shapes; proven equal to the traced "
                   "ones); traced: exported from the PyTorch reference (the export extra); auto (default): written where "
                   "PyTorch is not installed, traced where it is")
    p.add_argument("-o", "--out-root", default="onnx", help="bundles go to OUT_ROOT/KIND/DEVICE_PRECISION (default ./onnx)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="fp32; int8, int4 or int4-mixed weight-only (CPU; int4-mixed: 4 bits only where the "
                   "teacher-forced gates showed it harmless, 8 elsewhere; start from an fp32 bundle of the same "
                   "checkpoint beside it when there is one); int8-decoder (realtime): fp32 but the decoder in "
                   "dynamic int8, the fastest in a browser's WASM; fp16 (GPU only)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the execution provider the bundle is for")
    p.add_argument("--tokenizer", metavar="PATH", help="Qwen2.5 tokenizer.json (file or directory) if the checkpoint has none")
    p.add_argument("--profile", choices=["dynamic", "fixed"], default="dynamic", help="fixed (realtime): every graph "
                   "with static shapes and standard ops, for mobile and NPU engines, written to "
                   "ROOT/realtime/DEVICE_PRECISION_fixed (fp32, int8; fp16 with --device cuda)")
    p.add_argument("--cache", type=int, metavar="N", help="with --profile fixed: the KV caches' capacity, which is "
                   "the model's context in that bundle (default 1024)")
    p.add_argument("--decoder-frames", type=int, metavar="T", help="with --profile fixed: latent frames per decoder "
                   "call (default 3)")
    p.add_argument("--ort-format", action="store_true", help="with --profile fixed: also write each graph in the ORT "
                   "format that onnxruntime-mobile loads (GRAPH.ort beside GRAPH.onnx)")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("verify", help="run the parity gates of a bundle against the PyTorch reference (or, without "
                       "torch, against the fp32 graphs of the same checkpoint)")
    p.add_argument("bundle", nargs="?", metavar="MODEL", help=MODEL_HELP)
    add_model_options(p)
    p.add_argument("--checkpoint", metavar="DIR", help="the source checkpoint (default: the one recorded at build)")
    p.add_argument("--teacher", metavar="FP32_BUNDLE", help="judge the bundle against this fp32 bundle of the same "
                   "checkpoint instead of PyTorch (default without torch: the cpu_fp32 bundle beside it)")
    p.add_argument("--voice", metavar="NAME", help="run the closed loop from this bundle voice "
                   "(default: a prompt the reference computes from the checkpoint)")
    p.add_argument("--json", action="store_true", help="print the parity record as JSON")
    p.set_defaults(func=cmd_verify)

    voices = sub.add_parser("voices", help="import and list a bundle's voices").add_subparsers(
        dest="voices_command", required=True, metavar="ACTION", help="import or list")
    p = voices.add_parser("import", help="add a voice: an upstream preset (.pt) to a realtime bundle, an audio sample "
                          "(wav, flac, ogg, mp3; any rate and channels) to a 1.5B bundle")
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="the bundle to add the voice to")
    p.add_argument("source", metavar="PRESET_OR_SAMPLE", help="a file, or an http(s) URL (downloaded once into the "
                   "cache; Microsoft's realtime presets are files of its GitHub repository)")
    p.add_argument("--name", help="voice name (default: the file's name without extension)")
    p.add_argument("--force", action="store_true", help="replace a voice of the same name")
    p.set_defaults(func=cmd_voices_import)
    p = voices.add_parser("list", help="show each voice: cached prompt lengths (realtime), seconds and frames (1.5B)")
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="the bundle whose voices to list")
    p.add_argument("--json", action="store_true", help="print them as a JSON list")
    p.set_defaults(func=cmd_voices_list)

    p = sub.add_parser("speak", help="synthesise speech with a realtime or 1.5B bundle (no PyTorch needed)")
    p.add_argument("bundle", nargs="?", metavar="MODEL", help=MODEL_HELP + " (or --model; then the text comes first)")
    add_model_options(p, then="text")
    p.add_argument("text", nargs="?", metavar="TEXT", help="text (realtime) or a script of 'Speaker N: text' lines (1.5B); "
                   "or -f FILE, or standard input")
    p.add_argument("-f", "--file", metavar="TEXT_FILE", help="read the text or script from this UTF-8 file")
    p.add_argument("--voice", metavar="VOICE", help="realtime: a voice of the bundle (default: the first), or an "
                   "upstream preset (.pt) by path or http(s) URL (downloaded once)")
    p.add_argument("--speaker", action="append", metavar="N=VOICE", help="the voice of script speaker N (repeat for each "
                   "speaker; a lone speaker may omit N=). 1.5B: a bundle voice or an audio file; realtime: a bundle "
                   "voice, and the script is spoken as a dialogue, one fresh generation per line")
    p.add_argument("--turn-gap", type=cli_type("turn_gap"), metavar="SECONDS", help="realtime dialogue: silence "
                   "between turns (default 0)")
    p.add_argument("--stream-input", action="store_true", help="realtime: read standard input as it arrives and "
                   "speak each 5-token window as soon as it is complete (`llm ... | vibevoice-onnx speak B --stream-input --raw`)")
    p.add_argument("--voice-latents", choices=["sample", "mean"], help="1.5B: draw the voice prompt's σ-VAE noise as "
                   "upstream does (sample, default) or use the encoder mean, for reproducible runs")
    p.add_argument("-o", "--output", metavar="OUT.wav", help="WAV file to write (default speech.wav)")
    p.add_argument("--wav-format", choices=["pcm16", "float32"], default="pcm16", help="the WAV file's (or --raw "
                   "stream's) samples: 16-bit integers (default) or 32-bit floats, which keep what passes ±1")
    p.add_argument("--cfg-scale", type=cli_type("cfg_scale"), help="classifier-free guidance, 0 to 20 (default 1.5 realtime, 1.3 1.5B)")
    p.add_argument("--steps", type=cli_type("steps"), help="diffusion steps per latent, 1 to 999 (default 5 realtime, 10 1.5B)")
    p.add_argument("--seed", type=cli_type("seed"), help="noise seed (default: random, reported)")
    p.add_argument("--noise", metavar="NOISE.npy", help="float32 [frames, 64]: row i is the initial noise of latent i "
                   "(1.5B: --seed may still seed the voice prompt's noise)")
    p.add_argument("--save-latents", metavar="LATENTS.npy", help="save the generated latents [frames, 64]")
    p.add_argument("--max-frames", type=cli_type("max_frames"), metavar="N", help="stop after N frames (7.5 frames per second)")
    p.add_argument("--raw", action="store_true", help="write raw PCM (pcm16 or float32, little endian) to stdout")
    p.add_argument("--threads", type=cli_type("threads"), help="onnxruntime intra-op threads (default: all cores)")
    p.add_argument("--decode-group", type=cli_type("decode_group"), metavar="N", help="realtime: after the first frame, "
                   "decode N frames per call (the decoder's weights are read once per group; default 3)")
    p.add_argument("--force", action="store_true", help="speak with a bundle that failed its gates or, for a "
                   "quantized one, has not been verified")
    p.set_defaults(func=cmd_speak)

    p = sub.add_parser("decode", help="decode saved latents ([frames, 64] .npy) to a WAV in one pass")
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="a TTS bundle of the model that made the latents")
    p.add_argument("latents", metavar="LATENTS.npy", help="latents as `speak --save-latents` writes them")
    p.add_argument("-o", "--output", default="decoded.wav", metavar="OUT.wav", help="the WAV file to write "
                   "(default decoded.wav)")
    p.add_argument("--wav-format", choices=["pcm16", "float32"], default="float32", help="16-bit integer or 32-bit "
                   "float samples (default float32)")
    p.add_argument("--threads", type=cli_type("threads"), help="onnxruntime intra-op threads (default: all cores)")
    p.set_defaults(func=cmd_decode)

    p = sub.add_parser("transcribe", help="transcribe audio files with an ASR bundle (speakers, timestamps)")
    p.add_argument("audio", nargs="+", metavar="[MODEL] AUDIO", help="the model (" + MODEL_HELP + "; or --model), "
                   "then files soundfile reads (any rate and channel count); with --stream, '-' reads raw S16_LE "
                   "mono PCM from standard input")
    add_model_options(p, then="audio")
    p.add_argument("--format", choices=["json", "srt", "vtt", "txt", "raw"],
                   help="default json; with --stream txt (a line per chunk) or json (JSON Lines)")
    p.add_argument("--stream", action="store_true", help="ASR-Streaming bundles: print each chunk's text as it is "
                   "decoded, the audio read as it arrives")
    p.add_argument("--realtime", action="store_true", help="with --stream: play a file at the speed of speech")
    p.add_argument("--sample-rate", type=cli_type("sample_rate"), metavar="HZ",
                   help="with --stream and '-': the PCM's rate (default: the model's, 24000)")
    p.add_argument("--max-tokens-per-chunk", type=cli_type("max_tokens_per_chunk"), metavar="N",
                   help="with --stream: stop a chunk's text after N tokens (default 256, upstream's)")
    p.add_argument("-o", "--output", metavar="OUT", help="a file for one input, a directory for several (default: stdout)")
    p.add_argument("--hotwords", metavar="TEXT", help="names, terms or context to help recognition (upstream's hotword prompt)")
    p.add_argument("--max-new-tokens", type=cli_type("max_new_tokens"), metavar="N", help="stop after N tokens (default 32768)")
    p.add_argument("--seed", type=cli_type("seed"), help="seed of the acoustic latents' noise (default: random)")
    p.add_argument("--mean-latents", action="store_true", help="use the acoustic encoder's mean: a deterministic run")
    p.add_argument("--no-repetition-guard", dest="repetition_guard", action="store_false",
                   help="decode greedily to the end even through a repetition loop (by default a loop is cut back to "
                   "its first occurrence and decoding resumes; docs: troubleshooting)")
    p.add_argument("--threads", type=cli_type("threads"), help="onnxruntime intra-op threads (default: all cores)")
    p.add_argument("--force", action="store_true", help="transcribe with a bundle that failed its gates or, for a "
                   "quantized one, has not been verified")
    p.set_defaults(func=cmd_transcribe)

    p = sub.add_parser("batch", help="many items as a Ray Data job (the cluster extra): synthesize a JSONL of texts, "
                       "or transcribe a folder or JSONL of recordings; resumable, one output and manifest row per item")
    tasks = p.add_subparsers(dest="task", required=True, help="what the job does with each item")
    for task, items_help in (("synthesize", "a JSONL file: one {\"id\", \"text\" | \"script\", \"voice\" | "
                              "\"speakers\", and speak's options (seed, cfg_scale, steps, max_frames, wav_format, "
                              "turn_gap, voice_latents)} a line"),
                             ("transcribe", "a folder of recordings, or a JSONL file: one {\"audio\": PATH, and "
                              "optionally \"id\", \"hotwords\", \"seed\", \"max_new_tokens\"} a line")):
        t = tasks.add_parser(task, help=f"batch {task}: OUT/{'audio/ID.wav' if task == 'synthesize' else 'transcripts/ID.json'}"
                             ", OUT/manifest.jsonl and OUT/manifest.parquet")
        t.add_argument("bundle", nargs="?", metavar="MODEL", help=MODEL_HELP + " (or --model)")
        t.add_argument("items", nargs="?", metavar="ITEMS", help=items_help)
        add_model_options(t, then="items")
        t.add_argument("-o", "--output", required=True, metavar="OUT", help="the job's folder; a rerun skips the items "
                       "already complete there and redoes the rest")
        t.add_argument("--address", help="a running Ray cluster (ray start --head ...); default: a local one for the job")
        t.add_argument("--workers", type=int, default=1, metavar="N", help="workers, each with the bundle loaded once "
                       "(default 1)")
        t.add_argument("--threads-per-worker", type=cli_type("threads"), metavar="N", help="onnxruntime threads of "
                       "each worker (default: this machine's cores divided among the workers)")
        t.add_argument("--defaults", metavar="JSON", help="fields every item has unless it gives its own, as a JSON "
                       "object (e.g. '{\"seed\": 7}'; a folder's recordings have no fields of their own)")
        t.add_argument("--force", action="store_true", help="use a bundle that failed its gates or, quantized, has not "
                       "been verified")
        t.set_defaults(func=cmd_batch)

    p = sub.add_parser("bench", help="time a TTS bundle (realtime, 1.5B, Large): real-time factor, first audio, "
                       "per-graph cost, weight bytes per latent against this machine's memory bandwidth, peak memory, "
                       "and how the cost per latent and the memory move over a long run; an ASR bundle: tokens per "
                       "second of one or several batched transcriptions")
    p.add_argument("bundle", nargs="?", metavar="MODEL", help=MODEL_HELP + " (or --model)")
    add_model_options(p)
    p.add_argument("--reference", metavar="CHECKPOINT_DIR", help="also run the PyTorch reference on the same weights, "
                   "text, voice and noise, in the same run")
    p.add_argument("--frames", type=cli_type("max_frames"), default=48, metavar="N",
                   help="latents to generate, whatever the model decides (default 48 = 6.4 s); a long run (say "
                   "4000) shows how the cost per latent grows with the position")
    p.add_argument("--voice", metavar="NAME", help="a voice of the bundle (default: the first)")
    p.add_argument("--threads", type=cli_type("threads"), help="intra-op threads (default: all cores)")
    p.add_argument("--decode-group", type=cli_type("decode_group"), metavar="N", help="realtime: frames per decoder "
                   "call after the first (default: the runtime's)")
    p.add_argument("--streams", type=cli_type("max_streams"), default=1, metavar="N", help="N generations at once, "
                   "batched on one model (the bundle's voices in turn, different texts; ASR: the --audio recordings in "
                   "turn), and one alone in the same run: throughput, each stream's real-time factor, first audio and "
                   "late frames (ASR: tokens per second, first token)")
    p.add_argument("--audio", nargs="+", metavar="FILE", help="ASR bundles: the recordings to transcribe (--frames: "
                   "greedy tokens each)")
    p.add_argument("--against", metavar="BUNDLE_DIR", help="also time this bundle of the same kind the same way, in "
                   "a child process (its own memory): a fixed-profile bundle against its dynamic sibling, say")
    p.add_argument("--cuda-graphs", action="store_true", help="a fixed-profile CUDA bundle: capture each graph "
                   "once as a CUDA graph and replay it every call (time it against a bench without this flag)")
    p.add_argument("--profile", action="store_true", help="each graph against its floors, per latent (TTS) or token "
                   "(ASR): the weights it reads at the measured bandwidth, its multiply-accumulates at the measured "
                   "float32 and int8 rates, and the operators that take its time (onnxruntime's profiler, on a second run)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw when each latent's audio was ready and "
                   "what each latent cost along the run (needs matplotlib)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("serve", help="an OpenAI-compatible speech and transcription server over bundles (serve extra)")
    p.add_argument("bundle", nargs="*", metavar="MODEL", help="realtime, 1.5B and ASR models, in any mix: " + MODEL_HELP)
    add_model_options(p, several=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=cli_type("port"), default=8000, help="TCP port to listen on (default 8000)")
    add_server_options(p)
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on every route but /health "
                   "(or set VIBEVOICE_API_KEY)")
    p.add_argument("--ray", action="store_true", help="serve as a Ray Serve deployment (the cluster extra): replicas "
                   "that each hold the bundles, behind one address; --threads is then per replica (default: the cores "
                   "divided among the replicas)")
    p.add_argument("--address", help="with --ray: a running Ray cluster (ray start --head ...); default: a local one")
    p.add_argument("--replicas", type=int, metavar="N", help="with --ray: replicas (default 1)")
    p.add_argument("--autoscale", metavar="MIN:MAX", help="with --ray: between MIN and MAX replicas, one more while "
                   "each has more than --max-active requests going")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("wyoming", help="a Wyoming server for Home Assistant's voice assistants: speech and "
                       "transcription, streamed both ways (wyoming extra)")
    p.add_argument("bundle", nargs="*", metavar="MODEL", help="realtime, 1.5B, ASR and ASR-Streaming models, in any "
                   "mix: " + MODEL_HELP)
    add_model_options(p, several=True)
    p.add_argument("--uri", type=listen_uri, default="tcp://127.0.0.1:10200", help="where to listen: tcp://HOST:PORT or unix://PATH "
                   "(default tcp://127.0.0.1:10200, this machine only; tcp://0.0.0.0:10200 for Home Assistant on "
                   "another machine)")
    p.add_argument("--zeroconf", nargs="?", const="vibevoice-onnx", metavar="NAME", help="announce the server on the "
                   "LAN (mDNS) as Wyoming services do, so Home Assistant discovers it (default name vibevoice-onnx)")
    p.add_argument("--seed", type=cli_type("seed"), help="every answer reproducible: the same audio as speak --seed, "
                   "the same transcript as transcribe --seed (default: random)")
    p.add_argument("--max-new-tokens", type=cli_type("max_new_tokens"), metavar="N", help="the most tokens a "
                   "transcript may take (ASR-Streaming: each chunk's, at most 256; default: the model's limits)")
    add_server_options(p)
    p.set_defaults(func=cmd_wyoming)

    p = sub.add_parser("push", help="upload a verified bundle to the Hugging Face Hub, with a model card made from "
                       "its manifest (gates, quantization, files, bench numbers)")
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="a bundle whose gates passed")
    p.add_argument("repo_id", metavar="REPO_ID", help="ORG/NAME (created if missing)")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--revision", metavar="BRANCH", help="push to this branch (created if missing; default main)")
    p.add_argument("--base-model", metavar="ORG/NAME", help="the card's base_model (default: the Hub checkpoint the "
                   "bundle was built from, where it was)")
    p.add_argument("--dry-run", metavar="DIR", help="write exactly what would be uploaded into DIR, upload nothing")
    p.set_defaults(func=cmd_push)

    p = sub.add_parser("pull", help="download a prebuilt bundle from the Hub and check every file against the "
                       "sha256 its manifest records (no torch needed)")
    p.add_argument("repo_id", metavar="REPO_ID", help="ORG/NAME or ORG/NAME@REVISION")
    p.add_argument("--revision", help="a branch, tag or commit")
    p.add_argument("--local-dir", metavar="DIR", help="also copy the checked bundle into DIR (a folder of your own, "
                   "say to import voices into); default: use it from the Hugging Face cache")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("web", help="a static site that runs a realtime bundle in the browser (onnxruntime-web, "
                       "WebGPU or WASM): nothing is computed on a server")
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="a realtime bundle")
    p.add_argument("-o", "--output", required=True, metavar="SITE", help="the folder to write the site into (new or "
                   "empty); serve it with the headers docs/browser.md names")
    p.add_argument("--force", action="store_true", help="replace what SITE holds")
    p.add_argument("--check", nargs="?", const="wasm", choices=["wasm", "webgpu"], metavar="PROVIDER",
                   help="then hold the page to the Python runtime in headless Chromium (tokenizer, every graph, the "
                   "whole loop) on PROVIDER (wasm, the default; webgpu: on Chromium's SwiftShader, WebGPU's kernels on the CPU) and "
                   "write the record into SITE, which the page shows; needs Selenium (the `browser` extra) and "
                   "Chromium with chromedriver")
    p.add_argument("--preview", type=cli_type("port"), metavar="PORT", help="then serve SITE on 127.0.0.1:PORT with the headers it "
                   "needs, to open it in a browser on this machine (0: any free port)")
    p.set_defaults(func=cmd_web)

    cache = sub.add_parser("cache", help="the bundles built from checkpoints on first use ($VIBEVOICE_ONNX_HOME, "
                           "default ~/.cache/vibevoice-onnx)").add_subparsers(dest="cache_command", required=True,
                                                                              metavar="ACTION", help="list or remove")
    p = cache.add_parser("list", help="each cached bundle: its source, kind, variant, size and verdict")
    p.add_argument("--json", action="store_true", help="print them as a JSON list")
    p.set_defaults(func=cmd_cache_list)
    p = cache.add_parser("remove", help="free a source's cached bundles")
    p.add_argument("ref", metavar="REF", help="ORG/NAME (its bundles of every commit), ORG/NAME@REVISION, a "
                   "checkpoint directory, or a bundle's path")
    p.set_defaults(func=cmd_cache_remove)

    p = sub.add_parser("demo", help="the whole path on a tiny synthetic VibeVoice-Realtime checkpoint (about a minute): "
                       "make it, inspect it, build the ONNX bundle, import a voice, verify against PyTorch, speak "
                       "a sentence into WORKDIR/speech.wav")
    p.add_argument("--workdir", default="demo", help="where the checkpoint and outputs go (default ./demo)")
    p.set_defaults(func=cmd_demo)
    _describe_commands(parser)
    return parser


def _describe_commands(parser: argparse.ArgumentParser) -> None:
    """Each command's own --help opens with what the list of commands says of it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for listed in action._choices_actions:
                command = action.choices[listed.dest]
                command.description = command.description or listed.help
                _describe_commands(command)


class _Version(argparse.Action):
    """--version: read when asked, so that other commands do not import onnxruntime to build their parser."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def version_line() -> str:
    """This package's version, onnxruntime's and its execution providers (which tell a GPU build from a CPU one)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("vibevoice-onnx")
    except PackageNotFoundError:  # run from a source tree that was never installed
        ours = "(not installed)"
    import onnxruntime

    # the devices it can run on; Azure's provider calls a remote endpoint and runs nothing here
    devices = [p.removesuffix("ExecutionProvider") for p in onnxruntime.get_available_providers()
               if p != "AzureExecutionProvider"]
    return f"vibevoice-onnx {ours} (onnxruntime {onnxruntime.__version__}, runs on: {', '.join(devices)})"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so every cleanup path (partial files, build directories) runs."""


def _terminate(signum, frame):
    raise Terminated()


def _redelivering_termination(previous_hook):
    """A sys.unraisablehook for while a command runs. The signal handler's exception can land in a weakref
    callback or a __del__ (the garbage collector runs them between any two bytecodes), where Python prints
    and drops it, and the command would run on to the end: send SIGTERM again from another thread, so it is
    raised anew in ordinary code. Anything else goes to the hook that was there before."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, Terminated):
            threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGTERM)).start()
        else:
            previous_hook(unraisable)

    return hook


def _quiet_broken_pipe() -> int:
    """The reader of our standard output went away (`speak --raw | head -c 100`): stop quietly, as Unix
    tools do, and keep Python from complaining again when it flushes stdout at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


# Commands whose process runs onnxruntime sessions and nothing else: as the process's own command line they
# share one thread pool (runtime.bundle.share_threads).
SHARED_POOL_COMMANDS = ("speak", "decode", "transcribe", "bench", "serve", "wyoming")


def _spelled(error: VibeVoiceError) -> str:
    """An error's sentence, a request field named as its option (`--voice`)."""
    from .requests import RequestError

    if isinstance(error, RequestError):
        from .commands import CLI_SPELLING

        return error.spelled(CLI_SPELLING)
    return str(error)


def main(argv: list[str] | None = None) -> int:
    """Run one command. Without `argv` this is the process's own command line (the `vibevoice-onnx` script,
    `python -m vibevoice_onnx.cli`); called with a list, from Python code, it leaves the process's
    onnxruntime settings as they are."""
    args = build_parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _redelivering_termination(previous_hook)
    try:
        if argv is None and args.command in SHARED_POOL_COMMANDS and not getattr(args, "ray", False):
            from .runtime.bundle import share_threads

            share_threads(args.threads)
        if hasattr(args, "model"):
            take_models(args)
        return args.func(args)
    except VibeVoiceError as e:
        print(f"error: {_spelled(e)}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except Terminated:
        print("terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a failed write (a full disk) in a writer's own type; others go on
        from .outputs import os_error_message, writer_os_error

        cause = writer_os_error(e)
        if cause is None:
            raise
        print(f"error: {os_error_message(cause)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        sys.unraisablehook = previous_hook
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
