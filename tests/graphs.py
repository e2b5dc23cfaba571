"""Graphs the tests share, CPU and GPU alike: .cdg texts, the builders of small ones, and the torch twin of
BLOCK. A graph used by one test module stays in that module."""

import torch


def graph_text(body: str, io: str = "half") -> str:
    """A graph `t` of the given statements, io dtype `io`, computing in float."""
    return f"graph t {{\n  io {io}\n  compute float\n{body}\n}}\n"


# the least graph cuDNN plans: what walks the pipeline's stages, CPU and GPU
ADD = "graph g {\n  input a : half[4, 8]\n  input b : half[4, 8]\n  output y = a + b\n}\n"


# ---- graphs cuDNN declines whole: they run in parts ------------------------------------------------

LN_GELU = (
    "graph ln_gelu {\n  io bf16\n  input x : bf16[8, 1024, 1, 1] nhwc\n  input s : float[1, 1024, 1, 1] nhwc\n"
    "  input b : float[1, 1024, 1, 1] nhwc\n  output y = gelu(layernorm(x, s, b))\n}\n"
)
MM_RESHAPE = (
    "graph mm_reshape {\n  io half\n  input a : half[4, 64, 128]\n  input b : half[4, 128, 32]\n"
    "  output y : float[4, 2048] = reshape(matmul(a, b), shape=[4, 2048])\n}\n"
)
GENSTATS = (
    "graph gs {\n  io half\n  input x : half[8, 64, 16, 16] nhwc\n  s, sq = genstats(x)\n  output s\n  output sq\n}\n"
)
# a view read by one part, an output in place written by another (the parts' plan keys and binding)
VIEWED_IN_PLACE = (
    "graph viewed {\n  io bf16\n  buffer buf : bf16[2, 8, 1024, 1, 1]\n"
    "  input x : bf16[8, 1024, 1, 1] strides [1024, 1, 1024, 1024] in buf at 8192\n"
    "  input s : float[1, 1024, 1, 1] nhwc\n  input b : float[1, 1024, 1, 1] nhwc\n"
    "  input acc : bf16[8, 1024, 1, 1] nhwc\n  output y in acc = gelu(layernorm(x, s, b))\n}\n"
)
# x is overwritten by one part and read by a later one: that part must see x as it was
READ_AFTER_OVERWRITE = (
    "graph rao {\n  io bf16\n  input x : bf16[8, 1024, 1, 1] nhwc\n  input s : float[1, 1024, 1, 1] nhwc\n"
    "  input b : float[1, 1024, 1, 1] nhwc\n  output y in x = gelu(layernorm(x, s, b))\n"
    "  output z = layernorm(x, s, b)\n}\n"
)


# ---- graphs cuDNN 9.19 ran wrong as one graph on the H200 (cudnn_dsl/target/quirks.py) -------------


def defect_text(body: str) -> str:
    """A graph `g` of float inputs r [2, 8, 1], s [1, 1, 32], m and m0 [2, 8, 32], and `body`."""
    return (
        "graph g {\n  compute float\n  input r : float[2, 8, 1]\n  input s : float[1, 1, 32]\n"
        f"  input m : float[2, 8, 32]\n  input m0 : float[2, 8, 32]\n  {body}\n}}\n"
    )


#: case -> (the body of a defect_text graph, words of the reason it is declined)
DEFECTS = {
    # seen on the H200: NaN where the made value is broadcast
    "made_then_broadcast": ("t = mul(r, 0.03125)\n  output o = sub(m0, mul(m, t))", "broadcasts 't', a value made"),
    # seen on the H200: half the output wrong, split as well (the [1, 1, 32] scale over two dims)
    "two_dims": ("output o = mul(sub(m, r), mul(m0, s))", "broadcasts input 's' over 2 dims"),
    # seen on the H200: the conv_wgrad's output right, the relu_backward's never written
    "unconnected": ("output o = relu(m)\n  output p = sigmoid(m0)", "shares no value made in this graph"),
}


# ---- attention ---------------------------------------------------------------------------------------

ATTENTION = """
graph attention {
  io half
  compute float
  input q : half[2, 4, 128, 64]
  input k : half[2, 4, 128, 64]
  input v : half[2, 4, 128, 64]
  output o = sdpa(q, k, v, causal=true)
}
"""

# [B, S, 3, H, D] = [2, 128, 3, 4, 64], as a fused QKV projection writes it; Q, K, V are [B, H, S, D] views
PACKED = """
graph packed {
  io half
  compute float
  buffer qkv : half[2, 128, 3, 4, 64]
  input q : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in qkv at 0
  input k : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in qkv at 256
  input v : half[2, 4, 128, 64] strides [98304, 64, 768, 1] in qkv at 512
  output o = sdpa(q, k, v, causal=true)
}
"""


# ---- a block of a model, as a graph and in torch -------------------------------------------------------

BLOCK = """
graph block {
  compute float
  dim N in {2, 4}
  input x : float[N, 8, 16]
  input w : float[1, 16, 32]
  input b : float[1, 1, 32]
  input gamma : float[1, 1, 32]
  input beta : float[1, 1, 32]
  scalar alpha : float = 0.5
  h = gelu(bias(matmul(x, w) * alpha, b))
  output y = layernorm(h, gamma, beta, epsilon=1e-5)
}
"""


def block_in_torch(x, w, b, gamma, beta, alpha=0.5):
    """BLOCK in plain torch."""
    h = torch.nn.functional.gelu(torch.matmul(x, w) * alpha + b)
    return torch.nn.functional.layer_norm(h, (32,), gamma.reshape(32), beta.reshape(32), eps=1e-5)


class Block(torch.nn.Module):
    """A model calling a graph op twice, with a residual and a loss in torch around it."""

    def __init__(self, call, params: dict):
        super().__init__()
        self.call = call
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(v.clone()) for k, v in params.items()})

    def forward(self, x):
        y = self.call(x, self.p["w"], self.p["b"], self.p["gamma"], self.p["beta"])
        z = self.call(x + 0.1, self.p["w"], self.p["b"], self.p["gamma"], self.p["beta"], alpha=0.25)
        return ((y - z) ** 2).mean() + y.mean()


def block_params(seed: int = 0) -> dict:
    """BLOCK's weights, seeded, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(1, 16, 32, generator=g) * 0.3,
        "b": torch.randn(1, 1, 32, generator=g),
        "gamma": torch.rand(1, 1, 32, generator=g) + 0.5,
        "beta": torch.randn(1, 1, 32, generator=g),
    }
