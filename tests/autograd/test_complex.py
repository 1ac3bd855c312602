"""Complex autograd under the conjugate Wirtinger convention: the gradient is dL/dz* (times 2
as PyTorch reports it, i.e. dL/dx + i dL/dy for a real loss L)."""

from __future__ import annotations

import gradwire as gw
import numpy as np
import pytest

Z = np.array([1 + 2j, -0.5 + 1j, 3 - 1j])


def z_leaf():
    return gw.tensor(Z, requires_grad=True)


def test_squared_magnitude_gives_two_z():
    z = z_leaf()
    (z.abs() ** 2).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), 2 * Z)


def test_z_times_conj_z_gives_two_z():
    z = z_leaf()
    (z * z.conj()).real.sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), 2 * Z)


def test_real_part_of_c_times_z_gives_conj_c():
    c = 2 + 3j
    z = z_leaf()
    (z * c).real.sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), np.full(3, np.conj(c)))


def test_imag_part_gives_i_and_real_part_gives_one():
    z = z_leaf()
    z.imag.sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), np.full(3, 1j))
    z = z_leaf()
    z.real.sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), np.ones(3))


def test_abs_gives_z_over_abs_z():
    z = z_leaf()
    z.abs().sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), Z / np.abs(Z))


def test_holomorphic_function_gets_grad_output_times_conj_derivative():
    # L = Re(sum(v* . exp(z))) has gradient v . conj(exp(z)) under the convention.
    z = z_leaf()
    v = np.array([1.0, 1j, 2 - 1j])
    y = z.exp()
    y.backward(gw.tensor(v))
    np.testing.assert_allclose(z.grad.numpy(), v * np.conj(np.exp(Z)))


def test_real_input_through_complex_ops_gets_a_real_gradient():
    # R -> C -> R: the convention does not matter, the result must match the real derivative.
    x = gw.tensor([0.3, -1.2], dtype=gw.float64, requires_grad=True)
    c = gw.tensor([1 + 2j, 2 - 1j])
    ((x * c).abs() ** 2).sum().backward()
    assert x.grad.dtype == gw.float64
    np.testing.assert_allclose(
        x.grad.numpy(), 2 * x.detach().numpy() * np.abs([1 + 2j, 2 - 1j]) ** 2
    )


def test_real_to_complex_cast_gradient_is_the_real_part():
    x = gw.tensor([0.5, 1.5], dtype=gw.float64, requires_grad=True)
    y = x.to(gw.complex128) * (1 + 2j)
    y.backward(gw.tensor([1 + 1j, 2 - 1j]))
    # 2 * Re(grad_out^* ds/dz^*) form of the seed reduces to Re(conj(c) * g) here.
    np.testing.assert_allclose(
        x.grad.numpy(), np.real(np.conj(1 + 2j) * np.array([1 + 1j, 2 - 1j]))
    )


def test_gradient_descent_on_complex_parameter_converges():
    # Minimizing |z - target|^2 with the reported gradient must move z to the target.
    target = np.array([2 - 1j, -1 + 0.5j])
    z = gw.tensor([0j, 0j], requires_grad=True)
    t = gw.tensor(target)
    for _ in range(100):
        loss = ((z - t).abs() ** 2).sum()
        (g,) = gw.autograd.grad(loss, z)
        with gw.no_grad():
            z.sub_(0.1 * g)
    np.testing.assert_allclose(z.detach().numpy(), target, atol=1e-6)


def test_complex_scalar_output_needs_an_explicit_gradient():
    z = z_leaf()
    with pytest.raises(RuntimeError, match="real scalar outputs"):
        (z * z).sum().backward()
