"""Functions and modules the package tests compile, save and load again (in this process and
in fresh subprocesses, which import this file by name)."""
import torch

SCALE = torch.tensor([0.5, -1.0, 2.0, 3.0])    # a global tensor the functions read


def f(x, y):
    return torch.relu(x) * y + 1


def g(x):
    return torch.sin(x) + SCALE


def _helper(x):
    return x * 2 - 1


def uses_helper(x):
    return _helper(x).cos()


def with_break(x):
    y = x.sin() * 2
    print("", end="")          # a graph break
    return y.cos() + 1


class ScaledSquare(torch.autograd.Function):
    """A user's autograd.Function: captured into the graph as a node calling its forward and
    backward subgraphs (saved by a package as what makes it)."""

    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return x * x * k + SCALE

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 2 * ctx.k * x * g, None


def with_autograd_function(x):
    return ScaledSquare.apply(x.sin(), 3.0).sum()


def with_default(x, k=3):
    return x * k


class MLP(torch.nn.Module):
    def __init__(self, d=4, h=8):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train_step(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss


def make_scaled(scale):
    def scaled(x):
        return x * scale + 1
    return scaled


class Counter:
    def __init__(self):
        self.w = torch.ones(4)

    def step(self, x):
        return x @ self.w


def unsupported(x):
    return torch.tensor(sorted(x.tolist())) + 1     # data-dependent: runs eagerly


def generator_frame(x):
    yield x + 1
    yield x * 2


class Masked(torch.nn.Module):
    """forward has a default the capture reads through the inlined function's __defaults__."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, mask=None):
        y = self.fc(x)
        if mask is not None:
            y = y * mask
        return y


def double(x):
    return x * 2


def apply(fn, x):
    return fn(x) + 1


FLAG = 2.0


def with_break_flag(x):
    y = x.sin()
    print("", end="")          # a graph break; the continuation reads FLAG
    return y * FLAG


def branchy(x):
    """A shape branch (a SHAPE_ENV guard ``size <= 8`` under dynamic=True), a slice whose size
    is symbolic (``s - 1``) and the size itself in the result."""
    if x.shape[0] > 8:
        return x.sin() * 2
    return (x.cos() + 1)[1:] * x.shape[0]


def loop_with_breaks(x, n: int):
    """A graph break in each of ``n`` loop iterations: every recompile of the loop's frame
    resumes in the same chain of continuations."""
    for i in range(n):
        print("", end="")          # a graph break
        x = x * 2 + i
    return x


class ClassAttributeNone(torch.nn.Module):
    """Reads a class attribute that is None (diffusers' ModelMixin._keep_in_fp32_modules)."""
    _keep_in_fp32 = None

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        if self._keep_in_fp32 is not None:
            x = x.float()
        return self.lin(x)


def break_train_step(model, x):
    h = model(x)
    print("", end="")          # a graph break: the continuation takes h, which requires grad
    loss = h.pow(2).mean()
    loss.backward()
    return loss


def with_cond(x, y):
    """torch.cond on data: one graph whose branches are subgraphs (a closure lifted into both)."""
    return torch.cond(x.sum() > 0, lambda a: a.sin() + y, lambda a: a.cos() * y, (x,))


def with_while_loop(x, w):
    """torch.while_loop: its trip count (0 to 5) is the data's."""
    return torch.while_loop(lambda i, a: (i < 5) & (a.sum() < 100), lambda i, a: (i + 1, a * 2 + w),
                            (torch.tensor(0), x))


def signed(shape, sign):
    """A random input whose sum has the given sign (``with_cond`` tests the sum)."""
    return torch.rand(*shape) * sign + 0.01 * sign
