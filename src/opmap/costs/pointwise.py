"""Pointwise unary, binary and ternary ops: FLOPs per output element, by op.

Weights are (vector FLOPs, transcendental evaluations) per output element. The convention: each add,
subtract, multiply, divide, compare, select or min/max is one vector FLOP; each evaluation of exp, log, tanh,
erf, sqrt, rsqrt, sin, cos or a power with a non-integer exponent is one transcendental op (a separate
count, since hardware runs them on special-function units at a lower rate). Formulas:

- gelu (erf form)  0.5 * x * (1 + erf(x / sqrt 2)): 4 vector (div, add, mul, mul) + 1 erf
- gelu (tanh form) 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))): 7 vector + 1 tanh
- silu             x / (1 + exp(-x)): 3 vector (neg, add, div) + 1 exp
- sigmoid          1 / (1 + exp(-x)): 2 vector + 1 exp (the neg folds into the exp argument)
- softplus         log(1 + exp(x)): 1 vector + 2 transcendental
- mish             x * tanh(softplus(x)): 2 vector + 3 transcendental
"""

from __future__ import annotations

from opmap.costs.base import OpCost, io_cost, rule
from opmap.graph import Node
from opmap.ops import base_name

POINTWISE_WEIGHTS: dict[str, tuple[float, float]] = {
    # binary arithmetic
    "add": (1, 0), "sub": (1, 0), "rsub": (1, 0), "mul": (1, 0), "div": (1, 0), "true_divide": (1, 0),
    "floor_divide": (2, 0), "remainder": (2, 0), "fmod": (2, 0), "maximum": (1, 0), "minimum": (1, 0),
    "fmax": (1, 0), "fmin": (1, 0), "pow": (0, 2), "atan2": (0, 1), "hypot": (3, 1), "xlogy": (1, 1),
    "copysign": (1, 0),
    # comparisons and logic
    "eq": (1, 0), "ne": (1, 0), "lt": (1, 0), "le": (1, 0), "gt": (1, 0), "ge": (1, 0),
    "logical_and": (1, 0), "logical_or": (1, 0), "logical_not": (1, 0), "logical_xor": (1, 0),
    "bitwise_and": (1, 0), "bitwise_or": (1, 0), "bitwise_not": (1, 0), "bitwise_xor": (1, 0),
    "isnan": (1, 0), "isinf": (1, 0),
    # ternary
    "where": (1, 0), "masked_fill": (1, 0), "addcmul": (2, 0), "addcdiv": (2, 0), "lerp": (2, 0),
    "clamp": (2, 0), "clip": (2, 0), "hardtanh": (2, 0),
    # unary
    "neg": (1, 0), "abs": (1, 0), "sign": (1, 0), "sgn": (1, 0), "reciprocal": (1, 0), "square": (1, 0),
    "floor": (1, 0), "ceil": (1, 0), "round": (1, 0), "trunc": (1, 0), "frac": (1, 0),
    "clamp_min": (1, 0), "clamp_max": (1, 0), "relu": (1, 0), "relu6": (2, 0), "threshold": (1, 0),
    "leaky_relu": (2, 0), "hardswish": (4, 0), "hardsigmoid": (3, 0), "nan_to_num": (3, 0),
    "exp": (0, 1), "exp2": (0, 1), "expm1": (0, 1), "log": (0, 1), "log2": (0, 1), "log10": (0, 1),
    "log1p": (0, 1), "sqrt": (0, 1), "rsqrt": (0, 1), "sin": (0, 1), "cos": (0, 1), "tan": (0, 1),
    "asin": (0, 1), "acos": (0, 1), "atan": (0, 1), "sinh": (0, 1), "cosh": (0, 1), "tanh": (0, 1),
    "erf": (0, 1), "erfc": (0, 1), "erfinv": (0, 1), "sigmoid": (2, 1), "silu": (3, 1),
    "softplus": (1, 2), "mish": (2, 3), "elu": (2, 1), "selu": (3, 1), "celu": (3, 1), "logit": (2, 1),
    "gelu": (4, 1),  # erf form; the tanh form is weighted in gelu_weights
    "glu": (3, 1),  # a * sigmoid(b) on half the input
    "tril": (1, 0), "triu": (1, 0),  # one select per element
    # dropout: a random draw, a compare and a scale per element (the Philox draw counted as one op); the
    # backward multiplies the gradient by the mask and the scale
    "native_dropout": (3, 0), "native_dropout_backward": (2, 0),
}
GELU_TANH = (7.0, 1.0)


def _weights(node: Node) -> tuple[float, float]:
    name = base_name(node.packet)
    if name == "gelu" and node.args.get("approximate") == "tanh":
        return GELU_TANH
    if name == "pow":
        e = node.args.get("exponent")
        if isinstance(e, (int, float)) and float(e).is_integer() and 0 <= e <= 4:
            return (max(float(e) - 1, 0.0), 0.0)  # x**2 is one multiply, x**3 two
        return POINTWISE_WEIGHTS["pow"]
    return POINTWISE_WEIGHTS[name]


def pointwise_cost(node: Node) -> OpCost:
    """Vector and transcendental FLOPs per output element times the output elements; minimum bytes."""
    v, t = _weights(node)
    if node.input("bias") is not None:  # a fused bias add before the op (onnxruntime's BiasGelu, FastGelu)
        v += 1
    n = node.outputs[0].numel if node.outputs else 0
    return io_cost(node, vector_flops=v * n, transcendental_flops=t * n)


for _name in POINTWISE_WEIGHTS:
    rule(_name, _name + "_")(pointwise_cost)
