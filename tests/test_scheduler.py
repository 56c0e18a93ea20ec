"""The DPM-Solver++ sampler against diffusers' DPMSolverMultistepScheduler and the facts sheet's numbers."""

import numpy as np
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler

from vibevoice_onnx.sampling import DpmSolverSchedule, NoiseSource, sample_latent


def diffusers_scheduler(steps):
    scheduler = DPMSolverMultistepScheduler(
        num_train_timesteps=1000,
        beta_schedule="squaredcos_cap_v2",
        prediction_type="v_prediction",
        algorithm_type="dpmsolver++",
        solver_order=2,
        solver_type="midpoint",
        lower_order_final=True,
        final_sigmas_type="zero",
        timestep_spacing="linspace",
    )
    scheduler.set_timesteps(steps)
    return scheduler


def toy_velocity(seed):
    w = np.random.default_rng(seed).standard_normal((64, 64)).astype(np.float32) / 8
    return lambda x, t: (np.tanh(w @ x) * (1 + t / 1000)).astype(np.float32)


@pytest.mark.parametrize("steps", [1, 5, 10, 20])
def test_matches_diffusers_step_by_step(steps):
    ours = DpmSolverSchedule.create(steps)
    theirs = diffusers_scheduler(steps)
    assert ours.timesteps.tolist() == theirs.timesteps.tolist()
    np.testing.assert_allclose(ours.sigmas, theirs.sigmas.numpy(), rtol=1e-6)
    velocity = toy_velocity(steps)
    x = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    x_theirs = torch.from_numpy(x.copy())
    x0_prev = None
    for k, t in enumerate(ours.timesteps):
        v = velocity(x, t)
        x0 = ours.to_x0(k, x, v)
        x = ours.update(k, x, x0, x0_prev)
        x0_prev = x0
        x_theirs = theirs.step(torch.from_numpy(velocity(x_theirs.numpy(), t)), theirs.timesteps[k], x_theirs).prev_sample
        np.testing.assert_allclose(x, x_theirs.numpy(), atol=2e-5, rtol=1e-5, err_msg=f"step {k}")


def test_facts_sheet_schedule_numbers():
    s = DpmSolverSchedule.create(5)
    assert s.timesteps.tolist() == [999, 799, 599, 400, 200]
    np.testing.assert_allclose(s.sigmas, [20291.3, 3.10373, 1.39075, 0.740281, 0.337461, 0], rtol=2e-5)
    s10 = DpmSolverSchedule.create(10)
    assert s10.timesteps.tolist() == [999, 899, 799, 699, 599, 500, 400, 300, 200, 100]


def test_final_step_returns_the_data_prediction():
    s = DpmSolverSchedule.create(5)
    x = np.ones(64, np.float32)
    x0 = np.full(64, 0.25, np.float32)
    assert np.array_equal(s.update(4, x, x0, x0 * 2), x0)


def test_cfg_combines_as_upstream():
    # v = v_neg + cfg·(v_pos − v_neg), applied to the one sample: the same as sampling with that velocity.
    s = DpmSolverSchedule.create(5)
    noise = NoiseSource.from_seed(3)(0)
    positive, negative = toy_velocity(0), toy_velocity(1)
    guided = sample_latent(s, noise, lambda x, t: (positive(x, t), negative(x, t)), cfg_scale=1.5)
    combined = lambda x, t: negative(x, t) + 1.5 * (positive(x, t) - negative(x, t))  # noqa: E731
    expected = sample_latent(s, noise, lambda x, t: (combined(x, t), combined(x, t)), cfg_scale=1.0)
    np.testing.assert_allclose(guided, expected, atol=1e-5)
    swapped = sample_latent(s, noise, lambda x, t: (negative(x, t), positive(x, t)), cfg_scale=1.5)
    assert not np.allclose(guided, swapped, atol=1e-3)


def test_noise_sources(tmp_path):
    seeded = NoiseSource.from_seed(7)
    assert np.array_equal(seeded(3), NoiseSource.from_seed(7)(3))
    assert not np.array_equal(seeded(3), seeded(4))
    rows = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    np.save(tmp_path / "noise.npy", rows)
    from_file = NoiseSource.from_file(tmp_path / "noise.npy")
    assert np.array_equal(from_file(2), rows[2])
    from vibevoice_onnx.errors import VibeVoiceError

    with pytest.raises(VibeVoiceError, match="4 rows"):
        from_file(4)
    np.save(tmp_path / "bad.npy", rows[:, :10])
    with pytest.raises(VibeVoiceError, match=r"shape \[frames, 64\]"):
        NoiseSource.from_file(tmp_path / "bad.npy")
    np.savez(tmp_path / "several.npz", a=rows)
    with pytest.raises(VibeVoiceError, match="several arrays"):
        NoiseSource.from_file(tmp_path / "several.npz")
    (tmp_path / "empty.npy").write_bytes(b"")
    with pytest.raises(VibeVoiceError, match="not a readable .npy noise file"):
        NoiseSource.from_file(tmp_path / "empty.npy")


def test_one_step_and_the_bounds_of_the_steps():
    """One step is allowed (upstream's range starts at 1) and equals diffusers'; 0 and the training length are
    refused in one sentence; timesteps are integers and sigmas fp32, as the graphs take them."""
    from vibevoice_onnx.errors import VibeVoiceError

    one = DpmSolverSchedule.create(1)
    assert one.timesteps.tolist() == [999] and one.timesteps.dtype == np.int64 and one.sigmas.dtype == np.float32
    assert DpmSolverSchedule.create(5).sigmas.dtype == np.float32
    for steps in (0, 1000):
        with pytest.raises(VibeVoiceError, match=f"diffusion steps must be from 1 to 999, got {steps}"):
            DpmSolverSchedule.create(steps)
    with pytest.raises(VibeVoiceError, match="beta schedule 'linear' is not supported"):
        DpmSolverSchedule.create(5, beta_schedule="linear")


def test_the_sampler_computes_no_infinity_or_nan_on_the_way():
    """The last step (sigma 0) returns the data prediction directly: taking it through the general update would
    divide by zero and take log(0), and land on the same numbers only by luck of IEEE arithmetic."""
    s = DpmSolverSchedule.create(5)
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        latent = sample_latent(s, NoiseSource.from_seed(5)(0), lambda x, t: (toy_velocity(0)(x, t),) * 2, 1.5)
    assert latent.dtype == np.float32 and np.isfinite(latent).all()


class _Marks:
    """A pickle whose loading writes a file: the trace of code run by an unpickler."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_noise_file_is_read_without_pickles_and_checked(tmp_path):
    """Noise files are untrusted input: an object array (a pickle inside an .npy) is refused, never unpickled;
    so are an empty file of rows, integers and non-finite values. What is taken records where it came from."""
    from vibevoice_onnx.errors import VibeVoiceError

    marker = tmp_path / "unpickled"
    np.save(tmp_path / "objects.npy", np.array([_Marks(str(marker))], dtype=object), allow_pickle=True)
    with pytest.raises(VibeVoiceError):
        NoiseSource.from_file(tmp_path / "objects.npy")
    assert not marker.exists()  # loading it would have run the pickle's code
    for name, rows, sentence in (("none.npy", np.zeros((0, 64), np.float32), "at least one frame"),
                                 ("ints.npy", np.ones((2, 64), np.int32), "finite floating-point"),
                                 ("nan.npy", np.full((2, 64), np.nan, np.float32), "finite floating-point")):
        np.save(tmp_path / name, rows)
        with pytest.raises(VibeVoiceError, match=sentence):
            NoiseSource.from_file(tmp_path / name)
    rows = np.ones((1, 8), np.float64)
    np.save(tmp_path / "small.npy", rows)
    taken = NoiseSource.from_file(tmp_path / "small.npy", latent_size=8)
    assert taken.latent_size == 8 and taken.origin == str(tmp_path / "small.npy") and taken(0).dtype == np.float32
    seeded = NoiseSource.from_seed(9, latent_size=8)
    assert seeded.origin == "seed 9" and seeded(0).shape == (8,)


@pytest.mark.parametrize("logit", [-100.0, -20.0, -3.5, -1e-3, 0.0, 1e-3, 0.7, 3.5, 20.0, 100.0])
def test_the_eos_probability_is_the_logistic_of_the_logit(logit):
    """The EOS classifier's probability, in fp32 as upstream's torch.sigmoid, for either sign and far out."""
    from vibevoice_onnx.generation.realtime import eos_fires, sigmoid

    with np.errstate(over="raise", divide="raise", invalid="raise"):
        p = sigmoid(logit)
    assert p.dtype == np.float32
    assert p == pytest.approx(float(torch.sigmoid(torch.tensor(logit, dtype=torch.float32))), rel=1e-6, abs=1e-30)
    assert eos_fires(logit) == (logit > 0)
