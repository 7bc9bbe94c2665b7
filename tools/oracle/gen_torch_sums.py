"""torch's RMSNorm sums at real widths, and their goldens: tests/fixtures/torch_sums.

An RMSNorm in bf16 (transformers' `Qwen2RMSNorm`, the Llama form) widens its input to f32 and takes
`x.pow(2).mean(-1)`: a sum in the order of torch's CPU sum kernel, divided by the count. Which f32 that sum is
decides, now and then, on which side of a bf16 rounding a normalized value falls, so the numeric contract states
torch's order for bf16 activations. The fixture holds bf16-valued rows at the widths real models have (and the
small and ragged ones the kernel treats apart: under one vector, a scalar tail, leftover vectors, the cascade's
second and third levels), their f32 means of squares, and the RMSNorm of the rows of the widths up to 3584 in
bf16 with a random bf16 weight."""

import common
import torch
from safetensors.torch import save as st_save
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

FIXTURE = common.FIXTURES / "torch_sums"
# (width, rows): under a vector (4), a scalar tail (12, 100), leftover vectors (100), one cascade level
# (64 to 3584: Gemma 3 1B's 1152, Qwen2-VL-2B's 1536, Qwen2-VL-7B's 3584), two (8192), three (16384).
WIDTHS = [(4, 16), (12, 16), (64, 16), (100, 16), (1152, 16), (1536, 16), (2048, 16), (3584, 16), (8192, 8),
          (16384, 8)]
NORMED_MAX_WIDTH = 3584
EPS = 1e-6


def main() -> None:
    args = common.parse_args(__doc__)
    common.setup_torch()
    common.stage_dir(FIXTURE, args.check, torch.bfloat16)
    gen = torch.Generator().manual_seed(common.SEED)
    tensors = {}
    for width, rows in WIDTHS:
        # Rows of different magnitudes, as a residual stream's are.
        scale = torch.exp(torch.randn(rows, 1, generator=gen) * 2)
        x = (torch.randn(rows, width, generator=gen) * scale).to(torch.bfloat16)
        tensors[f"x.{width}"] = x
        tensors[f"mean_square.{width}"] = x.float().pow(2).mean(-1)
        if width <= NORMED_MAX_WIDTH:
            norm = Qwen2RMSNorm(width, eps=EPS).to(torch.bfloat16)
            with torch.no_grad():
                norm.weight.copy_((1 + 0.5 * torch.randn(width, generator=gen)).to(torch.bfloat16))
                tensors[f"weight.{width}"] = norm.weight.detach().clone()
                tensors[f"rms_norm.{width}"] = norm(x)
    data = st_save(dict(sorted(tensors.items())), metadata={"eps": repr(EPS)})
    common.emit(FIXTURE / "sums.safetensors", data, args.check)
    common.write_provenance(FIXTURE, "gen_torch_sums.py", "torch: x.float().pow(2).mean(-1); transformers Qwen2RMSNorm",
                            {"sums": "bf16 rows at each width; mean of squares in f32; RMSNorm in bf16"}, args.check,
                            notes=["the means and norms are torch's CPU kernels' own, in bf16 and f32"],
                            dtype="bfloat16")
    common.finish(FIXTURE)


if __name__ == "__main__":
    main()
