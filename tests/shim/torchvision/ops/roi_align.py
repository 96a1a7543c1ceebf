"""torchvision.ops.roi_align stand-in: a direct, loop-per-sample port of torchvision's CPU
kernel (roi_align_kernel.cpp), written independently of sam2serve.concepts.roi_align so
that the two check each other through the fidelity tests."""

import math

from torch import Tensor, nn


def _sample(feature: Tensor, y: float, x: float) -> Tensor:
    height, width = feature.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return feature.new_zeros(feature.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_high = y_low = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_high = x_low = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1.0 - ly, 1.0 - lx
    return (
        hy * hx * feature[:, y_low, x_low]
        + hy * lx * feature[:, y_low, x_high]
        + ly * hx * feature[:, y_high, x_low]
        + ly * lx * feature[:, y_high, x_high]
    )


def roi_align(
    input: Tensor,
    boxes,
    output_size,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> Tensor:
    out_h, out_w = (output_size, output_size) if isinstance(output_size, int) else output_size
    if isinstance(boxes, Tensor):  # (K, 5) rows of (batch index, x1, y1, x2, y2)
        rows = boxes.tolist()
    else:
        rows = [[i, *b] for i, bs in enumerate(boxes) for b in bs.tolist()]
    offset = 0.5 if aligned else 0.0
    result = input.new_zeros((len(rows), input.shape[1], out_h, out_w))
    for k, (b, x1, y1, x2, y2) in enumerate(rows):
        feature = input[int(b)]
        x1, y1 = x1 * spatial_scale - offset, y1 * spatial_scale - offset
        roi_w, roi_h = x2 * spatial_scale - offset - x1, y2 * spatial_scale - offset - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / out_h, roi_w / out_w
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / out_h)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / out_w)
        count = max(grid_h * grid_w, 1)
        for ph in range(out_h):
            for pw in range(out_w):
                acc = input.new_zeros(input.shape[1])
                for iy in range(grid_h):
                    y = y1 + ph * bin_h + (iy + 0.5) * bin_h / grid_h
                    for ix in range(grid_w):
                        x = x1 + pw * bin_w + (ix + 0.5) * bin_w / grid_w
                        acc = acc + _sample(feature, y, x)
                result[k, :, ph, pw] = acc / count
    return result


class RoIAlign(nn.Module):
    def __init__(self, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False):
        super().__init__()
        self.output_size, self.spatial_scale = output_size, spatial_scale
        self.sampling_ratio, self.aligned = sampling_ratio, aligned

    def forward(self, input: Tensor, rois) -> Tensor:
        return roi_align(
            input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned
        )
