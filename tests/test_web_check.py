"""web --check's own judging, without a browser: how close two outputs are, the whole loop's verdict, the page's
arithmetic for the Python side, and the graph-call replay against a caller (here onnxruntime itself, answering in
the page's wire form). The browser and Node.js run the same functions in test_browser_site and test_javascript."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.web.check import (LOOP_COSINE, LOOP_FRAMES, LOOP_GAIN, closeness, gain, graph_calls, leveled,
                                      loop_rows, loop_verdict, page_arithmetic, whole_loop)


@pytest.mark.parametrize("got, expected, difference, cosine", [
    ([1.0, -2.0, 4.0], [1.0, -2.0, 4.0], 0.0, 1.0),
    ([1.0, -2.0, 3.0], [1.0, -2.0, 4.0], 0.25, 0.9914601339836675),  # |3 - 4| of scale 4
    ([2.0, -4.0, 8.0], [1.0, -2.0, 4.0], 1.0, 1.0),  # twice as loud: the cosine cannot see it
    ([-1.0, 2.0], [1.0, -2.0], 2.0, -1.0),
    ([0.0, 1.0], [1.0, 0.0], 1.0, 0.0),
    ([0.1, 0.2], [0.1, 0.4], 0.5, 0.9761870601839527),  # a scale below 1 is the scale
    ([0.5, 0.5], [0.0, 0.0], 0.5, 1.0),  # nothing expected: scale 1, no direction
    ([3.0], [2.0], 0.5, 1.0),  # one value has no direction
    ([], [], 0.0, 1.0),
])
def test_closeness_is_the_largest_difference_of_scale_and_the_cosine(got, expected, difference, cosine):
    measured = closeness(np.array(got), np.array(expected))
    assert measured == pytest.approx((difference, cosine), abs=1e-12)


def test_gain_is_rms_over_rms_and_one_where_nothing_was_expected():
    assert gain([2.0, -2.0], [1.0, -1.0]) == pytest.approx(2.0)
    assert gain([0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert gain([1.0], [0.0]) == 1.0


def _loop(frames=(14, 14), cosine=1.0, gain_=1.0) -> dict:
    return {"frames": frames, "cosine": cosine, "difference": 0.01, "gain": gain_}


@pytest.mark.parametrize("precision, exactness", [("fp32", "fp32"), ("int8", "quantized"), ("int4", "quantized")])
def test_the_whole_loop_passes_at_its_limits_and_fails_past_any_of_them(precision, exactness):
    lowest = LOOP_COSINE[exactness]
    verdict = loop_verdict(_loop(cosine=lowest, gain_=1 + LOOP_GAIN), precision)
    assert verdict == {"name": "the whole loop against speak --noise", "frames": [14, 14], "cosine": lowest,
                       "largest_difference": 0.01, "gain": 1 + LOOP_GAIN,
                       "limit": {"cosine": lowest, "gain": LOOP_GAIN}, "passed": True}
    assert loop_verdict(_loop(gain_=1 - LOOP_GAIN / 2), precision)["passed"]  # quieter, within the limit
    for failing in (_loop(frames=(13, 14)), _loop(cosine=lowest - 1e-6), _loop(gain_=1 + LOOP_GAIN + 1e-6),
                    _loop(gain_=1 - LOOP_GAIN - 1e-6)):
        assert not loop_verdict(failing, precision)["passed"], failing


def test_the_page_arithmetic_of_an_int8_bundle_is_a_copy_at_accuracy_level_0(tiny_int8_bundle):
    """x86's int8 activations (accuracy level 4) differ by instruction set; the page computes at level 0. The copy
    is a bundle whose files are recorded as they now are; the bundle itself is left alone, and an fp32 bundle
    (nothing to change) is itself."""
    import onnx

    from vibevoice_onnx.runtime.bundle import Bundle

    levels = lambda folder: {p.name: [a.i for a in leveled(onnx.load(p, load_external_data=False))]  # noqa: E731
                             for p in sorted(folder.glob("*.onnx"))}
    before = levels(tiny_int8_bundle)
    assert any(before.values()) and all(set(v) <= {4} for v in before.values())
    with page_arithmetic(tiny_int8_bundle) as twin:
        assert twin != tiny_int8_bundle and twin.name == tiny_int8_bundle.name
        assert not any(levels(twin).values())
        nodes = [n for p in twin.glob("*.onnx") for n in onnx.load(p, load_external_data=False).graph.node
                 if n.op_type == "MatMulNBits"]
        assert nodes and all(a.i == 0 for n in nodes for a in n.attribute if a.name == "accuracy_level")
        Bundle(twin).check_files()  # recorded as it now is
        manifest = json.loads((twin / "manifest.json").read_text())
        assert manifest["files"] != json.loads((tiny_int8_bundle / "manifest.json").read_text())["files"]
    assert not twin.exists() and levels(tiny_int8_bundle) == before


def test_an_fp32_bundle_is_its_own_page_arithmetic(tiny_bundle):
    with page_arithmetic(tiny_bundle) as same:
        assert same == tiny_bundle


def _onnxruntime_caller(bundle_dir, answer=None):
    """Each graph call run by onnxruntime on `bundle_dir`, answered in the page's wire form (or as `answer` says)."""
    import onnxruntime as ort

    from vibevoice_onnx.web.parity import unwire, wire

    def call(requests):
        results = []
        for request in requests:
            session = ort.InferenceSession(str(bundle_dir / f"{request['name']}.onnx"), providers=["CPUExecutionProvider"])
            feeds = {name: unwire(value) for name, value in request["feeds"].items()}
            outputs = session.run(request["fetches"], feeds)
            results.append({name: wire(value) for name, value in zip(request["fetches"], outputs)})
        return [answer(r, result) if answer else result for r, result in zip(requests, results)]

    return call


def test_graph_calls_measure_each_output_of_each_graph_against_python(tiny_bundle):
    measured = graph_calls(_onnxruntime_caller(tiny_bundle), tiny_bundle)
    assert len(measured) >= 7 and all("." in name for name in measured)
    assert all(d <= 1e-6 and c >= 1 - 1e-9 for d, c in measured.values()), measured


def test_graph_calls_name_the_graph_a_caller_could_not_run_or_gave_the_wrong_shape(tiny_bundle):
    from vibevoice_onnx.web.parity import unwire, wire

    def failing(request, result):
        return {"error": "no such kernel"} if request["name"] == "acoustic_connector" else result

    with pytest.raises(VibeVoiceError, match="^the JavaScript module could not run acoustic_connector: no such kernel$"):
        graph_calls(_onnxruntime_caller(tiny_bundle, failing), tiny_bundle)

    def flattened(request, result):
        if request["name"] != "acoustic_connector":
            return result
        return {name: wire(unwire(value).reshape(-1)) for name, value in result.items()}

    with pytest.raises(VibeVoiceError, match=r"^acoustic_connector\.embeddings: JavaScript gave shape \(\d+,\), "
                                             r"Python \(1, 1, \d+\)$"):
        graph_calls(_onnxruntime_caller(tiny_bundle, flattened), tiny_bundle)


def _python_speaker(bundle_dir, heard: list, change=lambda samples, rate: (samples, rate)):
    """A JavaScript speaker's contract kept by the Python runtime itself: (text, noise rows, frames, voice) ->
    {samples, rate, frames}; `change` alters what it answers."""
    from vibevoice_onnx.runtime.speech import open_tts
    from vibevoice_onnx.sampling import NoiseSource

    def speak(text, rows, frames, voice):
        heard.append(voice)
        samples, rate = open_tts(bundle_dir).create(text, voice=voice, noise=NoiseSource(rows=rows), max_frames=frames)
        samples, rate = change(samples, rate)
        return {"samples": samples.tolist(), "rate": rate, "frames": frames}

    return speak


def test_the_whole_loop_holds_a_speaker_to_python_and_a_wrong_rate_or_length_to_nothing(tiny_bundle):
    """The noise rows are float32 (what the page's Float32Array holds, so both sides draw the same noise); a speaker
    that speaks as Python does measures cosine 1; one answering at another rate, or another length, fails whole."""
    assert loop_rows().dtype == np.float32 and loop_rows(3).shape == (3, 64)
    heard = []
    same = whole_loop(_python_speaker(tiny_bundle, heard), tiny_bundle, "synthetic", frames=4)
    assert heard == ["synthetic"] and same["frames"] == (4, 4)
    assert same["cosine"] == pytest.approx(1.0, abs=1e-12) and same["difference"] == 0.0 and same["gain"] == 1.0
    for change in (lambda samples, rate: (samples, rate + 1), lambda samples, rate: (samples[:-1], rate)):
        off = whole_loop(_python_speaker(tiny_bundle, [], change), tiny_bundle, "synthetic", frames=4)
        assert (off["cosine"], off["difference"], off["gain"]) == (0.0, float("inf"), 0.0)
        assert not loop_verdict(off, "fp32")["passed"]
    assert LOOP_FRAMES == len(loop_rows())
