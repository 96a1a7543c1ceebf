"""Which precision the batched decoder runs in, per mode and host: bf16 in furious where
the CPU runs bf16 natively, fp32 everywhere else. int8 is no decoder rung: on the one
native-bf16 host measured (Zen 4, bench/decoder_int8.py) its products did not beat bf16."""

from __future__ import annotations

import pytest
import torch

from sam2serve.runtime import build
from sam2serve.runtime.modes import MODES
from sam2serve.runtime.spec import RuntimeSpec


@pytest.mark.parametrize(
    "native, expected", [("bfloat16", torch.bfloat16), ("float32", torch.float32)]
)
def test_furious_decodes_in_the_hosts_native_reduced_precision(
    monkeypatch: pytest.MonkeyPatch, native: str, expected: torch.dtype
) -> None:
    monkeypatch.setattr(build, "native_reduced_dtype", lambda device: native)
    assert build.decoder_dtype(RuntimeSpec(mode="furious")) == expected


@pytest.mark.parametrize("mode", [name for name in MODES if name != "furious"])
def test_the_other_modes_decode_in_fp32_on_any_host(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(build, "native_reduced_dtype", lambda device: "bfloat16")
    assert build.decoder_dtype(RuntimeSpec(mode=mode)) == torch.float32


def test_no_mode_quantises_the_decoder() -> None:
    assert all(mode.decoder in ("reference", "fast") for mode in MODES.values())
    assert [m.name for m in MODES.values() if m.reduced_precision_decoder] == ["furious"]
