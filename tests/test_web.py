"""The web page at `/`, in a real browser: Debian's headless Chromium driven by Selenium against a real
`vibevoice-onnx serve` (with an API key) on 127.0.0.1, over tiny bundles of every servable kind. What the
page plays, types, uploads and transcribes is checked against what the runtime or the server's own routes
give for the same seed and the same samples; the page's console must stay free of errors."""

from __future__ import annotations

import base64
import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED, write_voice_sample
from helpers import CHROMEDRIVER, CHROMIUM, KEY, Server, chromium

pytest.importorskip("fastapi")
pytest.importorskip("av")
pytest.importorskip("selenium", reason="selenium is not installed (the `test` extra has it)")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402
from test_serve_live import spoken  # noqa: E402

SPEECH_FIXTURE = SHARED / "fixtures" / "audio" / "demo3-hotwords.wav"
UPLOAD_LIMIT_MB = 0.5
TEXT = "The page plays what speak gives."
if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
    pytest.skip(f"{CHROMIUM} or {CHROMEDRIVER} is missing: run scripts/install-test-system-packages",
                allow_module_level=True)
WAIT = 60  # seconds for anything the page waits on the server for


@pytest.fixture(scope="module")
def server(tiny_bundle, tiny_15b_bundle, tiny_asr_bundle, tiny_streaming_bundle, tmp_path_factory):
    root = tmp_path_factory.mktemp("web-server")
    tts15b = shutil.copytree(tiny_15b_bundle, root / "cpu_fp32")  # the page adds a voice to it
    running = Server([tiny_bundle, tts15b, tiny_asr_bundle, tiny_streaming_bundle], root / "server.log",
                     "--max-upload-mb", str(UPLOAD_LIMIT_MB))
    yield running
    assert running.stop() == 0, (root / "server.log").read_text()


@pytest.fixture(scope="module")
def screens(tmp_path_factory) -> Path:
    """Where each view's screenshot goes; VIBEVOICE_SCREENS names a folder that gets copies too."""
    return tmp_path_factory.mktemp("screens")


def screenshot(driver, screens: Path, name: str) -> None:
    path = screens / f"{name}.png"
    assert driver.save_screenshot(str(path))
    if os.environ.get("VIBEVOICE_SCREENS"):
        target = Path(os.environ["VIBEVOICE_SCREENS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / path.name)


@pytest.fixture(scope="module")
def microphone(tmp_path_factory) -> Path | None:
    """The speech fixture as a 16-bit WAV, what Chromium's fake capture device plays (in a loop)."""
    if not SPEECH_FIXTURE.is_file():
        return None
    import soundfile as sf

    samples, rate = sf.read(str(SPEECH_FIXTURE), dtype="float32")
    path = tmp_path_factory.mktemp("microphone") / "speech.wav"
    sf.write(str(path), samples, rate, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def browser(server, microphone, tmp_path_factory):
    flags = ["--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
             "--use-fake-device-for-media-stream", "--window-size=1000,1200"]
    if microphone is not None:
        flags.append(f"--use-file-for-fake-audio-capture={microphone}")
    driver = chromium(tmp_path_factory.mktemp("chromium"), WAIT, *flags)
    try:
        driver.get(server.url)
        yield driver
    finally:
        driver.quit()


def console_errors(driver, allowed: tuple[str, ...] = ()) -> list[str]:
    """The console's errors since the last call, but those naming one of `allowed` (a status provoked on purpose)."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]


def wait_for(driver, condition, what: str, timeout: float = WAIT):
    return WebDriverWait(driver, timeout).until(lambda d: condition(d), message=f"waiting for {what}")


def element(driver, element_id: str):
    return driver.find_element(By.ID, element_id)


def open_tab(driver, name: str) -> None:
    element(driver, f"tab-{name}").click()
    assert element(driver, f"view-{name}").is_displayed()


def set_field(driver, element_id: str, value) -> None:
    field = element(driver, element_id)
    if not field.is_displayed():  # inside a closed <details>: open it as a user would
        field.find_element(By.XPATH, "ancestor::details/summary").click()
    field.clear()
    field.send_keys(str(value))


def choose(driver, element_id: str, kind: str) -> str:
    """The option of select `element_id` whose label names model kind `kind`; its value (the model id)."""
    select = Select(element(driver, element_id))
    option = next(o for o in select.options if f"({kind}," in o.text)
    select.select_by_value(option.get_attribute("value"))
    return option.get_attribute("value")


def error_line(driver) -> str:
    line = element(driver, "error")
    return line.text if line.is_displayed() else ""


# A Float32Array of the page's, as base64 of its bytes (far smaller and faster through WebDriver than a list).
FLOATS = ("const floats = (a) => { const b = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = '';"
          "for (let i = 0; i < b.length; i += 8192) s += String.fromCharCode(...b.subarray(i, i + 8192));"
          "return btoa(s); };")


def floats(encoded: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded), "<f4")


def played(driver) -> np.ndarray:
    """The samples the page played last (window.__lastAudio), as int16 like `speak --raw`."""
    return np.round(floats(driver.execute_script(FLOATS + "return floats(window.__lastAudio);")) * 32768).astype("<i2")


def sent_pieces(driver) -> list[np.ndarray]:
    """The microphone's samples as the page sent them (window.__liveSent), piece by piece."""
    return [floats(p) for p in driver.execute_script(FLOATS + "return window.__liveSent.map(floats);")]


def spoken_by_the_page(driver) -> np.ndarray:
    wait_for(driver, lambda d: "RTF" in element(d, "speech-stats").text or error_line(d), "the speech to end")
    assert error_line(driver) == "" and "first audio after" in element(driver, "speech-stats").text
    return played(driver)


def api(server, path: str, body: bytes | None = None, content_type: str = "application/json"):
    request = urllib.request.Request(server.url + path, data=body, headers={"Authorization": f"Bearer {KEY}",
                                                                            "Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=WAIT) as response:
        return response.read()


def multipart(fields: dict, files: dict) -> tuple[bytes, str]:
    boundary = "pagetestboundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()]
    for name, path in files.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{path.name}"\r\n'
                     f"Content-Type: audio/wav\r\n\r\n".encode() + path.read_bytes() + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


# ---- the tests, in the order a user would go: key, speak, type, voices, dialogue, transcribe ----

def test_the_page_asks_for_the_key_once_and_shows_the_servers_sentence_for_a_wrong_one(browser, server, screens):
    wait_for(browser, lambda d: element(d, "key-form").is_displayed(), "the key form")
    console_errors(browser, allowed=("401",))  # the page's first call, which found that a key is needed
    set_field(browser, "key", "wrong")
    element(browser, "key").send_keys(Keys.ENTER)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(server.url + "/v1/models", timeout=10)
    expected = json.load(refused.value)["error"]["message"]
    wait_for(browser, lambda d: error_line(d) == expected, "the 401 sentence")
    screenshot(browser, screens, "key")
    assert console_errors(browser, allowed=("401",)) == []
    set_field(browser, "key", KEY)
    element(browser, "key").send_keys(Keys.ENTER)
    wait_for(browser, lambda d: not element(d, "key-form").is_displayed(), "the models")
    assert error_line(browser) == ""
    labels = [o.text for o in Select(element(browser, "speak-model")).options]
    assert any("(realtime, fp32, not verified)" in label for label in labels), labels
    assert [o.text for o in Select(element(browser, "speak-voice")).options] == ["synthetic"]
    # by keyboard: the arrow keys move along the tabs
    element(browser, "tab-speak").send_keys(Keys.ARROW_RIGHT)
    assert browser.switch_to.active_element.get_attribute("id") == "tab-type"
    assert element(browser, "view-type").is_displayed() and not element(browser, "view-speak").is_displayed()
    assert console_errors(browser) == []


def test_speak_plays_as_it_arrives_the_samples_speak_gives(browser, server, tiny_bundle, screens):
    open_tab(browser, "speak")
    choose(browser, "speak-model", "realtime")
    set_field(browser, "speak-text", TEXT)
    set_field(browser, "seed", 21)
    set_field(browser, "frames", 15)
    element(browser, "speak-go").click()
    got = spoken_by_the_page(browser)
    assert np.array_equal(got, spoken(tiny_bundle, 21, 15, TEXT))
    assert element(browser, "speech-download").get_attribute("href").startswith("blob:")
    screenshot(browser, screens, "speak")
    browser.set_window_size(390, 844)  # a phone's width
    screenshot(browser, screens, "speak-phone")
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 390
    browser.set_window_size(1000, 1200)
    assert console_errors(browser) == []


def test_typed_text_streams_in_and_gives_the_whole_texts_audio(browser, server, tiny_bundle, screens):
    open_tab(browser, "type")
    choose(browser, "type-model", "realtime")
    set_field(browser, "seed", 24)
    set_field(browser, "frames", 30)
    element(browser, "type-text").clear()
    for word in TEXT.split(" "):  # the socket opens at the first key; the rest follows as typed
        element(browser, "type-text").send_keys(word + " ")
    element(browser, "type-done").click()
    got = spoken_by_the_page(browser)
    assert np.array_equal(got, spoken(tiny_bundle, 24, 30, TEXT + " "))
    screenshot(browser, screens, "type")
    element(browser, "type-text").send_keys("And on.")  # typing on after the end speaks only the new text
    element(browser, "type-done").click()
    assert np.array_equal(spoken_by_the_page(browser), spoken(tiny_bundle, 24, 30, "And on."))
    assert console_errors(browser) == []


def test_a_voice_uploaded_from_the_page_is_listed_and_usable(browser, server, tmp_path, screens):
    open_tab(browser, "voices")
    model = choose(browser, "voice-model", "1.5b")
    set_field(browser, "voice-name", "bob")
    element(browser, "voice-file").send_keys(str(write_voice_sample(tmp_path / "bob.wav", pitch=120.0)))
    element(browser, "voice-go").click()
    wait_for(browser, lambda d: "voice 'bob' added" in element(d, "voice-status").text, "the new voice")
    assert f"bob ({model})" in element(browser, "voice-list").text
    voices = json.loads(api(server, f"/v1/audio/voices?model={model}"))["voices"]
    assert [v["id"] for v in voices] == ["alice", "bob"]
    screenshot(browser, screens, "voices")
    assert console_errors(browser) == []


def test_a_script_speaks_with_a_voice_per_speaker(browser, server, screens):
    open_tab(browser, "script")
    model = choose(browser, "script-model", "1.5b")
    script = "Speaker 1: Hello there!\nSpeaker 2: Hi, lovely to be here."
    set_field(browser, "script-text", script)
    Select(element(browser, "script-voice-1")).select_by_value("alice")
    Select(element(browser, "script-voice-2")).select_by_value("bob")
    set_field(browser, "seed", 5)
    set_field(browser, "frames", 12)
    element(browser, "script-go").click()
    got = spoken_by_the_page(browser)
    expected = api(server, "/v1/audio/speech", json.dumps({"model": model, "input": script, "voice": "alice,bob",
                                                            "response_format": "pcm", "seed": 5,
                                                            "max_frames": 12}).encode())
    assert len(got) > 0 and np.array_equal(got, np.frombuffer(expected, "<i2"))
    screenshot(browser, screens, "dialogue")
    assert console_errors(browser) == []


def test_a_file_transcribes_as_the_route_does(browser, server, tmp_path, screens):
    import soundfile as sf

    from test_serve import speech_like

    path = tmp_path / "speech.wav"
    sf.write(str(path), speech_like(2.0), 24000, subtype="PCM_16")
    open_tab(browser, "transcribe")
    model = choose(browser, "asr-model", "asr")
    set_field(browser, "asr-tokens", 6)
    set_field(browser, "asr-seed", 4)
    element(browser, "asr-file").send_keys(str(path))
    element(browser, "asr-go").click()
    wait_for(browser, lambda d: "s of audio in" in element(d, "asr-status").text, "the transcript")
    got = browser.execute_script("return window.__lastTranscript")
    body, kind = multipart({"model": model, "response_format": "verbose_json", "max_new_tokens": 6, "seed": 4},
                           {"file": path})
    expected = json.loads(api(server, "/v1/audio/transcriptions", body, kind))
    assert got["text"] == expected["text"] and got["segments"] == expected["segments"]
    assert element(browser, "asr-text").text == expected["text"].strip()
    assert element(browser, "asr-exports").is_displayed()
    assert element(browser, "record").is_enabled() and not element(browser, "record-stop").is_enabled()
    screenshot(browser, screens, "transcribe")
    assert console_errors(browser) == []


def test_an_oversized_upload_shows_the_servers_sentence(browser, server, tmp_path):
    import soundfile as sf

    path = tmp_path / "long.wav"
    sf.write(str(path), np.zeros(int(UPLOAD_LIMIT_MB * 2**20), np.int16) + 1, 24000, subtype="PCM_16")  # 2x the limit
    open_tab(browser, "transcribe")
    choose(browser, "asr-model", "asr")
    element(browser, "asr-file").send_keys(str(path))
    element(browser, "asr-go").click()
    wait_for(browser, lambda d: error_line(d), "the error")
    assert error_line(browser) == f"the upload is larger than the limit of {UPLOAD_LIMIT_MB:g} MB"
    assert console_errors(browser, allowed=("413",)) == []


def start_recording(browser, kind: str, tokens: int, seed: int, heard: str) -> str:
    """The Transcribe view on a model of `kind`, recording from the fake microphone until the script `heard`
    (run in the page) is true: the model's id."""
    open_tab(browser, "transcribe")
    model = choose(browser, "asr-model", kind)
    set_field(browser, "asr-tokens", tokens)
    set_field(browser, "asr-seed", seed)
    # the page sets its test hooks once the microphone is open: the last recording's must not answer for this one
    browser.execute_script("window.__liveSent = undefined")
    element(browser, "record").click()
    wait_for(browser, lambda d: d.execute_script(heard), "the microphone")
    return model


def test_live_transcription_from_the_microphone_shows_each_chunk_the_server_decodes(browser, server, microphone,
                                                                                     screens):
    if microphone is None:
        pytest.skip(f"{SPEECH_FIXTURE} is not available")
    from websockets.sync.client import connect

    model = start_recording(browser, "asr-streaming", 4, 3, "return (window.__liveSent || []).length >= 10")
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#asr-chunks li"), "a chunk while recording")
    element(browser, "record-stop").click()
    wait_for(browser, lambda d: d.execute_script("return window.__liveDone === true"), "the last chunk")
    chunks = browser.execute_script("return window.__liveChunks")
    sent = sent_pieces(browser)
    rate = browser.execute_script("return window.__liveRate")
    screenshot(browser, screens, "live")
    # the server given exactly the samples the page sent, in the same pieces, with the same settings
    with connect(f"ws://127.0.0.1:{server.port}/v1/stream", additional_headers={"Authorization": f"Bearer {KEY}"},
                 max_size=None) as ws:
        ws.send(json.dumps({"model": model, "sample_rate": rate, "format": "f32le", "max_tokens": 4, "seed": 3}))
        for piece in sent:
            ws.send(piece.tobytes())
        ws.send("end")
        expected = []
        while not (message := json.loads(ws.recv(timeout=WAIT))).get("done"):
            expected.append(message)
    assert len(chunks) >= 2
    assert [(c["chunk"], c["text"]) for c in chunks] == [(c["chunk"], c["text"]) for c in expected]
    shown = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#asr-chunks li")]
    assert len(shown) == len(chunks) and all(c["text"].strip() in s for c, s in zip(chunks, shown))
    assert element(browser, "asr-text").text == message["text"].strip()
    assert console_errors(browser) == []


def test_a_recording_on_a_whole_file_model_is_transcribed_as_the_route_transcribes_it(browser, server, microphone,
                                                                                      tmp_path):
    """On an ASR model that is not streaming, the page records, then uploads what it recorded as a 16-bit WAV."""
    if microphone is None:
        pytest.skip(f"{SPEECH_FIXTURE} is not available")
    import soundfile as sf

    model = start_recording(browser, "asr", 6, 4,  # a second of it, past the fixture's quiet start
                            "return (window.__liveSent || []).slice(5).some(p => p.some(v => Math.abs(v) > 0.1))")
    element(browser, "record-stop").click()
    wait_for(browser, lambda d: "s of audio in" in element(d, "asr-status").text or error_line(d), "the transcript")
    assert error_line(browser) == ""
    sent = np.concatenate(sent_pieces(browser))
    path = tmp_path / "recording.wav"  # as the page writes it: Math.round(v * 32768), clipped to 16 bits
    sf.write(str(path), np.clip(np.floor(sent * 32768 + 0.5), -32768, 32767).astype(np.int16),
             browser.execute_script("return window.__liveRate"), subtype="PCM_16")
    body, kind = multipart({"model": model, "response_format": "verbose_json", "max_new_tokens": 6, "seed": 4},
                           {"file": path})
    expected = json.loads(api(server, "/v1/audio/transcriptions", body, kind))
    got = browser.execute_script("return window.__lastTranscript")
    assert got["text"] == expected["text"] and got["segments"] == expected["segments"]
    assert abs(expected["duration"] - len(sent) / browser.execute_script("return window.__liveRate")) < 0.01
    assert console_errors(browser) == []
