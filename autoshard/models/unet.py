"""A small U-Net: image [N, H, W, C] (channels last) to a map of the same height and width.

Each level of the encoder is two 3x3 convolutions (padding 1) with relu, then a 2x2 max pool;
the bottleneck is two more; each level of the decoder upsamples by 2 (nearest neighbour:
a broadcast and a reshape), a 3x3 convolution halves the channels, the result is concatenated
with the encoder's activation of that level (the skip connection), and two 3x3 convolutions
follow. A 1x1 convolution gives the output channels. Biases are left out: an add of a [C]
parameter changes no sharding choice.

At high resolution the activations, not the weights, fill memory: a level-0 activation is
N * H * W * base values while all weights are a few hundred thousand. Splitting height and
width (with halos for the 3x3 windows) spreads them where a small batch cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoshard.errors import Problem
from autoshard.graph.builder import GraphBuilder
from autoshard.models.checks import float_dtype, positive_ints, raise_problems
from autoshard.models.training import add_training_step, weighted_sum_loss


@dataclass(frozen=True, slots=True)
class UNetConfig:
    levels: int = 3  # 2x2 poolings between the input resolution and the bottleneck
    batch: int = 2
    height: int = 256
    width: int = 256
    channels: int = 3
    base: int = 16  # channels of level 0; each level down doubles them
    out_channels: int = 1
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        problems = positive_ints(self, "levels", "batch", "height", "width", "channels", "base", "out_channels")
        if not problems:
            step = 2 ** self.levels
            problems += [Problem(field, f"must be a multiple of 2**levels = {step}, got {getattr(self, field)}")
                         for field in ("height", "width") if getattr(self, field) % step]
        raise_problems(problems + float_dtype(self.dtype))


class _Layers:
    def __init__(self, b: GraphBuilder):
        self.b = b

    def conv(self, x: str, out_channels: int, name: str, kernel: int = 3) -> str:
        w = self.b.parameter(f"{name}.w", (kernel, kernel, self.b.shape(x)[3], out_channels))
        pad = (kernel - 1) // 2
        return self.b.op("conv2d", [x, w], name, padding=[[pad, pad], [pad, pad]])

    def double_conv(self, x: str, out_channels: int, name: str) -> str:
        for i in (1, 2):
            x = self.b.op("relu", [self.conv(x, out_channels, f"{name}.conv{i}")], f"{name}.relu{i}")
        return x

    def upsample(self, x: str, name: str) -> str:
        n, h, w, c = self.b.shape(x)
        wide = self.b.op("broadcast_in_dim", [x], f"{name}.repeat", shape=[n, h, 2, w, 2, c],
                         broadcast_dimensions=[0, 1, 3, 5])
        return self.b.op("reshape", [wide], name, shape=[n, 2 * h, 2 * w, c])


def build_unet(config: UNetConfig, training: bool = False) -> GraphBuilder:
    c = config
    b = GraphBuilder(f"unet_{c.levels}l_{c.height}x{c.width}" + ("_training" if training else ""), c.dtype)
    layers = _Layers(b)
    x = b.input("image", (c.batch, c.height, c.width, c.channels), batch_dim=0)
    skips = []
    # layers in data-flow order: down0 .. down{levels-1}, the bottleneck, up{levels-1} .. up0
    for level in range(c.levels):
        b.layer = level
        x = layers.double_conv(x, c.base * 2 ** level, f"down{level}")
        skips.append(x)
        x = b.op("max_pool2d", [x], f"down{level}.pool", window=[2, 2])
    b.layer = c.levels
    x = layers.double_conv(x, c.base * 2 ** c.levels, "bottleneck")
    for level in reversed(range(c.levels)):
        b.layer = 2 * c.levels - level
        width = c.base * 2 ** level
        up = layers.conv(layers.upsample(x, f"up{level}.upsample"), width, f"up{level}.reduce")
        x = b.op("concat", [skips[level], up], f"up{level}.skip", axis=3)
        x = layers.double_conv(x, width, f"up{level}")
    b.layer = None
    y = layers.conv(x, c.out_channels, "head", kernel=1)
    if training:
        add_training_step(b, *weighted_sum_loss(b, y))
    else:
        b.mark_outputs(y)
    return b


def unet(config: UNetConfig, training: bool = False) -> dict[str, Any]:
    """The graph document of the U-Net (forward, or the whole training step)."""
    return build_unet(config, training).document()
