"""Conformance: torch functions, tensor methods, in-place ops (on locals and on inputs),
tensor attributes used in Python logic, indexing, torch.nn.functional, dtype/device
constants, grad-mode context managers."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _conformance import A, R, RI, Fresh, case, ids_unique, run_case  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- torch functions
def fn_add_mul_sub(x, y):
    return torch.add(x, y), torch.add(x, y, alpha=2), torch.mul(x, 3), torch.sub(x, y), torch.div(x, 2)


def fn_matmul_mm_bmm(x, y, b1, b2):
    return torch.matmul(x, y), torch.mm(x, y), torch.bmm(b1, b2), torch.einsum("ij,jk->ik", x, y)


def fn_cat_stack(x, y):
    return torch.cat([x, y]), torch.cat((x, y), dim=1), torch.stack([x, y], dim=0), torch.stack((x, y), 2)


def fn_where(x, y):
    return torch.where(x > y, x, y), torch.where(x > 0, x, 0.0)


def fn_activations(x):
    return torch.relu(x), torch.sigmoid(x), torch.tanh(x), torch.exp(x), torch.sin(x), torch.abs(x)


def fn_softmax_logsoftmax(x):
    return torch.softmax(x, dim=-1), torch.log_softmax(x, 1), x.softmax(0)


def fn_reductions(x):
    return torch.sum(x), torch.sum(x, dim=1), torch.mean(x, dim=0, keepdim=True), x.prod(1), x.std(0), x.var()


def fn_max_dim_namedtuple(x):
    r = torch.max(x, dim=1)
    m = x.min(0)
    return r.values * 2, r.indices, m[0], m[1]


def fn_max_return_types(x):
    return torch.max(x, dim=1), torch.sort(x, dim=1), torch.topk(x, 2)


def fn_max_unpack(x):
    vals, idx = x.max(-1)
    return vals + idx.float()


def fn_argmax_all_any(x):
    return x.argmax(), x.argmax(1), (x > 0).any(1), (x > -10).all()


def fn_shape_ops(x):
    return (torch.reshape(x, (4, 3)), x.permute(1, 0), torch.transpose(x, 0, 1), torch.flatten(x),
            x.unsqueeze(0).shape, torch.squeeze(x.unsqueeze(1), 1))


def fn_expand_repeat(x):
    v = x[:, :1]
    return v.expand(3, 4) + x, v.expand(-1, 5), x.repeat(2, 1), v.expand_as(x)


def fn_factories(x):
    return (torch.zeros_like(x), torch.ones(3, 4), torch.arange(5), torch.arange(1, 7, 2, dtype=torch.float32),
            torch.full((2, 2), 3.5), torch.ones_like(x) * x, torch.empty(2, 3).fill_(1.0), torch.eye(3),
            torch.zeros(2, dtype=torch.int64), torch.linspace(0, 1, 5), torch.tensor([1.0, 2.0]) + x[0, :2])


def fn_factories_from_shape(x):
    return torch.zeros(x.shape[0], 2) + x[:, :2], torch.arange(x.size(1)) * 2, torch.full_like(x, 7)


def fn_clamp_math(x):
    return torch.clamp(x, -0.5, 0.5), x.clamp(min=0), torch.sqrt(x.abs()), torch.pow(x, 3), torch.rsqrt(x.abs() + 1)


def fn_comparison_fns(x, y):
    return torch.eq(x, y), torch.gt(x, 0), torch.maximum(x, y), torch.minimum(x, y), torch.isclose(x, x)


def fn_logical(x, y):
    a, b = x > 0, y > 0
    return torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_not(a), a & ~b


def fn_split_chunk(x):
    a, b = torch.split(x, 2, dim=1)
    c = x.chunk(3, dim=0)
    return a * b, c[2], torch.unbind(x, 1)[3]


def fn_gather_index_select(x, idx):
    return torch.gather(x, 1, idx), torch.index_select(x, 0, torch.tensor([2, 0])), x[idx[:, 0]]


def fn_cumsum_flip_roll(x):
    return torch.cumsum(x, 1), torch.flip(x, [0]), torch.roll(x, 1, 1), torch.tril(x), x.triu(1)


def fn_outer_norm(x, v):
    return torch.outer(v, v), torch.linalg.norm(x), x.norm(dim=1), torch.nn.functional.normalize(x, dim=1)


def fn_type_promotion(x):
    i = torch.arange(12).reshape(3, 4)
    return x + i, i * 2, i / 2, i // 3, (i > 5) + 1, i.float().mean()


# ----------------------------------------------------------------------------- tensor methods
def m_sum_mean_dim(x):
    return x.sum(dim=1), x.sum(dim=(0, 1)), x.mean(-1, keepdim=True), x.sum(0, keepdim=True)


def m_view_reshape(x):
    return x.view(4, 3), x.view(-1), x.view(2, 2, 3), x.reshape(-1, 2), x.view(12, 1).squeeze(-1)


def m_t_clone_contiguous(x):
    y = x.t()
    z = y.contiguous()
    return y, z.is_contiguous(), y.is_contiguous(), x.clone() + 1, x.T.clone()


def m_dtype_conversions(x):
    return x.float(), x.double(), x.to(torch.float64), x.long(), x.int(), x.to(dtype=torch.float16), x.bool(), x.half()


def m_type_as_to_other(x, y):
    return x.type_as(y), x.to(y), x.to("cpu"), x.to(torch.device("cpu"), torch.float64)


def m_chained(x):
    return x.abs().sqrt().add(1).mul(2).sub(x).div(3).exp().log().neg()


def m_new_tensors(x):
    return x.new_zeros(2, 3), x.new_ones((3,)), x.new_full((2,), 4.0), x.new_empty(2, 2).zero_()


def m_detach(x):
    return x.detach() * 2, x.detach().requires_grad


def m_masked_fill_where(x):
    return x.masked_fill(x > 0, 0.0), x.where(x < 0, torch.zeros_like(x))


# ----------------------------------------------------------------------------- in-place
def inplace_on_local(x):
    y = x.clone()
    y.add_(1)
    y.mul_(2)
    y.clamp_(max=1.5)
    y[0] = 0
    y[:, 1] += 3
    return y


def inplace_zeros_fill_local(x):
    y = torch.zeros(3, 4)
    y.copy_(x)
    y[1:, :2] = 5.0
    y.fill_diagonal_(-1)
    return y


def inplace_on_input_add(x):
    x.add_(1)
    return x * 2


def inplace_on_input_setitem(x):
    x[0] = 0
    x[:, -1] = 5.0
    return x.sum(1)


def inplace_on_input_with_other(x, y):
    x.mul_(y)
    y.sub_(1)
    return x + y


def inplace_on_input_view(x):
    v = x.view(-1)
    v.add_(1)
    x[1].mul_(0)
    return x


def inplace_on_input_returns_self(x):
    return x.relu_()


def inplace_then_read_input(x):
    before = x.sum()
    x.sub_(1)
    after = x.sum()
    return before, after


def inplace_index_put_tensor(x, idx):
    x[idx] = -1.0
    return x


def inplace_out_of_place_mix(x):
    y = x + 1
    y.sin_()
    z = y.clone()
    z.mul_(x)
    return y, z


# ----------------------------------------------------------------------------- attributes in Python logic
def attr_shape(x):
    b, n = x.shape
    out = x.reshape(n, b) if b < n else x
    return out, x.shape, x.shape[0] * n


def attr_size(x):
    return x.view(x.size(0), x.size(1) // 2, 2), x.size(), x.size(-1), x.size()[1:]


def attr_dtype_device(x):
    out = x
    if x.dtype == torch.float32:
        out = out + 1
    if x.dtype != torch.float64:
        out = out * 2
    if x.device == torch.device("cpu") and x.device.type == "cpu":
        out = out - 3
    if x.is_floating_point() and not x.is_complex():
        out = out / 2
    return out, x.dtype, x.device


def attr_ndim_dim_numel(x):
    out = x
    if x.ndim == 2 and x.dim() == 2:
        out = out.sum(-1)
    return out * x.numel(), x.numel(), x.ndim, x.element_size()


def attr_requires_grad_false(x):
    if x.requires_grad:
        return x * 100
    return x + 1


def attr_requires_grad_true(x):
    if x.requires_grad:
        return x * 2
    return x + 100


def attr_is_leaf_and_grad_fn(x):
    y = x * 2
    return y + (x.grad_fn is None) + (y.is_leaf and 1)


def attr_shape_arith(x):
    h = x.shape[-1] // 2
    return x[:, :h] + x[:, h:], h


def attr_dtype_itemsize_and_props(x):
    return x + x.dtype.is_floating_point + (x.dtype.itemsize == 4), torch.is_tensor(x), torch.is_floating_point(x)


def attr_stride_and_layout(x):
    y = x.t()
    return y.contiguous() * (x.stride() == (4, 1)), x.layout == torch.strided, y.stride()


def attr_T_mT(x):
    return x.T + 1, x.mT * 2


# ----------------------------------------------------------------------------- indexing
def idx_basic(x):
    return x[0], x[-1], x[1, 2], x[:, 1:3], x[::2], x[1:, ::2]


def idx_none_ellipsis(x):
    return x[..., None], x[None], x[:, None, :], x[..., 1], x[None, ..., None].shape


def idx_tensor_index(x, idx):
    return x[idx], x[:, idx[:2]], x[[0, 2]], x[[0, 1], [1, 2]]


def idx_negative_and_step(x):
    return x[-2:], x[:-1, -3:-1], x.flip(0)[::3], x[1::2, ::3], x[-1, -1]


def idx_bool_ops(x, y):
    m = (x > 0) & (y < 0)
    return torch.where(m, x, y), m.float().sum(), (~m).sum(1), m | (x > 1)


def idx_setitem_slice_local(x):
    y = x.clone()
    y[:, :2] = y[:, 2:] * 2
    y[..., -1] = 1.0
    y[0, 0] = x[1, 1]
    return y


def idx_setitem_bool_mask_local(x):
    y = x.clone()
    y[y < 0] = 0.0  # masked assignment (shape static)
    return y


# ----------------------------------------------------------------------------- torch.nn.functional
def nnf_relu_gelu_silu(x):
    return F.relu(x), F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x), F.leaky_relu(x, 0.1), F.elu(x)


def nnf_linear(x, w, b):
    return F.linear(x, w, b), F.linear(x, w)


def nnf_softmax(x):
    return F.softmax(x, dim=-1), F.log_softmax(x, dim=0), F.softmax(x, dim=1, dtype=torch.float64)


def nnf_layer_norm(x, w, b):
    return F.layer_norm(x, (4,), w, b), F.layer_norm(x, x.shape[-1:])


def nnf_conv2d(x, w, b):
    return F.conv2d(x, w, b), F.conv2d(x, w, padding=1, stride=2)


def nnf_dropout_eval(x):
    return F.dropout(x, p=0.5, training=False), F.dropout(x, 0.2, False) * 2


def nnf_cross_entropy(logits, target):
    return F.cross_entropy(logits, target), F.cross_entropy(logits, target, reduction="none")


def nnf_mse_loss(x, y):
    return F.mse_loss(x, y), F.mse_loss(x, y, reduction="sum"), F.l1_loss(x, y)


def nnf_pooling_pad(x):
    return F.max_pool2d(x, 2), F.avg_pool2d(x, 2), F.pad(x, (1, 1)), F.adaptive_avg_pool2d(x, 1)


def nnf_one_hot_embedding(idx, w):
    return F.one_hot(idx, 5), F.embedding(idx, w)


def nnf_batch_norm_eval(x, rm, rv, w, b):
    return F.batch_norm(x, rm, rv, w, b, training=False)


def nnf_interpolate(x):
    return F.interpolate(x, scale_factor=2, mode="nearest")


# ----------------------------------------------------------------------------- dtype / device constants
def const_dtype_compare(x, dt):
    if dt == torch.float64:
        return x.to(dt) * 2
    return x.to(dt)


def const_dtype_in_tuple(x):
    if x.dtype in (torch.float16, torch.float32):
        return x.double()
    return x


def const_dtype_arg_to_factory(x):
    return torch.zeros(3, 4, dtype=x.dtype, device=x.device) + x, torch.ones(2, dtype=torch.float64)


def const_finfo(x):
    fi = torch.finfo(x.dtype)
    return x.clamp(min=fi.min, max=fi.max) * (fi.eps < 1e-6), torch.iinfo(torch.int8).max


def const_get_default_dtype(x):
    return x.to(torch.get_default_dtype()) + 1


# ----------------------------------------------------------------------------- grad mode
def grad_no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    z = x * 3
    return y, z, y.requires_grad, z.requires_grad


def grad_enable_inside_no_grad(x):
    with torch.no_grad():
        a = x + 1
        with torch.enable_grad():
            b = x * 2
        c = x - 1
    return a, b, c


def grad_is_grad_enabled(x):
    if torch.is_grad_enabled():
        y = x * 2
    else:
        y = x
    with torch.no_grad():
        inside = torch.is_grad_enabled()
    return y, inside


def grad_set_grad_enabled(x):
    with torch.set_grad_enabled(False):
        a = x * 2
    return a, x.sin()


def grad_detach_and_requires_grad_input(x):
    return x.detach() + 1, (x * 2).requires_grad


def grad_inference_free_ops(x, w):
    h = x @ w
    with torch.no_grad():
        stat = h.mean()
    return h - stat


CASES = ids_unique([
    # torch functions
    case(fn_add_mul_sub, A(R(3, 4), R(3, 4))),
    case(fn_matmul_mm_bmm, A(R(3, 4), R(4, 5), R(2, 3, 4), R(2, 4, 2)), **TOL),
    case(fn_cat_stack, A(R(3, 4), R(3, 4))),
    case(fn_where, A(R(3, 4), R(3, 4))),
    case(fn_activations, A(R(3, 4)), **TOL),
    case(fn_softmax_logsoftmax, A(R(3, 4)), **TOL),
    case(fn_reductions, A(R(3, 4)), **TOL),
    case(fn_max_dim_namedtuple, A(R(3, 4))),
    case(fn_max_return_types, A(R(3, 4))),
    case(fn_max_unpack, A(R(3, 4))),
    case(fn_argmax_all_any, A(R(3, 4))),
    case(fn_shape_ops, A(R(3, 4))),
    case(fn_expand_repeat, A(R(3, 4))),
    case(fn_factories, A(R(3, 4))),
    case(fn_factories_from_shape, A(R(3, 4))),
    case(fn_clamp_math, A(R(3, 4)), **TOL),
    case(fn_comparison_fns, A(R(3, 4), R(3, 4))),
    case(fn_logical, A(R(3, 4), R(3, 4))),
    case(fn_split_chunk, A(R(6, 4))),
    case(fn_gather_index_select, A(R(3, 4), RI(0, 3, 3, 2))),
    case(fn_cumsum_flip_roll, A(R(3, 4)), **TOL),
    case(fn_outer_norm, A(R(3, 4), R(3)), **TOL),
    case(fn_type_promotion, A(R(3, 4))),
    # tensor methods
    case(m_sum_mean_dim, A(R(3, 4)), **TOL),
    case(m_view_reshape, A(R(3, 4))),
    case(m_t_clone_contiguous, A(R(3, 4))),
    case(m_dtype_conversions, A(R(3, 4)), rtol=1e-3, atol=1e-3),
    case(m_type_as_to_other, A(R(3, 4), R(2, dtype=torch.float64))),
    case(m_chained, A(R(3, 4)), **TOL),
    case(m_new_tensors, A(R(3, 4))),
    case(m_detach, A(R(3, 4))),
    case(m_masked_fill_where, A(R(3, 4))),
    # in-place
    case(inplace_on_local, A(R(3, 4))),
    case(inplace_zeros_fill_local, A(R(3, 4))),
    case(inplace_on_input_add, A(R(3, 4))),
    case(inplace_on_input_setitem, A(R(3, 4))),
    case(inplace_on_input_with_other, A(R(3, 4), R(3, 4))),
    case(inplace_on_input_view, A(R(3, 4))),
    case(inplace_on_input_returns_self, A(R(3, 4))),
    case(inplace_then_read_input, A(R(3, 4)), **TOL),
    case(inplace_index_put_tensor, A(R(3, 4), RI(0, 3, 2))),
    case(inplace_out_of_place_mix, A(R(3, 4))),
    # attributes
    case(attr_shape, A(R(3, 4))),
    case(attr_size, A(R(3, 4))),
    case(attr_dtype_device, A(R(3, 4))),
    case(attr_ndim_dim_numel, A(R(3, 4))),
    case(attr_requires_grad_false, A(R(3, 4))),
    case(attr_requires_grad_true, A(R(3, 4, requires_grad=True))),
    case(attr_is_leaf_and_grad_fn, A(R(3, 4))),
    case(attr_shape_arith, A(R(3, 4))),
    case(attr_dtype_itemsize_and_props, A(R(3, 4))),
    case(attr_stride_and_layout, A(R(3, 4))),
    case(attr_T_mT, A(R(3, 4))),
    # indexing
    case(idx_basic, A(R(3, 4))),
    case(idx_none_ellipsis, A(R(3, 4))),
    case(idx_tensor_index, A(R(3, 4), RI(0, 3, 3))),
    case(idx_negative_and_step, A(R(6, 4))),
    case(idx_bool_ops, A(R(3, 4), R(3, 4))),
    case(idx_setitem_slice_local, A(R(3, 4))),
    case(idx_setitem_bool_mask_local, A(R(3, 4))),
    # torch.nn.functional
    case(nnf_relu_gelu_silu, A(R(3, 4)), **TOL),
    case(nnf_linear, A(R(3, 4), R(5, 4), R(5)), **TOL),
    case(nnf_softmax, A(R(3, 4)), **TOL),
    case(nnf_layer_norm, A(R(3, 4), R(4), R(4)), **TOL),
    case(nnf_conv2d, A(R(1, 2, 5, 5), R(3, 2, 3, 3), R(3)), **TOL),
    case(nnf_dropout_eval, A(R(3, 4))),
    case(nnf_cross_entropy, A(R(3, 5), RI(0, 5, 3)), **TOL),
    case(nnf_mse_loss, A(R(3, 4), R(3, 4)), **TOL),
    case(nnf_pooling_pad, A(R(1, 2, 4, 4)), **TOL),
    case(nnf_one_hot_embedding, A(RI(0, 5, 3), R(5, 2))),
    case(nnf_batch_norm_eval, A(R(3, 4), R(4), Fresh(lambda: torch.rand(4) + 0.5), R(4), R(4)), **TOL),
    case(nnf_interpolate, A(R(1, 2, 3, 3))),
    # dtype / device constants
    case(const_dtype_compare, A(R(3, 4), torch.float64)),
    case(const_dtype_in_tuple, A(R(3, 4))),
    case(const_dtype_arg_to_factory, A(R(3, 4))),
    case(const_finfo, A(R(3, 4))),
    case(const_get_default_dtype, A(R(3, 4, dtype=torch.float64))),
    # grad mode
    case(grad_no_grad_block, A(R(3, 4, requires_grad=True))),
    case(grad_enable_inside_no_grad, A(R(3, 4, requires_grad=True))),
    case(grad_is_grad_enabled, A(R(3, 4, requires_grad=True))),
    case(grad_set_grad_enabled, A(R(3, 4, requires_grad=True))),
    case(grad_detach_and_requires_grad_input, A(R(3, 4, requires_grad=True))),
    case(grad_inference_free_ops, A(R(3, 4, requires_grad=True), R(4, 4, requires_grad=True)), **TOL),
])


@pytest.mark.parametrize("fn,make_args,opts", CASES)
def test_torch(fn, make_args, opts):
    run_case(fn, make_args, opts)
