"""Curvature numerics (`tgo.optimisation.curvature`) against a tiny ViT's full Hessian.

The reference is ``torch.autograd.functional.hessian`` (reverse over reverse, vectorised) of the loss over the
flattened parameters (``torch.func.functional_call``): 415 parameters, so the 415 x 415 float64 Hessian and its
``numpy.linalg.eigvalsh`` are exact to round-off and cheap. Everything the family records is checked against it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import timm
import torch
from torch.func import functional_call

from tgo.optimisation.curvature import (
    HessianOperator,
    adam_preconditioner,
    curvature_batch_indices,
    hutchinson_samples,
    lanczos,
    rademacher_probe,
    stability_threshold,
    trace_estimate,
    unfused_eval,
)

IMAGES = 6


def tiny_net() -> torch.nn.Module:
    """A 1-block ViT of width 4 at 8 px (4 patches + CLS, 3 classes): 415 parameters, float64."""
    torch.manual_seed(0)
    net = timm.create_model(
        "vit_tiny_patch16_224", img_size=8, patch_size=4, embed_dim=4, depth=1, num_heads=2, mlp_ratio=2, num_classes=3
    )
    return net.double().eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(IMAGES, 3, 8, 8, generator=g, dtype=torch.float64), torch.arange(IMAGES) % 3


def full_hessian(net: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """The brute-force Hessian of the mean cross-entropy over every parameter, unfused attention, eval mode."""
    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for p in net.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])

    def loss(theta: torch.Tensor) -> torch.Tensor:
        parts = [t.view(s) for t, s in zip(torch.split(theta, [s.numel() for s in shapes]), shapes, strict=True)]
        logits = functional_call(net, dict(zip(names, parts, strict=True)), (images,))
        return torch.nn.functional.cross_entropy(logits, labels)

    with unfused_eval(net):
        h = torch.autograd.functional.hessian(loss, flat, vectorize=True)
    return h.detach().numpy()


@pytest.fixture(scope="module")
def problem() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, np.ndarray]:
    net = tiny_net()
    images, labels = batch()
    return net, images, labels, full_hessian(net, images, labels)


def test_hessian_vector_products_equal_the_full_hessian_in_chunks_and_float32(problem):
    net, images, labels, h = problem
    assert np.abs(h - h.T).max() <= 1e-12 * np.abs(h).max()
    v = np.random.default_rng(0).standard_normal(h.shape[0])
    want = h @ v
    for chunk in (IMAGES, 4, 1):  # one forward; 4 + 2 images; every image alone
        got = HessianOperator(net, images, labels, batch_size=chunk).matvec(v)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    low = HessianOperator(net, images, labels, dtype=torch.float32).matvec(v)
    assert np.abs(low - want).max() <= 1e-5 * np.abs(want).max()  # float32 products, measured ~1e-7 here


def test_lanczos_top_eigenvalues_to_1e_6_and_residuals_bound_the_error(problem):
    net, images, labels, h = problem
    exact = np.linalg.eigvalsh(h)[::-1]
    op = HessianOperator(net, images, labels)
    result = lanczos(op.matvec, op.dim, k=5, iterations=200, tol=1e-9, seed=0)
    assert result.converged and result.steps < 200 and op.products == result.steps
    np.testing.assert_allclose(result.eigenvalues, exact[:5], rtol=1e-6)
    assert np.all(result.residuals <= 1e-9 * abs(result.eigenvalues[0]))
    # early stop: every Ritz value lies within its residual of some eigenvalue (symmetric A), not necessarily its own
    early = lanczos(op.matvec, op.dim, k=5, iterations=8, tol=1e-12, seed=0)
    assert not early.converged and early.steps == 8
    nearest = np.abs(early.eigenvalues[:, None] - exact[None, :]).min(axis=1)
    assert np.all(nearest <= early.residuals * (1 + 1e-8) + 1e-12)
    assert np.all(early.eigenvalues <= exact[:5] + 1e-10)  # Ritz values interlace: below the eigenvalues they track


def test_lanczos_on_an_explicit_matrix_finds_an_invariant_subspace():
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.standard_normal((30, 30)))
    a = (q * np.r_[10.0, 5.0, 5.0, np.zeros(27)]) @ q.T  # rank 3: the Krylov space closes after 3 steps
    result = lanczos(lambda v: a @ v, 30, k=2, iterations=30, tol=1e-10, seed=1)
    np.testing.assert_allclose(result.eigenvalues, [10.0, 5.0], rtol=1e-12)
    assert result.converged and result.steps <= 3


def test_hutchinson_is_unbiased_within_its_standard_error_and_exact_on_a_diagonal(problem):
    _, _, _, h = problem
    exact, dim = float(np.trace(h)), h.shape[0]
    diag = np.diag(np.diag(h))
    samples = hutchinson_samples(lambda v: diag @ v, dim, range(4), seed=0)
    np.testing.assert_allclose(samples, exact, rtol=1e-12)  # z^T D z = tr D for every +-1 vector
    # Var(z^T A z) = 2 (||A||_F^2 - sum A_ii^2) for Rademacher z (Hutchinson 1989)
    variance = 2.0 * (np.sum(h * h) - np.sum(np.diag(h) ** 2))
    many = hutchinson_samples(lambda v: h @ v, dim, range(2000), seed=0)
    assert np.var(many, ddof=1) == pytest.approx(variance, rel=0.15)
    # coverage: |estimate - tr| <= 2 s.e. in at least 80 of 100 seeds at m = 16 (t_15: ~94% expected)
    covered = 0
    for seed in range(100):
        value, se = trace_estimate(hutchinson_samples(lambda v: h @ v, dim, range(16), seed=seed))
        covered += abs(value - exact) <= 2 * se
    assert covered >= 80
    assert math.isnan(trace_estimate(many[:1])[1])
    z = rademacher_probe(dim, 5, 7)
    assert set(np.unique(z)) == {-1.0, 1.0} and np.array_equal(z, rademacher_probe(dim, 5, 7))


def test_preconditioned_sharpness_of_a_real_adamw_state_equals_brute_force(problem):
    net0, images, labels, _ = problem
    net = tiny_net()
    lr, wd = 0.01, 0.05
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=wd, betas=(0.9, 0.99), eps=1e-6)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(images), labels).backward()
        opt.step()
    params = list(net.parameters())
    before = torch.cat([p.detach().reshape(-1) for p in params]).numpy().copy()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(images), labels).backward()
    opt.step()
    after = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    pre = adam_preconditioner(opt, params, lr)
    assert pre.kind == "adam" and pre.reason == "" and pre.diagonal is not None
    # torch's AdamW step: theta (1 - lr wd) - theta_next = lr P^-1 m_t, with P from the state after the step
    m = torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in params]).numpy()
    np.testing.assert_allclose(before * (1 - lr * wd) - after, lr * m / pre.diagonal, rtol=1e-9, atol=1e-15)
    assert pre.threshold == pytest.approx(38.0 / lr, rel=1e-15)

    h = full_hessian(net, images, labels)
    d = 1.0 / np.sqrt(pre.diagonal)
    exact = np.linalg.eigvalsh(d[:, None] * h * d[None, :])[-1]
    assert exact == pytest.approx(np.max(np.real(np.linalg.eigvals(h / pre.diagonal[:, None]))), rel=1e-8)
    op = HessianOperator(net, images, labels)
    result = lanczos(lambda v: d * op.matvec(d * v), op.dim, k=1, iterations=200, tol=1e-10, seed=1)
    assert result.eigenvalues[0] == pytest.approx(exact, rel=1e-6)
    assert net0 is not net


def test_stability_thresholds_and_the_optimizers_without_one():
    assert stability_threshold(0.9, 0.01) == pytest.approx(38.0 / 0.01, rel=1e-14)
    assert stability_threshold(0.0, 0.5) == 4.0
    assert math.isnan(stability_threshold(0.9, 0.0)) and math.isnan(stability_threshold(1.0, 0.1))
    net = tiny_net()
    params = list(net.parameters())
    sgd = adam_preconditioner(torch.optim.SGD(params, lr=0.1), params, 0.1)
    assert (sgd.kind, sgd.threshold, sgd.diagonal) == ("sgd", pytest.approx(20.0), None)
    for opt, why in (
        (torch.optim.SGD(params, lr=0.1, momentum=0.9), "momentum"),
        (torch.optim.RMSprop(params, lr=0.1), "RMSprop"),
        (torch.optim.AdamW(params, lr=0.1), "no step"),
        (None, "offline"),
    ):
        pre = adam_preconditioner(opt, params, 0.1)
        assert pre.kind == "none" and math.isnan(pre.threshold) and why in pre.reason, pre


def test_curvature_batch_is_class_stratified_seeded_and_deterministic():
    labels = np.repeat([2, 0, 1], [5, 7, 3])  # unequal classes, not in label order
    order = curvature_batch_indices(labels, 100, seed=0)
    assert sorted(order.tolist()) == list(range(labels.size))  # every image once
    sizes = {0: 7, 1: 3, 2: 5}  # dealt round robin in label order, a class dropping out once it is used up
    dealt = [c for i in range(7) for c in (0, 1, 2) if i < sizes[c]]
    assert labels[order].tolist() == dealt
    first = curvature_batch_indices(labels, 6, seed=0)
    assert np.array_equal(first, order[:6]) and np.array_equal(first, curvature_batch_indices(labels, 6, seed=0))
    assert sorted(labels[first].tolist()) == [0, 0, 1, 1, 2, 2]
    assert not np.array_equal(curvature_batch_indices(labels, 15, seed=1), order)


def test_the_network_modes_flags_and_gradients_are_left_as_they_were():
    net = tiny_net().float().train()
    block: Any = net.blocks[0]  # type: ignore[index]
    block.attn.fused_attn = True
    block.eval()  # a mixed state must come back as it was
    for p in net.parameters():
        p.grad = torch.full_like(p, 0.5)
    modes = [m.training for m in net.modules()]
    images, labels = batch()
    op = HessianOperator(net, images.float(), labels)
    op.matvec(np.ones(op.dim))
    assert [m.training for m in net.modules()] == modes and block.attn.fused_attn is True
    assert all(p.grad is not None and torch.equal(p.grad, torch.full_like(p, 0.5)) for p in net.parameters())
    assert all(p.dtype == torch.float32 for p in net.parameters())
    with pytest.raises(RuntimeError), unfused_eval(net):
        assert block.attn.fused_attn is False and not net.training
        raise RuntimeError
    assert [m.training for m in net.modules()] == modes and block.attn.fused_attn is True


def test_the_loss_protocol_refuses_a_bad_declaration_in_one_line_and_labels_round_trip():
    from types import SimpleNamespace

    from tgo.errors import UserInputError
    from tgo.optimisation.curvature import loss_label, offline_loss, read_loss_label, training_loss

    with pytest.raises(
        UserInputError, match=r"^SimpleNamespace\.tgo_loss: expected a method tgo_loss\(logits, labels\)"
    ):
        training_loss(SimpleNamespace(tgo_loss=0.1))
    with pytest.raises(UserInputError, match=r"^SimpleNamespace\.tgo_loss_name: expected a non-empty string"):
        training_loss(SimpleNamespace(tgo_loss=torch.nn.functional.mse_loss, tgo_loss_name=""))
    named = training_loss(SimpleNamespace(tgo_loss=torch.nn.functional.mse_loss))
    assert named.declared and named.name == "SimpleNamespace.tgo_loss" and named.fn is torch.nn.functional.mse_loss
    plain = training_loss(SimpleNamespace())
    assert not plain.declared and plain.fn is torch.nn.functional.cross_entropy
    logits, labels = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    assert float(plain(logits, labels)) == float(torch.nn.functional.cross_entropy(logits, labels))
    assert read_loss_label(loss_label(named)) == "SimpleNamespace.tgo_loss"
    assert read_loss_label(loss_label(offline_loss())) == "cross_entropy (offline: no training module)"
    assert read_loss_label(loss_label(None)) == "cross_entropy (no loss given)"
    assert read_loss_label(loss_label(torch.nn.functional.mse_loss)) == "mse_loss"
    label = loss_label(SimpleNamespace(name="focal γ=2 " + "x" * 300))
    assert label.dtype == np.uint8 and label.shape == (200,) and read_loss_label(label).startswith("focal ?=2 x")


def test_the_residual_bounds_lanczos_on_the_products_as_computed_not_their_float32_round_off(problem):
    """What ``docs/observables.md`` says the recorded residual bounds: in float64 the error of ``lambda_1`` against
    the full Hessian is within the residual; in float32 the error is far above the residual (the products' own error
    ``e``, not recorded), and within ``residual + |e(u_1)|`` (``u_1`` the top eigenvector, the Ritz vector's limit)."""
    net, images, labels, h = problem
    values, vectors = np.linalg.eigh(h)
    top, u = values[-1], vectors[:, -1]
    op64 = HessianOperator(net, images, labels)
    exact = lanczos(op64.matvec, op64.dim, k=1, iterations=200, tol=1e-12, seed=0)
    assert abs(exact.eigenvalues[0] - top) <= exact.residuals[0]  # measured 7.1e-14 <= 2.4e-12
    op32 = HessianOperator(net, images, labels, dtype=torch.float32)
    low = lanczos(op32.matvec, op32.dim, k=1, iterations=200, tol=1e-9, seed=0)
    error, residual = abs(low.eigenvalues[0] - top), low.residuals[0]
    assert low.converged and error > 100 * residual  # measured 5.4e-5 against 1.4e-8: no bound on float32
    product_error = np.linalg.norm(op32.matvec(u) - h @ u)
    assert error <= residual + product_error  # measured 5.4e-5 <= 8.5e-5
